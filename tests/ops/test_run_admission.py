"""The Job `dlinfra run` submits passes every admission policy dlinfra installs, at each step of its life: created by
a team member, admitted by Kueue to each flavor of the region (Kueue unsuspends it and writes the flavor's node
labels and tolerations into its pod template), and its pods created by the Job controller. The policies are the
ValidatingAdmissionPolicies of prod-us-west-2's in-cluster plan, their CEL evaluated by cel-python, as the chart tests
do. Its pods also meet the namespaces' enforced Pod Security level (baseline). A run that asks for more grace than
its pool allows is refused by the same policies (so the evaluation here can fail).
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from typing import Any

import celpy
import pytest
import yaml

from components.charts import gpu_admission
from dlinfra.model import run_job
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet
from tests.components import _pod_security
from tests.components._platform import Stack, platform_stacks
from tests.conftest import REFERENCE_FLEET, ROOT

POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
TEAM_USER = "arn:aws:sts::111122223333:assumed-role/team-vision/alice"  # as EKS names a team role's session
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return load_fleet(REFERENCE_FLEET).fleet


@pytest.fixture(scope="module")
def stack(fleet: Fleet) -> Stack:
    return platform_stacks(fleet)["prod-us-west-2"]


def _applies(policy: dict[str, Any], obj: dict[str, Any], operation: str) -> bool:
    group, resource = ("batch", "jobs") if obj["kind"] == "Job" else ("", "pods")
    return any(
        group in rule["apiGroups"] and resource in rule["resources"] and operation in rule["operations"]
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
    )


def _review(policy: dict[str, Any], request: dict[str, Any], obj: Any, old: Any = None) -> list[str]:
    """The messages of the validations a request fails; [] when admitted or when the policy does not apply."""
    env = celpy.Environment()

    def evaluate(expression: str, activation: dict[str, Any]) -> Any:
        return env.program(env.compile(expression)).evaluate(activation)

    activation: dict[str, Any] = {
        name: celpy.json_to_cel(value) for name, value in {"object": obj, "oldObject": old, "request": request}.items()
    }
    spec = policy["spec"]
    if not all(evaluate(c["expression"], activation) for c in spec.get("matchConditions", [])):
        return []
    variables: dict[str, Any] = {}
    for variable in spec.get("variables", []):  # in order: each may read the ones before it
        known = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})
        variables[variable["name"]] = evaluate(variable["expression"], activation | {"variables": known})
    activation["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})
    failed = []
    for validation in spec["validations"]:
        result = evaluate(validation["expression"], activation)
        assert isinstance(result, celpy.celtypes.BoolType), (validation["expression"], result)
        if not result:
            failed.append(f"{policy['metadata']['name']}: {validation['message']}")
    return failed


def _everything(stack: Stack, request: dict[str, Any], obj: dict[str, Any], old: Any = None) -> list[str]:
    policies = [dict(p.inputs) for p in stack.of_type(POLICY)]
    assert any(_applies(p, obj, request["operation"]) for p in policies)
    return [
        message for p in policies if _applies(p, obj, request["operation"]) for message in _review(p, request, obj, old)
    ]


def _run(fleet: Fleet, **options: Any) -> dict[str, Any]:
    plan = run_job.plan(
        fleet, env="prod", region="us-west-2", team="vision", name="my-idea-1", account="123456789012",
        command=["python", "train.py"], **options,
    )  # fmt: skip
    return run_job.job(replace(plan, code_sha256="ab" * 32))


BLOCK_CLOSED = "dlinfra.io/capacity-block-closed"  # components/block_flavors.py: the keeper removes it in the window


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Kubernetes' rule (core/v1 Toleration.ToleratesTaint), which Kueue applies to a flavor's nodeTaints."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


def _matches(requirement: dict[str, Any], labels: dict[str, str]) -> bool:
    """A node selector requirement against a flavor's labels (core/v1 NodeSelectorRequirement: NotIn and
    DoesNotExist hold when the label is absent)."""
    key, operator, values = requirement["key"], requirement["operator"], requirement.get("values", [])
    return {
        "In": lambda: labels.get(key) in values,
        "NotIn": lambda: labels.get(key) not in values,
        "Exists": lambda: key in labels,
        "DoesNotExist": lambda: key not in labels,
    }[operator]()


def _fits(job: dict[str, Any], flavor: dict[str, Any]) -> bool:
    """Whether Kueue may give the job this flavor (Kueue docs, "Resource Flavor"): its template tolerates every taint
    the flavor's nodes carry, and its nodeSelector and required node affinity match the flavor's nodeLabels. (Kueue
    leaves out keys that no flavor of the resource group labels; each key the run uses is labelled by some flavor.)"""
    pod = job["spec"]["template"]["spec"]
    tolerations = pod.get("tolerations", [])
    if not all(any(_tolerates(t, taint) for t in tolerations) for taint in flavor["spec"].get("nodeTaints", [])):
        return False
    labels = flavor["spec"].get("nodeLabels", {})
    if any(labels.get(key, value) != value for key, value in pod.get("nodeSelector", {}).items()):
        return False
    required = pod.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    # Terms are ORed, a term's expressions ANDed (core/v1 NodeSelector).
    return any(all(_matches(r, labels) for r in term["matchExpressions"]) for term in required["nodeSelectorTerms"])


def _admitted(job: dict[str, Any], flavor: dict[str, Any]) -> dict[str, Any]:
    """The Job after Kueue admitted it to `flavor`: unsuspended, the flavor's node labels and tolerations added."""
    admitted = copy.deepcopy(job)
    admitted["spec"]["suspend"] = False
    pod = admitted["spec"]["template"]["spec"]
    pod["nodeSelector"] = {**pod.get("nodeSelector", {}), **flavor["spec"].get("nodeLabels", {})}
    if flavor["spec"].get("tolerations"):
        pod["tolerations"] = [*pod.get("tolerations", []), *flavor["spec"]["tolerations"]]
    return admitted


def _pod_of(job: dict[str, Any]) -> dict[str, Any]:
    """A pod the Job controller creates from the admitted Job's template."""
    meta = job["spec"]["template"]["metadata"]
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"], "uid": "u", "controller": True}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**meta, "name": "my-idea-1-x7k2q", "namespace": job["metadata"]["namespace"],
                     "ownerReferences": [owner]},
        "spec": copy.deepcopy(job["spec"]["template"]["spec"]),
    }  # fmt: skip


def _request(operation: str, user: str) -> dict[str, Any]:
    return {"operation": operation, "userInfo": {"username": user}, "namespace": "team-vision"}


def _flavors(stack: Stack, pools: tuple[str, ...] | None = None) -> dict[str, dict[str, Any]]:
    flavors = {key.split("/")[0]: value for key, value in stack.kueue("ResourceFlavor").items()}
    gpu = {n: f for n, f in flavors.items() if "nodeLabels" in f["spec"] and n != "pool-cpu"}  # not multikueue
    assert {"pool-train-h100", "pool-interactive"} <= set(gpu), sorted(flavors)
    if pools is None:
        return gpu
    return {n: f for n, f in gpu.items() if f["spec"]["nodeLabels"].get(run_job.POOL_LABEL) in pools}


@pytest.mark.parametrize(
    "options",
    [{}, {"gpus": 8, "pool": "train-h100", "grace": 1800}],
    ids=["any GPU pool", "pinned to train-h100 with its grace"],
)
def test_every_policy_admits_the_run_at_each_step(fleet: Fleet, stack: Stack, options: dict[str, Any]) -> None:
    job = _run(fleet, **options)
    assert _everything(stack, _request("CREATE", TEAM_USER), job) == []
    pool = options.get("pool")
    for name, flavor in _flavors(stack, (pool,) if pool else None).items():
        if name.startswith("site-"):
            continue  # never given one: test_a_run_is_never_given_a_sites_flavor
        taints = flavor["spec"].get("nodeTaints", [])
        # A Capacity Block's flavor is created closed: no run may tolerate that, and inside the window it fits.
        assert not _fits(job, flavor) if any(t["key"] == BLOCK_CLOSED for t in taints) else _fits(job, flavor), name
        opened = {"spec": {**flavor["spec"], "nodeTaints": [t for t in taints if t["key"] != BLOCK_CLOSED]}}
        assert _fits(job, opened), name
        admitted = _admitted(job, flavor)
        assert _everything(stack, _request("UPDATE", gpu_admission.KUEUE_CONTROLLER), admitted, job) == [], name
        pod = _pod_of(admitted)
        assert _everything(stack, _request("CREATE", JOB_CONTROLLER), pod) == [], name
        assert _pod_security.violations(pod, "baseline") == [], name  # what team namespaces enforce


def test_a_pinned_pools_grace_asked_without_the_pin_is_refused(fleet: Fleet, stack: Stack) -> None:
    """The policies the run is checked against do refuse: train-h100's 1800 s without pinning train-h100."""
    job = _run(fleet, gpus=8, pool="train-h100", grace=1800)
    del job["spec"]["template"]["spec"]["nodeSelector"]
    failed = _everything(stack, _request("CREATE", TEAM_USER), job)
    assert any(m.startswith("dlinfra-checkpoint-grace-cap-jobs:") for m in failed), failed


def test_the_run_asks_for_at_most_the_smallest_gpu_grace_without_a_pin(fleet: Fleet) -> None:
    graces = [p.checkpoint_grace for p in fleet.pools_in("prod", "us-west-2").values() if p.kind == "gpu"]
    job = _run(fleet)
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == min(graces)
    assert job["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"] == [
        {"type": "DisruptionTarget", "status": "True"}
    ]


def test_a_cpu_run_passes_every_policy_and_tolerates_nothing(fleet: Fleet, stack: Stack) -> None:
    job = _run(fleet, gpus=0, cpu="4", memory="16Gi")
    assert "tolerations" not in job["spec"]["template"]["spec"]
    assert _everything(stack, _request("CREATE", TEAM_USER), job) == []
    pod = _pod_of(job)
    assert _everything(stack, _request("CREATE", JOB_CONTROLLER), pod) == []
    assert _pod_security.violations(pod, "baseline") == []


@pytest.mark.parametrize("options", [{}, {"gpus": 8}, {"gpus": 1, "grace": 600}], ids=["1 GPU", "8 GPUs", "grace"])
def test_a_run_is_never_given_a_sites_flavor(fleet: Fleet, stack: Stack, options: dict[str, Any]) -> None:
    """A site's machines (EKS Hybrid Nodes) cannot mount the team's EFS claim: Kueue, which tries owned sites first
    (docs/jobs.md), must skip their flavors, and give the run a pool's."""
    job = _run(fleet, **options)
    flavors = _flavors(stack)
    sites = {n: f for n, f in flavors.items() if f["spec"]["nodeLabels"].get(run_job.COMPUTE_TYPE_LABEL) == "hybrid"}
    assert sites, "the reference region has a site, or this test shows nothing"
    assert not [n for n, f in sites.items() if _fits(job, f)]
    assert _fits(job, flavors["pool-interactive"])
    # The exclusion is the run's affinity: without it the site's flavor would fit.
    loose = copy.deepcopy(job)
    del loose["spec"]["template"]["spec"]["affinity"]
    assert all(_fits(loose, f) for f in sites.values())


def test_the_jobs_guide_example_fits_the_gpu_flavors(stack: Stack) -> None:
    """docs/jobs.md's example Job tolerates the GPU taint every GPU flavor lists in nodeTaints: Kueue can admit it."""
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "jobs.md").read_text(), flags=re.S)
    (job,) = [doc for doc in map(yaml.safe_load, blocks) if doc.get("kind") == "Job"]
    fitting = [n for n, f in _flavors(stack).items() if _fits(job, f)]
    assert {"pool-interactive", "site-sjc1"} <= set(fitting), fitting
