"""Reordering the fleet file changes nothing declared: same URNs, same inputs, same Kubernetes objects.

Each example runs every stack offline (about 25 s), so hypothesis tries a few fixed permutations. Only the
fleet lists whose order means something are left in place (README, "Fleet reference": what order means).
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dlinfra.model import stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.offline import engine, plan_export
from tests import reference as _reference
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

# Fleet lists whose order is meaning, so a permutation keeps them: instance_types is preference (the first
# type is the launch template's and sets the GPU model; mixed-instances overrides follow the list).
ORDERED = frozenset({"instance_types"})


def permuted(value: Any, rng: random.Random, key: str | None = None) -> Any:
    """The same fleet with every mapping and every unordered list shuffled, at any depth."""
    if isinstance(value, dict):
        items = [(k, permuted(v, rng, k)) for k, v in value.items()]
        rng.shuffle(items)
        return dict(items)
    if isinstance(value, list):
        elements = [permuted(v, rng, key) for v in value]
        if key not in ORDERED:
            rng.shuffle(elements)
        return elements
    return value


def declared(results: Iterable[plan_export.StackResult]) -> dict[str, dict[str, Any]]:
    """Stack -> URN -> inputs, as the plan export has them (secrets masked, assets hashed)."""
    project = _reference.fleet().project
    return {r.role.name: {x["urn"]: x["inputs"] for x in r.plan(project)["resources"]} for r in results}


def kubernetes_objects(results: Iterable[plan_export.StackResult]) -> dict[str, list[dict[str, Any]]]:
    """Stack -> the Kubernetes manifests `preview` writes (ResourceFlavors, ClusterQueues, the Cohort, ...)."""
    return {r.role.name: plan_export.manifests(r) for r in results}


def run_permuted(seed: int) -> list[plan_export.StackResult]:
    data = permuted(yaml.safe_load(REFERENCE_FLEET.read_text()), random.Random(seed))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fleet.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        fleet = load_fleet(path).fleet
        config = {"dlinfra:fleet": str(path), "dlinfra:lock": str(REFERENCE_LOCK)}
        return engine.run_all(ROOT, stackroles.roles(fleet), project=fleet.project, config=config)


def test_permutation_shuffles_every_unordered_collection() -> None:
    # Guard the test itself: a shuffle that left the file alone would prove nothing.
    data = {"teams": {"a": 1, "b": 2, "c": 3}, "users": ["x", "y", "z"], "instance_types": ["p", "q", "r"]}
    seen = [permuted(data, random.Random(seed)) for seed in range(20)]
    assert {tuple(s["teams"]) for s in seen} != {("a", "b", "c")}
    assert {tuple(s["users"]) for s in seen} != {("x", "y", "z")}
    assert {tuple(s["instance_types"]) for s in seen} == {("p", "q", "r")}


@pytest.mark.slow
# No shrinking: a smaller seed is not a simpler permutation, and every try costs a whole run.
@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_reordered_fleet_declares_the_same_plan(seed: int) -> None:
    original = list(_reference.runs().values())
    results = run_permuted(seed)
    before, after = declared(original), declared(results)
    assert sorted(after) == sorted(before)
    for stack, resources in before.items():
        assert sorted(after[stack]) == sorted(resources), f"{stack}: URNs differ"
        for urn, inputs in resources.items():
            assert after[stack][urn] == inputs, f"{stack}: inputs of {urn} differ"
    # Kueue quotas and every other typed Kubernetes object, as `preview` writes them under manifests/.
    assert kubernetes_objects(results) == kubernetes_objects(original)
