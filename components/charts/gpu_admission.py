"""The backstop behind Kueue: a ValidatingAdmissionPolicy that refuses, in team namespaces, every pod asking for
GPUs that would start without Kueue's admission.

Kueue's pod webhook gates such pods (components/charts/kueue.py KUEUE_POD_FRAMEWORKS), but a webhook can be
misconfigured, and a pod that names an owner Kueue manages is left ungated by it (jobframework
FindAncestorJobManagedByKueue): anyone may write any ownerReference. The API server evaluates this policy itself
(Kubernetes docs, "Validating Admission Policy", GA in 1.30), after every mutating webhook, so it sees the gate Kueue
added and cannot be skipped. A ResourceQuota cannot do the job: it counts a pod Kueue admitted exactly like one that
bypassed Kueue (its scopes are priority class, QoS and termination, never scheduling gates: Kubernetes docs
"Resource Quotas"), so any cap it set would either block admitted work or let bypassing work through.

A GPU pod in a team namespace is admitted when
- it carries Kueue's scheduling gate: Kueue removes it only when the pod's workload is admitted, or
- a controller of the cluster, of an add-on, or of a job operator the fleet names (dlinfra.model.job_operators)
  made it for a job kind Kueue manages, and Kueue holds that job suspended until admitted (batch Jobs, and the
  JobSet, Kubeflow and Ray kinds of named operators only): their controllers make pods only for a running job.
  A person cannot pass for such a controller: EKS access entries refuse user names starting with "system:" (EKS
  user guide, "Create access entries"), and the `edit` role lets a team impersonate only its own namespace's
  service accounts (and validate refuses an operator in a team's namespace).
Only Kueue's controller may remove the gate afterwards. And a pod Kueue queues as a pod may not name the `overflow`
queue: MultiKueue workers grant the manager the job kinds only (components/charts/multikueue.py), so such a pod
would hold the team's overflow quota without ever running.

The trust in those controllers' pods holds only while every such job was itself queued, and Kueue queues a job only
when no ancestor it manages owns it: its job webhook leaves a job unsuspended when FindAncestorJobManagedByKueue
finds one through controller ownerReferences (Kueue v0.19.2 pkg/controller/jobframework/utils.go
WorkloadShouldBeSuspended, which counts the child in the ancestor's workload), and its reconciler suspends a child
only while that ancestor is not admitted (reconciler.go shouldSuspendChildJob). A team member could create a
CPU-only Job, wait for its admission, then a GPU Job naming it as controller: the job controller would make the GPU
pods, and the pod policy would trust them. So a second policy (JOB_OWNERS_POLICY_NAME) lets only the controllers
trusted above create a job of a kind Kueue manages with a controller ownerReference to a kind Kueue follows up
the chain (KUEUE_FOLLOWED_OWNERS), or add or change one; owners Kueue never follows (an Argo Workflow's, a
Kubeflow Pipelines run's) stay free, since Kueue queues such a job on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi_kubernetes as k8s

from components.charts.kueue import ADMISSION_GATE, framework_resources
from dlinfra.model.fleet.labels import GPU_HEALTH_TAINT_KEYS
from dlinfra.model.kueue import OVERFLOW_QUEUE

POLICY_NAME = "dlinfra-gpu-pods-through-kueue"
JOB_OWNERS_POLICY_NAME = "dlinfra-job-owners-set-by-controllers"
JOB_TOLERATIONS_POLICY_NAME = "dlinfra-gpu-jobs-tolerate-no-health-taint"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GPU_RESOURCE_PREFIX = "nvidia.com/"  # nvidia.com/gpu, and the MIG or shared resources the device plugin may offer
# Kueue's controller: the chart's service account "<release>-controller-manager" (release "kueue", addons.yaml
# namespace kueue-system; charts/kueue/templates/rbac/service_account.yaml).
KUEUE_CONTROLLER = "system:serviceaccount:kueue-system:kueue-controller-manager"
# kube-controller-manager's own identity, should it run without per-controller service accounts
# (--use-service-account-credentials); EKS runs each controller as kube-system:<controller>.
CONTROLLER_MANAGER = "system:kube-controller-manager"

# For each job kind Kueue may manage (dlinfra.model.job_operators): the controller object its pods belong to, as
# (API group, kind). JobSets and TrainJobs run their pods through batch Jobs, RayJobs through a RayCluster.
POD_OWNERS: Mapping[str, tuple[str, str]] = {
    "batch/job": ("batch", "Job"),
    "jobset.x-k8s.io/jobset": ("batch", "Job"),
    "kubeflow.org/pytorchjob": ("kubeflow.org", "PyTorchJob"),
    "kubeflow.org/mpijob": ("kubeflow.org", "MPIJob"),
    "trainer.kubeflow.org/trainjob": ("batch", "Job"),
    "ray.io/rayjob": ("ray.io", "RayCluster"),
    "ray.io/raycluster": ("ray.io", "RayCluster"),
}

# The controller owners Kueue follows up from a job (Kueue v0.19.2, the release dlinfra/data/addons.yaml pins), as
# (API group, kind): FindAncestorJobManagedByKueue (pkg/controller/jobframework/reconciler.go) stops at the first
# controller owner that isKnownOwner (integrationmanager.go) does not know. It knows the job types of every
# integration Kueue registers, enabled or not (pkg/controller/jobs/*: each RegisterIntegration's JobType; the
# version each is registered at follows it), the external frameworks its configuration names (dlinfra names none:
# components/charts/kueue.py), and apps/v1 ReplicaSet. Kueue compares apiVersion and kind exactly; the policy
# matches any version of the group, so a Kueue that moves a kind to a new version stays covered. A job owned by
# anything else (an Argo Workflow, a Kubeflow Pipelines run) is queued on its own, and its owner is left free.
KUEUE_FOLLOWED_OWNERS: tuple[tuple[str, str], ...] = (
    ("", "Pod"),  # v1: pod
    ("apps", "Deployment"),  # apps/v1: deployment
    ("apps", "StatefulSet"),  # apps/v1: statefulset
    ("apps", "ReplicaSet"),  # apps/v1: no integration, known so that Deployments' pods reach them
    ("batch", "Job"),  # batch/v1: batch/job
    ("jobset.x-k8s.io", "JobSet"),  # v1alpha2
    ("kubeflow.org", "JAXJob"),  # v1 (training-operator v1.9.3)
    ("kubeflow.org", "PaddleJob"),  # v1
    ("kubeflow.org", "PyTorchJob"),  # v1
    ("kubeflow.org", "TFJob"),  # v1
    ("kubeflow.org", "XGBoostJob"),  # v1
    ("kubeflow.org", "MPIJob"),  # v2beta1 (mpi-operator v0.8.2)
    ("trainer.kubeflow.org", "TrainJob"),  # v1alpha1 (trainer v2.2.1)
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"),  # v1
    ("ray.io", "RayCluster"),  # v1 (kuberay v1.6.2)
    ("ray.io", "RayJob"),  # v1
    ("ray.io", "RayService"),  # v1
    ("sparkoperator.k8s.io", "SparkApplication"),  # v1beta2
    ("workload.codeflare.dev", "AppWrapper"),  # v1beta2
)


def _asks_gpu(containers: str) -> str:
    """CEL: does a container of this list request or limit a GPU resource? (Extended resources need no request:
    a limit alone sets it, Kubernetes docs "Resource Management for Pods and Containers".)"""
    names = f"r.startsWith('{GPU_RESOURCE_PREFIX}')"
    return (
        f"{containers}.exists(c, has(c.resources) && ("
        f"(has(c.resources.limits) && c.resources.limits.exists(r, {names})) || "
        f"(has(c.resources.requests) && c.resources.requests.exists(r, {names}))))"
    )


def _gated(pod: str) -> str:
    return f"has({pod}.spec.schedulingGates) && {pod}.spec.schedulingGates.exists(g, g.name == '{ADMISSION_GATE}')"


def asks_gpu(pod: str) -> str:
    """CEL: the pod (or pod template) at `pod` asks for GPUs, in a container or an init container."""
    return f"{_asks_gpu(f'{pod}.spec.containers')} || " + (
        f"(has({pod}.spec.initContainers) && {_asks_gpu(f'{pod}.spec.initContainers')})"
    )


def match_condition() -> str:
    """CEL: the pod asks for GPUs, in a container or an init container."""
    return asks_gpu("object")


def _by_controller(controller_namespaces: Sequence[str]) -> str:
    """CEL: is the requester kube-controller-manager or a service account of a trusted controller namespace?"""
    if not controller_namespaces:
        raise ValueError("controller_namespaces: name at least kube-system, where the job controller runs")
    namespaces = ", ".join(f"'{ns}'" for ns in sorted(controller_namespaces))
    return (
        f"request.userInfo.username == '{CONTROLLER_MANAGER}' || [{namespaces}].exists(ns, "
        "request.userInfo.username.startsWith('system:serviceaccount:' + ns + ':'))"
    )


def variables(controller_namespaces: Sequence[str], frameworks: Sequence[str]) -> dict[str, str]:
    """The policy's named CEL expressions, in order (each may use those before it)."""
    owners = " || ".join(
        f"(o.apiVersion.startsWith('{group}/') && o.kind == '{kind}')"
        for group, kind in sorted(set(pod_owners(frameworks)))
    )
    return {
        "gated": _gated("object"),
        "wasGated": f"request.operation == 'UPDATE' && {_gated('oldObject')}",  # oldObject: UPDATE only
        "byController": _by_controller(controller_namespaces),
        "forQueuedJob": (
            "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, "
            f"has(o.controller) && o.controller && ({owners}))"
        ),
    }


def team_matches(
    namespace_selector: Mapping[str, Any], group: str, resource: str
) -> k8s.admissionregistration.v1.MatchResourcesArgs:
    """Creates and updates of `resource` (v1 of `group`) in the namespaces the selector picks (the team ones)."""
    admission = k8s.admissionregistration.v1
    return admission.MatchResourcesArgs(
        namespace_selector=selector_args(namespace_selector),
        resource_rules=[
            admission.NamedRuleWithOperationsArgs(
                api_groups=[group], api_versions=["v1"], operations=["CREATE", "UPDATE"], resources=[resource]
            )
        ],
    )


def health_tolerations(obj: str, old: str, template: str = "") -> tuple[str, str]:
    """(CEL, message): the pod (or the pod template at `template`) tolerates neither a GPU health taint nor every
    taint (operator Exists without a key). On an update only the tolerations it adds are judged: a pod's tolerations
    may only grow, and a pod admitted before this rule must still be able to lose its finalizers."""
    spec, old_spec = f"{obj}{template}.spec", f"{old}{template}.spec"
    health = "[" + ", ".join(f"'{k}'" for k in GPU_HEALTH_TAINT_KEYS) + "]"
    keyless = "(!has(t.key) || t.key == '') && has(t.operator) && t.operator == 'Exists'"
    bad = f"((has(t.key) ? t.key : '') in {health} || ({keyless}))"
    added = (
        f"{spec}.tolerations.filter(t, request.operation != 'UPDATE' || !has({old_spec}.tolerations) || "
        f"!(t in {old_spec}.tolerations))"
    )
    return (
        f"!has({spec}.tolerations) || {added}.all(t, !{bad})",
        "a pod that requests GPUs in a team namespace may not tolerate the GPU health taints "
        f"({', '.join(GPU_HEALTH_TAINT_KEYS)}), nor every taint (operator Exists without a key): it would start "
        "on GPUs that have not passed, or have failed, their check (docs/gpu-health.md)",
    )


def job_tolerations_policy_spec(
    namespace_selector: Mapping[str, Any],
) -> k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgs:
    """The same rule on batch Jobs that ask for GPUs, at submission: Kueue would admit such a Job and provision its
    nodes, and only then would its pods be refused, holding quota and nodes until waitForPodsReady evicts it."""
    admission = k8s.admissionregistration.v1
    expression, message = health_tolerations("object", "oldObject", ".spec.template")
    return admission.ValidatingAdmissionPolicySpecArgs(
        failure_policy="Fail",
        match_constraints=team_matches(namespace_selector, "batch", "jobs"),
        match_conditions=[
            admission.MatchConditionArgs(name="requests-gpus", expression=asks_gpu("object.spec.template"))
        ],
        validations=[
            admission.ValidationArgs(
                expression=expression, message=message.replace("a pod that", "a Job whose pods"), reason="Forbidden"
            )
        ],
    )


def validations() -> list[tuple[str, str]]:
    """(CEL expression, message) of each rule a matching pod must pass."""
    return [
        (
            "request.operation != 'CREATE' || variables.gated || (variables.byController && variables.forQueuedJob)",
            "a pod that requests GPUs in a team namespace must be admitted by Kueue: it has no "
            f"{ADMISSION_GATE} scheduling gate and was not made by a controller for a job Kueue manages; "
            "submit it as a Job (or a kind of a job operator the fleet names), or as a Pod, Deployment or StatefulSet "
            "that Kueue queues",
        ),
        (
            f"request.operation != 'CREATE' || !variables.gated || !has(object.metadata.labels) || "
            f"!('{QUEUE_LABEL}' in object.metadata.labels) || "
            f"object.metadata.labels['{QUEUE_LABEL}'] != '{OVERFLOW_QUEUE}'",
            f"the {OVERFLOW_QUEUE} queue takes jobs (batch Jobs and the kinds of named job operators), not Pods, "
            "Deployments or StatefulSets: other regions run none of those for this one; use the default queue",
        ),
        (
            "request.operation != 'UPDATE' || !variables.wasGated || variables.gated || "
            f"request.userInfo.username == '{KUEUE_CONTROLLER}'",
            f"only Kueue removes the {ADMISSION_GATE} scheduling gate, when it admits the pod",
        ),
        health_tolerations("object", "oldObject"),
    ]


def pod_owners(frameworks: Sequence[str]) -> list[tuple[str, str]]:
    """The controllers whose ungated GPU pods are trusted: one per job kind Kueue manages."""
    missing = [f for f in frameworks if f not in POD_OWNERS]
    if missing:
        raise ValueError(f"POD_OWNERS: no pod owner for Kueue frameworks {missing}")
    return [POD_OWNERS[f] for f in frameworks]


def policy_spec(
    namespace_selector: Mapping[str, Any], controller_namespaces: Sequence[str], frameworks: Sequence[str]
) -> k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgs:
    """The policy over pod creates and updates in the namespaces the selector picks (the team namespaces)."""
    admission = k8s.admissionregistration.v1
    return admission.ValidatingAdmissionPolicySpecArgs(
        # Fail closed: a policy that cannot be evaluated refuses (the default, spelled out).
        failure_policy="Fail",
        match_constraints=team_matches(namespace_selector, "", "pods"),
        match_conditions=[admission.MatchConditionArgs(name="requests-gpus", expression=match_condition())],
        variables=[
            admission.VariableArgs(name=name, expression=expression)
            for name, expression in variables(controller_namespaces, frameworks).items()
        ],
        validations=[
            admission.ValidationArgs(expression=expression, message=message, reason="Forbidden")
            for expression, message in validations()
        ],
    )


def binding_spec(
    policy_name: str = POLICY_NAME,
) -> k8s.admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgs:
    """Enforce a policy: refuse, never only warn or audit."""
    return k8s.admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgs(
        policy_name=policy_name, validation_actions=["Deny"]
    )


# --- who may make a job another job's child ----------------------------------------------------------------------
def job_owner_variables(controller_namespaces: Sequence[str]) -> dict[str, str]:
    """The job-owner policy's named CEL expressions. Kueue follows controller references only
    (FindAncestorJobManagedByKueue walks metav1.GetControllerOf), and only to owners it knows
    (KUEUE_FOLLOWED_OWNERS), so other ownerReferences stay free; removing one is free too (the garbage collector
    does, and a job without an owner is queued on its own)."""
    same = "p.apiVersion == o.apiVersion && p.kind == o.kind && p.name == o.name && p.uid == o.uid"
    followed = " || ".join(f"({_in_group('o', group)} && o.kind == '{kind}')" for group, kind in KUEUE_FOLLOWED_OWNERS)
    return {
        "byController": _by_controller(controller_namespaces),
        "newControllerOwner": (
            "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, "
            f"has(o.controller) && o.controller && ({followed}) && !(request.operation == 'UPDATE' && "
            "has(oldObject.metadata.ownerReferences) && oldObject.metadata.ownerReferences.exists(p, "
            f"has(p.controller) && p.controller && {same})))"
        ),
    }


def _in_group(ref: str, group: str) -> str:
    """CEL: does the ownerReference's apiVersion name this API group (any version; "" is the core group, "v1")?"""
    return f"!{ref}.apiVersion.contains('/')" if not group else f"{ref}.apiVersion.startsWith('{group}/')"


def job_owner_validations() -> list[tuple[str, str]]:
    """(CEL expression, message) of the job-owner policy's one rule."""
    return [
        (
            "!variables.newControllerOwner || variables.byController",
            "only a trusted controller may create a job whose controller ownerReference names a kind Kueue "
            "follows (its job kinds, Pods, Deployments, StatefulSets, ReplicaSets), or add or change one: Kueue "
            "leaves a job whose owner it manages unsuspended and uncounted, so it would run outside the team's "
            "quota; submit the job on its own (it is queued) or through its operator",
        )
    ]


def job_owner_policy_spec(
    namespace_selector: Mapping[str, Any], controller_namespaces: Sequence[str], frameworks: Sequence[str]
) -> k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgs:
    """The policy over creates and updates of every job kind Kueue manages (`frameworks`, "<group>/<kind>") in the
    namespaces the selector picks. A rule may name a resource whose CRD is not installed: it then matches nothing."""
    admission = k8s.admissionregistration.v1
    return admission.ValidatingAdmissionPolicySpecArgs(
        failure_policy="Fail",  # fail closed
        match_constraints=admission.MatchResourcesArgs(
            namespace_selector=selector_args(namespace_selector),
            resource_rules=[
                admission.NamedRuleWithOperationsArgs(
                    api_groups=[group], api_versions=["*"], operations=["CREATE", "UPDATE"], resources=[resource]
                )
                for group, resource in framework_resources(frameworks)
            ],
        ),
        variables=[
            admission.VariableArgs(name=name, expression=expression)
            for name, expression in job_owner_variables(controller_namespaces).items()
        ],
        validations=[
            admission.ValidationArgs(expression=expression, message=message, reason="Forbidden")
            for expression, message in job_owner_validations()
        ],
    )


def selector_args(selector: Mapping[str, Any]) -> k8s.meta.v1.LabelSelectorArgs:
    """A label selector as Kueue's configuration spells it (matchExpressions only) as the SDK's Args."""
    if set(selector) != {"matchExpressions"}:
        raise ValueError(f"namespace_selector: expected matchExpressions only, got {sorted(selector)}")
    return k8s.meta.v1.LabelSelectorArgs(
        match_expressions=[
            k8s.meta.v1.LabelSelectorRequirementArgs(key=e["key"], operator=e["operator"], values=e.get("values"))
            for e in selector["matchExpressions"]
        ]
    )
