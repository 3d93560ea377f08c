"""The GPU burn-in agent, declared as children of the Platform in every in-cluster stack (not a component of its
own): one pod on every GPU node, cloud and site, that lets work onto the node once its GPUs have passed their check
(the script is components/scripts/gpu_burn_in.py; dlinfra.model.gpu_health says how the parts meet).

A kubelet may not remove its own node's taints (NodeRestriction), so this agent, with its own service account, does.
What it may do is held tight:
- RBAC: read nodes and patch them and their status; RBAC cannot name "its own node" or "these fields".
- A ValidatingAdmissionPolicy (OWN_NODE_POLICY) can, and refuses the agent any other change: only the node its pod
  runs on (the service account token of a pod carries its node's name, authentication.kubernetes.io/node-name:
  Kubernetes "Service account tokens", bound token node info, on by default since 1.30), only the burn-in and
  unhealthy taints, only its annotations and its own cordon, only the GPUHealthy condition, and the GPU model labels
  only to the values the fleet gives the node's pool; other labels, taints and conditions, capacity, allocatable and
  addresses stay as they were.
The pod reads the check's report and the GPU watch's health file from the host read-only, writes a repair request
the repair controller approved into one host directory (gpu_health.REPAIR_DIR), runs as nobody with no privileges,
in kube-system (the namespace where node agents run with host paths), at the node-critical priority so it is never
the pod left out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from components import pod_scripts
from components.charts.nodes import GPU_MODEL_LABEL, GPU_NODE_AFFINITY, GPU_PRODUCT_LABEL
from components.charts.pinned import SYSTEM_NAMESPACE
from components.scripts import gpu_burn_in as agent
from components.scripts import kube_api
from dlinfra.model import gpu_health

Options = Callable[..., pulumi.ResourceOptions]
Meta = Callable[..., k8s.meta.v1.ObjectMetaArgs]

NAME = "gpu-burn-in"  # the agent's ServiceAccount, ConfigMap and DaemonSet (kube-system)
ROLE = "dlinfra-gpu-burn-in"  # its ClusterRole and binding
OWN_NODE_POLICY = "dlinfra-gpu-burn-in-own-node"
NAMESPACE = SYSTEM_NAMESPACE
SERVICE_ACCOUNT_USER = f"system:serviceaccount:{NAMESPACE}:{NAME}"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
FILES = pod_scripts.script_files(kube_api, agent)
REPORT_MOUNT = "/host/gpu-check"  # the host's gpu_health.REPORT_DIR, read-only
REPAIR_MOUNT = "/host/gpu-repair"  # the host's gpu_health.REPAIR_DIR, read-write
SCRIPTS_ANNOTATION = "dlinfra.io/scripts-sha256"
LABELS = {"app.kubernetes.io/name": NAME}
TOKEN_SECONDS = 3600  # the kubelet renews a projected token at 80% of its life; the agent reads it per call


def cluster_role_rules() -> list[dict[str, Any]]:
    """Nodes: read, and patch; their status: patch. OWN_NODE_POLICY narrows both to the agent's own node and fields."""
    return [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    ]


def _field(obj: str, path: str, empty: str) -> str:
    """`obj.path`, or `empty` where the field is absent (CEL's has() on the last step)."""
    return f"(has({obj}.{path}) ? {obj}.{path} : {empty})"


def _cel_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


def _same(path: str, empty: str) -> str:
    return f"{_field('object', path, empty)} == {_field('oldObject', path, empty)}"


def _cel_map(pools: Mapping[str, Mapping[str, str]]) -> str:
    """A CEL map literal of each pool's GPU labels (names and label values need no escaping)."""

    def body(labels: Mapping[str, str]) -> str:
        return ", ".join(f"'{k}': '{v}'" for k, v in sorted(labels.items()))

    # In name order: the fleet's order of pools changes nothing declared.
    return "{" + ", ".join(f"'{pool}': {{{body(pools[pool])}}}" for pool in sorted(pools)) + "}"


def own_node_policy_spec(gpu_labels: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """The policy that holds the agent to its own node and to the burn-in's fields, for updates of nodes and of
    their status (a patch is an update to admission). `gpu_labels`: the GPU model labels of each pool's nodes, by
    their pool label, the only values the agent may give those labels."""
    burn_in = (gpu_health.BURN_IN_TAINT, gpu_health.SITE_BURN_IN_TAINT)
    health_keys = sorted({t[0] for t in burn_in} | {gpu_health.UNHEALTHY_TAINT[0]})
    keys = _cel_list(health_keys)
    others = f".filter(t, !(t.key in {keys}))"
    new_taints, old_taints = _field("object", "spec.taints", "[]"), _field("oldObject", "spec.taints", "[]")
    # A health taint the agent puts on is one of its own: a burn-in taint "pending", or the unhealthy taint with one of
    # the agent's values, NoSchedule both; what was there before (another's unhealthy taint) may stay as it is.
    allowed = (
        f"t.effect == 'NoSchedule' && ((t.key in {_cel_list([k for k, _, _ in burn_in])} && t.value == 'pending') || "
        f"(t.key == '{gpu_health.UNHEALTHY_TAINT[0]}' && t.value in {_cel_list(gpu_health.UNHEALTHY_VALUES)}))"
    )
    conditions = f".filter(c, c.type != '{gpu_health.HEALTH_CONDITION}')"
    annotation, mark = gpu_health.CHECK_ANNOTATION, gpu_health.CORDON_ANNOTATION
    ours = _cel_list([annotation, mark])
    new_annotations = _field("object", "metadata.annotations", "{}")
    old_annotations = _field("oldObject", "metadata.annotations", "{}")

    keys_of_labels = sorted({GPU_MODEL_LABEL, GPU_PRODUCT_LABEL})
    label_keys = _cel_list(keys_of_labels)
    new_labels = _field("object", "metadata.labels", "{}")
    old_labels = _field("oldObject", "metadata.labels", "{}")
    pool = f"('{agent.POOL_LABEL}' in {old_labels} ? {old_labels}['{agent.POOL_LABEL}'] : '')"
    wanted = _cel_map(gpu_labels)

    def cordoned(obj: str) -> str:
        return f"(has({obj}.spec.unschedulable) && {obj}.spec.unschedulable)"

    def marked(obj: str) -> str:
        return f"(has({obj}.metadata.annotations) && '{mark}' in {obj}.metadata.annotations)"

    return pod_scripts.node_update_policy(
        SERVICE_ACCOUNT_USER,
        "burn-in-agent",
        [
            {
                "expression": f"'{NODE_NAME_CLAIM}' in request.userInfo.extra && "
                f"request.userInfo.extra['{NODE_NAME_CLAIM}'] == [object.metadata.name]",
                "message": "the GPU burn-in agent may change only the node its pod runs on",
            },
            {
                "expression": f"{_field('object', 'spec.taints', '[]')}{others} == "
                f"{_field('oldObject', 'spec.taints', '[]')}{others}",
                "message": f"the GPU burn-in agent may change only the taints {', '.join(health_keys)}",
            },
            {
                "expression": f"{new_taints}.filter(t, t.key in {keys} && !(t in {old_taints})).all(t, {allowed})",
                "message": "the GPU burn-in agent may put on only its own health taints: a burn-in taint 'pending', or "
                f"{gpu_health.UNHEALTHY_TAINT[0]} with one of {', '.join(gpu_health.UNHEALTHY_VALUES)}, NoSchedule",
            },
            {
                "expression": " && ".join(
                    _same(f"metadata.{name}", "[]") for name in ("ownerReferences", "finalizers")
                ),
                "message": "the GPU burn-in agent may not change a node's owners or finalizers",
            },
            {
                # A cordon only with its mark, and its own cordon lifted only with the mark; no other cordon touched.
                "expression": f"{cordoned('object')} == {cordoned('oldObject')} || "
                f"({cordoned('object')} && {marked('object')}) || "
                f"(!{cordoned('object')} && {marked('oldObject')} && !{marked('object')})",
                "message": "the GPU burn-in agent may cordon a node it puts off work, and lift only its own cordon",
            },
            {
                # The mark moves with a cordon, so it cannot be put on another's cordon first and then lifted with it;
                # a mark left on an uncordoned node may go.
                "expression": f"{marked('object')} == {marked('oldObject')} || "
                f"{cordoned('object')} != {cordoned('oldObject')} || (!{marked('object')} && !{cordoned('object')})",
                "message": f"the GPU burn-in agent may set {mark} only with its own cordon",
            },
            {
                "expression": f"{new_labels}.all(k, k in {label_keys} || (k in {old_labels} && "
                f"{old_labels}[k] == {new_labels}[k])) && {old_labels}.all(k, k in {label_keys} || k in {new_labels})",
                "message": "the GPU burn-in agent may not change a node's labels other than "
                + ", ".join(keys_of_labels),
            },
            {
                # Each GPU label as it was, or set to what the fleet gives the node's pool; never removed.
                "expression": f"{label_keys}.all(k, (k in {old_labels} ? {old_labels}[k] : '') == "
                f"(k in {new_labels} ? {new_labels}[k] : '') || ({pool} in {wanted} && k in {wanted}[{pool}] && "
                f"k in {new_labels} && {new_labels}[k] == {wanted}[{pool}][k]))",
                "message": "the GPU burn-in agent may set the GPU model labels only to the values the fleet gives the "
                "node's pool",
            },
            {
                "expression": f"{new_annotations}.all(k, k in {ours} || "
                f"(k in {old_annotations} && {old_annotations}[k] == {new_annotations}[k])) && "
                f"{old_annotations}.all(k, k in {ours} || k in {new_annotations})",
                "message": f"the GPU burn-in agent may change only the annotations {annotation} and {mark}",
            },
            {
                "expression": f"{_field('object', 'status.conditions', '[]')}{conditions} == "
                f"{_field('oldObject', 'status.conditions', '[]')}{conditions}",
                "message": f"the GPU burn-in agent may change only the condition {gpu_health.HEALTH_CONDITION}",
            },
            {
                "expression": " && ".join(
                    _same(f"status.{name}", empty)
                    for name, empty in (
                        ("capacity", "{}"),
                        ("allocatable", "{}"),
                        ("addresses", "[]"),
                        ("daemonEndpoints", "{}"),
                        ("nodeInfo", "{}"),
                    )
                ),
                "message": "the GPU burn-in agent may not change a node's capacity, allocatable, addresses, daemon "
                "endpoints or node info",
            },
        ],
    )


def daemon_set_spec(gpu_labels: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """One agent on every GPU node, through the burn-in taint and whatever else the node carries; `gpu_labels` as
    own_node_policy_spec's, what it keeps on the nodes."""
    container = pod_scripts.python_container(
        "agent",
        agent,
        f"{REPORT_MOUNT}/{gpu_health.REPORT_PATH.rsplit('/', 1)[1]}",
        REPAIR_MOUNT,
        mounts=[
            {"name": "gpu-check", "mountPath": REPORT_MOUNT, "readOnly": True},
            # Where it writes the repair request the controller approved; the machine's unit acts on it.
            {"name": "gpu-repair", "mountPath": REPAIR_MOUNT},
        ],
    )
    container["env"] += [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": agent.GPU_LABELS_ENV, "value": json.dumps(gpu_labels, sort_keys=True)},
    ]
    container["volumeMounts"].append({"name": "heartbeat", "mountPath": agent.HEARTBEAT_DIR})
    # Two probes on the agent's heartbeat files (agent.beat): live while its loop turns, ready while its passes
    # reach the API server. A python3 per probe needs more than the keeper's 64 MiB.
    container["resources"]["limits"]["memory"] = "128Mi"
    container.update(pod_scripts.beat_probes(agent))
    pod = {
        "serviceAccountName": NAME,
        "automountServiceAccountToken": False,
        "priorityClassName": "system-node-critical",
        "affinity": GPU_NODE_AFFINITY,
        # Every taint: the burn-in's own, a pool's, a cordon's. A node agent that is not on its node does nothing.
        "tolerations": [{"operator": "Exists"}],
        "securityContext": pod_scripts.pod_security(),
        "containers": [container],
        "volumes": [
            *pod_scripts.pod_volumes(NAME, FILES, TOKEN_SECONDS),
            # DirectoryOrCreate: on a node whose image has no check yet the agent still runs, and says so.
            {"name": "gpu-check", "hostPath": {"path": gpu_health.REPORT_DIR, "type": "DirectoryOrCreate"}},
            # On an image without the repair unit the kubelet creates it root's: the agent then says it cannot write.
            {"name": "gpu-repair", "hostPath": {"path": gpu_health.REPAIR_DIR, "type": "DirectoryOrCreate"}},
            {"name": "heartbeat", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ],
    }
    labels = LABELS
    # A new script rolls the pods (the ConfigMap's files change under running pods, but Python has read them).
    scripts = hashlib.sha256(json.dumps(FILES, sort_keys=True).encode()).hexdigest()
    return {
        "selector": {"matchLabels": labels},
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
        "template": {"metadata": {"labels": labels, "annotations": {SCRIPTS_ANNOTATION: scripts}}, "spec": pod},
    }


def declare(name: str, *, gpu_labels: Mapping[str, Mapping[str, str]], opts: Options, meta: Meta) -> None:
    """The agent's account, its rights and their limits, its scripts and its DaemonSet; `gpu_labels`: the GPU model
    labels of each GPU pool's and site's nodes, by their dlinfra.io/pool value."""
    waits = pod_scripts.declare_held_account(
        name,
        NAME,
        namespace=NAMESPACE,
        role=ROLE,
        rules=cluster_role_rules(),
        policy=("own-node", OWN_NODE_POLICY, own_node_policy_spec(gpu_labels)),
        files=FILES,
        labels=LABELS,
        opts=opts,
        meta=meta,
    )
    k8s.apps.v1.DaemonSet(
        f"{name}-{NAME}",
        metadata=meta(NAME, NAMESPACE),
        spec=cast("k8s.apps.v1.DaemonSetSpecArgsDict", daemon_set_spec(gpu_labels)),
        opts=opts(depends_on=waits),
    )
