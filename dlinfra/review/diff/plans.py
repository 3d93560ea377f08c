"""What the diff compares: one revision's plan set, and the topology of its fleet as the diagram shows it."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Site:
    """A physical site as the diagram shows it."""

    name: str
    region: str
    environment: str
    routing: str


@dataclass(frozen=True)
class Topology:
    """Regions, regional stacks, sites and links of a fleet."""

    regions: tuple[str, ...] = ()
    primary: str | None = None
    stacks: tuple[tuple[str, str], ...] = ()  # (environment, region)
    sites: tuple[Site, ...] = ()
    peerings: tuple[tuple[str, str, str], ...] = ()  # (environment, region, region)
    pools: tuple[tuple[str, str], ...] = ()  # (environment, pool)
    teams: tuple[str, ...] = ()
    scaled_quotas: tuple[str, ...] = ()  # environments with `gpu_quotas: scaled`: their team quotas shrink to fit
    dev_boxes: tuple[tuple[str, str], ...] = ()  # (environment, person)


@dataclass(frozen=True)
class PlanSet:
    """One revision's offline plans, address plan and topology."""

    label: str  # e.g. "origin/main (1a2b3c4)"
    plans: Mapping[str, Mapping[str, Any]]  # stack -> plan export (docs/plan-export.md)
    lock: Mapping[str, str] = field(default_factory=dict)  # allocation key -> CIDR
    topology: Topology = field(default_factory=Topology)
    configs: Mapping[str, str] = field(default_factory=dict)  # stack -> text of stacks/Pulumi.<stack>.yaml
    reach: Mapping[str, Any] | None = None  # `dlinfra reach --json` of these plans; None: not analysed
    reach_error: str = ""  # why the reachability analysis could not run on this revision
    cost: Mapping[str, Any] | None = None  # `dlinfra cost --json` of these plans; None: not estimated


def topology(fleet: Mapping[str, Any]) -> Topology:
    """The diagram's view of a fleet file, read leniently: an older revision may predate today's schema."""
    regions = fleet.get("regions") or {}
    environments = fleet.get("environments") or {}
    stacks = [(env, region) for env, spec in environments.items() for region in ((spec or {}).get("regions") or {})]
    peerings = []
    for env, spec in environments.items():
        env_regions = sorted((spec or {}).get("regions") or {})
        peerings += [(env, a, b) for a, b in itertools.combinations(env_regions, 2)]
    sites = [
        Site(
            name=str(name),
            region=str((spec or {}).get("region", "")),
            environment=str((spec or {}).get("environment", "prod")),
            routing=str((spec or {}).get("routing", "static")),
        )
        for name, spec in (fleet.get("sites") or {}).items()
    ]
    primary = next((r for r, spec in regions.items() if (spec or {}).get("primary")), None)
    pools = [(env, str(p)) for env, spec in environments.items() for p in ((spec or {}).get("node_pools") or {})]
    boxes = [
        (env, str(person))
        for env, spec in environments.items()
        for person in (((spec or {}).get("dev_boxes") or {}).get("people") or {})
    ]
    return Topology(
        regions=tuple(sorted(regions)),
        primary=primary,
        stacks=tuple(sorted(stacks)),
        sites=tuple(sorted(sites, key=lambda s: s.name)),
        peerings=tuple(sorted(peerings)),
        pools=tuple(sorted(pools)),
        teams=tuple(sorted(str(t) for t in (fleet.get("teams") or {}))),
        scaled_quotas=tuple(
            sorted(str(env) for env, spec in environments.items() if (spec or {}).get("gpu_quotas") == "scaled")
        ),
        dev_boxes=tuple(sorted(boxes)),
    )
