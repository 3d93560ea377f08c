"""Who gets which GPUs: each team's guaranteed and borrowable GPUs per region and flavor, read from the fleet and
from the rendered Kueue objects alike, and the warning for a team left without a guarantee."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from dlinfra.model import gpu_quotas, kueue
from dlinfra.model.fleet.load import validate_data
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.gpu_quotas import Limits, Queue
from tests import reference
from tests.conftest import REFERENCE_FLEET


def _fleet(change: Any = None) -> Fleet:
    data = yaml.safe_load(REFERENCE_FLEET.read_text())
    if change is not None:
        change(data)
    return validate_data(data, REFERENCE_FLEET)


def test_reference_quotas_per_team_region_and_flavor() -> None:
    view = gpu_quotas.from_fleet(reference.fleet())
    rows = view.by_key()
    # vision's 192 GPUs in prod, split over the 656 GPUs of prod's flavors by their size: us-west-2's H100 pool
    # (16 x 8 = 128 GPUs) holds 37 of them; the other 91 of the pool the cohort lends it while idle.
    vision = rows[("prod", "vision", "us-west-2", "pool-train-h100")]
    assert (vision.guaranteed, vision.borrowable) == (37, 91)
    assert rows[("prod", "robotics", "eu-west-1", "site-ams1")].guaranteed == 6
    fleet = reference.fleet()
    for env, spec in fleet.environments.items():
        capacity = {(f.region, f.name): f.gpus for f in kueue.flavors(fleet, env)}
        for row in view.rows:
            if row.environment == env:
                # guaranteed + borrowable is the flavor's size: an idle cohort lends a team the whole flavor.
                assert row.guaranteed + row.borrowable == capacity[(row.region, row.flavor)], row
        if spec.gpu_quotas == "guaranteed":
            for team, team_spec in fleet.teams.items():
                assert sum(r.guaranteed for r in view.rows if (r.environment, r.team) == (env, team)) == (
                    team_spec.gpu_quota
                )
    # Flavors in admission order within a region: the site first (owned), then the reserved block, then on demand.
    assert [r.flavor for r in view.rows if (r.environment, r.team, r.region) == ("prod", "vision", "us-west-2")] == [
        "site-sjc1",
        "pool-train-h100",
        "pool-interactive",
    ]
    assert ("prod", "language", "eu-west-1") in view.overflow and ("prod", "vision", "us-east-1") in view.overflow


def test_staging_scaled_leaves_robotics_without_a_guarantee() -> None:
    view = gpu_quotas.from_fleet(reference.fleet())
    # staging has 2 GPUs (interactive: 2 x g6.xlarge): 512 wanted, scaled to 2, and robotics' share rounds to 0.
    staging = {r.team: (r.guaranteed, r.borrowable) for r in view.rows if r.environment == "staging"}
    assert staging == {"language": (1, 1), "robotics": (0, 2), "vision": (1, 1)}
    (warning,) = view.warnings
    assert (warning.environment, warning.team) == ("staging", "robotics")
    assert "guaranteed no GPUs in environment staging" in str(warning)
    assert "borrows (up to 2)" in str(warning) and "gpu_quotas: scaled" in str(warning) and "2 GPUs" in str(warning)


def test_a_new_team_is_split_over_every_region_and_warned_where_it_gets_nothing() -> None:
    fleet = _fleet(lambda d: d["teams"].__setitem__("audio", {"gpu_quota": 8}))
    view = gpu_quotas.from_fleet(fleet)
    audio = [r for r in view.rows if (r.environment, r.team) == ("prod", "audio")]
    assert sum(r.guaranteed for r in audio) == 8
    assert {r.region for r in audio if r.guaranteed} == {"us-west-2", "us-east-1", "eu-west-1"}
    assert [(w.environment, w.team) for w in view.warnings] == [("staging", "audio"), ("staging", "robotics")]
    assert [w.team for w in view.only(team="audio").warnings] == ["audio"]
    assert view.only(environment="prod").warnings == ()


def test_the_plans_give_the_quotas_the_fleet_gives() -> None:
    """The diff reads the rendered objects; `dlinfra quota` reads the fleet: on today's code they agree."""
    plans = [r.plan("dlinfra") for r in reference.runs().values()]
    from_plans = gpu_quotas.from_plans(plans, scaled=["staging"])
    from_fleet = gpu_quotas.from_fleet(reference.fleet())
    assert from_plans == from_fleet
    assert from_plans.rows  # not two empty views


def _queue(name: str, cohort: str | None = "research", **flavors: Limits) -> Queue:
    return Queue("prod", "us-west-2", name, cohort, flavors)


@pytest.mark.parametrize(
    ("queues", "cohort_own", "expected"),
    [
        # No borrowing limit: everything the others and the cohort lend.
        ([_queue("a", f=Limits(2)), _queue("b", f=Limits(6))], {"f": 4}, {"a": (2, 10), "b": (6, 6)}),
        # A borrowing limit below what is lent caps it.
        ([_queue("a", f=Limits(2, 3)), _queue("b", f=Limits(6))], {}, {"a": (2, 3), "b": (6, 2)}),
        # A lending limit caps what a queue lends.
        ([_queue("a", f=Limits(2)), _queue("b", f=Limits(6, None, 1))], {}, {"a": (2, 1), "b": (6, 2)}),
        # No cohort: nothing to borrow, and nothing lent to others.
        ([_queue("a", None, f=Limits(2)), _queue("b", f=Limits(6))], {"f": 1}, {"a": (2, 0), "b": (6, 1)}),
        # Only the same flavor lends: b's g is not a's f.
        ([_queue("a", f=Limits(2)), _queue("b", g=Limits(6))], {}, {"a": (2, 0), "b": (6, 0)}),
    ],
)
def test_borrowing_follows_kueue(
    queues: list[Queue], cohort_own: dict[str, int], expected: dict[str, tuple[int, int]]
) -> None:
    view = gpu_quotas.view(queues, {("prod", "us-west-2", "research"): cohort_own})
    got = {r.team: (r.guaranteed, r.borrowable) for r in view.rows}
    # A queue with nothing guaranteed and nothing to borrow in a flavor has no row there.
    assert got == {t: v for t, v in expected.items() if v != (0, 0)}


def test_overflow_to_a_region_without_a_guarantee_is_warned() -> None:
    def queue(region: str, gpus: int) -> Queue:
        return Queue("prod", region, "audio", "research", {"pool-x": Limits(gpus, 8 - gpus)})

    queues = [queue("us-west-2", 4), queue("us-east-1", 0), queue("eu-west-1", 2)]
    cohorts = {
        ("prod", r, "research"): {"pool-x": 8 - q.flavors["pool-x"].nominal}
        for r, q in zip(("us-west-2", "us-east-1", "eu-west-1"), queues, strict=True)
    }
    some = gpu_quotas.view(queues, cohorts, [("prod", "audio", "us-east-1"), ("prod", "audio", "eu-west-1")])
    (warning,) = some.warnings
    assert "overflows to us-east-1 in environment prod but is guaranteed no GPUs there" in str(warning)
    assert "only on borrowed GPUs" in str(warning)
    none = gpu_quotas.view(queues, cohorts, [("prod", "audio", "us-east-1")])
    assert "admits no job" in str(none.warnings[0])
    fine = gpu_quotas.view(queues, cohorts, [("prod", "audio", "eu-west-1")])
    assert fine.warnings == ()


def _cluster_queue(name: str, spec: dict[str, Any], api: str = "v1beta2") -> dict[str, Any]:
    return {
        "type": f"kubernetes:kueue.x-k8s.io/{api}:ClusterQueue",
        "name": f"platform-queue-{name}",
        "inputs": {"metadata": {"name": name}, "spec": spec},
    }


def _gpus(flavor: str, nominal: Any, **limits: Any) -> dict[str, Any]:
    resource = {"name": kueue.GPU_RESOURCE, "nominalQuota": nominal, **limits}
    return {"coveredResources": [kueue.GPU_RESOURCE], "flavors": [{"name": flavor, "resources": [resource]}]}


def test_plans_of_an_older_revision_read_leniently() -> None:
    """v1beta1's `cohort`, quantities as numbers, no Cohort object; the MultiKueue accounting queue and flavor and a
    region's zero placeholder are not quotas; a regional stack's plan is not read."""
    resources = [
        _cluster_queue(
            "vision", {"cohort": "research", "resourceGroups": [_gpus("pool-a", 8, borrowingLimit="4")]}, "v1beta1"
        ),
        _cluster_queue("language", {"cohort": "research", "resourceGroups": [_gpus("pool-a", 8.0)]}, "v1beta1"),
        _cluster_queue("vision-overflow", {"resourceGroups": [_gpus(kueue.OVERFLOW_FLAVOR, "5")]}),
    ]
    k8s = {"role": {"kind": "k8s", "environment": "prod", "region": "us-west-2"}, "resources": resources}
    empty = {
        "role": {"kind": "k8s", "environment": "prod", "region": "us-east-1"},
        "resources": [
            _cluster_queue("vision", {"resourceGroups": [_gpus("no-gpus", "0")]}),
        ],
    }
    regional = {
        "role": {"kind": "regional", "environment": "prod", "region": "us-west-2"},
        "resources": copy.deepcopy(resources),
    }
    view = gpu_quotas.from_plans([k8s, empty, regional])
    assert {(r.team, r.region, r.flavor): (r.guaranteed, r.borrowable) for r in view.rows} == {
        ("language", "us-west-2", "pool-a"): (8, 8),
        ("vision", "us-west-2", "pool-a"): (8, 4),
    }
    assert view.teams == {"prod": ("language", "vision")}
    assert view.warnings == ()
