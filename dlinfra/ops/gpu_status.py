"""`dlinfra gpu status`: every GPU node's health as its burn-in left it, cloud pools and site machines alike, read
from the nodes' own record (the GPUHealthy condition, the health taints and the check's annotation that the burn-in
agent writes: components/scripts/gpu_burn_in.py). Pure: the caller reads the nodes (what_happened_sources.Kube)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dlinfra.errors import DlinfraError
from dlinfra.model import gpu_health, gpu_sharing
from dlinfra.model.fleet.labels import (
    GPU_BURN_IN_TAINT_KEY,
    GPU_MODEL_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_SITE_BURN_IN_TAINT_KEY,
    GPU_UNHEALTHY_TAINT_KEY,
)
from dlinfra.ops import aws
from dlinfra.ops.what_happened import region_of_zone

POOL_LABEL = "dlinfra.io/pool"
SITE_LABEL = "dlinfra.io/site"
GPU_RESOURCE = "nvidia.com/gpu"
# The agent's reasons for a node it put off work without a fault found (components/scripts/gpu_burn_in.py).
NOT_JUDGED_REASONS = ("CheckNotJudged", "CheckNotFinished", "GPUsNotAdvertised")


@dataclass(frozen=True)
class GpuNodeHealth:
    """One GPU node: where it is, what its GPUs are, and what its last check said."""

    node: str
    where: str  # "pool train-h100" or "site sjc1"
    gpu_model: str  # dlinfra.io/gpu-model, or NVIDIA's product label on a node the agent has not relabelled yet
    gpus: str  # advertised / on the node ("8/8")
    state: str  # healthy, failed, burning in, not judged, not checked
    reason: str  # the condition's reason (CheckPassed, CheckFailed, ...), or why there is none
    since: str  # when the condition last changed
    last_check: str  # the check's verdict and time, from its annotation
    message: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def _condition(node: Mapping[str, Any]) -> Mapping[str, Any]:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == gpu_health.HEALTH_CONDITION:
            return dict(condition)
    return {}


def _state(taints: set[str], condition: Mapping[str, Any]) -> str:
    if condition.get("status") == "Unknown" and condition.get("reason") in NOT_JUDGED_REASONS:
        return "not judged"  # off work under the unhealthy taint, but nothing is known against its GPUs
    if GPU_UNHEALTHY_TAINT_KEY in taints or condition.get("status") == "False":
        return "failed"
    if taints & {GPU_BURN_IN_TAINT_KEY, GPU_SITE_BURN_IN_TAINT_KEY}:
        return "burning in"
    if condition.get("status") == "True":
        return "healthy"
    return "not checked"


def _last_check(node: Mapping[str, Any]) -> str:
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(gpu_health.CHECK_ANNOTATION)
    try:
        check = json.loads(text) if text else None
    except ValueError:
        return "unreadable annotation"
    if not isinstance(check, dict):
        return "-"
    return f"{check.get('verdict', '?')} at {check.get('finished_at', '?')}"


def node_health(node: Mapping[str, Any]) -> GpuNodeHealth | None:
    """The node's GPU health, or None for a node without GPUs."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = node.get("status") or {}
    capacity = (status.get("capacity") or {}).get(GPU_RESOURCE)
    if GPU_MODEL_LABEL not in labels and GPU_PRODUCT_LABEL not in labels and not capacity:
        return None
    taints = {str(t.get("key")) for t in (node.get("spec") or {}).get("taints") or []}
    condition = _condition(node)
    site = labels.get(SITE_LABEL)
    where = f"site {site}" if site else f"pool {labels.get(POOL_LABEL, '?')}"
    advertised = (status.get("allocatable") or {}).get(GPU_RESOURCE, "0")
    gpus = f"{advertised}/{capacity or 0}"
    shares = {r: n for r, n in (status.get("capacity") or {}).items() if _gpu_resource(r) and r != GPU_RESOURCE}
    if shares and not capacity:  # a shared node: its shares, which it offers instead of whole GPUs
        offered = sum(_int((status.get("allocatable") or {}).get(r)) for r in shares)
        gpus = f"{offered}/{sum(_int(n) for n in shares.values())} shares"
    return GpuNodeHealth(
        node=str(meta.get("name", "?")),
        where=where,
        gpu_model=str(labels.get(GPU_MODEL_LABEL) or labels.get(GPU_PRODUCT_LABEL, "?")),
        gpus=gpus,
        state=_state(taints, condition),
        reason=str(condition.get("reason") or "no GPUHealthy condition: is the burn-in agent running?"),
        since=str(condition.get("lastTransitionTime") or "-"),
        last_check=_last_check(node),
        message=" ".join(str(condition.get("message") or "").split()),
    )


def _int(quantity: Any) -> int:
    try:
        return int(str(quantity))
    except ValueError:
        return 0


def gpu_nodes(nodes: Iterable[Mapping[str, Any]]) -> list[GpuNodeHealth]:
    """Every GPU node's health, by place and name."""
    found = [h for h in map(node_health, nodes) if h is not None]
    return sorted(found, key=lambda h: (h.where, h.node))


# --- the GPU model labels that work selects -----------------------------------------------------------------------
# Kueue writes a flavor's node labels into an admitted job's pod template, and a pod keeps its selector for life: work
# admitted while nvidia.com/gpu.product held dlinfra's short model name keeps selecting that value. Before an
# environment's gpu_product_label goes to NVIDIA's product names (the agent then relabels every node), nothing
# unfinished may still select a short name there; afterwards, nothing may select a value no node carries.
GPU_LABEL_KEYS = (GPU_MODEL_LABEL, GPU_PRODUCT_LABEL)


@dataclass(frozen=True)
class LabelSelection:
    """An unfinished pod or Job that selects a GPU model label value that is, or would become, on no node."""

    kind: str  # Pod or Job
    namespace: str
    name: str
    key: str
    values: tuple[str, ...]  # the values it accepts (one for a nodeSelector, the list of an `In` expression)
    problem: str
    # True: it selects a short name in NVIDIA's label, and would be stranded by the move to NVIDIA's names. False: a
    # value no node carries now, which a pool at zero may still bring (a note, not a reason to wait).
    blocking: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"values": list(self.values)}


def selected_gpu_labels(pod_spec: Mapping[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    """(key, accepted values) of each GPU model label the pod spec requires: its nodeSelector, and the `In`
    expressions of a required node affinity term (the terms are alternatives: each is reported)."""
    found: list[tuple[str, tuple[str, ...]]] = [
        (str(k), (str(v),)) for k, v in (pod_spec.get("nodeSelector") or {}).items() if k in GPU_LABEL_KEYS
    ]
    affinity = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in affinity.get("nodeSelectorTerms") or []:
        for expression in term.get("matchExpressions") or []:
            if expression.get("key") in GPU_LABEL_KEYS and expression.get("operator") == "In":
                found.append((str(expression["key"]), tuple(str(v) for v in expression.get("values") or [])))
    return found


def label_selections(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], jobs: Iterable[Mapping[str, Any]]
) -> list[LabelSelection]:
    """Unfinished pods and Jobs selecting NVIDIA's product label by a short model name (stranded once the environment
    carries NVIDIA's names there: blocking), or a GPU label value no node carries now (a note: a pool at zero brings
    nodes only for pending work). Other job kinds are seen through their pods only: a JobSet's or RayJob's replica
    whose pods do not exist yet is not."""
    carried = {(k, str(v)) for n in nodes for k, v in ((n.get("metadata") or {}).get("labels") or {}).items()}
    short_names = set(gpu_health.table().models)
    objects = [("Pod", p, p.get("spec") or {}) for p in pods if (p.get("status") or {}).get("phase") not in _DONE]
    objects += [
        ("Job", j, ((j.get("spec") or {}).get("template") or {}).get("spec") or {}) for j in jobs if not _finished(j)
    ]
    found = []
    for kind, obj, pod_spec in objects:
        meta = obj.get("metadata") or {}
        for key, values in selected_gpu_labels(pod_spec):
            blocking = key == GPU_PRODUCT_LABEL and bool(set(values) & short_names)
            if blocking:
                problem = (
                    "selects NVIDIA's product label by dlinfra's short model name: keep gpu_product_label: short in "
                    "this environment until it has finished"
                )
            elif not any((key, v) in carried for v in values):
                problem = "no node carries it now (a pool at zero may still bring one)"
            else:
                continue
            where = (kind, str(meta.get("namespace")), str(meta.get("name")))
            found.append(LabelSelection(*where, key, values, problem, blocking))
    return sorted(found, key=lambda f: (f.namespace, f.kind, f.name, f.key))


_DONE = ("Succeeded", "Failed")


def _finished(job: Mapping[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions)


# --- the check by hand ----------------------------------------------------------------------------------------------
# The check runs through SSM Run Command: cloud nodes are EC2 instances with the SSM agent (the EKS-optimized and our
# images run it), site machines are SSM managed instances registered by their hybrid activation, whose node name is
# the managed instance id (EKS user guide, "Hybrid nodes": nodeadm with SSM names the node after it).
RUN_SHELL = "AWS-RunShellScript"
RESTART = f"systemctl restart --no-block {gpu_health.CHECK_UNIT}"
_EC2_PROVIDER = re.compile(r"^aws:///(?P<zone>[a-z0-9-]+)/(?P<instance>i-[0-9a-f]{8,17})$")
_MANAGED = re.compile(r"^mi-[0-9a-f]{17}$")


@dataclass(frozen=True)
class CheckTarget:
    node: str
    instance: str  # i-... (EC2) or mi-... (a site machine)
    region: str | None  # the EC2 instance's; None for a site machine (its home region, from the caller)


def check_target(node: Mapping[str, Any]) -> CheckTarget:
    """Where the check of this node runs; DlinfraError when the node is neither an EC2 instance nor a site machine."""
    name = str((node.get("metadata") or {}).get("name", "?"))
    provider = str((node.get("spec") or {}).get("providerID") or "")
    if node_health(node) is None:
        raise DlinfraError(f"node {name} has no GPUs", key="gpu check")
    ec2 = _EC2_PROVIDER.match(provider)
    if ec2:
        return CheckTarget(name, ec2["instance"], region_of_zone(ec2["zone"]))
    if _MANAGED.match(name):
        return CheckTarget(name, name, None)
    raise DlinfraError(
        f"node {name} (providerID {provider or 'none'}) is neither an EC2 instance nor an SSM managed site machine",
        key="gpu check",
    )


def _gpu_resource(name: str) -> bool:
    """A whole GPU, or a shared pool's share of one (dlinfra.model.gpu_sharing: MIG instances, time-sliced turns)."""
    return name in (GPU_RESOURCE, gpu_sharing.TIME_SLICED_RESOURCE) or name.startswith(gpu_sharing.MIG_RESOURCE_PREFIX)


def busy_with_gpus(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Running or pending pods on the node that ask for GPUs, other than DaemonSets': the check loads every GPU."""
    busy = []
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
            continue
        containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
        if any(_gpu_resource(r) for c in containers for r in ((c.get("resources") or {}).get("limits") or {})):
            busy.append(f"{meta.get('namespace')}/{meta.get('name')}")
    return sorted(busy)


def send_check(ssm: Any, target: CheckTarget) -> str:
    """Start the node's check again (the burn-in agent reads the new report); the Run Command id."""
    reply = aws.call(
        "SendCommand",
        lambda: ssm.send_command(
            InstanceIds=[target.instance],
            DocumentName=RUN_SHELL,
            Comment=f"dlinfra gpu check {target.node}"[:100],
            Parameters={"commands": [RESTART]},
            TimeoutSeconds=60,
        ),
    )
    with aws.reading("SendCommand"):
        return str(reply["Command"]["CommandId"])
