"""The GPU burn-in agent: lets work onto a GPU node once its GPUs have passed their check (components/gpu_burn_in.py
declares it, one pod per GPU node).

A kubelet cannot take a taint off its own node (the NodeRestriction admission plugin refuses it), so the check on the
machine (the unit dlinfra-gpu-check, chef/cookbooks/dlinfra_gpu/files/gpu_check.py) only writes its report, and this
agent, in a pod on the node, reads it and tells the API server:
- passed, and the device plugin advertises the GPUs: the burn-in taint comes off, condition GPUHealthy is True;
- failed (a fault was found): the burn-in taint is replaced by the unhealthy taint, GPUHealthy is False with the
  problems, so the node takes no work and, on a cloud pool, the autoscaler removes it as unneeded;
- not judged (the check could not run to the end), or no report yet: the burn-in taint stays, GPUHealthy is Unknown
  with the reason;
- later, while the node works: a fault the GPU watch on the machine found (Xids, memory, ECC, DCGM's health watches;
  its health file keeps every fault of the boot) puts the node off work as a failed check does, GPUHealthy False
  (GPUFault), until a reboot's check passes. A watch that stopped writing is said in the condition's message;
- a node off work whose repair the repair controller approved for this boot (components/gpu_repair.py): the agent
  writes the request on the host (a directory mounted read-write), where the machine's own unit acts on it.
The report names the boot it is for (the kernel's boot id, which a container reads as the host's): after a reboot
the previous report no longer counts, and the agent puts the burn-in taint back until this boot's check is done,
since registration taints apply only when the node object is created. A node with no report at all that registered
without the burn-in taint predates the burn-in (an image without the check): it is left as it is, marked Unknown.

It also keeps the node's GPU model labels as the fleet declares them for its pool (GPU_LABELS_ENV, from the pool's
instance type or the site): registration labels, like taints, apply only when the node object is created, so nodes
that joined before a label changed are relabelled in place rather than replaced, in the same patch that would let
them on.

Level-triggered: every POLL_SECONDS it reads the node and the report and changes only what differs, taints and the
annotation by merge patch with the node's resourceVersion (a concurrent change makes it try again), the condition
by strategic merge patch of the node's status. Standard library only; the API through kube_api.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import urllib.error
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from components.scripts import kube_api

# These equal dlinfra.model.gpu_health's (tests/components/test_gpu_burn_in.py keeps them equal); the script runs in a
# pod without dlinfra, so it carries its own copy.
BURN_IN_TAINT = {"key": "dlinfra.io/gpu-burn-in", "value": "pending", "effect": "NoSchedule"}
SITE_BURN_IN_TAINT = {"key": "dlinfra.io/gpu-burn-in-site", "value": "pending", "effect": "NoSchedule"}
BURN_IN_KEYS = (BURN_IN_TAINT["key"], SITE_BURN_IN_TAINT["key"])
UNHEALTHY_TAINT = {"key": "dlinfra.io/gpu-unhealthy", "value": "check-failed", "effect": "NoSchedule"}
# The unhealthy taint's values a check puts on (and a passing check takes off): why the node takes no work.
CHECK_FAILED, NOT_JUDGED, NOT_FINISHED, NOT_ADVERTISED, GPU_FAULT = (
    "check-failed",
    "check-not-judged",
    "check-not-finished",
    "gpus-not-advertised",
    "gpu-fault",  # the watch found a fault after the burn-in: kept until the next boot's check passes
)
OURS = (CHECK_FAILED, NOT_JUDGED, NOT_FINISHED, NOT_ADVERTISED, GPU_FAULT)
SITE_LABEL = "dlinfra.io/site"
CONDITION = "GPUHealthy"
ANNOTATION = "dlinfra.io/gpu-check"
# Set when the agent cordoned the node itself, so it lifts only its own cordon. A node off work is cordoned too: the
# cluster-autoscaler builds a pool's scale-up template from a schedulable node as it is (its allocatable GPUs, 7 of 8
# after a GPU is lost), and caches it for years (mixed_nodeinfos_processor.go isNodeGoodTemplateCandidate).
CORDON_ANNOTATION = "dlinfra.io/gpu-cordoned"  # = dlinfra.model.gpu_health.CORDON_ANNOTATION
BURN_IN_SECONDS = 600  # the check unit's own limit
DEADLINE_SECONDS = 900  # from boot: the burn-in's limit and a margin for the boot and the join before it starts
GPU_RESOURCE = "nvidia.com/gpu"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
UPTIME = "/proc/uptime"
POLL_SECONDS = 15
POOL_LABEL = "dlinfra.io/pool"
# JSON: the GPU model labels of each pool's nodes, by their dlinfra.io/pool value (a site's machines' too).
GPU_LABELS_ENV = "GPU_LABELS"
# Heartbeats for the pod's probes (components/gpu_burn_in.py): ALIVE after every pass, READY after one that reached
# the API server; the probes fail when a file is older than these.
HEARTBEAT_DIR = "/run/gpu-burn-in"
ALIVE, READY = "alive", "ready"
LIVE_SECONDS = 5 * 60
READY_SECONDS = 2 * 60
MAX_PROBLEMS = 5  # in the condition's message and the annotation; the whole report stays on the machine
# The watch writes its health file every WATCH_INTERVAL_SECONDS (dlinfra.model.gpu_health); a file this much older
# than now says the watch has stopped, which the condition's message tells (the node stays on: nothing is known).
WATCH_INTERVAL_SECONDS = 60
HEALTH_FILE = "health.json"  # beside the check's report (dlinfra.model.gpu_health.HEALTH_PATH)
# The repair (dlinfra.model.gpu_health REPAIR_*): the controller's approval on the node, and the request this agent
# writes on the host for the machine's own unit to act on.
REPAIR_ANNOTATION = "dlinfra.io/gpu-repair"
REPAIR_REQUEST = "request"  # in the host's repair directory, mounted read-write
REPAIR_ACTIONS = ("replace", "reboot")
REQUEST_RETRY_SECONDS = 60
WATCH_STALE_SECONDS = 5 * WATCH_INTERVAL_SECONDS
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
T = TypeVar("T")


@dataclass(frozen=True)
class Report:
    """What the check wrote (gpu_check.write_report): its verdict and what it is about."""

    verdict: str  # passed, failed or unchecked
    finished_at: str
    boot_id: str
    expected_gpus: int | None
    problems: tuple[str, ...] = ()
    # A shared node's shares (nvidia.com/mig-<profile>, nvidia.com/gpu.shared -> count), which it offers instead of
    # whole GPUs (dlinfra.model.gpu_sharing); None: expected_gpus of nvidia.com/gpu.
    expected_resources: Mapping[str, int] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Report:
        problems = [
            ("" if p.get("gpu") is None else f"GPU {p['gpu']} ") + f"{p.get('check', '?')}: {p.get('detail', '')}"
            for p in data.get("problems", ())
        ]
        if data.get("error"):
            problems.insert(0, str(data["error"]))
        expected = data.get("expected_gpus")
        shares = data.get("expected_resources")
        return cls(
            verdict=str(data.get("verdict", "unchecked")),
            finished_at=str(data.get("finished_at", "")),
            boot_id=str(data.get("boot_id", "")),
            expected_gpus=int(expected) if expected is not None else None,
            problems=tuple(problems),
            expected_resources={str(k): int(v) for k, v in shares.items()} if shares else None,
        )

    def expected(self) -> dict[str, int]:
        """What the device plugin must advertise on the node: resource -> count ({} when the check did not say)."""
        if self.expected_resources:
            return dict(self.expected_resources)
        return {} if self.expected_gpus is None else {GPU_RESOURCE: self.expected_gpus}

    def summary(self) -> str:
        """The annotation: the verdict, when, and the first problems, as compact JSON."""
        body = {
            "verdict": self.verdict,
            "finished_at": self.finished_at,
            # The boot it judged: the repair controller acts only on a verdict of the node's current boot.
            "boot_id": self.boot_id,
            "problems": list(self.problems[:MAX_PROBLEMS]),
        }
        return json.dumps(body, separators=(",", ":"))


@dataclass(frozen=True)
class Health:
    """What the watch wrote (gpu_check's watch mode): the faults it saw on one boot, kept for the boot."""

    boot_id: str
    updated_at: str
    status: str  # ok, faulted or unreadable
    faults: tuple[tuple[str, str], ...] = ()  # (first seen, what), earliest first

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Health:
        faults = sorted(
            (
                str(f.get("first_seen", "")),
                ("" if f.get("gpu") is None else f"GPU {f['gpu']} ") + f"{f.get('check', '?')}: {f.get('detail', '')}",
            )
            for f in data.get("faults", ())
        )
        return cls(
            boot_id=str(data.get("boot_id", "")),
            updated_at=str(data.get("updated_at", "")),
            status=str(data.get("status", "unreadable")),
            faults=tuple(faults),
        )

    def since(self, moment: str) -> tuple[tuple[str, str], ...]:
        """The faults first seen at `moment` or later (times in TIME_FORMAT order as text)."""
        return tuple(f for f in self.faults if f[0] >= moment)


def read_health(path: str) -> Health | None:
    """The watch's health file, or None if there is none yet (it writes by rename, so never half of one)."""
    return _read(path, Health.from_json)


def read_report(path: str) -> Report | None:
    """The report on the machine, or None if there is none (or half of one: the check writes it by rename)."""
    return _read(path, Report.from_json)


def _read(path: str, parse: Callable[[Mapping[str, Any]], T]) -> T | None:
    try:
        with open(path, encoding="utf-8") as f:
            return parse(json.load(f))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class Condition:
    status: str  # True, False, Unknown
    reason: str  # CamelCase, as Kubernetes' own
    message: str


@dataclass(frozen=True)
class Decision:
    """What the node should carry: its taints, the check's annotation (None: leave it) and the condition."""

    taints: list[dict[str, str]]
    condition: Condition
    annotation: str | None = None
    # True: cordon the node (the agent's cordon, marked by CORDON_ANNOTATION); False: lift the agent's own cordon, if
    # it holds one; None: leave spec.unschedulable alone.
    cordon: bool | None = None


def _with(taints: Sequence[Mapping[str, Any]], taint: Mapping[str, str]) -> list[dict[str, Any]]:
    if any(t.get("key") == taint["key"] for t in taints):
        return [dict(t) for t in taints]
    return [*(dict(t) for t in taints), dict(taint)]


def advertised_gpus(node: Mapping[str, Any], resource: str = GPU_RESOURCE) -> int:
    """GPUs (or shares of a shared node's `resource`) the device plugin advertises on the node (status.allocatable)."""
    value = node.get("status", {}).get("allocatable", {}).get(resource, "0")
    try:
        return int(value)
    except ValueError:
        return 0


def _unit(resource: str) -> str:
    """How a count of `resource` reads: GPUs, or a shared node's shares by name."""
    return "GPUs" if resource == GPU_RESOURCE else resource


def burn_in_taint(node: Mapping[str, Any]) -> dict[str, str]:
    """The burn-in taint of this node: a site machine's (one the autoscaler does not count as unready), or a cloud
    node's (the autoscaler's startup taint)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return dict(SITE_BURN_IN_TAINT if SITE_LABEL in labels else BURN_IN_TAINT)


def _unhealthy(value: str) -> dict[str, str]:
    return {**UNHEALTHY_TAINT, "value": value}


def _settled(taints: Sequence[Mapping[str, Any]], value: str | None) -> list[dict[str, Any]]:
    """The taints without the burn-in's and without any unhealthy taint a check put on (its values say so), plus
    the unhealthy taint `value` when given. Another's unhealthy taint (another value) stays."""
    kept = [
        dict(t)
        for t in taints
        if t.get("key") not in BURN_IN_KEYS and not (t.get("key") == UNHEALTHY_TAINT["key"] and t.get("value") in OURS)
    ]
    return _with(kept, _unhealthy(value)) if value else kept


def _off_work(
    taints: Sequence[Mapping[str, Any]], value: str, condition: Condition, report: Report | None = None
) -> Decision:
    """Settled off work: the unhealthy taint `value` and the agent's cordon."""
    annotation = report.summary() if report else None
    return Decision(cordon=True, taints=_settled(taints, value), condition=condition, annotation=annotation)


def _burning_in(node: Mapping[str, Any], condition: Condition, report: Report | None = None) -> Decision:
    """Still kept off work by the burn-in taint, the check's own unhealthy taint lifted meanwhile."""
    taints = node.get("spec", {}).get("taints", []) or []
    annotation = report.summary() if report else None
    return Decision(
        taints=_with(_settled(taints, None), burn_in_taint(node)), condition=condition, annotation=annotation
    )


def decide(
    node: Mapping[str, Any],
    report: Report | None,
    *,
    boot_id: str,
    uptime: float,
    health: Health | None = None,
    now: datetime.datetime | None = None,
) -> Decision:
    """What the node should carry, from its current state, the report on the machine, the watch's health file and this
    boot (`now` judges whether the watch still writes; None: not judged).

    Every path ends in one of two states within DEADLINE_SECONDS of boot: the burn-in taint off, or replaced by the
    unhealthy taint (a fault found, the check not judging, no report, the GPUs not advertised). The unhealthy taint is
    one the autoscaler treats as a status taint: the node counts as ready, takes no work, and a cloud node is removed
    as unneeded."""
    taints = node.get("spec", {}).get("taints", []) or []
    tainted = any(t.get("key") in BURN_IN_KEYS for t in taints)
    late = uptime >= DEADLINE_SECONDS
    if report is None and not tainted and not any(t.get("key") == UNHEALTHY_TAINT["key"] for t in taints):
        return Decision(
            taints=[dict(t) for t in taints],
            condition=Condition(
                "Unknown",
                "NotChecked",
                "no GPU check report on this machine, and the node joined without the burn-in taint: its image "
                "predates the burn-in; replace the node (dlinfra pool roll) to have it checked",
            ),
        )
    if report is None or report.boot_id != boot_id:
        if late:
            return _off_work(
                taints,
                NOT_FINISHED,
                Condition(
                    "Unknown",
                    "CheckNotFinished",
                    f"no GPU check report for this boot {DEADLINE_SECONDS} s after it: see `systemctl status "
                    "dlinfra-gpu-check` on the machine",
                ),
            )
        return _burning_in(node, Condition("Unknown", "Checking", "the GPU check of this boot is running"))
    problems = "; ".join(report.problems[:MAX_PROBLEMS])
    if report.verdict == "failed":
        failed = Condition("False", "CheckFailed", f"the GPU check failed at {report.finished_at}: {problems}")
        return _off_work(taints, CHECK_FAILED, failed, report)
    if report.verdict != "passed":
        unjudged = f"the GPU check could not judge the node at {report.finished_at}: {problems}"
        return _off_work(taints, NOT_JUDGED, Condition("Unknown", "CheckNotJudged", unjudged), report)
    # A fault the watch found after this check passed, kept by the watch for the boot: off work until a reboot's check
    # passes, however the fault itself comes and goes. Faults seen before it are the check's to judge: a check run
    # again on this boot (a GPU reset clears a pending row remap) that passes has judged them gone.
    later = health.since(report.finished_at) if health is not None and health.boot_id == boot_id else ()
    if later:
        found = "; ".join(what for _, what in later[:MAX_PROBLEMS])
        fault = f"the GPU watch found a fault at {later[0][0]}, after the check passed: {found}"
        return _off_work(taints, GPU_FAULT, Condition("False", "GPUFault", fault), report)
    expected = report.expected()
    advertised = {resource: advertised_gpus(node, resource) for resource in expected}
    held = current_condition(node) or {}
    accepted = held.get("reason") == "CheckPassed" and report.finished_at in str(held.get("message", ""))
    short = any(advertised[r] < n for r, n in expected.items())
    counts = ", ".join(f"{advertised[r]} of {n} {_unit(r)}" for r, n in sorted(expected.items()))
    if short and accepted and any(advertised.values()):
        # Let on, and now short of a GPU (the device plugin marks one unhealthy, or it fell off the bus): off work.
        lost = (
            f"the node advertises {counts} since its check passed at {report.finished_at}: a GPU has left (see its "
            "Xids: dmesg, nvidia-smi)"
        )
        return _off_work(taints, NOT_ADVERTISED, Condition("Unknown", "GPUsNotAdvertised", lost), report)
    # Once this report has let the node on, all its GPUs leaving allocatable for a while (the device plugin or the
    # kubelet restarting) is not a new verdict.
    if short and not accepted:
        message = (
            f"the GPU check passed at {report.finished_at}, but the node advertises {counts}: is the NVIDIA device "
            "plugin running on it?"
        )
        waiting = Condition("Unknown", "GPUsNotAdvertised", message)
        return _off_work(taints, NOT_ADVERTISED, waiting, report) if late else _burning_in(node, waiting, report)
    return Decision(
        cordon=False,
        taints=_settled(taints, None),
        condition=Condition(
            "True", "CheckPassed", f"the GPU check passed at {report.finished_at}{_watch(health, report, boot_id, now)}"
        ),
        annotation=report.summary(),
    )


def _watch(health: Health | None, report: Report, boot_id: str, now: datetime.datetime | None) -> str:
    """What a working node's condition adds about its watch: nothing while it writes (it starts when the check has
    finished), else since when it has not."""
    if now is None:
        return ""
    ours = health is not None and health.boot_id == boot_id
    since = health.updated_at if health is not None and ours else report.finished_at
    last = _time(since)
    if last is not None and (now - last).total_seconds() <= WATCH_STALE_SECONDS:
        return ""
    where = "see `systemctl status dlinfra-gpu-watch` on the machine"
    if not ours:
        return f"; the GPU watch has not written on this boot since the check finished: {where}"
    return f"; the GPU watch has not written since {since}: {where}"


def _time(text: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(text, TIME_FORMAT).replace(tzinfo=datetime.UTC)
    except ValueError:
        return None


class Cluster(Protocol):
    def get_node(self, name: str) -> dict[str, Any]: ...
    def patch_node(self, name: str, body: Mapping[str, Any]) -> None: ...
    def patch_node_status(self, name: str, body: Mapping[str, Any]) -> None: ...


class ApiServer(kube_api.ApiServer):
    """The API server, with the three calls the agent makes on its own node."""

    def _path(self, name: str) -> str:
        return f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}"

    def get_node(self, name: str) -> dict[str, Any]:
        node = self.request("GET", self._path(name))
        if not isinstance(node, dict):
            raise ValueError(f"node {name}: the API server answered {node!r}")
        return node

    def patch_node(self, name: str, body: Mapping[str, Any]) -> None:
        self.request("PATCH", self._path(name), body, content_type="application/merge-patch+json")

    def patch_node_status(self, name: str, body: Mapping[str, Any]) -> None:
        self.request("PATCH", self._path(name) + "/status", body, content_type="application/strategic-merge-patch+json")


def current_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in node.get("status", {}).get("conditions", []) or []:
        if condition.get("type") == CONDITION:
            return dict(condition)
    return None


def relabel(node: Mapping[str, Any], gpu_labels: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The GPU model labels the node lacks or carries with another value, for its pool (none for a pool not listed)."""
    labels = node.get("metadata", {}).get("labels") or {}
    wanted = gpu_labels.get(str(labels.get(POOL_LABEL, "")), {})
    return {key: value for key, value in sorted(wanted.items()) if labels.get(key) != value}


def apply(
    cluster: Cluster,
    name: str,
    node: Mapping[str, Any],
    decision: Decision,
    now: datetime.datetime,
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """Change on the node what differs from the decision, and the `labels` (relabel); what was changed, one line
    each."""
    changed = []
    metadata = node.get("metadata", {})
    patch: dict[str, Any] = {}
    if labels:
        patch["metadata"] = {"labels": dict(labels)}
        changed.append("labels: " + ", ".join(f"{k}={v}" for k, v in labels.items()))
    if decision.taints != (node.get("spec", {}).get("taints") or []):
        patch["spec"] = {"taints": decision.taints}
        changed.append("taints: " + (", ".join(t["key"] for t in decision.taints) or "none"))
    if decision.annotation is not None and (metadata.get("annotations") or {}).get(ANNOTATION) != decision.annotation:
        patch.setdefault("metadata", {})["annotations"] = {ANNOTATION: decision.annotation}
        changed.append("annotation")
    annotations = metadata.get("annotations") or {}
    cordoned = bool(node.get("spec", {}).get("unschedulable"))
    if decision.cordon and not cordoned:
        patch.setdefault("spec", {})["unschedulable"] = True
        patch.setdefault("metadata", {}).setdefault("annotations", {})[CORDON_ANNOTATION] = "true"
        changed.append("cordoned")
    elif decision.cordon is False and annotations.get(CORDON_ANNOTATION) == "true":
        patch.setdefault("spec", {})["unschedulable"] = None  # merge patch: remove the field
        patch.setdefault("metadata", {}).setdefault("annotations", {})[CORDON_ANNOTATION] = None
        changed.append("uncordoned")
    if patch:
        # With the resourceVersion read, a merge patch fails (409) if the node changed since: taints are one list.
        patch.setdefault("metadata", {})["resourceVersion"] = metadata.get("resourceVersion", "")
        cluster.patch_node(name, patch)
    wanted = decision.condition
    held = current_condition(node)
    if held is None or (held.get("status"), held.get("reason"), held.get("message")) != (
        wanted.status,
        wanted.reason,
        wanted.message,
    ):
        stamp = now.strftime(TIME_FORMAT)
        since = held.get("lastTransitionTime", stamp) if held and held.get("status") == wanted.status else stamp
        condition = {
            "type": CONDITION,
            "status": wanted.status,
            "reason": wanted.reason,
            "message": wanted.message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": since,
        }
        cluster.patch_node_status(name, {"status": {"conditions": [condition]}})
        changed.append(f"{CONDITION}={wanted.status} ({wanted.reason})")
    return changed


def read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


def once(
    cluster: Cluster,
    name: str,
    report_path: str,
    *,
    boot_id: str,
    uptime: float,
    now: datetime.datetime,
    gpu_labels: Mapping[str, Mapping[str, str]] | None = None,
    repair_dir: str | None = None,
    requested: dict[str, datetime.datetime] | None = None,
) -> list[str]:
    """One pass: read, decide, change what differs; with `repair_dir`, write the repair request the controller
    approved for this boot while it is absent (`requested`: when it was last written, by boot). The watch's health file
    lies beside the report."""
    node = cluster.get_node(name)
    health = read_health(os.path.join(os.path.dirname(report_path), HEALTH_FILE))
    decision = decide(node, read_report(report_path), boot_id=boot_id, uptime=uptime, health=health, now=now)
    changed = apply(cluster, name, node, decision, now, relabel(node, gpu_labels or {}))
    requested = requested if requested is not None else {}
    request = repair_request(node, decision, boot_id) if repair_dir is not None else None
    path = os.path.join(repair_dir, REPAIR_REQUEST) if repair_dir is not None else ""
    last = requested.get(boot_id)
    # Again while the request is absent: the machine's unit removes one it failed to carry out (IMDS or the API out
    # for a moment), and keeps one it did. At most once a REQUEST_RETRY_SECONDS.
    due = last is None or (now - last).total_seconds() >= REQUEST_RETRY_SECONDS
    if request is not None and repair_dir is not None and due and not os.path.exists(path):
        requested[boot_id] = now
        try:
            write_request(repair_dir, request)
        except OSError as exc:  # an image without the repair unit has no directory the agent may write in
            changed.append(f"repair not requested: {exc}")
        else:
            changed.append(f"repair requested on the machine: {request['action']}")
    return changed


def repair_request(node: Mapping[str, Any], decision: Decision, boot_id: str) -> dict[str, str] | None:
    """The request to write on the host: the controller approved the repair of this node on this boot, and the node is
    off work for a failed check or a fault (never a working node, whatever its annotation says)."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(REPAIR_ANNOTATION)
    try:
        approval = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(approval, dict) or approval.get("state") != "approved" or approval.get("boot_id") != boot_id:
        return None
    if approval.get("action") not in REPAIR_ACTIONS or decision.condition.status != "False":
        return None
    name = str((node.get("metadata") or {}).get("name", ""))
    return {"action": str(approval["action"]), "boot_id": boot_id, "node": name,
            "approved_at": str(approval.get("approved_at", ""))}  # fmt: skip


def write_request(directory: str, request: Mapping[str, str]) -> None:
    """The request, whole or not at all (written aside, then renamed: the host's path unit starts on the name)."""
    path = os.path.join(directory, REPAIR_REQUEST)
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(request, f)
        os.replace(partial, path)
    except OSError:
        if os.path.exists(partial):
            os.unlink(partial)
        raise


def main(argv: Sequence[str]) -> int:
    """python3 -m components.scripts.gpu_burn_in REPORT [REPAIR_DIR]: runs until stopped; NODE_NAME from the downward
    API, GPU_LABELS_ENV from the DaemonSet."""
    report_path, name = argv[1], os.environ["NODE_NAME"]
    repair_dir = argv[2] if len(argv) > 2 else None
    requested: dict[str, datetime.datetime] = {}
    gpu_labels = json.loads(os.environ.get(GPU_LABELS_ENV, "{}"))
    cluster = ApiServer.in_cluster()
    boot_id = read_text(BOOT_ID)
    while True:
        uptime = float(read_text(UPTIME).split()[0])
        try:
            lines = once(cluster, name, report_path, boot_id=boot_id, uptime=uptime, now=_now(), gpu_labels=gpu_labels,
                         repair_dir=repair_dir, requested=requested)  # fmt: skip
            for line in lines:
                print(f"node {name}: {line}", flush=True)
            beat(READY)
        except (OSError, ValueError, urllib.error.URLError) as exc:  # 409 after a concurrent change: next pass
            detail = exc.read().decode(errors="replace")[:300] if isinstance(exc, urllib.error.HTTPError) else ""
            print(f"node {name}: not changed: {exc} {detail}".rstrip(), file=sys.stderr, flush=True)
        beat(ALIVE)
        time.sleep(POLL_SECONDS)


def beat(name: str, directory: str = HEARTBEAT_DIR) -> None:
    """Touch a heartbeat file (the pod's probes read its age)."""
    kube_api.beat(name, directory)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
