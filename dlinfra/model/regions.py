"""AWS regions as data (dlinfra/data/regions.yaml): AZ names in order, their zone ids, reserved customer ASNs.
Pure (no pulumi)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from ruamel.yaml import YAML


@dataclass(frozen=True)
class RegionInfo:
    """What AWS offers in one region: AZ names (in order) with zone ids, and reserved customer ASNs."""

    name: str
    azs: tuple[str, ...]
    zone_ids: Mapping[str, str]
    reserved_asns: frozenset[int]


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
