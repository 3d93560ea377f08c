"""The GPU repair controller: what it decides (a pool's share at a time, given up when a repair does not help), its
script against a loopback API server that lists nodes and enforces the controller's annotation-only admission policy
(its CEL evaluated by cel-python, as tests/components/test_gpu_burn_in.py does), and what it declares."""

from __future__ import annotations

import contextvars
import copy
import datetime
import http.server
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import pulumi
import pulumi_kubernetes as k8s
import pytest
from pulumi.runtime import mocks

from components import gpu_repair, pod_scripts
from components.charts import nodes
from components.scripts import gpu_repair as controller
from components.scripts import kube_api
from dlinfra.model import gpu_health
from dlinfra.model.fleet.pools import DRAIN_MARGIN_SECONDS, MAX_CHECKPOINT_GRACE
from dlinfra.offline import engine
from tests.components.charts.test_checkpoint_grace import _review
from tests.components.test_gpu_burn_in import _merge
from tests.loopback import JsonHandler, serving

NOW = datetime.datetime(2027, 1, 5, 12, 0, tzinfo=datetime.UTC)
STAMP = "2027-01-05T12:00:00Z"
EARLIER = "2027-01-05T11:00:00Z"  # when the nodes below were judged failed
UNHEALTHY = dict(zip(("key", "value", "effect"), gpu_health.UNHEALTHY_TAINT, strict=True))
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
KEY = gpu_health.REPAIR_ANNOTATION


def _node(
    name: str,
    *,
    pool: str = "train-h100",
    boot: str = "boot-1",
    health: tuple[str, str] | None = ("False", "CheckFailed"),
    judged_at: str = EARLIER,
    tainted: bool = True,
    site: str | None = None,
    note: dict[str, Any] | None = None,
    verdict_boot: str | None = None,
) -> dict[str, Any]:
    """A GPU node as the API server lists it; by default one the burn-in agent put off work for a failed check of
    this boot (`verdict_boot`: the boot the agent's last verdict is of, this one by default)."""
    labels = {"dlinfra.io/pool": pool, "kubernetes.io/hostname": name}
    if site:
        labels["dlinfra.io/site"] = site
    verdict = {"verdict": "failed", "finished_at": judged_at, "boot_id": verdict_boot or boot, "problems": []}
    annotations = {"node.alpha.kubernetes.io/ttl": "0", gpu_health.CORDON_ANNOTATION: "true",
                   gpu_health.CHECK_ANNOTATION: json.dumps(verdict)}  # fmt: skip
    if note is not None:
        annotations[KEY] = json.dumps(note)
    conditions: list[dict[str, str]] = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    if health is not None:
        conditions.append({"type": "GPUHealthy", "status": health[0], "reason": health[1], "message": "...",
                           "lastHeartbeatTime": judged_at, "lastTransitionTime": judged_at})  # fmt: skip
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "100",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "providerID": f"aws:///us-west-2a/i-{name}",
            "taints": [GPU_TAINT, UNHEALTHY] if tainted else [GPU_TAINT],
            "unschedulable": True,
        },
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": conditions,
            "nodeInfo": {"bootID": boot, "kubeletVersion": "v1.33.5"},
        },
    }


def _healthy(name: str, **kw: Any) -> dict[str, Any]:
    return _node(name, health=("True", "CheckPassed"), tainted=False, **kw)


def _approved(boot: str = "boot-1", *, action: str = "replace", at: str = STAMP, attempt: int = 1) -> dict[str, Any]:
    return {"action": action, "boot_id": boot, "approved_at": at, "attempt": attempt, "state": "approved"}


def _by_node(actions: list[controller.Action]) -> dict[str, controller.Action]:
    return {a.node: a for a in actions}


def test_the_script_carries_the_names_dlinfra_declares() -> None:
    # The script runs in a pod without dlinfra, so it keeps its own copy; the two must not drift.
    assert controller.ANNOTATION == gpu_health.REPAIR_ANNOTATION
    assert (controller.REPLACE, controller.REBOOT) == gpu_health.REPAIR_ACTIONS
    assert controller.CONDITION == gpu_health.HEALTH_CONDITION
    assert gpu_health.UNHEALTHY_TAINT[0] == controller.UNHEALTHY_TAINT_KEY
    assert (controller.SITE_LABEL, controller.POOL_LABEL) == (nodes.SITE_LABEL, nodes.POOL_LABEL)
    # Given up only after the longest a node may take to go: the longest grace, the hook's margin, and 30 minutes.
    assert controller.STUCK_SECONDS == MAX_CHECKPOINT_GRACE + DRAIN_MARGIN_SECONDS + 30 * 60
    assert controller.CHECK_ANNOTATION == gpu_health.CHECK_ANNOTATION


# What the controller decides --------------------------------------------------------------------------------------


def test_a_pool_is_repaired_its_share_at_a_time_in_name_order() -> None:
    """An 8-node pool at 0.25: two repairs at once; the third waits until one machine has rebooted or gone."""
    pool = [_node(f"n{i}") for i in range(3)] + [_healthy(f"n{i}") for i in range(3, 8)]
    first = controller.decide(pool, NOW, {"train-h100": 0.25})
    assert [(a.node, a.annotation) for a in first] == [("n0", _approved()), ("n1", _approved())]
    assert first[0].line == "approved: replace, attempt 1 (1 of 2 in pool train-h100)" and first[0].event is None
    assert first[0].resource_version == "100"
    # Applied: both in flight, the third still waits.
    pool[0] = _node("n0", note=_approved())
    pool[1] = _node("n1", note=_approved())
    later = NOW + datetime.timedelta(minutes=5)
    assert controller.decide(pool, later, {"train-h100": 0.25}) == []
    # n0 rebooted (its burn-in runs, not yet judged): no longer in flight, so n2 goes.
    pool[0] = _node("n0", boot="boot-2", health=("Unknown", "Checking"), tainted=False, note=_approved())
    (action,) = controller.decide(pool, later, {"train-h100": 0.25})
    assert action.node == "n2" and action.annotation == _approved(at="2027-01-05T12:05:00Z")
    # Or n0's instance was replaced: its node leaves the list. The share is of the nodes there are, so while the pool
    # is one short (7: one at once) n2 still waits; once the replacement has joined, n2 goes.
    pool[0] = _node("n1", note=_approved())
    del pool[1]
    assert controller.decide(pool, later, {"train-h100": 0.25}) == []
    (action,) = controller.decide([*pool, _node("n8", health=("Unknown", "Checking"))], later, {"train-h100": 0.25})
    assert action.node == "n2"


def test_a_small_pool_repairs_one_node_at_a_time() -> None:
    both = [_node("a"), _node("b")]
    assert [a.node for a in controller.decide(both, NOW, {})] == ["a"]  # the default share, but at least one
    assert controller.pool_limit(2, controller.DEFAULT_SHARE) == 1
    assert controller.pool_limit(8, 0.25) == 2 and controller.pool_limit(9, 0.25) == 2
    assert controller.pool_limit(4, 1.0) == 4


def test_pools_are_counted_apart() -> None:
    train = [_node("t0", note=_approved()), _node("t1"), _healthy("t2"), _healthy("t3")]
    infer = [_node("i0", pool="infer-l4"), _node("i1", pool="infer-l4")]
    actions = _by_node(controller.decide(train + infer, NOW, {"train-h100": 0.25, "infer-l4": 1.0}))
    assert set(actions) == {"i0", "i1"}  # train-h100's one repair is in flight; infer-l4 may repair all its nodes


@pytest.mark.parametrize(
    "node",
    [
        # Not judged, not finished, GPUs not advertised: nothing known about the GPUs; a person's call.
        _node("x", health=("Unknown", "CheckNotJudged")),
        _node("x", health=("Unknown", "CheckNotFinished")),
        _node("x", health=("Unknown", "GPUsNotAdvertised")),
        _node("x", health=None),  # no verdict at all
        _node("x", tainted=False),  # failed, but not put off work (someone took the taint off)
        _healthy("x"),
        _node("x", health=("False", "SomeoneElses")),
    ],
)
def test_only_a_node_judged_at_fault_and_off_work_is_repaired(node: dict[str, Any]) -> None:
    assert controller.decide([node], NOW, {}) == []


def test_a_fault_the_watch_found_is_repaired_too() -> None:
    (action,) = controller.decide([_node("x", health=("False", "GPUFault"))], NOW, {})
    assert action.annotation == _approved()


def test_a_repair_that_worked_clears_the_annotation() -> None:
    rebooted = _healthy("s0", boot="boot-2", site="sjc1", note=_approved(action="reboot", at=EARLIER))
    (action,) = controller.decide([rebooted], NOW, {})
    assert action.annotation is None and action.event is None and action.line == "repaired: healthy after the reboot"
    # Healthy again on the approved boot (its check passed again first): withdrawn, and its share goes to the next.
    same_boot = _healthy("s0", site="sjc1", note=_approved(action="reboot"))
    withdrawn, approved = controller.decide([same_boot, _node("s1", site="sjc1")], NOW, {})
    assert (withdrawn.node, withdrawn.annotation, withdrawn.line) == ("s0", None, "withdrawn: no longer due for repair")
    assert approved.node == "s1"


def test_a_site_machine_that_fails_again_after_its_reboot_is_given_up_with_an_event() -> None:
    (approve,) = controller.decide([_node("s0", site="sjc1")], NOW, {})
    assert approve.annotation == _approved(action="reboot")
    note = approve.annotation
    later = NOW + datetime.timedelta(minutes=20)
    # Rebooted: until the agent on it has judged this boot, the condition is still the last boot's failure.
    stale = _node("s0", boot="boot-2", site="sjc1", note=note, verdict_boot="boot-1")
    assert controller.decide([stale], later, {}) == []
    # Nor is a node with no repair yet approved on a verdict of an earlier boot.
    assert controller.decide([_node("s1", boot="boot-2", site="sjc1", verdict_boot="boot-1")], later, {}) == []
    checking = _node("s0", boot="boot-2", site="sjc1", note=note, health=("Unknown", "Checking"), tainted=False)
    assert controller.decide([checking], later, {}) == []
    failed = _node("s0", boot="boot-2", site="sjc1", note=note, judged_at="2027-01-05T12:15:00Z")
    (action,) = controller.decide([failed], later, {})
    assert action.annotation == {
        **_approved(action="reboot"),
        "state": "given-up",
        "reason": "the GPUs failed again after 1 reboot(s)",
        "given_up_at": "2027-01-05T12:20:00Z",
    }
    event = action.event
    assert event is not None
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "s0", "uid": "uid-s0"}
    assert (event["reason"], event["type"], event["metadata"]["namespace"]) == (
        "GPURepairGivenUp",
        "Warning",
        "default",
    )
    assert "stays cordoned" in event["message"] and "site's administrator" in event["message"]
    assert f"kubectl annotate node s0 {KEY}-" in event["message"]
    # Given up: never approved again, and it holds no share, until a person removes the annotation.
    given_up = _node("s0", boot="boot-2", site="sjc1", note=action.annotation, judged_at="2027-01-05T12:15:00Z")
    assert controller.decide([given_up], later + datetime.timedelta(days=3), {}) == []
    (other,) = controller.decide([given_up, _node("s1", site="sjc1")], later, {})
    assert other.node == "s1"
    removed = _node("s0", boot="boot-2", site="sjc1", judged_at="2027-01-05T12:15:00Z")
    (again,) = controller.decide([removed], later, {})
    assert again.annotation == _approved(boot="boot-2", action="reboot", at="2027-01-05T12:20:00Z")


def test_a_given_up_machine_someone_repaired_is_cleared_once_it_passes_again() -> None:
    """The record stays while the machine is off work; once a check of its current boot passes (given up only while
    it was not healthy), the next fault is repaired again. No clocks compared: the machine's may run behind."""
    given_up = {**_approved(action="reboot"), "state": "given-up", "reason": "r", "given_up_at": "2027-01-05T12:20:00Z"}
    off = _node("s0", boot="boot-3", site="sjc1", note=given_up)
    assert controller.decide([off], NOW + datetime.timedelta(hours=1), {}) == []
    fixed = _node("s0", boot="boot-3", site="sjc1", note=given_up, health=("True", "CheckPassed"),
                  judged_at="2027-01-05T10:00:00Z", tainted=False)  # fmt: skip
    (cleared,) = controller.decide([fixed], NOW + datetime.timedelta(hours=3), {})
    assert cleared.annotation is None and cleared.line.startswith("cleared")


def test_more_reboots_when_a_site_allows_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller, "MAX_REBOOTS", 2)
    failed = _node("s0", boot="boot-2", site="sjc1", note=_approved(action="reboot", at=EARLIER),
                   judged_at="2027-01-05T11:30:00Z")  # fmt: skip
    (action,) = controller.decide([failed], NOW, {})
    assert action.annotation == _approved(boot="boot-2", action="reboot", attempt=2)


def test_a_request_the_machine_never_acts_on_is_given_up_and_frees_its_share() -> None:
    old = (NOW - datetime.timedelta(seconds=controller.STUCK_SECONDS + 1)).strftime(controller.TIME_FORMAT)
    stuck = _node("a", note=_approved(at=old))
    actions = controller.decide([stuck, _node("b")], NOW, {})
    assert [a.node for a in actions] == ["a", "b"]  # the stuck one no longer counts in flight
    given_up = actions[0]
    assert given_up.annotation is not None
    assert given_up.annotation["state"] == "given-up"
    assert given_up.annotation["reason"] == "the machine did not act on the request"
    assert given_up.event is not None and given_up.event["type"] == "Warning"
    # Not yet stuck at the limit itself.
    on_time = (NOW - datetime.timedelta(seconds=controller.STUCK_SECONDS)).strftime(controller.TIME_FORMAT)
    assert controller.decide([_node("a", note=_approved(at=on_time)), _node("b")], NOW, {}) == []


def test_an_annotation_the_controller_does_not_own_is_left_alone() -> None:
    """An operator holds a node back from repair with any other state (or anything that is not our JSON)."""
    held = _node("a")
    held["metadata"]["annotations"][KEY] = json.dumps({"state": "hold", "by": "ops"})
    garbled = _node("b")
    garbled["metadata"]["annotations"][KEY] = "not json"
    assert controller.decide([held, garbled], NOW, {"train-h100": 1.0}) == []


def test_shares_come_from_the_environment_and_are_checked() -> None:
    assert controller.load_shares('{"train-h100": 0.5, "infer": 1}') == {"train-h100": 0.5, "infer": 1.0}
    assert controller.load_shares("") == {}
    for bad in ('{"p": 0}', '{"p": 1.5}', '{"p": "x"}', '{"p": true}', "[0.5]"):
        with pytest.raises(ValueError, match="GPU_REPAIR_SHARES"):
            controller.load_shares(bad)
    with pytest.raises(ValueError, match="shares: pool p"):
        gpu_repair.check_shares({"p": 0.0})


# The controller against a loopback API server that enforces its admission policy ----------------------------------


def _policy_refusals(
    old: dict[str, Any], new: dict[str, Any], user: str = gpu_repair.SERVICE_ACCOUNT_USER
) -> list[str]:
    spec = gpu_repair.annotation_only_policy_spec()
    request = {"userInfo": {"username": user}}
    env = celpy.Environment()
    (match,) = spec["matchConditions"]
    if not env.program(env.compile(match["expression"])).evaluate({"request": celpy.json_to_cel(request)}):
        return []
    return _review({"spec": {**spec, "variables": []}}, request, new, old)


class FakeNodeApi(JsonHandler):
    """List and merge-patch of nodes and creation of Events, the way the API server answers them, with the policy."""

    nodes: dict[str, dict[str, Any]]
    events: list[dict[str, Any]]
    page: int  # nodes per list page the server gives (at most the client's limit)

    def _body(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def do_GET(self) -> None:
        cls = type(self)
        path, _, query = self.path.partition("?")
        if path != "/api/v1/nodes":
            return self._send(404, {"kind": "Status", "code": 404})
        params = dict(p.split("=", 1) for p in query.split("&") if p)
        start = int(params.get("continue", "0"))
        names = sorted(cls.nodes)
        end = start + min(cls.page, int(params.get("limit", "500")))
        more = {"continue": str(end)} if end < len(names) else {}
        items = [cls.nodes[n] for n in names[start:end]]
        return self._send(200, {"kind": "NodeList", "metadata": {"resourceVersion": "1", **more}, "items": items})

    def do_PATCH(self) -> None:
        cls = type(self)
        name = self.path.removeprefix("/api/v1/nodes/")
        if name not in cls.nodes:
            return self._send(404, {"kind": "Status", "code": 404})
        assert self.headers["Content-Type"] == "application/merge-patch+json"
        body, old = self._body(), cls.nodes[name]
        if body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
            return self._send(409, {"kind": "Status", "code": 409, "reason": "Conflict"})
        new = _merge(old, body)
        refused = _policy_refusals(old, new)
        if refused:
            return self._send(422, {"kind": "Status", "code": 422, "message": "; ".join(refused)})
        new["metadata"]["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 1)
        cls.nodes[name] = new
        return self._send(200, new)

    def do_POST(self) -> None:
        if self.path != "/api/v1/namespaces/default/events":
            return self._send(404, {"kind": "Status", "code": 404})
        event = self._body()
        type(self).events.append(event)
        return self._send(201, event)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[controller.ApiServer, type[FakeNodeApi]]]:
    pool = [_node(f"n{i}") for i in range(3)] + [_healthy(f"n{i}") for i in range(3, 8)]
    handler = type("Handler", (FakeNodeApi,), {"nodes": {n["metadata"]["name"]: n for n in pool}, "events": [],
                                              "page": 3})  # fmt: skip
    token = tmp_path / "token"
    token.write_text("controller-token\n")
    with serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)) as url:
        yield controller.ApiServer(url, str(token), None), handler


def _note(handler: type[FakeNodeApi], name: str) -> Any:
    text = handler.nodes[name]["metadata"]["annotations"].get(KEY)
    return None if text is None else json.loads(text)


def test_a_pass_approves_through_the_policy_and_then_leaves_the_pool_alone(
    api: tuple[controller.ApiServer, type[FakeNodeApi]],
) -> None:
    server, handler = api
    assert len(server.list_nodes()) == 8  # three pages
    assert controller.once(server, NOW, {"train-h100": 0.25}) == [
        "node n0: approved: replace, attempt 1 (1 of 2 in pool train-h100)",
        "node n1: approved: replace, attempt 1 (2 of 2 in pool train-h100)",
    ]
    assert _note(handler, "n0") == _approved() and _note(handler, "n2") is None
    # Only the annotation changed: the taints, the cordon and the agent's mark are as they were.
    assert (
        handler.nodes["n0"]["spec"]["taints"] == [GPU_TAINT, UNHEALTHY] and handler.nodes["n0"]["spec"]["unschedulable"]
    )
    assert controller.once(server, NOW, {"train-h100": 0.25}) == []
    # n0's machine is replaced: its node leaves, its replacement joins (burning in), and n2 goes.
    del handler.nodes["n0"]
    handler.nodes["n8"] = _node("n8", health=("Unknown", "Checking"), tainted=False)
    assert controller.once(server, NOW, {"train-h100": 0.25}) == [
        "node n2: approved: replace, attempt 1 (2 of 2 in pool train-h100)"
    ]


def test_a_given_up_site_machine_is_recorded_for_its_administrator(
    api: tuple[controller.ApiServer, type[FakeNodeApi]],
) -> None:
    server, handler = api
    handler.nodes = {"s0": _node("s0", site="sjc1")}
    assert controller.once(server, NOW, {}) == ["node s0: approved: reboot, attempt 1 (1 of 1 in pool train-h100)"]
    rebooted = _node("s0", boot="boot-2", site="sjc1", judged_at="2027-01-05T12:15:00Z")
    rebooted["metadata"]["annotations"][KEY] = handler.nodes["s0"]["metadata"]["annotations"][KEY]
    handler.nodes["s0"] = rebooted
    later = NOW + datetime.timedelta(minutes=20)
    assert controller.once(server, later, {}) == ["node s0: given up: the GPUs failed again after 1 reboot(s)"]
    assert _note(handler, "s0")["state"] == "given-up"
    (event,) = handler.events
    assert event["involvedObject"]["name"] == "s0" and event["reason"] == "GPURepairGivenUp"
    assert controller.once(server, later, {}) == [] and len(handler.events) == 1  # one record, not one a pass


def test_a_repaired_node_s_annotation_is_removed(api: tuple[controller.ApiServer, type[FakeNodeApi]]) -> None:
    server, handler = api
    handler.nodes = {"s0": _healthy("s0", boot="boot-2", site="sjc1", note=_approved(action="reboot", at=EARLIER))}
    assert controller.once(server, NOW, {}) == ["node s0: repaired: healthy after the reboot"]
    assert KEY not in handler.nodes["s0"]["metadata"]["annotations"]
    assert gpu_health.CORDON_ANNOTATION in handler.nodes["s0"]["metadata"]["annotations"]  # the agent's, untouched


def test_a_concurrent_change_is_retried_on_the_next_pass(
    api: tuple[controller.ApiServer, type[FakeNodeApi]], capsys: pytest.CaptureFixture[str]
) -> None:
    server, handler = api
    listed = server.list_nodes()
    handler.nodes["n0"]["metadata"]["resourceVersion"] = "101"  # the kubelet wrote in between
    changed = controller.apply(server, controller.decide(listed, NOW, {"train-h100": 0.25}))
    assert changed == ["node n1: approved: replace, attempt 1 (2 of 2 in pool train-h100)"]  # the other still goes
    assert "node n0: not changed: HTTP Error 409" in capsys.readouterr().err
    assert controller.once(server, NOW, {"train-h100": 0.25}) == [
        "node n0: approved: replace, attempt 1 (2 of 2 in pool train-h100)"
    ]


def test_the_loop_beats_and_survives_an_unreachable_api_server(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    unreachable = controller.ApiServer("http://127.0.0.1:9", str(token), None)
    slept: list[float] = []
    controller.run(unreachable, {}, clock=lambda: NOW, sleep=slept.append, passes=2, heartbeat_dir=str(tmp_path))
    assert slept == [controller.POLL_SECONDS] * 2
    assert (tmp_path / controller.ALIVE).exists() and not (tmp_path / controller.READY).exists()


# The admission policy: the one annotation, nothing else --------------------------------------------------------------


def _with(node: dict[str, Any], change: Any) -> dict[str, Any]:
    new = copy.deepcopy(node)
    change(new)
    return new


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        (lambda n: n["metadata"]["annotations"].update({KEY: json.dumps(_approved())}), None),
        (lambda n: n["metadata"]["annotations"].pop(KEY), None),
        (lambda n: n["metadata"]["annotations"].update({gpu_health.CHECK_ANNOTATION: "{}"}), "only the annotation"),
        (lambda n: n["metadata"]["annotations"].pop(gpu_health.CORDON_ANNOTATION), "only the annotation"),
        (lambda n: n["metadata"]["labels"].update({"dlinfra.io/pool": "other"}), "labels"),
        (lambda n: n["metadata"]["labels"].pop("dlinfra.io/pool"), "labels"),
        (lambda n: n["spec"].update(taints=[GPU_TAINT]), "taints"),
        (lambda n: n["spec"].pop("taints"), "taints"),
        (lambda n: n["spec"].pop("unschedulable"), "cordon"),
        (lambda n: n["metadata"].update(finalizers=["x/y"]), "owners or finalizers"),
        (lambda n: n["metadata"].update(ownerReferences=[{"kind": "Machine", "name": "m"}]), "owners or finalizers"),
        (lambda n: n["spec"].update(providerID="aws:///x"), "spec or status"),
        (lambda n: n["status"]["conditions"].clear(), "spec or status"),
        (lambda n: n["status"]["allocatable"].update({"nvidia.com/gpu": "16"}), "spec or status"),
    ],
)
def test_the_controller_may_change_only_the_repair_annotation(change: Any, refused: str | None) -> None:
    old = _node("n0", note=_approved())
    refusals = _policy_refusals(old, _with(old, change))
    assert (refusals == []) if refused is None else any(refused in r for r in refusals), refusals


def test_the_policy_leaves_everyone_else_to_rbac() -> None:
    old = _node("n0")
    retainted = _with(old, lambda n: n["spec"].update(taints=[GPU_TAINT]))
    assert _policy_refusals(old, retainted, "system:serviceaccount:kube-system:gpu-burn-in") == []
    assert _policy_refusals(old, retainted)


# What is declared --------------------------------------------------------------------------------------------------


def test_the_shipped_script_is_the_config_map_s() -> None:
    # It runs from that layout with the standard library only: tests/components/test_gpu_burn_in.py, for every script.
    assert pod_scripts.script_files(kube_api, controller) == gpu_repair.FILES


def test_the_probes_read_the_heartbeats_the_controller_writes(tmp_path: Path) -> None:
    (container,) = gpu_repair.deployment_spec({})["template"]["spec"]["containers"]
    for probe, name in (
        (container["livenessProbe"], controller.ALIVE),
        (container["readinessProbe"], controller.READY),
    ):
        command = [c.replace(controller.HEARTBEAT_DIR, str(tmp_path)) for c in probe["exec"]["command"]]
        command[0] = sys.executable
        assert subprocess.run(command, timeout=120, check=False).returncode == 1  # no heartbeat yet
        controller.beat(name, str(tmp_path))
        assert subprocess.run(command, timeout=120, check=False).returncode == 0


class _Recorder(mocks.Mocks):
    def __init__(self) -> None:
        self.created: dict[tuple[str, str], dict[str, Any]] = {}

    def new_resource(self, args: mocks.MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        kind = args.typ.rsplit(":", 1)[1]
        self.created[(kind, args.inputs["metadata"]["name"])] = dict(args.inputs)
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: mocks.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


Declared = tuple[dict[tuple[str, str], dict[str, Any]], list[set[str]]]


@pytest.fixture(scope="module")
def declared() -> Declared:
    """What declare registers, by kind and name, and the logical names each object's options depend on."""
    recorder = _Recorder()
    depends: list[set[str]] = []

    def opts(**kw: Any) -> pulumi.ResourceOptions:
        depends.append({dep._name for dep in kw.get("depends_on", [])})
        return pulumi.ResourceOptions(**kw)

    def meta(name: str, namespace: str | None = None) -> k8s.meta.v1.ObjectMetaArgs:
        return k8s.meta.v1.ObjectMetaArgs(name=name, namespace=namespace)

    def program() -> None:
        gpu_repair.declare("platform", shares={"train-h100": 0.5, "infer-l4": 1.0}, opts=opts, meta=meta)

    contextvars.Context().run(
        engine.under_mocks, mocks.MockMonitor(recorder), program, root=Path.cwd(), project="dlinfra",
        stack_name="test", config={},
    )  # fmt: skip
    return recorder.created, depends


def test_the_controller_s_objects_and_rights(
    declared: Declared,
) -> None:
    created, depends = declared
    assert set(created) == {
        ("ServiceAccount", "gpu-repair"),
        ("ClusterRole", "dlinfra-gpu-repair"),
        ("ClusterRoleBinding", "dlinfra-gpu-repair"),
        ("ValidatingAdmissionPolicy", "dlinfra-gpu-repair-annotation-only"),
        ("ValidatingAdmissionPolicyBinding", "dlinfra-gpu-repair-annotation-only"),
        ("NetworkPolicy", "gpu-repair"),
        ("ConfigMap", "gpu-repair"),
        ("Deployment", "gpu-repair"),
    }
    rules = created[("ClusterRole", "dlinfra-gpu-repair")]["rules"]
    assert [(r["resources"], r["verbs"]) for r in rules] == [
        (["nodes"], ["get", "list", "patch"]),
        (["events"], ["create"]),
    ]
    vap_binding = created[("ValidatingAdmissionPolicyBinding", "dlinfra-gpu-repair-annotation-only")]["spec"]
    assert vap_binding == {"policyName": "dlinfra-gpu-repair-annotation-only", "validationActions": ["Deny"]}
    assert (
        created[("ValidatingAdmissionPolicy", "dlinfra-gpu-repair-annotation-only")]["spec"]["failurePolicy"] == "Fail"
    )
    subjects = created[("ClusterRoleBinding", "dlinfra-gpu-repair")]["subjects"]
    assert subjects == [{"kind": "ServiceAccount", "name": "gpu-repair", "namespace": "kube-system"}]
    # The rights come after their limits: the binding waits for the policy's binding.
    binding_deps = {"platform-gpu-repair-role", "platform-gpu-repair", "platform-gpu-repair-annotation-only-binding"}
    assert binding_deps in depends
    network = created[("NetworkPolicy", "gpu-repair")]["spec"]
    assert network["ingress"] == [] and network["egress"] == [{"ports": [{"protocol": "TCP", "port": 443}]}]
    assert created[("ConfigMap", "gpu-repair")]["data"] == gpu_repair.FILES


def test_one_decider_on_a_cloud_node_unprivileged(
    declared: Declared,
) -> None:
    spec = declared[0][("Deployment", "gpu-repair")]["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["affinity"] == nodes.CLOUD_NODE_AFFINITY and pod["priorityClassName"] == "system-cluster-critical"
    assert pod["serviceAccountName"] == "gpu-repair" and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] and not container["securityContext"]["allowPrivilegeEscalation"]
    assert container["command"] == ["python3", "-m", "components.scripts.gpu_repair"]
    (shares,) = [e["value"] for e in container["env"] if e["name"] == controller.SHARES_ENV]
    assert shares == '{"infer-l4": 1.0, "train-h100": 0.5}'
    assert controller.load_shares(shares) == {"infer-l4": 1.0, "train-h100": 0.5}


def test_a_share_outside_0_1_is_refused_before_anything_is_declared() -> None:
    with pytest.raises(ValueError, match="shares: pool train-h100"):
        gpu_repair.declare(
            "p", shares={"train-h100": 1.5}, opts=pulumi.ResourceOptions, meta=k8s.meta.v1.ObjectMetaArgs
        )


def test_an_approval_no_longer_due_on_its_boot_is_withdrawn_and_frees_its_share() -> None:
    """Judged Unknown since (a check run by hand that could not judge), or its unhealthy taint lifted by a person: not
    held in flight for the stuck timeout, and the pool's share goes to the next."""
    unknown = _node("n0", note=_approved(), health=("Unknown", "CheckNotJudged"))
    withdrawn, approved = controller.decide([unknown, _node("n1")], NOW, {})
    assert (withdrawn.node, withdrawn.annotation) == ("n0", None) and approved.node == "n1"
    untainted = _node("n0", note=_approved(), tainted=False)
    assert controller.decide([untainted], NOW, {})[0].line == "withdrawn: no longer due for repair"
