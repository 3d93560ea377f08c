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


def _job(pod: dict[str, Any]) -> dict[str, Any]:
    """A batch/v1 Job whose pod template is `pod`'s metadata and spec, suspended as Kueue's webhook leaves it."""
    template = {"metadata": {"labels": {"app": "train"}}, "spec": pod["spec"]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "team-vision", "labels": {"kueue.x-k8s.io/queue-name": "default"}},
        "spec": {"suspend": True, "template": template},
    }


def _declared(stacks: dict[str, Stack], name: str) -> dict[str, Any]:
    (declared,) = [p for p in stacks["prod-us-west-2"].of_type(POLICY) if p.inputs["metadata"]["name"] == name]
    return dict(declared.inputs)


@pytest.fixture(scope="module")
def policy(stacks: dict[str, Stack]) -> dict[str, Any]:
    return _declared(stacks, checkpoint_grace.POLICY_NAME)


@pytest.fixture(scope="module")
def job_policy(stacks: dict[str, Stack]) -> dict[str, Any]:
    return _declared(stacks, checkpoint_grace.JOBS_POLICY_NAME)


@pytest.mark.parametrize(
    ("case", "pod", "admitted"),
    [
        ("GPU pod within its pool's grace", _pod(1800, pool="train-h100"), True),
        ("GPU pod above its pool's grace", _pod(1801, pool="train-h100"), False),
        ("GPU pod above a smaller pool's grace", _pod(1200, pool="interactive"), False),
        ("GPU pod with the default grace", _pod(None, pool="interactive"), True),
        ("GPU pod without a pool, within the smallest GPU grace", _pod(900), True),
        ("GPU pod without a pool, above the smallest GPU grace", _pod(1800), False),
        ("GPU pod without a pool, above every GPU grace", _pod(1900), False),
        ("CPU pod on the CPU pool above its grace", _pod(1000, gpus=0, pool="cpu"), False),
        ("CPU pod without a pool: nothing to wait for it", _pod(7200, gpus=0), True),
        # No node here can take it: a job bound for eu-west-1 through MultiKueue is checked by that region's policy.
        ("pod naming a pool of another region", _pod(1800, pool="train-a100"), True),
        # A site's machines carry pool site-<site> (dlinfra/render/nodeadm.py): capped as a GPU pod naming no pool.
        ("GPU pod pinned to the site, within the smallest GPU grace", _pod(900, pool="site-sjc1"), True),
        ("GPU pod pinned to the site, above the smallest GPU grace", _pod(901, pool="site-sjc1"), False),
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


@pytest.mark.parametrize(
    ("case", "pod", "admitted"),
    [
        ("GPU job within the smallest GPU grace", _pod(900), True),
        ("GPU job pinned to its pool, within its grace", _pod(1800, pool="train-h100"), True),
        ("GPU job without a pool, above the smallest GPU grace", _pod(1800), False),
        ("GPU job pinned to a pool, above its grace", _pod(1200, pool="interactive"), False),
        ("CPU job without a pool", _pod(7200, gpus=0), True),
    ],
)
def test_a_job_is_refused_at_submission_not_after_admission(
    job_policy: dict[str, Any], case: str, pod: dict[str, Any], admitted: bool
) -> None:
    """The Job is created suspended, before Kueue admits it: refusing it then returns the error to its author and
    holds no quota. Its pods, created after admission, would otherwise be refused with the quota held."""
    failed = _review(job_policy, _request("CREATE"), _job(pod))
    assert (failed == []) is admitted, (case, failed)


def test_kueue_writing_a_pool_into_a_job_is_checked(job_policy: dict[str, Any]) -> None:
    submitted = _job(_pod(1800))  # as if created before the cap was lowered
    admitted = copy.deepcopy(submitted)
    admitted["spec"]["template"]["spec"]["nodeSelector"] = {"dlinfra.io/pool": "interactive"}
    assert _review(job_policy, _request("UPDATE", KUEUE), admitted, submitted)
    admitted["spec"]["template"]["spec"]["nodeSelector"] = {"dlinfra.io/pool": "train-h100"}
    assert _review(job_policy, _request("UPDATE", KUEUE), admitted, submitted) == []
    # Evicted or preempted, Kueue restores the submitted selector: never refused, or the eviction could not finish.
    assert _review(job_policy, _request("UPDATE", KUEUE), submitted, admitted) == []
    # Its author removing the pin of a suspended job is checked: Kueue could then give it a smaller pool.
    pinned = _job(_pod(1800, pool="train-h100"))
    assert _review(job_policy, _request("UPDATE"), submitted, pinned)


@pytest.mark.parametrize("grace", [30, 600, 900, 901, 1800, 3600])
def test_what_passes_at_submission_passes_on_any_pool_kueue_picks(
    policy: dict[str, Any], job_policy: dict[str, Any], grace: int
) -> None:
    """Finding 3 of the issue-22 review: capped by the largest GPU grace at submission, a 1800 s job was admitted to
    the 900 s pool and its pods refused only then. Now whatever a pool-less GPU job passes with, every GPU pool
    Kueue may give it (us-west-2: train-h100, interactive) accepts its pods."""
    if _review(job_policy, _request("CREATE"), _job(_pod(grace))):
        return
    for pool in ("train-h100", "interactive"):
        assert _review(policy, _request("CREATE", KUEUE), _pod(grace, pool=pool)) == [], pool


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
        assert variables["gpuCap"] == str(min(p.checkpoint_grace for p in pools.values() if p.kind == "gpu"))
        (jobs,) = [
            p for p in stack.of_type(POLICY) if p.inputs["metadata"]["name"] == checkpoint_grace.JOBS_POLICY_NAME
        ]
        (rule,) = jobs.inputs["spec"]["matchConstraints"]["resourceRules"]
        assert (rule["apiGroups"], rule["resources"]) == (["batch"], ["jobs"])
        for name in (checkpoint_grace.POLICY_NAME, checkpoint_grace.JOBS_POLICY_NAME):
            (binding,) = [b for b in stack.of_type(BINDING) if b.inputs["spec"]["policyName"] == name]
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


def test_a_region_without_gpu_pools_caps_no_pool_less_gpu_job(policy: dict[str, Any]) -> None:
    """Only a site's machines can run it there, and no cloud disruption drains them: refusing every GPU job (the
    old -1 meant "nothing may ask") would have made a site-only region unusable."""
    site_only = copy.deepcopy(policy)
    for variable in site_only["spec"]["variables"]:
        if variable["name"] == "gpuCap":
            variable["expression"] = "-1"
    assert _review(site_only, _request("CREATE"), _pod(3600)) == []
    assert _review(policy, _request("CREATE"), _pod(3600))
