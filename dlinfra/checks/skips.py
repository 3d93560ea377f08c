"""checkov checks dlinfra deliberately does not act on: one file (checkov-skips.yaml), a reason for each."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from dlinfra.errors import DlinfraError
from dlinfra.model.fleet.load import parse_yaml

SKIPS_VERSION = 1
FRAMEWORKS = ("terraform_plan", "kubernetes")

_CheckId = Annotated[str, StringConstraints(pattern=r"^CKV2?_[A-Z0-9]+_\d+$")]
_Reason = Annotated[str, StringConstraints(strip_whitespace=True, min_length=10)]


class SkipError(DlinfraError):
    """The skips file is malformed, or an entry has no reason."""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: _CheckId  # checkov check id, e.g. CKV2_AWS_12
    reason: _Reason  # why dlinfra does not act on it: a sentence a reviewer can check
    resources: tuple[str, ...] = ()  # shell patterns over Terraform addresses or Kubernetes ids; empty: all
    frameworks: tuple[str, ...] = ()  # checkov frameworks the skip applies to; empty: all


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int
    skips: tuple[_Entry, ...] = ()


@dataclass(frozen=True)
class Skip:
    """One skipped checkov check and why."""

    check_id: str
    reason: str
    resources: tuple[str, ...] = ()
    frameworks: tuple[str, ...] = ()

    def matches(self, framework: str, check_id: str, resource: str) -> bool:
        """True when this skip covers a result of `check_id` on `resource` in `framework`."""
        if check_id != self.check_id or (self.frameworks and framework not in self.frameworks):
            return False
        return not self.resources or any(fnmatch.fnmatchcase(resource, p) for p in self.resources)


def load_skips(path: Path, *, missing_ok: bool = False) -> list[Skip]:
    """Read the skips file; SkipError naming the file and entry for any problem (a missing reason included)."""
    where = str(path)
    if not path.is_file():
        if missing_ok:
            return []
        raise SkipError("skips file not found", file=where)
    try:
        data = parse_yaml(path)
    except DlinfraError as exc:
        raise SkipError(exc.detail, file=where) from None
    try:
        parsed = _File.model_validate(data if data is not None else {"version": SKIPS_VERSION})
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "file"
        hint = " (every skip needs a reason of at least a few words)" if err["loc"][-1:] == ("reason",) else ""
        raise SkipError(f"{err['msg']}{hint}", file=where, key=key) from None
    if parsed.version != SKIPS_VERSION:
        raise SkipError(f"unsupported version {parsed.version} (expected {SKIPS_VERSION})", file=where, key="version")
    out: list[Skip] = []
    seen: set[tuple[str, tuple[str, ...], tuple[str, ...]]] = set()
    for i, entry in enumerate(parsed.skips):
        unknown = sorted(set(entry.frameworks) - set(FRAMEWORKS))
        if unknown:
            raise SkipError(
                f"unknown framework {unknown[0]!r} (known: {', '.join(FRAMEWORKS)})", file=where, key=f"skips.{i}"
            )
        marker = (entry.id, entry.resources, entry.frameworks)
        if marker in seen:
            raise SkipError(f"{entry.id} is skipped twice with the same scope", file=where, key=f"skips.{i}")
        seen.add(marker)
        out.append(Skip(entry.id, entry.reason, entry.resources, entry.frameworks))
    return out


def find_skip(skips: Sequence[Skip], framework: str, check_id: str, resource: str) -> Skip | None:
    """The first skip covering a result, or None."""
    return next((s for s in skips if s.matches(framework, check_id, resource)), None)
