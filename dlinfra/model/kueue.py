"""Kueue GPU quota planning: each team's fleet-wide GPU quota split over regions and flavors by capacity.

Pure planning code: no pulumi import. A flavor is one GPU node pool in one region (capacity: max_size x GPUs
per node) or one physical site on its home region (nodes x GPUs per node). Every region's cluster gets one
ClusterQueue per team in one cohort; the team's nominal quota in each flavor comes from `plan`.

Quotas adding up to more than the environment's GPU capacity are an error under the `guaranteed` policy: a
Kueue nominal quota is a guarantee (a team under its quota reclaims lent GPUs by preemption), so nominal
quotas beyond what exists promise GPUs nobody can deliver, and a team within its quota could wait forever.
Under-subscription is fine: the capacity no team is guaranteed goes to the cohort itself, where every team
can borrow it. The `scaled` policy (for environments that are not meant to honour research guarantees,
such as staging) shrinks the quotas proportionally to fit instead.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from dlinfra.errors import FleetError
from dlinfra.model import gpu_sharing, instances
from dlinfra.model.fleet.schema import Fleet

COHORT = "research"  # the one cohort every team's ClusterQueue joins
GPU_RESOURCE = "nvidia.com/gpu"

QuotaPolicy = Literal["guaranteed", "scaled"]
PoolCapacityClass = Literal["reserved", "on-demand", "spot"]  # what a node pool buys
CapacityClass = Literal["owned", "reserved", "on-demand", "spot"]  # owned: a physical site
# Flavor admission order: hardware we own first (sunk cost), then paid-for reservations, then on demand.
_CLASS_ORDER: Mapping[str, int] = {"owned": 0, "reserved": 1, "on-demand": 2, "spot": 3}


class QuotaError(FleetError):
    """Team GPU quotas that cannot be honoured by the environment's capacity."""


@dataclass(frozen=True)
class Flavor:
    """A Kueue ResourceFlavor: one GPU pool or one site in one region, with its GPU capacity."""

    region: str
    name: str  # ResourceFlavor name: pool-<pool> or site-<site> (cluster scoped, unique in a region)
    source: Literal["pool", "site"]
    source_name: str  # the pool or site name from the fleet file
    gpus: int  # GPU capacity: max_size x GPUs per node (pool) or nodes x GPUs per node (site)
    gpu_model: str  # short GPU name (H100, A100, L4): the dlinfra.io/gpu-model label its nodeLabels select
    capacity_class: CapacityClass
    # A shared pool's shares per GPU, (resource, count) sorted (dlinfra.model.gpu_sharing.per_gpu): its queues count
    # those instead of nvidia.com/gpu. Quotas are still planned in GPUs, so a team's guarantee means the same GPUs
    # whether they come whole or shared. Empty: whole GPUs.
    shares: tuple[tuple[str, int], ...] = ()

    @property
    def resources(self) -> dict[str, int]:
        """What one of the flavor's GPUs counts as in a ClusterQueue: resource -> count."""
        return dict(self.shares) if self.shares else {GPU_RESOURCE: 1}

    @property
    def autoscaled(self) -> bool:
        """Do the flavor's nodes come from the cluster-autoscaler (a cloud pool), so that a job's nodes must be
        provisioned before it runs? A site's machines are there or not: no autoscaler adds them."""
        return self.source == "pool"


def pool_flavor(pool: str) -> str:
    """ResourceFlavor name of a node pool."""
    return f"pool-{pool}"


def site_flavor(site: str) -> str:
    """ResourceFlavor name of a physical site."""
    return f"site-{site}"


@dataclass(frozen=True)
class RegionQuotas:
    """One region's share: its flavors in admission order and every team's nominal GPUs per flavor."""

    region: str
    flavors: tuple[Flavor, ...]
    nominal: Mapping[str, Mapping[str, int]]  # team -> flavor name -> GPUs (every team, every flavor)

    def spare(self, flavor: str) -> int:
        """GPUs of a flavor that no team is guaranteed: the cohort's own quota, open to borrowing."""
        capacity = next(f.gpus for f in self.flavors if f.name == flavor)
        return capacity - sum(team[flavor] for team in self.nominal.values())

    def borrowing_limit(self, team: str, flavor: str) -> int:
        """GPUs of a flavor a team may borrow above its nominal quota: the rest of the flavor, so that an idle
        cohort lends a team the whole flavor (its ClusterQueue's borrowingLimit)."""
        capacity = next(f.gpus for f in self.flavors if f.name == flavor)
        return capacity - self.nominal[team][flavor]

    def team_total(self, team: str) -> int:
        """A team's nominal GPUs in this region, over every flavor."""
        return sum(self.nominal[team].values())


@dataclass(frozen=True)
class QuotaPlan:
    """Nominal GPU quotas of every team in every region of one environment."""

    environment: str
    policy: QuotaPolicy
    regions: Mapping[str, RegionQuotas]

    def region(self, region: str) -> RegionQuotas:
        """The quotas of one region (a region without GPU capacity has no flavors)."""
        return self.regions[region]

    def team_total(self, team: str) -> int:
        """A team's nominal GPUs summed over every region of the environment."""
        return sum(r.team_total(team) for r in self.regions.values())


def shared_resources(quotas: RegionQuotas) -> tuple[str, ...]:
    """The shared resources this region's flavors count (nvidia.com/mig-<profile>, nvidia.com/gpu.shared), sorted."""
    return tuple(sorted({r for f in quotas.flavors for r, _ in f.shares}))


def apportion(quotas: Mapping[str, int], capacities: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """Split each quota over named columns in proportion to their capacity, in integers: every row sums to its
    quota exactly, no column gets more than its capacity, and equal inputs give the same split in any order."""
    # Floors first, then the largest fractional parts; where that greedy choice would overfill a column,
    # augmenting paths move units around. A feasible rounding always exists when the quotas fit the capacity
    # (the exact fractional split is one), so the search cannot fail. Rows and columns are visited in name
    # order, so ties go by name: reordering the fleet file must not move a team's guarantee between flavors.
    if any(q < 0 for q in quotas.values()) or any(c < 0 for c in capacities.values()):
        raise ValueError("quotas and capacities must not be negative")
    total = sum(capacities.values())
    if sum(quotas.values()) > total:
        raise ValueError(f"quotas add up to {sum(quotas.values())}, more than the capacity {total}")
    teams = sorted(quotas)
    names = sorted(capacities)
    columns = [capacities[n] for n in names]
    if total == 0:
        return {t: dict.fromkeys(capacities, 0) for t in quotas}
    exact = {t: [Fraction(quotas[t] * c, total) for c in columns] for t in teams}
    out = {t: [math.floor(x) for x in exact[t]] for t in teams}
    need = {t: quotas[t] - sum(out[t]) for t in teams}
    slack = [c - sum(out[t][f] for t in teams) for f, c in enumerate(columns)]
    # A cell may take one extra unit only where its exact share had a fractional part.
    eligible = {(t, f) for t in teams for f, x in enumerate(exact[t]) if x != math.floor(x)}
    extra: set[tuple[str, int]] = set()
    for t, f in sorted(eligible, key=lambda cell: (-(exact[cell[0]][cell[1]] % 1), cell[0], cell[1])):
        if need[t] and slack[f]:
            extra.add((t, f))
            need[t] -= 1
            slack[f] -= 1
    for t in teams:
        while need[t]:
            _augment(t, teams, len(columns), eligible, extra, slack)
            need[t] -= 1
    for t, f in extra:
        out[t][f] += 1
    by_name = {t: dict(zip(names, out[t], strict=True)) for t in teams}
    return {t: {n: by_name[t][n] for n in capacities} for t in quotas}


def _augment(
    start: str, teams: list[str], columns: int, eligible: set[tuple[str, int]], extra: set[tuple[str, int]],
    slack: list[int],
) -> None:  # fmt: skip
    """Give row `start` one more unit along a path of swaps that ends in a column with slack (breadth first)."""
    took_from: dict[int, str] = {}  # column -> the row that would take a unit in it
    gave_up: dict[str, int | None] = {start: None}  # row -> the column it would give its unit up in
    queue = deque([start])
    while queue:
        row = queue.popleft()
        for f in range(columns):
            if (row, f) not in eligible or (row, f) in extra or f in took_from:
                continue
            took_from[f] = row
            if slack[f]:
                slack[f] -= 1
                column: int | None = f
                while column is not None:
                    taker = took_from[column]
                    extra.add((taker, column))
                    column = gave_up[taker]
                    if column is not None:
                        extra.discard((taker, column))
                return
            for t in teams:
                if (t, f) in extra and t not in gave_up:
                    gave_up[t] = f
                    queue.append(t)
    raise AssertionError("no feasible rounding: quotas exceed capacity")  # excluded by the check in apportion


def flavors(fleet: Fleet, env: str) -> list[Flavor]:
    """GPU flavors of an environment, region by region in fleet order, each region in admission order."""
    out: list[Flavor] = []
    for region in fleet.environments[env].regions:
        here: list[Flavor] = []
        for name, pool in fleet.pools_in(env, region).items():
            spec = instances.lookup(fleet.pool_types(env, region, name)[0])
            if pool.kind != "gpu" or not spec.gpus or not pool.max_size or spec.gpu_model is None:
                continue
            here.append(
                Flavor(
                    region=region,
                    name=pool_flavor(name),
                    source="pool",
                    source_name=name,
                    gpus=pool.max_size * spec.gpus,
                    gpu_model=spec.gpu_model,
                    capacity_class=capacity_class(fleet, env, region, name),
                    shares=tuple(sorted(gpu_sharing.per_gpu(pool.gpu_sharing).items())) if pool.gpu_sharing else (),
                )
            )
        for name, site in fleet.sites_of(env, region).items():
            if site.gpu_nodes * site.gpus_per_node:
                here.append(
                    Flavor(
                        region=region,
                        name=site_flavor(name),
                        source="site",
                        source_name=name,
                        gpus=site.gpu_nodes * site.gpus_per_node,
                        gpu_model=site.gpu_model,
                        capacity_class="owned",
                    )
                )
        out += sorted(here, key=lambda f: (_CLASS_ORDER[f.capacity_class], f.name))
    return out


def capacity_class(fleet: Fleet, env: str, region: str, pool_name: str) -> PoolCapacityClass:
    """reserved (capacity reservation or block in this region), spot (mixed instances) or on-demand."""
    pool = fleet.environments[env].node_pools[pool_name]
    if region in pool.capacity_reservations:
        return "reserved"
    return "spot" if pool.spot is not None else "on-demand"


def plan(fleet: Fleet, env: str, policy: QuotaPolicy = "guaranteed", *, source: str | None = None) -> QuotaPlan:
    """Every team's nominal GPUs per region and flavor; QuotaError (naming `source`) when they cannot fit."""
    found = flavors(fleet, env)
    capacity = sum(f.gpus for f in found)
    wanted = {team: spec.gpu_quota for team, spec in fleet.teams.items()}
    if policy == "guaranteed":
        _check_fits(fleet, env, found, wanted, source)
        quotas = wanted
    else:
        # Shrink every team by the same ratio; each keeps at most its own quota.
        quotas = apportion({"all": min(sum(wanted.values()), capacity)}, wanted)["all"]
    grid = apportion(quotas, {_column(f): f.gpus for f in found})
    regions: dict[str, RegionQuotas] = {}
    for region in fleet.environments[env].regions:
        columns = [i for i, f in enumerate(found) if f.region == region]
        regions[region] = RegionQuotas(
            region=region,
            flavors=tuple(found[i] for i in columns),
            nominal={team: {found[i].name: grid[team][_column(found[i])] for i in columns} for team in fleet.teams},
        )
    return QuotaPlan(environment=env, policy=policy, regions=regions)


def _column(flavor: Flavor) -> str:
    """A flavor's name across the environment (flavor names are unique only within a region)."""
    return f"{flavor.region}/{flavor.name}"


def _check_fits(fleet: Fleet, env: str, found: Sequence[Flavor], wanted: Mapping[str, int], source: str | None) -> None:
    capacity = sum(f.gpus for f in found)
    for team, quota in wanted.items():
        if quota and not capacity:
            raise QuotaError(
                f"{quota} GPUs guaranteed, but environment {env!r} has no GPU capacity in any region "
                "(no GPU pool with max_size > 0, no site with GPU nodes); add capacity or set gpu_quota: 0",
                file=source,
                key=f"teams.{team}.gpu_quota",
            )
    total = sum(wanted.values())
    if total > capacity:
        by_region: dict[str, int] = {}
        for f in found:
            by_region[f.region] = by_region.get(f.region, 0) + f.gpus
        where = ", ".join(f"{r}: {n}" for r, n in by_region.items())
        asked = ", ".join(f"{t}: {q}" for t, q in wanted.items())
        raise QuotaError(
            f"team GPU quotas add up to {total} ({asked}) but environment {env!r} has {capacity} GPUs ({where}). "
            "Kueue nominal quotas are guarantees, so they must fit: lower gpu_quota or add GPU capacity",
            file=source,
            key="teams",
        )


def check_fleet(fleet: Fleet, *, source: str | None = None) -> dict[str, QuotaPlan]:
    """Plan every environment's quotas, so a quota that cannot fit fails before any resource is declared."""
    plans = {env: plan(fleet, env, spec.gpu_quotas, source=source) for env, spec in fleet.environments.items()}
    for quotas in plans.values():
        overflow(fleet, quotas, source=source)
    return plans


OVERFLOW_QUEUE = "overflow"  # the LocalQueue a team submits to when its job may run in another region
OVERFLOW_FLAVOR = "multikueue"  # the manager's flavor for GPUs its workers hold (accounting only: no nodes)


@dataclass(frozen=True)
class OverflowTeam:
    """A team whose jobs may overflow from the manager region: where to, and how many GPUs that is."""

    regions: tuple[str, ...]  # worker regions, sorted (MultiKueue offers a job to all of them at once)
    gpus: int  # the team's nominal GPUs in those regions: the manager's quota for its overflowing jobs


@dataclass(frozen=True)
class OverflowPlan:
    """MultiKueue in one environment: the manager region, the teams that overflow, the workers' teams."""

    environment: str
    manager: str
    teams: Mapping[str, OverflowTeam]

    @property
    def workers(self) -> tuple[str, ...]:
        """Regions whose clusters take overflowing jobs, sorted."""
        return tuple(sorted({r for t in self.teams.values() for r in t.regions}))

    def teams_of(self, region: str) -> tuple[str, ...]:
        """Teams whose overflowing jobs may run in a worker region, sorted."""
        return tuple(sorted(t for t, spec in self.teams.items() if region in spec.regions))


def overflow(fleet: Fleet, quotas: QuotaPlan, *, source: str | None = None) -> OverflowPlan:
    """Who overflows where in an environment; QuotaError when a team overflows to a region of the environment
    with no GPU capacity there (it has no queues to take the jobs)."""
    env = quotas.environment
    teams: dict[str, OverflowTeam] = {}
    for team in sorted(fleet.teams):
        regions = fleet.overflow_regions(env, team)
        for region in regions:
            if not quotas.region(region).flavors:
                raise QuotaError(
                    f"jobs overflow to {region}, which has no GPU capacity in environment {env!r} (no GPU pool with "
                    "max_size > 0, no site with GPU nodes); drop the region or add capacity there",
                    file=source,
                    key=f"teams.{team}.overflow",
                )
        if regions:
            teams[team] = OverflowTeam(regions, sum(quotas.region(r).team_total(team) for r in regions))
    return OverflowPlan(env, fleet.multikueue_manager(env), teams)
