"""The GPU repair controller: approves the repair of GPU nodes the burn-in agent put off work, a pool's share at a
time (components/gpu_repair.py declares it, one pod for the cluster; dlinfra.model.gpu_health says how the parts
meet).

A node to repair is one whose check failed or whose watch found a fault (GPUHealthy False, CheckFailed or GPUFault)
and that carries the unhealthy taint. Unknown verdicts (not judged, not finished, GPUs not advertised) say nothing
about the GPUs, so they are left to a person. The controller approves a repair by REPAIR_ANNOTATION on the node
(JSON: action, boot_id, approved_at, attempt, state "approved"); the burn-in agent on that node, on that boot, hands
the request to the machine, which replaces itself (a cloud node: its Auto Scaling group drains and replaces it) or
reboots (a site machine: its check runs again).

It is a circuit breaker: a fault that hits many nodes at once (a bad driver, a bad image, a cooling failure) must not
take a whole pool down for repair together. At most max(1, floor(share * the pool's nodes)) repairs of a pool are in
flight, in flight meaning approved on the node's current boot (the machine has not yet rebooted or gone). Then:
- a node healthy again on another boot than the approved one: the repair worked, the annotation goes;
- a site machine rebooted and judged failed again, MAX_REBOOTS times: given up, kept off work for the site's
  administrator, with a Warning Event on the node saying so and how to retry (remove the annotation);
- an approval the machine has not acted on in STUCK_SECONDS: given up likewise, so it stops holding its pool's share.
A given-up node is never approved again until someone removes the annotation; an annotation the controller does not
understand (an operator's hold) is left alone.

Level-triggered: every POLL_SECONDS it lists the nodes and changes only what differs, by merge patch of the one
annotation with the node's resourceVersion (a concurrent change makes it try again on the next pass). Standard
library only; the API through kube_api.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sys
import time
import urllib.error
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from components.scripts import kube_api

# These equal dlinfra.model.gpu_health's and components.charts.nodes' (tests/components/test_gpu_repair.py keeps them
# equal); the script runs in a pod without dlinfra, so it carries its own copy.
ANNOTATION = "dlinfra.io/gpu-repair"
CONDITION = "GPUHealthy"
UNHEALTHY_TAINT_KEY = "dlinfra.io/gpu-unhealthy"
SITE_LABEL = "dlinfra.io/site"
POOL_LABEL = "dlinfra.io/pool"
REPLACE, REBOOT = "replace", "reboot"  # a cloud node's repair, a site machine's
# The verdicts that say the GPUs are at fault (the burn-in agent's reasons); the others are Unknown, not judged.
REPAIRABLE_REASONS = ("CheckFailed", "GPUFault")
APPROVED, GIVEN_UP = "approved", "given-up"
CHECK_ANNOTATION = "dlinfra.io/gpu-check"  # the burn-in agent's: the last verdict, with the boot it is of
# A site machine rebooted this many times and judged failed again is left to its administrator: a fault a reboot
# does not clear needs hands on the machine.
MAX_REBOOTS = 1
# An approval not acted on (the machine still on the boot it was approved on) this long after it is given up: the
# longest a node takes to go is its drain, the longest checkpoint grace (dlinfra.model.fleet.pools
# MAX_CHECKPOINT_GRACE, 3600 s) plus the termination hook's margin (DRAIN_MARGIN_SECONDS, 300 s), and 30 minutes for
# the agent's pass, the instance's replacement or the machine's shutdown to begin. A site machine's reboot waits less
# (the kubelet's shutdownGracePeriod, MAX_CHECKPOINT_GRACE + 30 s: dlinfra/render/nodeadm.py).
STUCK_SECONDS = 3600 + 300 + 30 * 60
DEFAULT_SHARE = 0.25  # of a pool's nodes in repair at once, for a pool GPU_REPAIR_SHARES does not list
SHARES_ENV = "GPU_REPAIR_SHARES"  # JSON: {pool label value: share in (0, 1]}
POLL_SECONDS = 30
LIST_PAGE = 250  # nodes per list call: a large cluster's list is read in pages, each slimmed before the next
# Node events go to the default namespace, where the kubelet writes its own and `kubectl describe node` finds them.
EVENT_NAMESPACE = "default"
EVENT_REASON = "GPURepairGivenUp"
COMPONENT = "dlinfra-gpu-repair"
# Heartbeats for the pod's probes (components/gpu_repair.py): ALIVE after every pass, READY after one that reached
# the API server; the probes fail when a file is older than these.
HEARTBEAT_DIR = "/run/gpu-repair"
ALIVE, READY = "alive", "ready"
LIVE_SECONDS = 5 * 60
READY_SECONDS = 3 * POLL_SECONDS + 60
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class Action:
    """One change to one node: its annotation set (a dict) or removed (None), and an Event to record, if any."""

    node: str
    resource_version: str
    annotation: dict[str, Any] | None
    line: str  # what the controller prints
    event: dict[str, Any] | None = None


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def _name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


def boot_id(node: Mapping[str, Any]) -> str:
    return str(((node.get("status") or {}).get("nodeInfo") or {}).get("bootID", ""))


def condition(node: Mapping[str, Any]) -> Mapping[str, Any]:
    for held in (node.get("status") or {}).get("conditions") or []:
        if held.get("type") == CONDITION:
            return dict(held)
    return {}


def annotation(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The repair annotation as JSON; {} when there is one the controller cannot read (left alone), None when none."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def to_repair(node: Mapping[str, Any]) -> bool:
    """Judged at fault by its check or its watch on the boot it runs now, and put off work for it. After a reboot the
    kubelet reports the new boot before the agent has judged it, and the condition still holds the last boot's
    failure: the check's annotation names the boot its verdict is of."""
    held = condition(node)
    tainted = any(t.get("key") == UNHEALTHY_TAINT_KEY for t in (node.get("spec") or {}).get("taints") or [])
    failed = held.get("status") == "False" and held.get("reason") in REPAIRABLE_REASONS and tainted
    return failed and verdict_boot(node) == boot_id(node) != ""


def verdict_boot(node: Mapping[str, Any]) -> str:
    """The boot the node's last check verdict is of (the agent's CHECK_ANNOTATION), "" if unknown."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(CHECK_ANNOTATION)
    try:
        verdict = json.loads(text) if text else None
    except ValueError:
        return ""
    return str(verdict.get("boot_id", "")) if isinstance(verdict, dict) else ""


def _time(text: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(str(text), TIME_FORMAT).replace(tzinfo=datetime.UTC)
    except ValueError:
        return None


def pool_limit(size: int, share: float) -> int:
    """Repairs of a pool of `size` nodes in flight at once: its share, and always one, so a small pool is repaired."""
    return max(1, math.floor(share * size))


def decide(nodes: Sequence[Mapping[str, Any]], now: datetime.datetime, shares: Mapping[str, float]) -> list[Action]:
    """What to change, from the nodes as listed, the time and each pool's share (DEFAULT_SHARE if not listed)."""
    stamp = now.strftime(TIME_FORMAT)
    actions: list[Action] = []
    pools: dict[str, list[Mapping[str, Any]]] = {}
    for node in sorted(nodes, key=_name):
        pools.setdefault(str(_labels(node).get(POOL_LABEL, "")), []).append(node)
    for pool, members in pools.items():
        flying = 0
        waiting: list[tuple[Mapping[str, Any], int]] = []  # (node, attempt) to approve, in name order
        for node in members:
            note = annotation(node)
            if note is None:
                if to_repair(node):
                    waiting.append((node, 1))
                continue
            if note.get("state") == GIVEN_UP and condition(node).get("status") == "True":
                # Given up only while not healthy: healthy on this boot's verdict, someone repaired it (no clocks
                # compared: the machine's and the controller's may differ).
                if verdict_boot(node) == boot_id(node):
                    actions.append(Action(_name(node), _version(node), None, "cleared: healthy since it was given up"))
                continue
            if note.get("state") != APPROVED:
                continue  # given up, or an operator's: only a person takes it off
            approved_at = _time(note.get("approved_at"))
            attempt = note.get("attempt")
            attempt = attempt if isinstance(attempt, int) else 1
            if note.get("boot_id") == boot_id(node):  # in flight, unless stuck or no longer due
                if not to_repair(node):  # its check passed again first, or someone took it in hand: nothing to repair
                    actions.append(Action(_name(node), _version(node), None, "withdrawn: no longer due for repair"))
                    continue
                if approved_at is not None and (now - approved_at).total_seconds() <= STUCK_SECONDS:
                    flying += 1
                    continue
                reason = "the machine did not act on the request"
                detail = (
                    f"{reason} to {note.get('action')} within {STUCK_SECONDS} s of its approval at "
                    f"{note.get('approved_at')} (see `journalctl -u dlinfra-gpu-repair` on it: an image without the "
                    "repair unit, or a reboot refused for want of the kubelet's shutdown lock)"
                )
                actions.append(_give_up(node, note, reason, detail, stamp))
            elif condition(node).get("status") == "True":
                actions.append(
                    Action(_name(node), _version(node), None, f"repaired: healthy after the {note.get('action')}")
                )
            elif to_repair(node):  # failed again, on a boot after the approved one
                if attempt < MAX_REBOOTS:
                    waiting.append((node, attempt + 1))
                    continue
                reason = f"the GPUs failed again after {attempt} {note.get('action')}(s)"
                actions.append(_give_up(node, note, reason, reason, stamp))
            # Else rebooted and not judged yet (its burn-in runs), or judged Unknown: a person's, or the next pass's.
        limit = pool_limit(len(members), shares.get(pool, DEFAULT_SHARE))
        for node, attempt in waiting[: max(0, limit - flying)]:
            action = REBOOT if SITE_LABEL in _labels(node) else REPLACE
            note = {"action": action, "boot_id": boot_id(node), "approved_at": stamp, "attempt": attempt}
            line = f"approved: {action}, attempt {attempt} ({flying + 1} of {limit} in pool {pool or '-'})"
            actions.append(Action(_name(node), _version(node), {**note, "state": APPROVED}, line))
            flying += 1
    return actions


def _version(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("resourceVersion", ""))


def _give_up(node: Mapping[str, Any], note: Mapping[str, Any], reason: str, detail: str, stamp: str) -> Action:
    """Given up: the annotation says so and why, and a Warning Event on the node tells its administrator."""
    name = _name(node)
    message = (
        f"{detail}; the node stays cordoned and off work for the site's administrator (or the pool's operator). To "
        f"have it repaired again, remove the annotation: kubectl annotate node {name} {ANNOTATION}-"
    )
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": EVENT_NAMESPACE},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "uid": str((node.get("metadata") or {}).get("uid", "")),
        },
        "reason": EVENT_REASON,
        "type": "Warning",
        "message": message,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    given_up = {**note, "state": GIVEN_UP, "reason": reason, "given_up_at": stamp}
    return Action(name, _version(node), given_up, f"given up: {reason}", event)


class Cluster(Protocol):
    def list_nodes(self) -> list[dict[str, Any]]: ...
    def patch_node(self, name: str, body: Mapping[str, Any]) -> None: ...
    def create_event(self, body: Mapping[str, Any]) -> None: ...


def slim(node: Mapping[str, Any]) -> dict[str, Any]:
    """What decide reads of a node, so a large cluster's list is not held whole."""
    metadata = node.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    held = condition(node)
    return {
        "metadata": {
            **{k: metadata[k] for k in ("name", "uid", "resourceVersion") if k in metadata},
            "labels": {k: v for k, v in (metadata.get("labels") or {}).items() if k in (POOL_LABEL, SITE_LABEL)},
            "annotations": {k: annotations[k] for k in (ANNOTATION, CHECK_ANNOTATION) if k in annotations},
        },
        "spec": {
            "taints": [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") == UNHEALTHY_TAINT_KEY]
        },
        "status": {
            "nodeInfo": {"bootID": boot_id(node)},
            "conditions": [held] if held else [],
        },
    }


class ApiServer(kube_api.ApiServer):
    """The API server, with the three calls the controller makes."""

    def list_nodes(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = []
        query = {"limit": str(LIST_PAGE)}
        while True:
            page = self.request("GET", "/api/v1/nodes", query=query)
            if not isinstance(page, dict):
                raise ValueError(f"list of nodes: the API server answered {page!r}")
            nodes += [slim(node) for node in page.get("items") or []]
            more = (page.get("metadata") or {}).get("continue")
            if not more:
                return nodes
            query = {"limit": str(LIST_PAGE), "continue": str(more)}

    def patch_node(self, name: str, body: Mapping[str, Any]) -> None:
        path = f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}"
        self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def create_event(self, body: Mapping[str, Any]) -> None:
        self.request("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body)


def apply(cluster: Cluster, actions: Iterable[Action]) -> list[str]:
    """Make each change, one merge patch of the annotation with the node's resourceVersion (409 if it changed since:
    the next pass decides again); what was changed, one line each. A refused change does not stop the others."""
    changed = []
    for action in actions:
        value = None if action.annotation is None else json.dumps(action.annotation, separators=(",", ":"))
        patch = {"metadata": {"annotations": {ANNOTATION: value}, "resourceVersion": action.resource_version}}
        try:
            cluster.patch_node(action.node, patch)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            print(f"node {action.node}: not changed: {exc} {detail}".rstrip(), file=sys.stderr, flush=True)
            continue
        changed.append(f"node {action.node}: {action.line}")
        if action.event is not None:
            # After the annotation: the annotation is the record, the Event its notice, sent once.
            try:
                cluster.create_event(action.event)
            except urllib.error.HTTPError as exc:
                print(f"node {action.node}: no event recorded: {exc}", file=sys.stderr, flush=True)
    return changed


def once(cluster: Cluster, now: datetime.datetime, shares: Mapping[str, float]) -> list[str]:
    """One pass: list, decide, change what differs."""
    return apply(cluster, decide(cluster.list_nodes(), now, shares))


def load_shares(text: str) -> dict[str, float]:
    """GPU_REPAIR_SHARES: each pool's share, in (0, 1]."""
    shares = json.loads(text or "{}")
    if not isinstance(shares, dict):
        raise ValueError(f"{SHARES_ENV}: a JSON object of pool: share, got {text!r}")
    for pool, share in shares.items():
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise ValueError(f"{SHARES_ENV}: pool {pool}: a share in (0, 1], got {share!r}")
    return {str(pool): float(share) for pool, share in shares.items()}


def run(
    cluster: Cluster,
    shares: Mapping[str, float],
    *,
    clock: Callable[[], datetime.datetime],
    sleep: Callable[[float], None] = time.sleep,
    passes: int | None = None,
    heartbeat_dir: str = HEARTBEAT_DIR,
) -> None:
    """Pass after pass, POLL_SECONDS apart (`passes`: that many, for tests; None: until stopped)."""
    done = 0
    while passes is None or done < passes:
        try:
            for line in once(cluster, clock(), shares):
                print(line, flush=True)
            beat(READY, heartbeat_dir)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            print(f"pass failed: {exc}", file=sys.stderr, flush=True)
        beat(ALIVE, heartbeat_dir)
        done += 1
        sleep(POLL_SECONDS)


def beat(name: str, directory: str = HEARTBEAT_DIR) -> None:
    """Touch a heartbeat file (the pod's probes read its age)."""
    kube_api.beat(name, directory)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def main(argv: Sequence[str]) -> int:
    """python3 -m components.scripts.gpu_repair: runs until stopped; SHARES_ENV from the Deployment."""
    del argv
    run(ApiServer.in_cluster(), load_shares(os.environ.get(SHARES_ENV, "{}")), clock=_now)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
