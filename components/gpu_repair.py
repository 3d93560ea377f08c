"""The GPU repair controller, declared as children of the Platform in every in-cluster stack (not a component of its
own): one pod for the cluster that approves the repair of GPU nodes put off work by a failed check or a fault, a
pool's share at a time (the script is components/scripts/gpu_repair.py; dlinfra.model.gpu_health says how the parts
meet).

What it may do is held tight:
- RBAC: list and read nodes and patch them, and create Events; RBAC cannot name "this annotation".
- A ValidatingAdmissionPolicy (ANNOTATION_ONLY_POLICY) can, and refuses it any other change to a node: only the
  annotation REPAIR_ANNOTATION; labels, other annotations, taints, the cordon, owners, finalizers, the rest of spec
  and status stay as they were. An approval is what makes a machine replace or reboot itself, so this one annotation
  is all the controller can do to a node.
One replica, replaced by Recreate: two deciders would each approve up to a pool's share. It runs on cloud nodes (it
needs only the API server), at the cluster-critical priority: while it is away no repair is approved, and nothing
else is lost.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from components import pod_scripts
from components.charts.nodes import CLOUD_NODE_AFFINITY
from components.charts.pinned import SYSTEM_NAMESPACE
from components.scripts import gpu_repair as controller
from components.scripts import kube_api
from dlinfra.model import gpu_health

Options = Callable[..., pulumi.ResourceOptions]
Meta = Callable[..., k8s.meta.v1.ObjectMetaArgs]

NAME = "gpu-repair"  # the controller's ServiceAccount, ConfigMap, NetworkPolicy and Deployment (kube-system)
ROLE = "dlinfra-gpu-repair"  # its ClusterRole and binding
ANNOTATION_ONLY_POLICY = "dlinfra-gpu-repair-annotation-only"
NAMESPACE = SYSTEM_NAMESPACE
SERVICE_ACCOUNT_USER = f"system:serviceaccount:{NAMESPACE}:{NAME}"
FILES = pod_scripts.script_files(kube_api, controller)
SCRIPTS_ANNOTATION = "dlinfra.io/scripts-sha256"
LABELS = {"app.kubernetes.io/name": NAME}
TOKEN_SECONDS = 3600  # the kubelet renews a projected token at 80% of its life; the controller reads it per call


def check_shares(shares: Mapping[str, float]) -> None:
    """Each pool's share of its nodes in repair at once must be in (0, 1]."""
    for pool, share in shares.items():
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise ValueError(f"shares: pool {pool}: a share of its nodes in repair at once, in (0, 1], got {share!r}")


def cluster_role_rules() -> list[dict[str, Any]]:
    """Nodes: list, read and patch (ANNOTATION_ONLY_POLICY narrows the patch to one annotation); Events: create."""
    return [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]


def _field(obj: str, path: str, empty: str) -> str:
    """`obj.path`, or `empty` where the field is absent (CEL's has() on the last step)."""
    return f"(has({obj}.{path}) ? {obj}.{path} : {empty})"


def _same(path: str, empty: str) -> str:
    return f"{_field('object', path, empty)} == {_field('oldObject', path, empty)}"


def annotation_only_policy_spec() -> dict[str, Any]:
    """The policy that holds the controller to REPAIR_ANNOTATION, for updates of nodes and of their status (a patch is
    an update to admission; RBAC gives it no status, the policy covers it anyway). The named checks come first, so a
    refusal says what was touched; the whole spec and status last, for anything they do not name."""
    key = gpu_health.REPAIR_ANNOTATION
    new_annotations = _field("object", "metadata.annotations", "{}")
    old_annotations = _field("oldObject", "metadata.annotations", "{}")
    return pod_scripts.node_update_policy(
        SERVICE_ACCOUNT_USER,
        "gpu-repair-controller",
        [
            {
                "expression": f"{new_annotations}.all(k, k == '{key}' || "
                f"(k in {old_annotations} && {old_annotations}[k] == {new_annotations}[k])) && "
                f"{old_annotations}.all(k, k == '{key}' || k in {new_annotations})",
                "message": f"the GPU repair controller may change only the annotation {key}",
            },
            {
                "expression": _same("metadata.labels", "{}"),
                "message": "the GPU repair controller may not change a node's labels",
            },
            {
                "expression": " && ".join(
                    _same(f"metadata.{name}", "[]") for name in ("ownerReferences", "finalizers")
                ),
                "message": "the GPU repair controller may not change a node's owners or finalizers",
            },
            {
                "expression": _same("spec.taints", "[]"),
                "message": "the GPU repair controller may not change a node's taints",
            },
            {
                "expression": _same("spec.unschedulable", "false"),
                "message": "the GPU repair controller may not cordon or uncordon a node",
            },
            {
                # A Node always has both (empty structs are still written), and they are objects, not maps: no has().
                "expression": "object.spec == oldObject.spec && object.status == oldObject.status",
                "message": "the GPU repair controller may not change a node's spec or status",
            },
        ],
    )


def deployment_spec(shares: Mapping[str, float]) -> dict[str, Any]:
    """One controller, replaced by stopping the old one first; `shares` as declare's."""
    container = pod_scripts.python_container("controller", controller, mounts=[])
    container["env"].append({"name": controller.SHARES_ENV, "value": json.dumps(dict(shares), sort_keys=True)})
    container["volumeMounts"].append({"name": "heartbeat", "mountPath": controller.HEARTBEAT_DIR})
    # Two probes on the heartbeat files (controller.beat), as the burn-in agent's: live while its loop turns, ready
    # while its passes reach the API server. A python3 per probe needs more than 64 MiB; so does a list of a few
    # thousand nodes, read a page at a time and slimmed (controller.LIST_PAGE).
    container["resources"]["limits"]["memory"] = "256Mi"
    container["resources"]["requests"]["memory"] = "64Mi"
    container.update(pod_scripts.beat_probes(controller))
    pod = {
        "serviceAccountName": NAME,
        "automountServiceAccountToken": False,
        "priorityClassName": "system-cluster-critical",
        # It needs the API server only; cloud nodes reach it whatever a site's VPN does.
        "affinity": CLOUD_NODE_AFFINITY,
        "securityContext": pod_scripts.pod_security(),
        "containers": [container],
        "volumes": [
            *pod_scripts.pod_volumes(NAME, FILES, TOKEN_SECONDS),
            {"name": "heartbeat", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ],
    }
    # A new script rolls the pod (the ConfigMap's files change under a running pod, but Python has read them).
    scripts = hashlib.sha256(json.dumps(FILES, sort_keys=True).encode()).hexdigest()
    return {
        "replicas": 1,
        # Recreate: the old pod is gone before the new one starts, so two never approve past a share together.
        "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": LABELS},
        "template": {"metadata": {"labels": LABELS, "annotations": {SCRIPTS_ANNOTATION: scripts}}, "spec": pod},
    }


def declare(name: str, *, shares: Mapping[str, float], opts: Options, meta: Meta) -> None:
    """The controller's account, its rights and their limits, its scripts and its Deployment; `shares`: each pool's
    share of its nodes in repair at once, by dlinfra.io/pool value, in (0, 1] (a pool not listed:
    controller.DEFAULT_SHARE)."""
    check_shares(shares)
    waits = pod_scripts.declare_held_account(
        name,
        NAME,
        namespace=NAMESPACE,
        role=ROLE,
        rules=cluster_role_rules(),
        policy=("annotation-only", ANNOTATION_ONLY_POLICY, annotation_only_policy_spec()),
        files=FILES,
        labels=LABELS,
        opts=opts,
        meta=meta,
    )
    k8s.apps.v1.Deployment(
        f"{name}-{NAME}",
        metadata=meta(NAME, NAMESPACE),
        spec=cast("k8s.apps.v1.DeploymentSpecArgsDict", deployment_spec(shares)),
        opts=opts(depends_on=waits),
    )
