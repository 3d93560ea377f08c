"""The admission policy behind Kueue, as declared: its CEL evaluated by cel-python against sample admission requests
(a bare GPU pod refused, a queued one admitted, a CPU pod untouched, ...), the way the API server evaluates a
ValidatingAdmissionPolicy (Kubernetes docs, "Validating Admission Policy": match conditions, then variables in order,
then every validation)."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest

from components.charts import gpu_admission
from dlinfra.model import job_operators
from tests.components._platform import Stack

POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
TEAM_USER = "arn:aws:sts::111122223333:assumed-role/team-vision/alice"  # a team's IAM role, as EKS names it
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"
REPLICASET_CONTROLLER = "system:serviceaccount:kube-system:replicaset-controller"
GATE = {"name": "kueue.x-k8s.io/admission"}


def _pod(
    gpus: int | None = 1, *, gated: bool = False, owner: tuple[str, str] | None = None, init: bool = False
) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus is not None else {"requests": {"cpu": "2"}}
    container = {"name": "train", "image": "train:1", "resources": resources}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "main:1"}]}
    spec["initContainers" if init else "containers"] = [container]
    if gated:
        spec["schedulingGates"] = [GATE]
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-vision"}
    if owner is not None:
        api_version, kind = owner
        metadata["ownerReferences"] = [
            {"apiVersion": api_version, "kind": kind, "name": "j", "uid": "u", "controller": True}
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _shared(pod: dict[str, Any], resource: str) -> dict[str, Any]:
    """The pod asking for one share of a shared pool instead of a whole GPU."""
    for container in pod["spec"]["containers"]:
        if "resources" in container:
            container["resources"] = {"limits": {resource: "1"}}
    return pod


def _tolerating(pod: dict[str, Any], toleration: dict[str, str]) -> dict[str, Any]:
    pod["spec"]["tolerations"] = [toleration]
    return pod


def _labelled(pod: dict[str, Any], queue: str) -> dict[str, Any]:
    pod["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue, "app": "x"}
    return pod


def _review(policy: dict[str, Any], request: dict[str, Any], obj: Any, old: Any = None) -> list[str]:
    """The messages of the validations a request fails; [] when it is admitted or the policy does not apply."""
    env = celpy.Environment()

    def evaluate(expression: str, activation: dict[str, Any]) -> bool:
        result = env.program(env.compile(expression)).evaluate(
            {name: celpy.json_to_cel(value) for name, value in activation.items()}
        )
        assert isinstance(result, celpy.celtypes.BoolType), (expression, result)
        return bool(result)

    spec = policy["spec"]
    activation = {"object": obj, "oldObject": old, "request": request}
    if not all(evaluate(c["expression"], activation) for c in spec.get("matchConditions", [])):
        return []
    variables: dict[str, bool] = {}
    for variable in spec.get("variables", []):  # in order: each may read the ones before it
        variables[variable["name"]] = evaluate(variable["expression"], activation | {"variables": variables})
    activation["variables"] = variables
    return [v["message"] for v in spec["validations"] if not evaluate(v["expression"], activation)]


def _create(user: str) -> dict[str, Any]:
    return {"operation": "CREATE", "userInfo": {"username": user}, "namespace": "team-vision"}


@pytest.fixture(scope="module")
def policy(stacks: dict[str, Stack]) -> dict[str, Any]:
    (declared,) = [
        p for p in stacks["prod-us-west-2"].of_type(POLICY) if p.inputs["metadata"]["name"] == gpu_admission.POLICY_NAME
    ]
    return dict(declared.inputs)


@pytest.mark.parametrize(
    ("case", "user", "pod", "admitted"),
    [
        ("bare GPU pod", TEAM_USER, _pod(), False),
        ("GPU pod Kueue gated", TEAM_USER, _pod(gated=True), True),
        ("CPU pod", TEAM_USER, _pod(None), True),
        ("GPU init container", TEAM_USER, _pod(init=True), False),
        ("pod of an admitted batch Job", JOB_CONTROLLER, _pod(owner=("batch/v1", "Job")), True),
        # No job operator is named in the reference fleet, so Kueue queues no RayCluster: its pods are not trusted,
        # even from a trusted namespace (test_named_operators_kinds_are_queued_and_their_controllers_trusted).
        ("pod of a RayCluster", "system:serviceaccount:kube-system:kuberay", _pod(owner=("ray.io/v1", "RayCluster")),
         False),
        # A person names a Job as owner: Kueue's pod webhook leaves it ungated, the policy does not.
        ("bare pod claiming a Job owner", TEAM_USER, _pod(owner=("batch/v1", "Job")), False),
        ("team service account claiming a Job owner", "system:serviceaccount:team-vision:runner",
         _pod(owner=("batch/v1", "Job")), False),
        # A Deployment's pods when Kueue's pod integrations were off: the ReplicaSet is no job Kueue suspends.
        ("ungated Deployment pod", REPLICASET_CONTROLLER, _pod(owner=("apps/v1", "ReplicaSet")), False),
        ("gated Deployment pod", REPLICASET_CONTROLLER, _pod(gated=True, owner=("apps/v1", "ReplicaSet")), True),
        ("ungated StatefulSet pod", "system:serviceaccount:kube-system:statefulset-controller",
         _pod(owner=("apps/v1", "StatefulSet")), False),
        ("queued pod sent to overflow", TEAM_USER, _labelled(_pod(gated=True), "overflow"), False),
        ("queued pod sent to its default queue", TEAM_USER, _labelled(_pod(gated=True), "default"), True),
        ("pod of a Job sent to overflow", JOB_CONTROLLER, _labelled(_pod(owner=("batch/v1", "Job")), "overflow"), True),
        # The GPU health taints keep work off unchecked and failed GPUs: no GPU pod may tolerate them, or everything.
        ("tolerates the burn-in taint", TEAM_USER, _tolerating(_pod(gated=True), {"key": "dlinfra.io/gpu-burn-in",
         "operator": "Exists"}), False),
        ("tolerates the site burn-in taint", TEAM_USER, _tolerating(_pod(gated=True), {
            "key": "dlinfra.io/gpu-burn-in-site", "operator": "Equal", "value": "pending"}), False),
        ("tolerates the unhealthy taint", JOB_CONTROLLER, _tolerating(_pod(owner=("batch/v1", "Job")), {
            "key": "dlinfra.io/gpu-unhealthy", "operator": "Exists", "effect": "NoSchedule"}), False),
        ("tolerates every taint", TEAM_USER, _tolerating(_pod(gated=True), {"operator": "Exists"}), False),
        ("tolerates every NoSchedule taint", TEAM_USER, _tolerating(_pod(gated=True), {"operator": "Exists",
         "effect": "NoSchedule"}), False),
        ("tolerates the GPU taint", TEAM_USER, _tolerating(_pod(gated=True), {"key": "nvidia.com/gpu",
         "operator": "Exists"}), True),
        # A share of a shared pool is a GPU workload too (dlinfra.model.gpu_sharing): queued, or refused.
        ("bare MIG pod", TEAM_USER, _shared(_pod(), "nvidia.com/mig-1g.10gb"), False),
        ("bare time-sliced pod", TEAM_USER, _shared(_pod(), "nvidia.com/gpu.shared"), False),
        ("MIG pod Kueue gated", TEAM_USER, _shared(_pod(gated=True), "nvidia.com/mig-1g.10gb"), True),
        ("owner that is not the controller", JOB_CONTROLLER, {
            **_pod(), "metadata": {"name": "p", "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u"}]}}, False),
    ],
)  # fmt: skip
def test_policy_admits_only_pods_kueue_admits(
    policy: dict[str, Any], case: str, user: str, pod: dict[str, Any], admitted: bool
) -> None:
    failed = _review(policy, _create(user), pod)
    assert (failed == []) is admitted, (case, failed)


@pytest.mark.parametrize(
    ("user", "admitted"),
    [(gpu_admission.KUEUE_CONTROLLER, True), (TEAM_USER, False), (JOB_CONTROLLER, False)],
)
def test_only_kueue_removes_the_gate(policy: dict[str, Any], user: str, admitted: bool) -> None:
    old = _pod(gated=True)
    new = copy.deepcopy(old)
    del new["spec"]["schedulingGates"]
    update = {"operation": "UPDATE", "userInfo": {"username": user}, "namespace": "team-vision"}
    failed = _review(policy, update, new, old)
    assert (failed == []) is admitted, failed
    # Any other update of a gated pod, by anyone, is not this policy's business.
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert _review(policy, update, relabelled, old) == []


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label selector semantics for matchExpressions (Exists, NotIn)."""
    for e in selector["matchExpressions"]:
        present = e["key"] in labels
        if e["operator"] == "Exists" and not present:
            return False
        if e["operator"] == "NotIn" and present and labels[e["key"]] in e["values"]:
            return False
        assert e["operator"] in ("Exists", "NotIn"), e
    return True


def test_policy_binds_in_team_namespaces_only(stacks: dict[str, Stack], policy: dict[str, Any]) -> None:
    constraints = policy["spec"]["matchConstraints"]
    assert constraints["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}
    ]
    assert policy["spec"]["failurePolicy"] == "Fail"
    selector = constraints["namespaceSelector"]
    name = "kubernetes.io/metadata.name"
    assert _selects(selector, {name: "team-vision", "dlinfra.io/team": "vision"})
    for system in ("kube-system", "kueue-system", "default"):
        assert not _selects(selector, {name: system})
        assert not _selects(selector, {name: system, "dlinfra.io/team": "x"})  # labelled by mistake
    (binding,) = [
        b
        for b in stacks["prod-us-west-2"].of_type(BINDING)
        if b.inputs["spec"]["policyName"] == gpu_admission.POLICY_NAME
    ]
    assert binding.inputs["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert stacks["prod-us-west-2"].by_name["platform-gpu-admission"].urn in binding.dependencies


def test_every_kueue_job_kind_names_its_pods_owner() -> None:
    assert set(gpu_admission.POD_OWNERS) == set(job_operators.all_frameworks())
    with pytest.raises(ValueError, match="controller_namespaces"):
        gpu_admission.variables([], ("batch/job",))


# --- who may make a job another job's child -----------------------------------------------------------------------
# Kueue leaves a job unsuspended when an ancestor it manages owns it (v0.19.2 jobframework/utils.go
# WorkloadShouldBeSuspended, FindAncestorJobManagedByKueue over controller references), so the job-owner policy
# refuses a controller ownerReference from anyone but a trusted controller.
CRONJOB_CONTROLLER = "system:serviceaccount:kube-system:cronjob-controller"
GC = "system:serviceaccount:kube-system:generic-garbage-collector"


def test_the_owners_kueue_follows_include_every_kind_it_queues_here() -> None:
    """Every job kind Kueue may manage here (batch Jobs, the named operators' kinds and the pod-based integrations)
    is an owner Kueue follows; the list was read from Kueue v0.19.2, the pinned release: re-read it on an upgrade."""
    from components.charts import kueue, pinned

    assert pinned.load_addons()["kueue"].version == "0.19.2"
    followed = {kind.lower() for _, kind in gpu_admission.KUEUE_FOLLOWED_OWNERS}
    for framework in (*job_operators.all_frameworks(), *kueue.KUEUE_POD_FRAMEWORKS):
        assert framework.rsplit("/", 1)[-1] in followed, framework
    assert ("apps", "ReplicaSet") in gpu_admission.KUEUE_FOLLOWED_OWNERS  # isKnownOwner's one non-integration


@pytest.fixture(scope="module")
def job_policy(stacks: dict[str, Stack]) -> dict[str, Any]:
    (declared,) = [
        p
        for p in stacks["prod-us-west-2"].of_type(POLICY)
        if p.inputs["metadata"]["name"] == gpu_admission.JOB_OWNERS_POLICY_NAME
    ]
    return dict(declared.inputs)


def _owner(api_version: str, kind: str, name: str, *, controller: bool | None = True) -> dict[str, Any]:
    ref: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "name": name, "uid": f"uid-{name}"}
    if controller is not None:
        ref["controller"] = controller
    return ref


def _job(name: str, *owners: dict[str, Any], gpus: int | None = None) -> dict[str, Any]:
    pod = _pod(gpus)
    metadata: dict[str, Any] = {"name": name, "namespace": "team-vision"}
    if owners:
        metadata["ownerReferences"] = list(owners)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": {"template": {"spec": pod["spec"]}}}


def _update(user: str) -> dict[str, Any]:
    return {"operation": "UPDATE", "userInfo": {"username": user}, "namespace": "team-vision"}


def test_a_gpu_job_cannot_hide_under_an_admitted_cpu_job(policy: dict[str, Any], job_policy: dict[str, Any]) -> None:
    """The case the policy exists for: Job A (CPU only) is admitted; Job B asks for GPUs and names A its controller.
    Kueue would leave B running unsuspended, and B's pods, made by the job controller for a batch Job, pass the pod
    policy: only the job-owner policy stands in the way, and it refuses B."""
    job_a = _job("a")
    assert _review(job_policy, _create(TEAM_USER), job_a) == []  # a plain job: Kueue queues it
    job_b = _job("b", _owner("batch/v1", "Job", "a"), gpus=8)
    assert _review(job_policy, _create(TEAM_USER), job_b) != []
    pod_of_b = _pod(8, owner=("batch/v1", "Job"))
    assert _review(policy, _create(JOB_CONTROLLER), pod_of_b) == []  # why the pod policy alone is not enough


@pytest.mark.parametrize(
    ("case", "user", "job", "admitted"),
    [
        ("job without owner", TEAM_USER, _job("j"), True),
        ("job naming a Job its controller", TEAM_USER, _job("j", _owner("batch/v1", "Job", "a")), False),
        ("job naming a JobSet its controller", TEAM_USER, _job("j", _owner("jobset.x-k8s.io/v1alpha2", "JobSet", "s")),
         False),
        ("team service account", "system:serviceaccount:team-vision:runner",
         _job("j", _owner("batch/v1", "Job", "a")), False),
        ("service account of a namespace named like a trusted one", "system:serviceaccount:kube-systemx:x",
         _job("j", _owner("batch/v1", "Job", "a")), False),
        # Kueue follows controller references only (metav1.GetControllerOf): other owners are free.
        ("owner that is not the controller", TEAM_USER, _job("j", _owner("v1", "ConfigMap", "c", controller=False)),
         True),
        ("owner without a controller field", TEAM_USER, _job("j", _owner("batch/v1", "Job", "a", controller=None)),
         True),
        ("CronJob's job by its controller", CRONJOB_CONTROLLER, _job("j", _owner("batch/v1", "CronJob", "nightly")),
         True),
        # Kueue follows only owners it knows (v0.19.2 FindAncestorJobManagedByKueue stops where isKnownOwner says no):
        # a job under an Argo Workflow or a Kubeflow Pipelines run is queued on its own, so their controllers (not
        # trusted here) may make them.
        ("Argo Workflow's job", "system:serviceaccount:argo:argo-workflow-controller",
         _job("j", _owner("argoproj.io/v1alpha1", "Workflow", "wf")), True),
        ("Kubeflow Pipelines run's job", "system:serviceaccount:kubeflow:ml-pipeline-scheduledworkflow",
         _job("j", _owner("kubeflow.org/v1beta1", "ScheduledWorkflow", "run")), True),
        ("a person naming a Workflow the controller", TEAM_USER, _job("j", _owner("argoproj.io/v1alpha1", "Workflow",
                                                                                  "wf")), True),
        # ...but every kind it follows is refused, a Job under a Job (the nested case) first of all, at any version.
        ("job naming a Job of another version", TEAM_USER, _job("j", _owner("batch/v2", "Job", "a")), False),
        ("job naming a PyTorchJob", TEAM_USER, _job("j", _owner("kubeflow.org/v1", "PyTorchJob", "t")), False),
        ("job naming a ReplicaSet", TEAM_USER, _job("j", _owner("apps/v1", "ReplicaSet", "r")), False),
        ("job naming a Pod", TEAM_USER, _job("j", _owner("v1", "Pod", "p")), False),
        ("job naming an AppWrapper", TEAM_USER, _job("j", _owner("workload.codeflare.dev/v1beta2", "AppWrapper",
                                                                 "w")), False),
        ("kube-controller-manager itself", gpu_admission.CONTROLLER_MANAGER, _job("j", _owner("batch/v1", "Job", "a")),
         True),
    ],
)  # fmt: skip
def test_only_trusted_controllers_create_owned_jobs(
    job_policy: dict[str, Any], case: str, user: str, job: dict[str, Any], admitted: bool
) -> None:
    failed = _review(job_policy, _create(user), job)
    assert (failed == []) is admitted, (case, failed)


@pytest.mark.parametrize(
    ("case", "user", "old", "new", "admitted"),
    [
        ("adding a controller owner", TEAM_USER, _job("b"), _job("b", _owner("batch/v1", "Job", "a")), False),
        ("pointing the controller at another job", TEAM_USER, _job("b", _owner("batch/v1", "Job", "a")),
         _job("b", _owner("batch/v1", "Job", "c")), False),
        ("turning an owner into the controller", TEAM_USER, _job("b", _owner("batch/v1", "Job", "a", controller=False)),
         _job("b", _owner("batch/v1", "Job", "a")), False),
        ("relabelling an owned job", TEAM_USER, _job("b", _owner("batch/v1", "CronJob", "n")),
         {**_job("b", _owner("batch/v1", "CronJob", "n")), "spec": {"suspend": True}}, True),
        ("removing the owner", GC, _job("b", _owner("batch/v1", "CronJob", "n")), _job("b"), True),
        ("removing the owner, by a person", TEAM_USER, _job("b", _owner("batch/v1", "CronJob", "n")), _job("b"),
         True),
        ("adding a non-controller owner", TEAM_USER, _job("b"), _job("b", _owner("v1", "ConfigMap", "c",
                                                                                 controller=False)), True),
        ("a controller adding the owner", CRONJOB_CONTROLLER, _job("b"), _job("b", _owner("batch/v1", "CronJob", "n")),
         True),
        ("moving a job from a Workflow to a Job", TEAM_USER, _job("b", _owner("argoproj.io/v1alpha1", "Workflow", "w")),
         _job("b", _owner("batch/v1", "Job", "a")), False),
        ("adding a Workflow as controller", TEAM_USER, _job("b"),
         _job("b", _owner("argoproj.io/v1alpha1", "Workflow", "w")), True),
    ],
)  # fmt: skip
def test_only_trusted_controllers_set_owners_later(
    job_policy: dict[str, Any], case: str, user: str, old: dict[str, Any], new: dict[str, Any], admitted: bool
) -> None:
    failed = _review(job_policy, _update(user), new, old)
    assert (failed == []) is admitted, (case, failed)


def test_job_owner_policy_covers_every_kueue_job_kind_in_team_namespaces(
    stacks: dict[str, Stack], job_policy: dict[str, Any]
) -> None:
    spec = job_policy["spec"]
    assert spec["failurePolicy"] == "Fail" and "matchConditions" not in spec
    rules = spec["matchConstraints"]["resourceRules"]
    assert all(r["operations"] == ["CREATE", "UPDATE"] and r["apiVersions"] == ["*"] for r in rules)
    covered = {(group, resource) for r in rules for group in r["apiGroups"] for resource in r["resources"]}
    assert ("batch", "jobs") in covered
    assert covered == {("batch", "jobs")}  # the reference fleet names no job operator: Kueue manages batch Jobs
    selector = spec["matchConstraints"]["namespaceSelector"]
    assert _selects(selector, {"kubernetes.io/metadata.name": "team-vision", "dlinfra.io/team": "vision"})
    assert not _selects(selector, {"kubernetes.io/metadata.name": "kube-system", "dlinfra.io/team": "x"})
    (binding,) = [
        b
        for b in stacks["prod-us-west-2"].of_type(BINDING)
        if b.inputs["spec"]["policyName"] == gpu_admission.JOB_OWNERS_POLICY_NAME
    ]
    assert binding.inputs["spec"] == {"policyName": gpu_admission.JOB_OWNERS_POLICY_NAME, "validationActions": ["Deny"]}
    assert stacks["prod-us-west-2"].by_name["platform-job-owners"].urn in binding.dependencies


# --- job operators the fleet names: Kueue queues their kinds, the policies trust their namespaces -----------------
KUBERAY = "system:serviceaccount:ray-system:kuberay-operator"
JOBSET = "system:serviceaccount:jobset-system:jobset-controller-manager"


@pytest.fixture(scope="module")
def with_operators(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    """prod-eu-west-1 with JobSet and KubeRay installed by the lab (kubernetes.job_operators)."""
    import shutil

    import yaml

    from dlinfra.model import stackroles
    from dlinfra.model.fleet.load import load_fleet
    from dlinfra.offline import engine
    from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

    tmp = tmp_path_factory.mktemp("operators")
    data = yaml.safe_load(REFERENCE_FLEET.read_text())
    data["environments"]["prod"]["kubernetes"]["job_operators"] = {"kuberay": "ray-system", "jobset": "jobset-system"}
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    shutil.copy(REFERENCE_LOCK, tmp / "cidr-lock.yaml")
    config = {"dlinfra:fleet": str(path), "dlinfra:lock": str(tmp / "cidr-lock.yaml")}
    fleet = load_fleet(path).fleet
    roles = [r for r in stackroles.roles(fleet) if r.name in ("prod-eu-west-1", "prod-eu-west-1-k8s")]
    results = {r.role.name: r for r in engine.run_all(ROOT, roles, project="dlinfra", config=config)}
    return Stack(results["prod-eu-west-1"], results["prod-eu-west-1-k8s"])


def _declared(stack: Stack, name: str) -> dict[str, Any]:
    (declared,) = [p for p in stack.of_type(POLICY) if p.inputs["metadata"]["name"] == name]
    return dict(declared.inputs)


def test_named_operators_kinds_are_queued_and_their_controllers_trusted(with_operators: Stack) -> None:
    import yaml

    config = yaml.safe_load(with_operators.release("kueue")["values"]["managerConfig"]["controllerManagerConfigYaml"])
    assert config["integrations"]["frameworks"][:4] == [
        "batch/job", "jobset.x-k8s.io/jobset", "ray.io/rayjob", "ray.io/raycluster"
    ]  # fmt: skip
    pods = _declared(with_operators, gpu_admission.POLICY_NAME)
    ray_pod = _pod(owner=("ray.io/v1", "RayCluster"))
    assert _review(pods, _create(KUBERAY), ray_pod) == []  # KubeRay makes a RayCluster's pods
    assert _review(pods, _create(TEAM_USER), ray_pod) != []
    jobs = _declared(with_operators, gpu_admission.JOB_OWNERS_POLICY_NAME)
    rules = jobs["spec"]["matchConstraints"]["resourceRules"]
    covered = {(group, resource) for r in rules for group in r["apiGroups"] for resource in r["resources"]}
    assert covered == {("batch", "jobs"), ("jobset.x-k8s.io", "jobsets"), ("ray.io", "rayjobs"),
                       ("ray.io", "rayclusters")}  # fmt: skip
    child = _job("worker", _owner("jobset.x-k8s.io/v1alpha2", "JobSet", "train"), gpus=8)
    assert _review(jobs, _create(JOBSET), child) == []  # the JobSet controller makes a JobSet's Jobs
    assert _review(jobs, _create(TEAM_USER), child) != []


def test_an_operator_the_fleet_does_not_name_is_not_trusted(stacks: dict[str, Stack]) -> None:
    """Reference fleet: no operator named, so a KubeRay installed by hand in ray-system makes no GPU pod."""
    pods = _declared(stacks["prod-eu-west-1"], gpu_admission.POLICY_NAME)
    assert _review(pods, _create(KUBERAY), _pod(owner=("ray.io/v1", "RayCluster"))) != []


def test_a_pod_admitted_before_the_toleration_rule_can_still_be_updated(policy: dict[str, Any]) -> None:
    """On an update only added tolerations are judged: a pod that already tolerated everything loses its finalizers
    (the job controller's, Kueue's) as before; adding a health toleration is refused."""
    old = _tolerating(_pod(owner=("batch/v1", "Job")), {"operator": "Exists"})
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = []
    update = {"operation": "UPDATE", "userInfo": {"username": JOB_CONTROLLER}, "namespace": "team-vision"}
    assert _review(policy, update, new, old) == []
    added = copy.deepcopy(old)
    added["spec"]["tolerations"].append({"key": "dlinfra.io/gpu-unhealthy", "operator": "Exists"})
    (refused,) = _review(policy, update, added, old)
    assert "may not tolerate the GPU health taints" in refused


@pytest.fixture(scope="module")
def job_tolerations_policy(stacks: dict[str, Stack]) -> dict[str, Any]:
    (declared,) = [
        p
        for p in stacks["prod-us-west-2"].of_type(POLICY)
        if p.inputs["metadata"]["name"] == gpu_admission.JOB_TOLERATIONS_POLICY_NAME
    ]
    return dict(declared.inputs)


def _job_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"template": pod}}


@pytest.mark.parametrize(
    ("pod", "admitted"),
    [
        (_tolerating(_pod(), {"operator": "Exists"}), False),
        (_tolerating(_pod(), {"key": "dlinfra.io/gpu-burn-in", "operator": "Exists"}), False),
        (_tolerating(_pod(), {"key": "nvidia.com/gpu", "operator": "Exists"}), True),
        (_tolerating(_pod(None), {"operator": "Exists"}), True),  # asks for no GPU: not this policy's
    ],
)
def test_a_gpu_job_tolerating_the_health_taints_is_refused_at_submission(
    job_tolerations_policy: dict[str, Any], pod: dict[str, Any], admitted: bool
) -> None:
    """Kueue would admit it and provision nodes for pods the pod policy then refuses: refused before that."""
    assert (_review(job_tolerations_policy, _create(TEAM_USER), _job_of(pod)) == []) is admitted
