"""What each team may use of each GPU flavor, per environment and region: the GPUs it is guaranteed and the GPUs it
may borrow on top, read from the fleet (`from_fleet`) or from the Kueue objects a revision's plans declare
(`from_plans`), with a warning for every team left without a guarantee.

Pure: no pulumi. Both readings go through the same `Queue` shape and the same `view`, so they agree wherever the
plans were rendered from the fleet by today's code (tests/model/test_gpu_quotas.py checks the reference fleet);
reading the plans also works for an older revision, whose fleet may not load and whose objects may differ.

Kueue's rules, as it admits a workload (Kueue docs, "Cluster Queue" and "Cohort"): a ClusterQueue may use its
nominalQuota of a flavor (guaranteed: a team under it takes lent GPUs back by preemption, reclaimWithinCohort), and
may borrow above it up to its borrowingLimit (no limit when absent) from what the rest of its cohort does not use:
the other ClusterQueues' nominal quota, each up to its lendingLimit when one is set, and the Cohort object's own
quota. A ClusterQueue with no cohort borrows nothing. So a team's borrowable GPUs in a flavor are the most it can
hold above its guarantee while every other team is idle: min(borrowingLimit, what the others and the cohort lend).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dlinfra.model import gpu_sharing, kueue
from dlinfra.model.fleet.schema import Fleet

SCHEMA = "dlinfra.quota/v1"  # `dlinfra quota --json`


@dataclass(frozen=True)
class Limits:
    """One flavor's GPU quota in a ClusterQueue or Cohort (nominalQuota, borrowingLimit, lendingLimit)."""

    nominal: int
    borrowing_limit: int | None = None  # None: may borrow all the cohort lends
    lending_limit: int | None = None  # None: lends all of its unused nominal quota


@dataclass(frozen=True)
class Queue:
    """A ClusterQueue's GPU quotas in one environment's region, by flavor in admission order."""

    environment: str
    region: str
    name: str  # the ClusterQueue's name: the team's name
    cohort: str | None
    flavors: Mapping[str, Limits]
    # A shared pool's flavor -> what one of its GPUs counts as, (resource, count) sorted; its Limits are in GPUs.
    shares: Mapping[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class TeamQuota:
    """A team's GPUs in one flavor of one region."""

    environment: str
    team: str
    region: str
    flavor: str  # ResourceFlavor name: pool-<pool> or site-<site>
    guaranteed: int  # nominalQuota: held for the team, taken back from borrowers when it needs them
    borrowable: int  # at most this many more while other teams leave them idle
    # A shared pool's flavor: what each of those GPUs is shared into, (resource, count per GPU) sorted: the team's
    # queue holds guaranteed x count of each (dlinfra.model.gpu_sharing). Empty: whole GPUs.
    shares: tuple[tuple[str, int], ...] = ()

    def share_text(self, gpus: int) -> str:
        """`gpus` of this flavor in its shares ("8 x mig-1g.10gb, 2 x mig-3g.40gb", NVIDIA's resources named without
        nvidia.com/); "" for whole GPUs."""
        return ", ".join(f"{gpus * n} x {resource.removeprefix('nvidia.com/')}" for resource, n in self.shares)

    def to_json(self) -> dict[str, Any]:
        shared = {"shares_per_gpu": dict(self.shares)} if self.shares else {}
        return {
            "environment": self.environment,
            "team": self.team,
            "region": self.region,
            "flavor": self.flavor,
            "guaranteed": self.guaranteed,
            "borrowable": self.borrowable,
            **shared,
        }


@dataclass(frozen=True)
class QuotaWarning:
    """A team left without guaranteed GPUs in an environment, or in a region its jobs overflow to."""

    environment: str
    team: str
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class QuotaView:
    """Every team's guaranteed and borrowable GPUs, by environment, team, region and flavor, and the warnings."""

    rows: tuple[TeamQuota, ...]  # by environment, team, region; flavors in admission order
    teams: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # environment -> its teams (queues), sorted
    overflow: tuple[tuple[str, str, str], ...] = ()  # (environment, team, region) the team's jobs may overflow to
    warnings: tuple[QuotaWarning, ...] = ()

    def by_key(self) -> dict[tuple[str, str, str, str], TeamQuota]:
        """(environment, team, region, flavor) -> its row."""
        return {(r.environment, r.team, r.region, r.flavor): r for r in self.rows}

    def only(self, environment: str | None = None, team: str | None = None) -> QuotaView:
        """The rows and warnings of one environment, one team, or both."""

        def keep(env: str, name: str) -> bool:
            return environment in (None, env) and team in (None, name)

        return QuotaView(
            rows=tuple(r for r in self.rows if keep(r.environment, r.team)),
            teams={e: tuple(t for t in ts if keep(e, t)) for e, ts in self.teams.items() if environment in (None, e)},
            overflow=tuple(o for o in self.overflow if keep(o[0], o[1])),
            warnings=tuple(w for w in self.warnings if keep(w.environment, w.team)),
        )

    def to_json(self) -> dict[str, Any]:
        """`dlinfra quota --json`: schema dlinfra.quota/v1 (docs/jobs.md, "Who gets which GPUs")."""
        return {
            "schema": SCHEMA,
            "quotas": [r.to_json() for r in self.rows],
            "overflow": [{"environment": e, "team": t, "region": r} for e, t, r in self.overflow],
            "warnings": [str(w) for w in self.warnings],
        }


def view(
    queues: Iterable[Queue],
    cohorts: Mapping[tuple[str, str, str], Mapping[str, int]],
    overflow: Iterable[tuple[str, str, str]] = (),
    scaled: Iterable[str] = (),
) -> QuotaView:
    """Guaranteed and borrowable GPUs of every queue, by Kueue's rules (module docstring). `cohorts`: (environment,
    region, cohort) -> the Cohort object's own GPUs by flavor; `overflow`: (environment, team, region) a team's jobs
    may overflow to; `scaled`: environments with `gpu_quotas: scaled`, which their warnings name as the cause."""
    queues = list(queues)
    rows = []
    for q in queues:
        peers = [p for p in queues if (p.environment, p.region, p.cohort) == (q.environment, q.region, q.cohort)]
        for flavor, limits in q.flavors.items():
            borrowable = 0
            if q.cohort is not None:
                lent = sum(_lends(p.flavors.get(flavor)) for p in peers if p.name != q.name)
                lent += cohorts.get((q.environment, q.region, q.cohort), {}).get(flavor, 0)
                limit = limits.borrowing_limit
                borrowable = lent if limit is None else min(limit, lent)
            if limits.nominal or borrowable:  # a region without GPUs has a zero placeholder flavor: no quota
                shares = q.shares.get(flavor, ())
                rows.append(TeamQuota(q.environment, q.name, q.region, flavor, limits.nominal, borrowable, shares))
    order = {(q.environment, q.region, q.name): list(q.flavors) for q in queues}
    rows.sort(key=lambda r: (r.environment, r.team, r.region, order[(r.environment, r.region, r.team)].index(r.flavor)))
    names: dict[str, set[str]] = {}
    for q in queues:
        names.setdefault(q.environment, set()).add(q.name)
    teams = {env: tuple(sorted(found)) for env, found in sorted(names.items())}
    spread = tuple(sorted(set(overflow)))
    notes = {}
    for env in scaled:
        gpus = sum(q.flavors[f].nominal for q in queues if q.environment == env for f in q.flavors)
        gpus += sum(n for (e, _, _), own in cohorts.items() if e == env for n in own.values())
        notes[env] = f"gpu_quotas: scaled shrinks every team's gpu_quota to fit the environment's {gpus} GPUs"
    return QuotaView(tuple(rows), teams, spread, _warnings(rows, teams, spread, notes))


def _lends(limits: Limits | None) -> int:
    """What a queue lends the rest of its cohort of a flavor when it uses none of it."""
    if limits is None:
        return 0
    return limits.nominal if limits.lending_limit is None else min(limits.nominal, limits.lending_limit)


def _warnings(
    rows: Iterable[TeamQuota],
    teams: Mapping[str, tuple[str, ...]],
    overflow: Iterable[tuple[str, str, str]],
    notes: Mapping[str, str],
) -> tuple[QuotaWarning, ...]:
    """A team guaranteed nothing in an environment runs only on borrowed GPUs, which their owners take back; one
    guaranteed nothing in a region it overflows to runs its overflowing jobs there only on borrowed GPUs, and none at
    all when that holds in every such region (its overflow queue's quota is the sum of its guarantees there)."""
    rows = list(rows)
    out = []
    for env, names in teams.items():
        note = f" ({notes[env]})" if env in notes else ""
        for team in names:
            mine = [r for r in rows if (r.environment, r.team) == (env, team)]
            if sum(r.guaranteed for r in mine):
                continue
            borrow = sum(r.borrowable for r in mine)
            what = "it has no GPUs to borrow either"
            if borrow:
                what = f"its jobs run only on GPUs it borrows (up to {borrow}), which their owners take back at need"
            out.append(QuotaWarning(env, team, f"team {team} is guaranteed no GPUs in environment {env}: {what}{note}"))
    targets: dict[tuple[str, str], list[str]] = {}
    for env, team, region in overflow:
        targets.setdefault((env, team), []).append(region)
    for (env, team), regions in targets.items():
        total = sum(r.guaranteed for r in rows if (r.environment, r.team) == (env, team))
        bare = [
            region
            for region in regions
            if not sum(r.guaranteed for r in rows if (r.environment, r.team, r.region) == (env, team, region))
        ]
        if not total or not bare:
            continue  # nothing anywhere is the warning above
        if len(bare) == len(regions):
            what = "its overflow queue's quota, the sum of its guarantees there, is 0: it admits no job"
        else:
            what = "its jobs that overflow run there only on borrowed GPUs"
        where = ", ".join(bare)
        out.append(
            QuotaWarning(
                env,
                team,
                f"team {team} overflows to {where} in environment {env} but is guaranteed no GPUs there: {what}",
            )
        )
    return tuple(out)


def from_fleet(fleet: Fleet) -> QuotaView:
    """Every environment's quotas as `kueue.plan` sets them and components/charts/kueue.py renders them: each team's
    ClusterQueue in the cohort with its nominal GPUs and a borrowing limit (kueue.RegionQuotas.borrowing_limit), and
    the cohort's own quota, the GPUs no team is guaranteed (kueue.RegionQuotas.spare). QuotaError as kueue.plan."""
    queues, cohorts, overflow = [], {}, []
    for env, spec in fleet.environments.items():
        quotas = kueue.plan(fleet, env, spec.gpu_quotas)
        for region, here in quotas.regions.items():
            cohort = kueue.COHORT if here.flavors else None
            for team in fleet.teams:
                limits = {
                    f.name: Limits(here.nominal[team][f.name], here.borrowing_limit(team, f.name)) for f in here.flavors
                }
                shares = {f.name: f.shares for f in here.flavors if f.shares}
                queues.append(Queue(env, region, team, cohort, limits, shares))
            if here.flavors:
                cohorts[(env, region, kueue.COHORT)] = {f.name: here.spare(f.name) for f in here.flavors}
        plan = kueue.overflow(fleet, quotas)
        overflow += [(env, team, region) for team, spec_ in plan.teams.items() for region in spec_.regions]
    scaled = [env for env, spec in fleet.environments.items() if spec.gpu_quotas == "scaled"]
    return view(queues, cohorts, overflow, scaled)


def from_plans(plans: Iterable[Mapping[str, Any]], scaled: Iterable[str] = ()) -> QuotaView:
    """The quotas the in-cluster stacks' plan exports declare (docs/plan-export.md), read leniently so that an older
    revision's plans read too: its ClusterQueues (a team's own: MultiKueue's accounting flavor is left out, its GPUs
    are the workers' own queues'), its Cohort objects, and the `overflow` LocalQueues that feed a team's own queue
    on a worker. `scaled`: environments with `gpu_quotas: scaled` (their fleet says so, not their plans)."""
    queues, cohorts, overflow = [], {}, []
    for plan in plans:
        role = plan.get("role") or {}
        env, region = str(role.get("environment") or ""), str(role.get("region") or "")
        if role.get("kind") != "k8s":
            continue
        objects = [
            (str(r.get("type", "")).rsplit(":", 1)[-1], r.get("inputs") or {})
            for r in plan.get("resources") or []
            if "kueue.x-k8s.io" in str(r.get("type", ""))
        ]
        team_queues = set()
        shares = _flavor_shares(objects)
        for kind, inputs in objects:
            name = str((inputs.get("metadata") or {}).get("name") or "")
            spec = inputs.get("spec") or {}
            if kind == "ClusterQueue":
                limits = _gpu_limits(spec, shares)
                limits.pop(kueue.OVERFLOW_FLAVOR, None)
                if limits:
                    cohort = spec.get("cohortName") or spec.get("cohort")  # v1beta1 named it cohort
                    mine = {f: shares[f] for f in limits if f in shares}
                    queues.append(Queue(env, region, name, str(cohort) if cohort else None, limits, mine))
                    team_queues.add(name)
            elif kind == "Cohort":
                cohorts[(env, region, name)] = {f: lim.nominal for f, lim in _gpu_limits(spec, shares).items()}
        for kind, inputs in objects:
            name = str((inputs.get("metadata") or {}).get("name") or "")
            target = str((inputs.get("spec") or {}).get("clusterQueue") or "")
            if kind == "LocalQueue" and name == kueue.OVERFLOW_QUEUE and target in team_queues:
                overflow.append((env, target, region))
    return view(queues, cohorts, overflow, scaled)


def _flavor_shares(objects: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, tuple[tuple[str, int], ...]]:
    """Shared flavors' shares per GPU, from their ResourceFlavors' annotation (gpu_sharing.SHARES_ANNOTATION)."""
    out = {}
    for kind, inputs in objects:
        metadata = inputs.get("metadata") or {}
        value = (metadata.get("annotations") or {}).get(gpu_sharing.SHARES_ANNOTATION)
        if kind == "ResourceFlavor" and value:
            try:
                out[str(metadata.get("name"))] = tuple(sorted(gpu_sharing.parse_shares_tag(str(value)).items()))
            except ValueError:
                continue  # not ours to judge here: such a flavor reads as having no GPU quota
    return out


def _gpu_limits(
    spec: Mapping[str, Any], shares: Mapping[str, tuple[tuple[str, int], ...]] | None = None
) -> dict[str, Limits]:
    """Flavor -> GPU limits of a ClusterQueue's or Cohort's resource groups, in the order they list the flavors. A
    shared flavor's (`shares`) GPUs are its first shared resource's quantities over that resource's count per GPU."""
    out = {}
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            name = str(flavor.get("name"))
            per_gpu = dict((shares or {}).get(name, ())) or {kueue.GPU_RESOURCE: 1}
            counted, per = min(per_gpu.items())
            for resource in flavor.get("resources") or []:
                if resource.get("name") == counted:
                    borrowing, lending = _count(resource.get("borrowingLimit")), _count(resource.get("lendingLimit"))
                    out[name] = Limits(
                        (_count(resource.get("nominalQuota")) or 0) // per,
                        None if borrowing is None else borrowing // per,
                        None if lending is None else lending // per,
                    )
    return out


def _count(quantity: Any) -> int | None:
    """A GPU count as a Kubernetes quantity ("8", 8, 8.0); None when absent."""
    if quantity is None:
        return None
    return int(float(str(quantity)))
