"""The one place physical names and tag sets are made, so every resource follows one pattern.

Pure planning code (no pulumi import).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# Tag keys dlinfra owns. Fleet tags may not set them (checked in the fleet model), so the precedence
# order is simple: fleet tags, then resource-specific extras, then these, each later one winning.
STANDARD_TAG_KEYS = ("project", "environment", "region", "component", "managed-by")
MANAGED_BY = "pulumi-dlinfra"

_DIRECTIONS = {
    "east": "e", "west": "w", "north": "n", "south": "s", "central": "c",
    "northeast": "ne", "northwest": "nw", "southeast": "se", "southwest": "sw",
}  # fmt: skip


def region_code(region: str) -> str:
    """Short form of a region for names: us-west-2 -> usw2, ap-northeast-1 -> apne1."""
    area, direction, number = region.split("-")
    return f"{area}{_DIRECTIONS.get(direction, direction[:2])}{number}"


def _fit(name: str, max_len: int) -> str:
    """Shorten a name past a limit by keeping its start and a hash of the whole, so it stays unique."""
    if len(name) <= max_len:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: max_len - 9].rstrip('-')}-{digest}"


@dataclass(frozen=True)
class Names:
    """Names and tags for one stack: `<project>-<env>-<region code>` or `<project>-<env>-global`."""

    project: str
    environment: str
    region: str | None  # None for the environment's global stack
    fleet_tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        where = region_code(self.region) if self.region else "global"
        return f"{self.project}-{self.environment}-{where}"

    def physical(self, component: str, *parts: str, max_len: int = 63) -> str:
        """A physical name: prefix, component and parts joined by '-', lower-case, within max_len."""
        raw = "-".join((self.prefix, component, *parts)).lower()
        return _fit(re.sub(r"[^a-z0-9-]+", "-", raw), max_len)

    def tags(self, component: str, name: str | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The tag set of a resource: fleet tags, extras, then the standard keys; Name when given."""
        tags = dict(self.fleet_tags) | dict(extra or {})
        tags |= {
            "project": self.project,
            "environment": self.environment,
            "region": self.region or "global",
            "component": component,
            "managed-by": MANAGED_BY,
        }
        if name is not None:
            tags["Name"] = name
        return tags
