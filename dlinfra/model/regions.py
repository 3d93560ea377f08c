"""AWS regions as data (dlinfra/data/regions.yaml): the zones dlinfra may use, each an AZ name (dlinfra's label for
it) and its zone id (the physical zone), and the customer ASNs AWS reserves. Pure (no pulumi)."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from ruamel.yaml import YAML

# An Availability Zone ID: the region's short code, -az and a number (use1-az1, apne1-az4, caw1-az1).
ZONE_ID = re.compile(r"^[a-z]{3,5}\d-az\d+$")


@dataclass(frozen=True)
class RegionInfo:
    """What AWS offers in one region: AZ names (in order) with zone ids, and reserved customer ASNs."""

    name: str
    azs: tuple[str, ...]
    zone_ids: Mapping[str, str]  # AZ name (dlinfra's label) -> zone id
    reserved_asns: frozenset[int]

    def az_of(self, zone_id: str) -> str | None:
        """The AZ name dlinfra labels a zone id with, or None when the zone is not one of this region's."""
        return next((az for az, zone in self.zone_ids.items() if zone == zone_id), None)


@functools.cache
def known_regions() -> Mapping[str, RegionInfo]:
    """AWS regions dlinfra knows, from dlinfra/data/regions.yaml."""
    text = resources.files("dlinfra").joinpath("data/regions.yaml").read_text()
    raw = YAML(typ="safe").load(text)
    return {
        name: RegionInfo(
            name=name,
            azs=tuple(spec["azs"]),
            zone_ids=dict(spec["azs"]),
            reserved_asns=frozenset(spec.get("reserved_asns", ())),
        )
        for name, spec in raw.items()
    }


def region_of_zone(zone_id: str) -> str | None:
    """The region a zone id belongs to, or None when no known region has it."""
    return next((r.name for r in known_regions().values() if r.az_of(zone_id)), None)
