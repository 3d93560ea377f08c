"""The cap on a job's checkpoint grace: a ValidatingAdmissionPolicy that refuses, in team namespaces, a pod whose
terminationGracePeriodSeconds exceeds the checkpoint_grace of the pool it runs on.

A job says how long it needs to checkpoint with its pods' own terminationGracePeriodSeconds: the kubelet sends
SIGTERM, waits up to that many seconds, then SIGKILL (Kubernetes docs, "Pod Lifecycle", termination of Pods). Every
voluntary disruption waits that long (the termination handler's drain, the termination hook, the autoscaler's
scale-down), and each is sized from the fleet's per-pool checkpoint_grace. A pod asking for more than its pool's
cap would outlast them and be killed mid-checkpoint, so it is refused at the door instead, where its author sees why.

Which pool: the `dlinfra.io/pool` node selector, which every node carries (components/nodepool.py node_labels; a
site's machines carry site-<site>, capped like a GPU pod naming no pool: dlinfra/render/nodeadm.py) and
Kueue's ResourceFlavor nodeLabels inject into the pod when it admits the workload (Kueue docs, "Resource Flavor":
nodeLabels are added to the pod's nodeSelector). Kueue injects it into a plain pod by an UPDATE when it ungates it
(the pod's scheduling gates and node selector may change while it is gated: Kubernetes docs "Pod Scheduling
Readiness"), so UPDATEs that change the pool are checked as well as CREATEs. A GPU pod with no pool selector (not
admitted yet, or placed by affinity) may be given any GPU pool: it is capped at submission by the smallest GPU pool
grace of the region, so that the pool Kueue picks later can never refuse it. Were it capped by the largest, a pod
refused only once Kueue had admitted it to a smaller pool would hold the quota until waitForPodsReady evicted it,
and be admitted and refused again at each requeue. A job that needs more pins its pool (nodeSelector
`dlinfra.io/pool`), which Kueue honours when it picks a flavor, and is capped by that pool's grace. A pool this
region does not have (a job bound for another region through MultiKueue) is left to that region's policy: no node
here can take it. Other updates are let through: terminationGracePeriodSeconds cannot change on a pod (it is
immutable after creation), and a cap lowered in the fleet must not block controllers updating a running pod's
metadata (Kueue removes its finalizers that way).

Jobs (batch/v1) are checked the same way on their pod template when they are created (suspended, before Kueue
admits them) and when Kueue writes the flavor's pool into the template, so a job is refused at submission, where
its author sees why, not once its pods are created after admission. Other job kinds' pods are checked when their
operator creates them.

The API server evaluates the policy itself (ValidatingAdmissionPolicy, GA in Kubernetes 1.30; dlinfra/data/eks.yaml
pins 1.31 and later), failing closed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi_kubernetes as k8s

from components.charts import gpu_admission

POLICY_NAME = "dlinfra-checkpoint-grace-cap"
JOBS_POLICY_NAME = "dlinfra-checkpoint-grace-cap-jobs"
POOL_LABEL = "dlinfra.io/pool"  # components/nodepool.py node_labels; Kueue flavors select pools by it
DEFAULT_GRACE = 30  # the kubelet's default terminationGracePeriodSeconds (core/v1 PodSpec)


def _pool_of(pod: str) -> str:
    """CEL: the pool the pod's (or pod template's) node selector names, or '' when it names none."""
    return (
        f"has({pod}.spec.nodeSelector) && '{POOL_LABEL}' in {pod}.spec.nodeSelector ? "
        f"{pod}.spec.nodeSelector['{POOL_LABEL}'] : ''"
    )


def _caps_literal(caps: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"'{pool}': {grace}" for pool, grace in sorted(caps.items())) + "}"


def gpu_cap(caps: Mapping[str, int], gpu_pools: Sequence[str]) -> int | None:
    """The cap for a GPU pod with no pool selector: the smallest among the region's GPU pools, so whichever Kueue
    gives it, the pod fits (None: no GPU pool)."""
    return min((caps[p] for p in gpu_pools), default=None)


def variables(caps: Mapping[str, int], gpu_pools: Sequence[str], template: str = "") -> dict[str, str]:
    """The policy's named CEL expressions, in order (each may use those before it). `template`: where the pod spec
    sits in the object ("" for a Pod, ".spec.template" for a Job)."""
    unknown = sorted(set(gpu_pools) - set(caps))
    if unknown:
        raise ValueError(f"gpu_pools: {unknown} have no checkpoint grace in caps")
    for pool in caps:
        if "'" in pool or "\\" in pool:
            raise ValueError(f"caps: pool name {pool!r} cannot be quoted in CEL")
    smallest = gpu_cap(caps, gpu_pools)
    pod, old = f"object{template}", f"oldObject{template}"
    return {
        "grace": (
            f"has({pod}.spec.terminationGracePeriodSeconds) ? {pod}.spec.terminationGracePeriodSeconds : "
            f"{DEFAULT_GRACE}"
        ),
        "pool": _pool_of(pod),
        # oldObject is null on CREATE. An UPDATE is checked when it changes the pool, except Kueue's own that takes
        # it away: Kueue restores a Job's template to its submitted node selector when it evicts or preempts it
        # (RestorePodSetsInfo), and that must never be refused, or the eviction could not finish. Anyone else
        # removing a pin is checked, since the job could then be given a pool with a smaller cap.
        "poolChanged": (
            f"request.operation == 'CREATE' || (variables.pool != ({_pool_of(old)}) && "
            f"(variables.pool != '' || request.userInfo.username != '{gpu_admission.KUEUE_CONTROLLER}'))"
        ),
        "caps": _caps_literal(caps),
        "asksGpu": gpu_admission.asks_gpu(pod),
        # A GPU pod without a pool: any GPU pool may take it. No GPU pool in the region: -1, no cap, since only a
        # site's machines can run it and no cloud disruption source drains them.
        "gpuCap": str(-1 if smallest is None else smallest),
    }


def validations(caps: Mapping[str, int], gpu_pools: Sequence[str]) -> list[tuple[str, str]]:
    """(CEL expression, message) of the one rule."""
    listed = ", ".join(f"{pool} {grace} s" for pool, grace in sorted(caps.items()))
    smallest = gpu_cap(caps, gpu_pools)
    without = (
        f"; a GPU pod with no {POOL_LABEL} selector may be given any GPU pool, so {smallest} s, or pin its pool "
        f"with that selector"
        if smallest is not None
        else ""
    )
    return [
        (
            "!variables.poolChanged || (variables.pool in variables.caps ? "
            "variables.grace <= variables.caps[variables.pool] : "
            "(variables.pool != '' || !variables.asksGpu || variables.gpuCap < 0 || "
            "variables.grace <= variables.gpuCap))",
            f"terminationGracePeriodSeconds is above the checkpoint_grace of the pool the pod runs on ({listed}"
            f"{without}): disruptions wait only that long, so the pod would be killed mid-checkpoint. Ask for at "
            "most the pool's grace, or have the fleet raise the pool's checkpoint_grace (docs/jobs.md)",
        )
    ]


def policy_spec(
    namespace_selector: Mapping[str, Any], caps: Mapping[str, int], gpu_pools: Sequence[str], *, jobs: bool = False
) -> k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgs:
    """The policy over pod (or, with `jobs`, batch/v1 Job) creates and updates in the namespaces the selector picks
    (the team namespaces). `caps`: pool -> checkpoint_grace, every pool of the region; `gpu_pools`: the GPU ones."""
    admission = k8s.admissionregistration.v1
    group, resource, template = ("batch", "jobs", ".spec.template") if jobs else ("", "pods", "")
    return admission.ValidatingAdmissionPolicySpecArgs(
        failure_policy="Fail",  # fail closed
        match_constraints=gpu_admission.team_matches(namespace_selector, group, resource),
        variables=[
            admission.VariableArgs(name=name, expression=expression)
            for name, expression in variables(caps, gpu_pools, template).items()
        ],
        validations=[
            admission.ValidationArgs(expression=expression, message=message, reason="Forbidden")
            for expression, message in validations(caps, gpu_pools)
        ],
    )
