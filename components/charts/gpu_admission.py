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
- a controller of the cluster or of an add-on made it for the job kind that owns it, and Kueue holds that job
  suspended until admitted (batch Jobs, RayClusters, Kubeflow jobs): their controllers make pods only for a running
  job. A person cannot pass for such a controller: EKS access entries refuse user names starting with "system:"
  (EKS user guide, "Create access entries"), and the `edit` role lets a team impersonate only its own namespace's
  service accounts.
Only Kueue's controller may remove the gate afterwards. And a pod Kueue queues as a pod may not name the `overflow`
queue: MultiKueue workers grant the manager the job kinds only (components/charts/multikueue.py), so such a pod
would hold the team's overflow quota without ever running.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi_kubernetes as k8s

from components.charts.kueue import ADMISSION_GATE, KUEUE_FRAMEWORKS
from dlinfra.model.kueue import OVERFLOW_QUEUE

POLICY_NAME = "dlinfra-gpu-pods-through-kueue"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GPU_RESOURCE_PREFIX = "nvidia.com/"  # nvidia.com/gpu, and the MIG or shared resources the device plugin may offer
# Kueue's controller: the chart's service account "<release>-controller-manager" (release "kueue", addons.yaml
# namespace kueue-system; charts/kueue/templates/rbac/service_account.yaml).
KUEUE_CONTROLLER = "system:serviceaccount:kueue-system:kueue-controller-manager"
# kube-controller-manager's own identity, should it run without per-controller service accounts
# (--use-service-account-credentials); EKS runs each controller as kube-system:<controller>.
CONTROLLER_MANAGER = "system:kube-controller-manager"

# For each job kind Kueue manages (KUEUE_FRAMEWORKS): the controller object its pods belong to, as
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


def match_condition() -> str:
    """CEL: the pod asks for GPUs, in a container or an init container."""
    return f"{_asks_gpu('object.spec.containers')} || " + (
        f"(has(object.spec.initContainers) && {_asks_gpu('object.spec.initContainers')})"
    )


def variables(controller_namespaces: Sequence[str]) -> dict[str, str]:
    """The policy's named CEL expressions, in order (each may use those before it)."""
    if not controller_namespaces:
        raise ValueError("controller_namespaces: name at least kube-system, where the job controller runs")
    namespaces = ", ".join(f"'{ns}'" for ns in sorted(controller_namespaces))
    owners = " || ".join(
        f"(o.apiVersion.startsWith('{group}/') && o.kind == '{kind}')" for group, kind in sorted(set(pod_owners()))
    )
    return {
        "gated": _gated("object"),
        "wasGated": f"request.operation == 'UPDATE' && {_gated('oldObject')}",  # oldObject: UPDATE only
        "byController": (
            f"request.userInfo.username == '{CONTROLLER_MANAGER}' || [{namespaces}].exists(ns, "
            "request.userInfo.username.startsWith('system:serviceaccount:' + ns + ':'))"
        ),
        "forQueuedJob": (
            "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, "
            f"has(o.controller) && o.controller && ({owners}))"
        ),
    }


def validations() -> list[tuple[str, str]]:
    """(CEL expression, message) of each rule a matching pod must pass."""
    return [
        (
            "request.operation != 'CREATE' || variables.gated || (variables.byController && variables.forQueuedJob)",
            "a pod that requests GPUs in a team namespace must be admitted by Kueue: it has no "
            f"{ADMISSION_GATE} scheduling gate and was not made by a controller for a job Kueue manages; "
            "submit it as a Job or JobSet, or as a Pod, Deployment or StatefulSet that Kueue queues",
        ),
        (
            f"request.operation != 'CREATE' || !variables.gated || !has(object.metadata.labels) || "
            f"!('{QUEUE_LABEL}' in object.metadata.labels) || "
            f"object.metadata.labels['{QUEUE_LABEL}'] != '{OVERFLOW_QUEUE}'",
            f"the {OVERFLOW_QUEUE} queue takes jobs (batch Jobs, JobSets, Kubeflow and Ray jobs), not Pods, "
            "Deployments or StatefulSets: other regions run none of those for this one; use the default queue",
        ),
        (
            "request.operation != 'UPDATE' || !variables.wasGated || variables.gated || "
            f"request.userInfo.username == '{KUEUE_CONTROLLER}'",
            f"only Kueue removes the {ADMISSION_GATE} scheduling gate, when it admits the pod",
        ),
    ]


def pod_owners() -> list[tuple[str, str]]:
    """The controllers whose ungated GPU pods are trusted: one per job kind Kueue manages."""
    missing = [f for f in KUEUE_FRAMEWORKS if f not in POD_OWNERS]
    if missing:
        raise ValueError(f"POD_OWNERS: no pod owner for Kueue frameworks {missing}")
    return [POD_OWNERS[f] for f in KUEUE_FRAMEWORKS]


def policy_spec(
    namespace_selector: Mapping[str, Any], controller_namespaces: Sequence[str]
) -> k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgs:
    """The policy over pod creates and updates in the namespaces the selector picks (the team namespaces)."""
    admission = k8s.admissionregistration.v1
    return admission.ValidatingAdmissionPolicySpecArgs(
        # Fail closed: a policy that cannot be evaluated refuses (the default, spelled out).
        failure_policy="Fail",
        match_constraints=admission.MatchResourcesArgs(
            namespace_selector=_selector_args(namespace_selector),
            resource_rules=[
                admission.NamedRuleWithOperationsArgs(
                    api_groups=[""], api_versions=["v1"], operations=["CREATE", "UPDATE"], resources=["pods"]
                )
            ],
        ),
        match_conditions=[admission.MatchConditionArgs(name="requests-gpus", expression=match_condition())],
        variables=[
            admission.VariableArgs(name=name, expression=expression)
            for name, expression in variables(controller_namespaces).items()
        ],
        validations=[
            admission.ValidationArgs(expression=expression, message=message, reason="Forbidden")
            for expression, message in validations()
        ],
    )


def binding_spec() -> k8s.admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgs:
    """Enforce the policy: refuse, never only warn or audit."""
    return k8s.admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgs(
        policy_name=POLICY_NAME, validation_actions=["Deny"]
    )


def _selector_args(selector: Mapping[str, Any]) -> k8s.meta.v1.LabelSelectorArgs:
    """A label selector as Kueue's configuration spells it (matchExpressions only) as the SDK's Args."""
    if set(selector) != {"matchExpressions"}:
        raise ValueError(f"namespace_selector: expected matchExpressions only, got {sorted(selector)}")
    return k8s.meta.v1.LabelSelectorArgs(
        match_expressions=[
            k8s.meta.v1.LabelSelectorRequirementArgs(key=e["key"], operator=e["operator"], values=e.get("values"))
            for e in selector["matchExpressions"]
        ]
    )
