"""The checkpoint grace cap, as declared: its CEL evaluated by cel-python against sample pod creates and updates (the
way tests/components/charts/test_gpu_admission.py evaluates the GPU policy), with the reference fleet's caps in
us-west-2: train-h100 1800 s, interactive 900 s, cpu 900 s."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest

from components.charts import checkpoint_grace
from dlinfra.model.fleet.schema import Fleet
from tests.components._platform import Stack
from tests.components.charts.test_gpu_admission import BINDING, POLICY, TEAM_USER

KUEUE = "system:serviceaccount:kueue-system:kueue-controller-manager"


def _review(policy: dict[str, Any], request: dict[str, Any], obj: Any, old: Any = None) -> list[str]:
    """The messages of the validations a request fails (variables here are not all booleans)."""
    env = celpy.Environment()
    activation: dict[str, Any] = {
        name: celpy.json_to_cel(value) for name, value in {"object": obj, "oldObject": old, "request": request}.items()
    }
    spec = policy["spec"]
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:  # in order: each may read the ones before it
        ast = env.compile(variable["expression"])
        known = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})
        variables[variable["name"]] = env.program(ast).evaluate(activation | {"variables": known})
    activation["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})
    failed = []
    for v in spec["validations"]:
        result = env.program(env.compile(v["expression"])).evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), (v["expression"], result)
        if not result:
            failed.append(v["message"])
    return failed


def _pod(grace: int | None, *, gpus: int = 1, pool: str | None = None) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {"requests": {"cpu": "2"}}
    spec: dict[str, Any] = {"containers": [{"name": "train", "image": "train:1", "resources": resources}]}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    if pool is not None:
        spec["nodeSelector"] = {"dlinfra.io/pool": pool, "kubernetes.io/arch": "amd64"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-vision"}, "spec": spec}


def _request(operation: str, user: str = TEAM_USER) -> dict[str, Any]:
    return {"operation": operation, "userInfo": {"username": user}, "namespace": "team-vision"}


@pytest.fixture(scope="module")
def policy(stacks: dict[str, Stack]) -> dict[str, Any]:
    (declared,) = [
        p
        for p in stacks["prod-us-west-2"].of_type(POLICY)
        if p.inputs["metadata"]["name"] == checkpoint_grace.POLICY_NAME
    ]
    return dict(declared.inputs)


@pytest.mark.parametrize(
    ("case", "pod", "admitted"),
    [
        ("GPU pod within its pool's grace", _pod(1800, pool="train-h100"), True),
        ("GPU pod above its pool's grace", _pod(1801, pool="train-h100"), False),
        ("GPU pod above a smaller pool's grace", _pod(1200, pool="interactive"), False),
        ("GPU pod with the default grace", _pod(None, pool="interactive"), True),
        ("GPU pod without a pool, within the largest GPU grace", _pod(1800), True),
        ("GPU pod without a pool, above every GPU grace", _pod(1900), False),
        ("CPU pod on the CPU pool above its grace", _pod(1000, gpus=0, pool="cpu"), False),
        ("CPU pod without a pool: nothing to wait for it", _pod(7200, gpus=0), True),
        ("pod naming a pool of another region: GPU cap", _pod(1800, pool="train-a100"), True),
    ],
)
def test_grace_is_capped_by_the_pool(policy: dict[str, Any], case: str, pod: dict[str, Any], admitted: bool) -> None:
    failed = _review(policy, _request("CREATE"), pod)
    assert (failed == []) is admitted, (case, failed)
    if failed:
        assert "checkpoint_grace" in failed[0] and "train-h100 1800 s" in failed[0]


def test_kueue_injecting_a_pool_is_checked_other_updates_are_not(policy: dict[str, Any]) -> None:
    """Kueue ungates a plain pod by an UPDATE that adds its flavor's node labels: the pool it names is checked then.
    An update that leaves the pool alone (a finalizer removed) passes even if the cap was lowered since."""
    gated = _pod(1800)
    to_interactive = copy.deepcopy(gated)
    to_interactive["spec"]["nodeSelector"] = {"dlinfra.io/pool": "interactive"}
    assert _review(policy, _request("UPDATE", KUEUE), to_interactive, gated)
    to_h100 = copy.deepcopy(gated)
    to_h100["spec"]["nodeSelector"] = {"dlinfra.io/pool": "train-h100"}
    assert _review(policy, _request("UPDATE", KUEUE), to_h100, gated) == []
    running = _pod(1800, pool="interactive")
    relabelled = copy.deepcopy(running)
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert _review(policy, _request("UPDATE", KUEUE), relabelled, running) == []


def test_caps_follow_the_fleet_in_every_region(stacks: dict[str, Stack], fleet: Fleet) -> None:
    for stack in stacks.values():
        env, region = stack.role.environment, stack.role.region
        (declared,) = [p for p in stack.of_type(POLICY) if p.inputs["metadata"]["name"] == checkpoint_grace.POLICY_NAME]
        spec = declared.inputs["spec"]
        assert spec["failurePolicy"] == "Fail"
        assert spec["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE", "UPDATE"]
        variables = {v["name"]: v["expression"] for v in spec["variables"]}
        pools = fleet.pools_in(env, region)
        for name, pool in pools.items():
            assert f"'{name}': {pool.checkpoint_grace}" in variables["caps"]
        assert variables["gpuCap"] == str(max(p.checkpoint_grace for p in pools.values() if p.kind == "gpu"))
        (binding,) = [
            b for b in stack.of_type(BINDING) if b.inputs["spec"]["policyName"] == checkpoint_grace.POLICY_NAME
        ]
        assert binding.inputs["spec"]["validationActions"] == ["Deny"]


def test_without_the_policy_an_oversized_grace_is_admitted(policy: dict[str, Any]) -> None:
    """The cap lives in the policy alone: with its rule removed, a pod outlasting every drain gets in."""
    gutted = copy.deepcopy(policy)
    gutted["spec"]["validations"] = []
    assert _review(gutted, _request("CREATE"), _pod(3600, pool="interactive")) == []
    assert _review(policy, _request("CREATE"), _pod(3600, pool="interactive"))


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="no checkpoint grace"):
        checkpoint_grace.variables({"a": 900}, ["b"])
    assert checkpoint_grace.variables({"cpu": 900}, [])["gpuCap"] == "-1"
