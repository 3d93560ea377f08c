"""Kueue quota planning: integer splits that keep totals and capacities, and quotas the fleet cannot honour."""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlinfra.errors import DlinfraError
from dlinfra.model import kueue
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet
from tests.conftest import REFERENCE_FLEET


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return load_fleet(REFERENCE_FLEET).fleet


def _columns(capacities: list[int]) -> dict[str, int]:
    """Name columns c0, c1, ... in the given order (their names, not their positions, break ties)."""
    return {f"c{i}": c for i, c in enumerate(capacities)}


def _check_apportion(quotas: dict[str, int], capacities: dict[str, int]) -> dict[str, dict[str, int]]:
    out = kueue.apportion(quotas, capacities)
    total = sum(capacities.values())
    assert list(out) == list(quotas)
    for team, row in out.items():
        assert list(row) == list(capacities)
        assert sum(row.values()) == quotas[team]  # totals preserved
        for f, value in row.items():
            exact = Fraction(quotas[team] * capacities[f], total) if total else Fraction(0)
            assert abs(value - exact) < 1  # each cell is its exact share rounded down or up
    for f, capacity in capacities.items():
        assert sum(out[t][f] for t in out) <= capacity  # never more nominal quota than the flavor has
    return out


@pytest.mark.parametrize(
    ("quotas", "capacities", "expected"),
    [
        ({"a": 10}, [3, 7], {"a": [3, 7]}),
        ({"a": 1, "b": 1}, [1, 1], {"a": [1, 0], "b": [0, 1]}),  # greedy alone would give both column 0
        ({"a": 5, "b": 5}, [5, 5], {"a": [3, 2], "b": [2, 3]}),
        ({"a": 0, "b": 4}, [2, 2], {"a": [0, 0], "b": [2, 2]}),
        ({"a": 3}, [0, 4], {"a": [0, 3]}),
        ({"a": 0}, [0, 0], {"a": [0, 0]}),
    ],
)
def test_apportion_examples(quotas: dict[str, int], capacities: list[int], expected: dict[str, list[int]]) -> None:
    columns = _columns(capacities)
    assert _check_apportion(quotas, columns) == {t: dict(zip(columns, row, strict=True)) for t, row in expected.items()}


def _shuffled(mapping: dict[str, int], rng: random.Random) -> dict[str, int]:
    items = list(mapping.items())
    rng.shuffle(items)
    return dict(items)


@pytest.mark.parametrize("seed", range(20))
def test_apportion_properties(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(100):
        capacities = _columns([rng.randint(0, 24) for _ in range(rng.randint(1, 8))])
        left = sum(capacities.values())
        quotas = {}
        for i in range(rng.randint(1, 6)):
            quotas[f"t{i}"] = rng.randint(0, left)
            left -= quotas[f"t{i}"]
        first = _check_apportion(quotas, capacities)
        assert kueue.apportion(quotas, capacities) == first  # deterministic
        # The order rows and columns are given in changes no cell (dict equality ignores order).
        assert _check_apportion(_shuffled(quotas, rng), _shuffled(capacities, rng)) == first


def test_apportion_breaks_ties_by_name_not_position() -> None:
    # Two equal teams, two equal flavors: every cell is 2.5, so one team gets 3 of each flavor by the tie rule.
    # The alphabetically first team takes the extra unit in the alphabetically first column, however given.
    expected = {"alpha": {"x": 3, "y": 2}, "beta": {"x": 2, "y": 3}}
    for quotas in ({"alpha": 5, "beta": 5}, {"beta": 5, "alpha": 5}):
        for capacities in ({"x": 5, "y": 5}, {"y": 5, "x": 5}):
            assert kueue.apportion(quotas, capacities) == expected


@pytest.mark.parametrize(
    ("quotas", "capacities", "message"),
    [
        ({"a": 5}, [2, 2], "more than the capacity 4"),
        ({"a": -1}, [2], "must not be negative"),
        ({"a": 1}, [-1, 3], "negative"),
    ],
)
def test_apportion_rejects(quotas: dict[str, int], capacities: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kueue.apportion(quotas, _columns(capacities))


def test_flavors_of_the_reference_fleet(fleet: Fleet) -> None:
    by_region = {}
    for f in kueue.flavors(fleet, "prod"):
        by_region.setdefault(f.region, []).append((f.name, f.gpus, f.capacity_class))
    # Owned sites first, then reserved capacity, then on demand; GPUs = max_size x GPUs of the first type.
    assert by_region == {
        "us-west-2": [
            ("site-sjc1", 128, "owned"),
            ("pool-train-h100", 128, "reserved"),
            ("pool-interactive", 48, "on-demand"),
        ],
        "us-east-1": [("pool-interactive", 48, "on-demand"), ("pool-train-h100", 128, "on-demand")],
        "eu-west-1": [
            ("site-ams1", 64, "owned"),
            ("pool-interactive", 48, "on-demand"),
            ("pool-train-a100", 64, "on-demand"),
        ],
    }


def test_plan_keeps_every_team_quota_and_every_capacity(fleet: Fleet) -> None:
    plan = kueue.plan(fleet, "prod")
    for team, spec in fleet.teams.items():
        assert plan.team_total(team) == spec.gpu_quota
    capacity = sum(f.gpus for f in kueue.flavors(fleet, "prod"))
    spare = 0
    for region in plan.regions.values():
        for flavor in region.flavors:
            assert region.spare(flavor.name) >= 0
            spare += region.spare(flavor.name)
    assert spare == capacity - sum(t.gpu_quota for t in fleet.teams.values())
    # Proportional: a team's share of a flavor is its share of the fleet, within rounding.
    us = plan.region("us-west-2")
    assert us.nominal["language"]["site-sjc1"] == 50  # 256 x 128 / 656 = 49.95


def test_plan_is_deterministic(fleet: Fleet) -> None:
    assert kueue.plan(fleet, "prod") == kueue.plan(fleet, "prod")


def _changed(write_fleet: Callable[..., Path], change: Callable[[dict[str, Any]], Any]) -> Fleet:
    # The model alone: load_fleet refuses quotas that do not fit, and these tests look at kueue's own answer.
    return Fleet.model_validate(yaml.safe_load(write_fleet(change).read_text()))


def test_quotas_over_capacity_are_an_error(write_fleet: Callable[..., Path], fleet: Fleet) -> None:
    # Guarantees beyond the GPUs that exist would be promises nobody can keep: refused, naming the numbers.
    bigger = _changed(write_fleet, lambda d: d["teams"]["language"].update(gpu_quota=500))
    with pytest.raises(kueue.QuotaError) as info:
        kueue.plan(bigger, "prod", source="fleet.yaml")
    text = str(info.value)
    assert text.startswith("fleet.yaml: teams: ")
    assert "add up to 756" in text and "has 656 GPUs" in text and "us-west-2: 304" in text
    assert isinstance(info.value, DlinfraError)


def test_quotas_exactly_at_capacity_fit(write_fleet: Callable[..., Path]) -> None:
    full = _changed(write_fleet, lambda d: d["teams"]["language"].update(gpu_quota=400))  # 192 + 400 + 64 = 656
    plan = kueue.plan(full, "prod")
    assert all(r.spare(f.name) == 0 for r in plan.regions.values() for f in r.flavors)


def test_team_with_quota_but_no_gpu_capacity(write_fleet: Callable[..., Path]) -> None:
    def no_gpus(d: dict[str, Any]) -> None:
        d["environments"]["staging"]["node_pools"]["interactive"]["max_size"] = 0

    staging = _changed(write_fleet, no_gpus)
    with pytest.raises(kueue.QuotaError) as info:
        kueue.plan(staging, "staging")
    assert info.value.key == "teams.vision.gpu_quota"
    assert "no GPU capacity in any region" in str(info.value)
    # Scaled (best effort) environments simply get no quota.
    scaled = kueue.plan(staging, "staging", "scaled")
    assert scaled.region("us-west-2").flavors == () and scaled.team_total("vision") == 0


def test_scaled_policy_shrinks_quotas_to_capacity(fleet: Fleet) -> None:
    plan = kueue.plan(fleet, "staging", "scaled")
    region = plan.region("us-west-2")
    assert [f.name for f in region.flavors] == ["pool-interactive"]  # 2 x g6.xlarge, one L4 each
    assert {t: region.team_total(t) for t in fleet.teams} == {"vision": 1, "language": 1, "robotics": 0}
    with pytest.raises(kueue.QuotaError):
        kueue.plan(fleet, "staging", "guaranteed")


def test_scaled_policy_keeps_quotas_that_fit(fleet: Fleet) -> None:
    assert kueue.plan(fleet, "prod", "scaled").regions == kueue.plan(fleet, "prod").regions


def test_plan_does_not_depend_on_fleet_order(write_fleet: Callable[..., Path], fleet: Fleet) -> None:
    # Teams, regions, pools and sites listed the other way round: every team keeps the same GPUs per flavor.
    def reverse(d: dict[str, Any]) -> None:
        for parent, key in ((d, "teams"), (d, "sites"), (d["environments"]["prod"], "regions")):
            parent[key] = dict(reversed(parent[key].items()))
        prod = d["environments"]["prod"]
        prod["node_pools"] = dict(reversed(prod["node_pools"].items()))

    reordered = _changed(write_fleet, reverse)
    assert list(reordered.teams) == list(reversed(fleet.teams))  # the change did reorder
    for region in fleet.environments["prod"].regions:
        assert kueue.plan(reordered, "prod").region(region) == kueue.plan(fleet, "prod").region(region)


def test_overflow_plan_of_the_reference_fleet(fleet: Fleet) -> None:
    quotas = kueue.plan(fleet, "prod", "guaranteed")
    plan = kueue.overflow(fleet, quotas)
    assert (plan.manager, plan.workers) == ("us-west-2", ("eu-west-1", "us-east-1"))
    assert set(plan.teams) == {"language", "vision"}  # robotics lists no overflow: its jobs stay local
    language = plan.teams["language"]
    assert language.regions == ("eu-west-1", "us-east-1")
    assert language.gpus == quotas.region("eu-west-1").team_total("language") + quotas.region("us-east-1").team_total(
        "language"
    )
    assert plan.teams_of("eu-west-1") == ("language",) and plan.teams_of("us-east-1") == ("language", "vision")
    staging = kueue.overflow(fleet, kueue.plan(fleet, "staging", "scaled"))
    assert staging.teams == {} and staging.workers == ()  # one region: nowhere to overflow


def test_overflow_to_a_region_without_gpus_is_refused(write_fleet: Callable[..., Path]) -> None:
    def no_gpus_in_eu(data: dict[str, Any]) -> None:
        pools = data["environments"]["prod"]["node_pools"]
        pools["train-a100"]["regions"] = ["us-east-1"]
        pools["train-a100"]["efa"] = False
        pools["interactive"]["regions"] = ["us-west-2", "us-east-1"]
        data["sites"]["ams1"]["gpu_nodes"] = 0

    fleet = _changed(write_fleet, no_gpus_in_eu)
    with pytest.raises(DlinfraError, match=r"teams\.language\.overflow: jobs overflow to eu-west-1, which has no GPU"):
        kueue.check_fleet(fleet, source="fleet.yaml")
