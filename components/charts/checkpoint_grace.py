"""The cap on a job's checkpoint grace: a ValidatingAdmissionPolicy that refuses, in team namespaces, a pod whose
terminationGracePeriodSeconds exceeds the checkpoint_grace of the pool it runs on.

A job says how long it needs to checkpoint with its pods' own terminationGracePeriodSeconds: the kubelet sends
SIGTERM, waits up to that many seconds, then SIGKILL (Kubernetes docs, "Pod Lifecycle", termination of Pods). Every
voluntary disruption waits that long (the termination handler's drain, the termination hook, the autoscaler's
scale-down), and each is sized from the fleet's per-pool checkpoint_grace. A pod asking for more than its pool's
cap would outlast them and be killed mid-checkpoint, so it is refused at the door instead, where its author sees why.

Which pool: the `dlinfra.io/pool` node selector, which every node carries (components/nodepool.py node_labels) and
Kueue's ResourceFlavor nodeLabels inject into the pod when it admits the workload (Kueue docs, "Resource Flavor":
nodeLabels are added to the pod's nodeSelector). Kueue injects it into a plain pod by an UPDATE when it ungates it
(the pod's scheduling gates and node selector may change while it is gated: Kubernetes docs "Pod Scheduling
Readiness"), so UPDATEs that change the pool are checked as well as CREATEs. A GPU pod with no pool selector (not
admitted yet, or placed by affinity) may land on any GPU pool: it is capped by the largest GPU pool grace of the
region. Other updates are let through: terminationGracePeriodSeconds cannot change on a pod (it is immutable after
creation), and a cap lowered in the fleet must not block controllers updating a running pod's metadata (Kueue
removes its finalizers that way).

The API server evaluates the policy itself (ValidatingAdmissionPolicy, GA in Kubernetes 1.30; dlinfra/data/eks.yaml
pins 1.31 and later), failing closed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi_kubernetes as k8s

from components.charts import gpu_admission

POLICY_NAME = "dlinfra-checkpoint-grace-cap"
POOL_LABEL = "dlinfra.io/pool"  # components/nodepool.py node_labels; Kueue flavors select pools by it
DEFAULT_GRACE = 30  # the kubelet's default terminationGracePeriodSeconds (core/v1 PodSpec)


def _pool_of(obj: str) -> str:
    """CEL: the pool the pod's node selector names, or '' when it names none."""
    return (
        f"has({obj}.spec.nodeSelector) && '{POOL_LABEL}' in {obj}.spec.nodeSelector ? "
        f"{obj}.spec.nodeSelector['{POOL_LABEL}'] : ''"
    )


def _caps_literal(caps: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"'{pool}': {grace}" for pool, grace in sorted(caps.items())) + "}"


def gpu_cap(caps: Mapping[str, int], gpu_pools: Sequence[str]) -> int | None:
    """The cap for a GPU pod with no pool selector: the largest among the region's GPU pools (None: no GPU pool)."""
    return max((caps[p] for p in gpu_pools), default=None)


def variables(caps: Mapping[str, int], gpu_pools: Sequence[str]) -> dict[str, str]:
    """The policy's named CEL expressions, in order (each may use those before it)."""
    unknown = sorted(set(gpu_pools) - set(caps))
    if unknown:
        raise ValueError(f"gpu_pools: {unknown} have no checkpoint grace in caps")
    for pool in caps:
        if "'" in pool or "\\" in pool:
            raise ValueError(f"caps: pool name {pool!r} cannot be quoted in CEL")
    largest = gpu_cap(caps, gpu_pools)
    return {
        "grace": (
            "has(object.spec.terminationGracePeriodSeconds) ? object.spec.terminationGracePeriodSeconds : "
            f"{DEFAULT_GRACE}"
        ),
        "pool": _pool_of("object"),
        # oldObject is null on CREATE.
        "poolChanged": f"request.operation == 'CREATE' || variables.pool != ({_pool_of('oldObject')})",
        "caps": _caps_literal(caps),
        "asksGpu": gpu_admission.match_condition(),
        # A GPU pod without a pool: any GPU pool may take it. No GPU pool in the region: -1, nothing may ask.
        "gpuCap": str(-1 if largest is None else largest),
    }


def validations(caps: Mapping[str, int], gpu_pools: Sequence[str]) -> list[tuple[str, str]]:
    """(CEL expression, message) of the one rule."""
    listed = ", ".join(f"{pool} {grace} s" for pool, grace in sorted(caps.items()))
    largest = gpu_cap(caps, gpu_pools)
    without = f"; a GPU pod with no {POOL_LABEL} selector: {largest} s" if largest is not None else ""
    return [
        (
            "!variables.poolChanged || (variables.pool in variables.caps ? "
            "variables.grace <= variables.caps[variables.pool] : "
            "(!variables.asksGpu || variables.grace <= variables.gpuCap))",
            f"terminationGracePeriodSeconds is above the checkpoint_grace of the pool the pod runs on ({listed}"
            f"{without}): disruptions wait only that long, so the pod would be killed mid-checkpoint. Ask for at "
            "most the pool's grace, or have the fleet raise the pool's checkpoint_grace (docs/jobs.md)",
        )
    ]


def policy_spec(
    namespace_selector: Mapping[str, Any], caps: Mapping[str, int], gpu_pools: Sequence[str]
) -> k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgs:
    """The policy over pod creates and updates in the namespaces the selector picks (the team namespaces).
    `caps`: pool -> checkpoint_grace, every pool of the region; `gpu_pools`: the GPU ones."""
    admission = k8s.admissionregistration.v1
    return admission.ValidatingAdmissionPolicySpecArgs(
        failure_policy="Fail",  # fail closed
        match_constraints=admission.MatchResourcesArgs(
            namespace_selector=gpu_admission.selector_args(namespace_selector),
            resource_rules=[
                admission.NamedRuleWithOperationsArgs(
                    api_groups=[""], api_versions=["v1"], operations=["CREATE", "UPDATE"], resources=["pods"]
                )
            ],
        ),
        variables=[
            admission.VariableArgs(name=name, expression=expression)
            for name, expression in variables(caps, gpu_pools).items()
        ],
        validations=[
            admission.ValidationArgs(expression=expression, message=message, reason="Forbidden")
            for expression, message in validations(caps, gpu_pools)
        ],
    )
