"""The GPU burn-in, end to end without a GPU: the check's stamped report (from a recorded H100 reading) read by the
agent (components/scripts/gpu_burn_in.py) against a loopback API server that holds a node and enforces the agent's
own-node admission policy (its CEL evaluated by cel-python, as tests/components/charts/test_gpu_admission.py does),
and what the platform declares for it in every in-cluster stack."""

from __future__ import annotations

import base64
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
import pytest

from components import gpu_burn_in, pod_scripts
from components.charts import autoscaler, nodes, nvidia
from components.charts import kueue as kueue_chart
from components.scripts import capacity_block_flavor, kube_api
from components.scripts import gpu_burn_in as agent
from components.scripts import gpu_repair as gpu_repair_script
from dlinfra.model import gpu_health
from tests import reference
from tests.chef._gpu_check import gpu_check
from tests.chef.test_gpu_check import H100, recorded
from tests.components.charts.test_checkpoint_grace import _review
from tests.loopback import JsonHandler, serving

NODE = "ip-10-1-2-3.us-west-2.compute.internal"
BOOT = "5138c633-f26b-424d-b55b-d8189c8c1504"
NOW = datetime.datetime(2027, 1, 5, 12, 0, tzinfo=datetime.UTC)
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
BURN_IN = dict(zip(("key", "value", "effect"), gpu_health.BURN_IN_TAINT, strict=True))
UNHEALTHY = dict(zip(("key", "value", "effect"), gpu_health.UNHEALTHY_TAINT, strict=True))
SITE_BURN_IN = dict(zip(("key", "value", "effect"), gpu_health.SITE_BURN_IN_TAINT, strict=True))
MARK_KEY = gpu_health.CORDON_ANNOTATION
MARK = {MARK_KEY: "true"}
# The GPU model labels the fleet gives pool train-h100's nodes (as stacks/in_cluster.py passes them); _node is a node
# that joined before dlinfra.io/gpu-model existed, with the short name in NVIDIA's label.
GPU_LABELS = {"train-h100": {"dlinfra.io/gpu-model": "H100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}


def _node(taints: list[dict[str, str]], *, gpus: str = "8", name: str = NODE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": "100",
            "labels": {"dlinfra.io/pool": "train-h100", "nvidia.com/gpu.product": "H100"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"providerID": "aws:///us-west-2a/i-0abc", "taints": taints},
        "status": {
            "capacity": {"cpu": "192", "nvidia.com/gpu": gpus},
            "allocatable": {"cpu": "191", "nvidia.com/gpu": gpus},
            "addresses": [{"type": "InternalIP", "address": "10.1.2.3"}],
            "conditions": [READY],
        },
    }


def _report(verdict: str, *, boot: str = BOOT, problems: tuple[str, ...] = ()) -> agent.Report:
    return agent.Report(verdict=verdict, finished_at="2027-01-05T11:58:00Z", boot_id=boot, expected_gpus=8,
                        problems=problems)  # fmt: skip


def test_the_script_carries_the_burn_in_names_dlinfra_declares() -> None:
    # The script runs in a pod without dlinfra, so it keeps its own copy; the two must not drift.
    assert (BURN_IN, SITE_BURN_IN, UNHEALTHY) == (agent.BURN_IN_TAINT, agent.SITE_BURN_IN_TAINT, agent.UNHEALTHY_TAINT)
    assert agent.OURS == gpu_health.UNHEALTHY_VALUES
    assert agent.CONDITION == gpu_health.HEALTH_CONDITION and agent.ANNOTATION == gpu_health.CHECK_ANNOTATION
    assert (agent.BURN_IN_SECONDS, agent.DEADLINE_SECONDS) == (gpu_health.BURN_IN_SECONDS, gpu_health.DEADLINE_SECONDS)
    assert agent.WATCH_INTERVAL_SECONDS == gpu_health.WATCH_INTERVAL_SECONDS
    assert (agent.SITE_LABEL, agent.POOL_LABEL) == (nodes.SITE_LABEL, nodes.POOL_LABEL)


# What the agent decides -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("taints", "report", "uptime", "after", "condition"),
    [
        # A new node, its check still running: the registration taint stays.
        ([GPU_TAINT, BURN_IN], None, 60, [GPU_TAINT, BURN_IN], ("Unknown", "Checking")),
        # Passed: the burn-in taint comes off, the pool's stays.
        ([GPU_TAINT, BURN_IN], _report("passed"), 300, [GPU_TAINT], ("True", "CheckPassed")),
        # Failed: the unhealthy taint replaces it.
        (
            [GPU_TAINT, BURN_IN],
            _report("failed", problems=("GPU 3 memory: 1 failed row remap",)),
            300,
            [GPU_TAINT, UNHEALTHY],
            ("False", "CheckFailed"),
        ),
        # Not judged: nothing is known, but the node settles: off work, ready to the autoscaler (a status taint).
        (
            [GPU_TAINT, BURN_IN],
            _report("unchecked"),
            300,
            [GPU_TAINT, {**UNHEALTHY, "value": "check-not-judged"}],
            ("Unknown", "CheckNotJudged"),
        ),
        # Rebooted: the report is the last boot's, so the burn-in taint goes back on until this boot's check.
        ([GPU_TAINT], _report("passed", boot="previous-boot"), 60, [GPU_TAINT, BURN_IN], ("Unknown", "Checking")),
        # No report by the deadline: settled the same way, never left under the startup taint.
        (
            [GPU_TAINT, BURN_IN],
            None,
            agent.DEADLINE_SECONDS,
            [GPU_TAINT, {**UNHEALTHY, "value": "check-not-finished"}],
            ("Unknown", "CheckNotFinished"),
        ),
        # A rebooted node that had failed is checked again: burn-in on, the old failure off meanwhile.
        (
            [GPU_TAINT, UNHEALTHY],
            _report("failed", boot="previous-boot"),
            60,
            [GPU_TAINT, BURN_IN],
            ("Unknown", "Checking"),
        ),
        # A node from an image without the check (joined untainted, no report): left as it is, and said.
        ([GPU_TAINT], None, 86400, [GPU_TAINT], ("Unknown", "NotChecked")),
        # After a repair and a reboot a passing check clears the failure an earlier check put on...
        ([GPU_TAINT, UNHEALTHY, BURN_IN], _report("passed"), 300, [GPU_TAINT], ("True", "CheckPassed")),
        # ...but not a taint of the same key someone else put on with another value.
        (
            [{**UNHEALTHY, "value": "xid-79"}, BURN_IN],
            _report("passed"),
            300,
            [{**UNHEALTHY, "value": "xid-79"}],
            ("True", "CheckPassed"),
        ),
    ],
)
def test_decide(
    taints: list[dict[str, str]],
    report: agent.Report | None,
    uptime: float,
    after: list[dict[str, str]],
    condition: tuple[str, str],
) -> None:
    decision = agent.decide(_node(taints), report, boot_id=BOOT, uptime=uptime)
    assert decision.taints == after
    assert (decision.condition.status, decision.condition.reason) == condition


def test_a_passed_check_waits_until_the_device_plugin_advertises_the_gpus() -> None:
    decision = agent.decide(_node([GPU_TAINT, BURN_IN], gpus="0"), _report("passed"), boot_id=BOOT, uptime=300)
    assert decision.taints == [GPU_TAINT, BURN_IN]
    assert decision.condition.reason == "GPUsNotAdvertised" and "0 of 8 GPUs" in decision.condition.message
    # Not forever: by the deadline the node settles off work.
    late = agent.decide(_node([GPU_TAINT, BURN_IN], gpus="0"), _report("passed"), boot_id=BOOT, uptime=900)
    assert late.taints == [GPU_TAINT, {**UNHEALTHY, "value": "gpus-not-advertised"}]


def test_a_shared_node_is_let_on_when_it_offers_its_shares_not_whole_gpus() -> None:
    """A MIG node offers nvidia.com/mig-<profile> and no nvidia.com/gpu (dlinfra.model.gpu_sharing): the agent waits
    for the shares the check wrote, and never for the whole GPUs the node will not offer."""
    shares = {"nvidia.com/mig-1g.10gb": 32, "nvidia.com/mig-3g.40gb": 8}
    report = agent.Report.from_json(
        {"verdict": "passed", "finished_at": "2027-01-05T11:58:00Z", "boot_id": BOOT, "expected_gpus": 8,
         "expected_resources": shares}
    )  # fmt: skip
    node = _node([GPU_TAINT, BURN_IN], gpus="0")
    waiting = agent.decide(node, report, boot_id=BOOT, uptime=300)
    assert waiting.condition.reason == "GPUsNotAdvertised" and waiting.taints == [GPU_TAINT, BURN_IN]
    assert "0 of 32 nvidia.com/mig-1g.10gb, 0 of 8 nvidia.com/mig-3g.40gb" in waiting.condition.message
    node["status"]["allocatable"] |= {"nvidia.com/mig-1g.10gb": "32", "nvidia.com/mig-3g.40gb": "7"}
    short = agent.decide(node, report, boot_id=BOOT, uptime=300)
    assert short.condition.reason == "GPUsNotAdvertised"  # one 3g instance missing: not yet
    node["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] = "8"
    passed = agent.decide(node, report, boot_id=BOOT, uptime=300)
    assert passed.taints == [GPU_TAINT] and passed.condition.reason == "CheckPassed"


def test_a_site_machine_is_burned_in_under_its_own_taint() -> None:
    """A rebooted site machine gets the site burn-in taint back, a status taint to the autoscaler, so a site's
    machines rebooting together never count as unready nodes (which would stop the autoscaler)."""
    site = _node([GPU_TAINT])
    site["metadata"]["labels"]["dlinfra.io/site"] = "sjc1"
    rebooted = agent.decide(site, _report("passed", boot="previous-boot"), boot_id=BOOT, uptime=60)
    assert rebooted.taints == [GPU_TAINT, SITE_BURN_IN]
    site["spec"]["taints"] = rebooted.taints
    assert agent.decide(site, _report("passed"), boot_id=BOOT, uptime=300).taints == [GPU_TAINT]
    assert autoscaler.autoscaler_args("1.33")["status-taint_site"] == SITE_BURN_IN["key"]
    assert autoscaler.autoscaler_args("1.33")["status-taint_unhealthy"] == UNHEALTHY["key"]


def test_the_failure_names_the_problems() -> None:
    report = _report("failed", problems=tuple(f"GPU {i} xid: Xid 79" for i in range(8)))
    decision = agent.decide(_node([BURN_IN]), report, boot_id=BOOT, uptime=300)
    assert "GPU 0 xid: Xid 79" in decision.condition.message
    assert decision.condition.message.count("Xid 79") == agent.MAX_PROBLEMS  # the rest stay on the machine
    assert json.loads(decision.annotation or "")["verdict"] == "failed"


# The agent against a loopback API server that enforces its admission policy -------------------------------------


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _policy_refusals(old: dict[str, Any], new: dict[str, Any], node_name: str) -> list[str]:
    spec = gpu_burn_in.own_node_policy_spec(GPU_LABELS)
    request = {
        "userInfo": {
            "username": gpu_burn_in.SERVICE_ACCOUNT_USER,
            "extra": {gpu_burn_in.NODE_NAME_CLAIM: [node_name]} if node_name else {},
        }
    }
    env = celpy.Environment()
    (match,) = spec["matchConditions"]
    activation = {"request": celpy.json_to_cel(request)}
    if not env.program(env.compile(match["expression"])).evaluate(activation):
        return []
    return _review({"spec": {**spec, "variables": []}}, request, new, old)


class FakeNodeApi(JsonHandler):
    """GET and PATCH of one node and its status, the way the API server answers them, with the agent's policy."""

    node: dict[str, Any]
    pod_node: str  # the node the agent's pod runs on (its token's node-name claim)
    patches: list[str]

    def do_GET(self) -> None:
        if self.path != f"/api/v1/nodes/{NODE}":
            return self._send(404, {"kind": "Status", "code": 404})
        return self._send(200, type(self).node)

    def do_PATCH(self) -> None:
        cls = type(self)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        old = cls.node
        if self.path == f"/api/v1/nodes/{NODE}":
            assert self.headers["Content-Type"] == "application/merge-patch+json"
            if body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
                return self._send(409, {"kind": "Status", "code": 409, "reason": "Conflict"})
            new = _merge(old, body)
        elif self.path == f"/api/v1/nodes/{NODE}/status":
            assert self.headers["Content-Type"] == "application/strategic-merge-patch+json"
            new = copy.deepcopy(old)
            for condition in body["status"]["conditions"]:  # strategic merge: conditions by type
                kept = [c for c in new["status"]["conditions"] if c["type"] != condition["type"]]
                new["status"]["conditions"] = [*kept, condition]
        else:
            return self._send(404, {"kind": "Status", "code": 404})
        refused = _policy_refusals(old, new, cls.pod_node)
        if refused:
            return self._send(422, {"kind": "Status", "code": 422, "message": "; ".join(refused)})
        new["metadata"]["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 1)
        cls.node = new
        cls.patches.append(self.path)
        return self._send(200, new)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[agent.ApiServer, type[FakeNodeApi]]]:
    handler = type("Handler", (FakeNodeApi,), {"node": _node([GPU_TAINT, BURN_IN]), "pod_node": NODE, "patches": []})
    token = tmp_path / "token"
    token.write_text("agent-token\n")
    with serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)) as url:
        yield agent.ApiServer(url, str(token), None), handler


def _write_check_report(tmp_path: Path, recording: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What the unit on the machine writes: the check of a recorded reading, stamped for this boot."""
    boot = tmp_path / "boot_id"
    boot.write_text(BOOT + "\n")
    monkeypatch.setattr(gpu_check, "BOOT_ID", str(boot))
    report = gpu_check.check(H100, recorded(recording), log="", efa_root=str(tmp_path))
    path = tmp_path / "report.json"
    gpu_check.write_report(str(path), report)
    return path


def test_a_healthy_node_is_let_onto_work_once_and_then_left_alone(
    api: tuple[agent.ApiServer, type[FakeNodeApi]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, handler = api
    report = tmp_path / "report.json"
    # Booted a minute ago, no report yet: only the condition is written.
    assert agent.once(server, NODE, str(report), boot_id=BOOT, uptime=60, now=NOW) == ["GPUHealthy=Unknown (Checking)"]
    assert handler.node["spec"]["taints"] == [GPU_TAINT, BURN_IN]
    _write_check_report(tmp_path, "h100-healthy.json", monkeypatch)
    changed = agent.once(server, NODE, str(report), boot_id=BOOT, uptime=240, now=NOW)
    assert changed == ["taints: nvidia.com/gpu", "annotation", "GPUHealthy=True (CheckPassed)"]
    node = handler.node
    assert node["spec"]["taints"] == [GPU_TAINT]
    (condition,) = [c for c in node["status"]["conditions"] if c["type"] == "GPUHealthy"]
    assert condition["status"] == "True" and condition["lastTransitionTime"] == "2027-01-05T12:00:00Z"
    assert READY in node["status"]["conditions"]  # the kubelet's conditions untouched
    assert json.loads(node["metadata"]["annotations"][gpu_health.CHECK_ANNOTATION])["verdict"] == "passed"
    # Nothing differs any more: no call but the read.
    patches = len(handler.patches)
    assert agent.once(server, NODE, str(report), boot_id=BOOT, uptime=300, now=NOW) == []
    assert len(handler.patches) == patches


def test_a_node_one_gpu_short_is_marked_failed(
    api: tuple[agent.ApiServer, type[FakeNodeApi]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, handler = api
    report = _write_check_report(tmp_path, "h100-seven-gpus.json", monkeypatch)
    agent.once(server, NODE, str(report), boot_id=BOOT, uptime=240, now=NOW)
    assert handler.node["spec"]["taints"] == [GPU_TAINT, UNHEALTHY]
    (condition,) = [c for c in handler.node["status"]["conditions"] if c["type"] == "GPUHealthy"]
    assert condition["status"] == "False" and "7 GPUs" in condition["message"]
    # Cordoned too, with its mark: the autoscaler builds no scale-up template from a cordoned node (7 GPUs here).
    assert handler.node["spec"]["unschedulable"] is True
    assert handler.node["metadata"]["annotations"][MARK_KEY] == "true"
    # Repaired and rebooted: the next boot's passing check lifts the agent's own cordon.
    handler.node["spec"]["taints"] = [GPU_TAINT, UNHEALTHY, BURN_IN]
    _write_check_report(tmp_path, "h100-healthy.json", monkeypatch)
    agent.once(server, NODE, str(tmp_path / "report.json"), boot_id=BOOT, uptime=240, now=NOW)
    assert handler.node["spec"]["taints"] == [GPU_TAINT] and "unschedulable" not in handler.node["spec"]
    assert MARK_KEY not in handler.node["metadata"]["annotations"]


def test_a_cordon_that_is_not_the_agent_s_stays(
    api: tuple[agent.ApiServer, type[FakeNodeApi]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, handler = api
    handler.node["spec"]["unschedulable"] = True  # cordoned by someone else during the burn-in
    report = _write_check_report(tmp_path, "h100-healthy.json", monkeypatch)
    agent.once(server, NODE, str(report), boot_id=BOOT, uptime=240, now=NOW)
    assert handler.node["spec"]["unschedulable"] is True and handler.node["spec"]["taints"] == [GPU_TAINT]


def test_gpus_dropping_after_the_node_was_let_on_are_not_a_new_verdict() -> None:
    """A device plugin or kubelet restart takes the GPUs out of allocatable for a while: not a failed burn-in."""
    node = _node([GPU_TAINT], gpus="0")
    node["status"]["conditions"].append(
        {"type": "GPUHealthy", "status": "True", "reason": "CheckPassed",
         "message": "the GPU check passed at 2027-01-05T11:58:00Z"}
    )  # fmt: skip
    decision = agent.decide(node, _report("passed"), boot_id=BOOT, uptime=5000)
    assert decision.taints == [GPU_TAINT] and decision.condition.reason == "CheckPassed"
    # But a GPU lost after the node was let on (7 of 8 advertised) puts it off work and cordons it.
    node["status"]["allocatable"]["nvidia.com/gpu"] = "7"
    lost = agent.decide(node, _report("passed"), boot_id=BOOT, uptime=5000)
    assert lost.taints == [GPU_TAINT, {**UNHEALTHY, "value": "gpus-not-advertised"}] and lost.cordon is True
    assert "7 of 8 GPUs" in lost.condition.message


def _health(boot: str = BOOT, *, faults: tuple[dict[str, Any], ...] = (), updated: str = "2027-01-05T11:59:30Z"
            ) -> dict[str, Any]:  # fmt: skip
    """A health file as the watch writes it (gpu_check's watch mode)."""
    return {"boot_id": boot, "started_at": "2027-01-05T11:58:05Z", "updated_at": updated,
            "status": "faulted" if faults else "ok", "faults": list(faults), "notes": []}  # fmt: skip


XID_79 = {"gpu": 3, "check": "xid", "detail": "Xid 79: GPU has fallen off the bus (RESTART_BM)",
          "first_seen": "2027-01-05T11:59:00Z"}  # fmt: skip
GPU_FAULT = {**UNHEALTHY, "value": "gpu-fault"}


def _working() -> dict[str, Any]:
    """A node let on by this boot's passing check."""
    node = _node([GPU_TAINT])
    node["status"]["conditions"].append(
        {"type": "GPUHealthy", "status": "True", "reason": "CheckPassed",
         "message": "the GPU check passed at 2027-01-05T11:58:00Z"}
    )  # fmt: skip
    return node


def test_a_fault_the_watch_finds_after_the_burn_in_puts_the_node_off_work_until_a_reboot() -> None:
    node = _working()
    faulted = agent.Health.from_json(_health(faults=(XID_79,)))
    decision = agent.decide(node, _report("passed"), boot_id=BOOT, uptime=5000, health=faulted, now=NOW)
    assert decision.taints == [GPU_TAINT, GPU_FAULT] and decision.cordon is True
    assert (decision.condition.status, decision.condition.reason) == ("False", "GPUFault")
    assert "GPU 3 xid: Xid 79" in decision.condition.message and "2027-01-05T11:59:00Z" in decision.condition.message
    # The watch keeps the boot's faults (a fault that came and went is still in the file): the node stays off work on
    # every later pass, however many GPUs the device plugin advertises meanwhile.
    node["spec"]["taints"] = decision.taints
    again = agent.decide(node, _report("passed"), boot_id=BOOT, uptime=9000, health=faulted, now=NOW)
    assert again.taints == [GPU_TAINT, GPU_FAULT] and again.condition.reason == "GPUFault"
    # A check run again on this boot (after a GPU reset, say) that passes has judged the earlier faults gone.
    rechecked = _report("passed")
    rechecked = agent.Report(**{**rechecked.__dict__, "finished_at": "2027-01-05T12:30:00Z"})
    passed_again = agent.decide(node, rechecked, boot_id=BOOT, uptime=9000, health=faulted, now=NOW)
    assert passed_again.condition.reason == "CheckPassed" and passed_again.taints == [GPU_TAINT]
    # Rebooted: the old boot's faults do not count; the burn-in runs again, and its pass lets the node back on.
    old = agent.Health.from_json(_health(boot="previous-boot", faults=(XID_79,)))
    rebooted = agent.decide(node, _report("passed", boot="previous-boot"), boot_id=BOOT, uptime=60, health=old)
    assert rebooted.taints == [GPU_TAINT, BURN_IN]
    healthy = agent.Health.from_json(_health())
    back = agent.decide(node, _report("passed"), boot_id=BOOT, uptime=400, health=healthy, now=NOW)
    assert back.taints == [GPU_TAINT] and back.condition.reason == "CheckPassed" and back.cordon is False


def test_a_watch_that_stopped_writing_is_said_but_takes_no_node_off_work() -> None:
    node = _working()
    later = NOW + datetime.timedelta(minutes=30)
    stale = agent.Health.from_json(_health(updated="2027-01-05T12:05:00Z"))
    decision = agent.decide(node, _report("passed"), boot_id=BOOT, uptime=5000, health=stale, now=later)
    assert decision.taints == [GPU_TAINT] and decision.condition.status == "True"
    assert "the GPU watch has not written since 2027-01-05T12:05:00Z" in decision.condition.message
    # None on this boot, well after the check finished; and nothing said while it writes, or just after the check.
    missing = agent.decide(node, _report("passed"), boot_id=BOOT, uptime=5000, health=None, now=later)
    assert "has not written on this boot" in missing.condition.message
    fresh = agent.Health.from_json(_health(updated="2027-01-05T12:29:30Z"))
    assert agent.decide(node, _report("passed"), boot_id=BOOT, uptime=5000, health=fresh, now=later).condition == (
        agent.Condition("True", "CheckPassed", "the GPU check passed at 2027-01-05T11:58:00Z")
    )
    assert "watch" not in agent.decide(node, _report("passed"), boot_id=BOOT, uptime=240, now=NOW).condition.message


def test_a_watched_fault_reaches_the_node_through_the_policy(
    api: tuple[agent.ApiServer, type[FakeNodeApi]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The health file beside the report, read by the agent, and the node changed through its own-node policy."""
    server, handler = api
    report = _write_check_report(tmp_path, "h100-healthy.json", monkeypatch)
    agent.once(server, NODE, str(report), boot_id=BOOT, uptime=240, now=NOW)
    assert handler.node["spec"]["taints"] == [GPU_TAINT]
    (tmp_path / "health.json").write_text(json.dumps(_health(faults=(XID_79,), updated="2027-01-05T12:00:00Z")))
    changed = agent.once(server, NODE, str(report), boot_id=BOOT, uptime=300, now=NOW)
    assert changed == ["taints: nvidia.com/gpu, dlinfra.io/gpu-unhealthy", "cordoned", "GPUHealthy=False (GPUFault)"]
    assert handler.node["spec"]["taints"] == [GPU_TAINT, GPU_FAULT] and handler.node["spec"]["unschedulable"]
    assert f"{gpu_health.REPORT_DIR}/{agent.HEALTH_FILE}" == gpu_health.HEALTH_PATH


def test_the_watch_s_own_health_file_takes_the_node_off_work(
    api: tuple[agent.ApiServer, type[FakeNodeApi]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the watch on the machine writes (gpu_check's watch, a recorded H100 and a kernel log with Xid 79) is what
    the agent reads: the two halves meet on the file's format."""
    server, handler = api
    report = _write_check_report(tmp_path, "h100-healthy.json", monkeypatch)
    agent.once(server, NODE, str(report), boot_id=BOOT, uptime=240, now=NOW)
    expect = tmp_path / "expect.json"
    expect.write_text(json.dumps(gpu_health.expectation("H100", 8)))
    log = (Path(__file__).parents[1] / "fixtures" / "gpu" / "kernel-xid79.log").read_text()
    gpu_check.watch(str(expect), str(tmp_path / "health.json"), polls=1, nvml=recorded("h100-healthy.json"),
                    read_log=lambda: log, clock=lambda: NOW.timestamp(), sleep=lambda _: None,
                    boot_id_file=gpu_check.BOOT_ID)  # fmt: skip
    agent.once(server, NODE, str(report), boot_id=BOOT, uptime=300, now=NOW)
    assert handler.node["spec"]["taints"] == [GPU_TAINT, GPU_FAULT]
    (condition,) = [c for c in handler.node["status"]["conditions"] if c["type"] == "GPUHealthy"]
    assert condition["reason"] == "GPUFault" and "GPU 3 xid: Xid 79" in condition["message"]


def _approved(boot: str = BOOT, action: str = "replace") -> dict[str, str]:
    approval = {"action": action, "boot_id": boot, "approved_at": "2027-01-05T12:00:00Z", "attempt": 1,
                "state": "approved"}  # fmt: skip
    return {gpu_health.REPAIR_ANNOTATION: json.dumps(approval)}


def test_an_approved_repair_is_requested_on_the_machine_while_it_is_absent(
    api: tuple[agent.ApiServer, type[FakeNodeApi]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, handler = api
    report = _write_check_report(tmp_path, "h100-seven-gpus.json", monkeypatch)  # fails: off work
    repair = tmp_path / "repair"
    repair.mkdir()
    requested: dict[str, datetime.datetime] = {}

    def once(now: datetime.datetime = NOW) -> list[str]:
        return agent.once(server, NODE, str(report), boot_id=BOOT, uptime=300, now=now, repair_dir=str(repair),
                          requested=requested)  # fmt: skip

    once()
    assert not (repair / "request").exists()  # not approved: nothing asked of the machine
    handler.node["metadata"]["annotations"].update(_approved())
    assert "repair requested on the machine: replace" in once()
    assert json.loads((repair / "request").read_text()) == {
        "action": "replace", "boot_id": BOOT, "node": NODE, "approved_at": "2027-01-05T12:00:00Z"
    }  # fmt: skip
    # Kept there while the machine acts on it: not written again.
    assert not any("repair" in line for line in once(NOW + datetime.timedelta(minutes=5)))
    # The machine's unit removes a request it failed to carry out (IMDS out for a moment): written again, at most once
    # a minute.
    (repair / "request").unlink()
    assert "repair requested on the machine: replace" in once(NOW + datetime.timedelta(minutes=6))
    (repair / "request").unlink()
    assert not any("repair" in line for line in once(NOW + datetime.timedelta(minutes=6, seconds=30)))
    assert "repair requested on the machine: replace" in once(NOW + datetime.timedelta(minutes=7))
    assert (repair / "request").exists() and not list(repair.glob("*.partial"))
    assert gpu_health.REPAIR_ANNOTATION == agent.REPAIR_ANNOTATION and gpu_health.REPAIR_ACTIONS == agent.REPAIR_ACTIONS


@pytest.mark.parametrize(
    ("approval", "working"),
    [(_approved(boot="previous-boot"), False), (_approved(action="format-disk"), False), (_approved(), True)],
    ids=["another-boot", "unknown-action", "a-working-node"],
)
def test_a_repair_is_requested_only_for_this_boot_s_approval_of_a_node_off_work(
    approval: dict[str, str], working: bool
) -> None:
    node = _working() if working else _node([GPU_TAINT, UNHEALTHY])
    node["metadata"]["annotations"].update(approval)
    report = _report("passed") if working else _report("failed", problems=("GPU 3 xid: Xid 79",))
    decision = agent.decide(node, report, boot_id=BOOT, uptime=5000)
    assert agent.repair_request(node, decision, BOOT) is None


def test_a_machine_without_the_repair_directory_says_so_once(tmp_path: Path) -> None:
    node = _node([GPU_TAINT, UNHEALTHY])
    node["metadata"]["annotations"].update(_approved())
    decision = agent.decide(node, _report("failed", problems=("GPU 3 xid: Xid 79",)), boot_id=BOOT, uptime=5000)
    request = agent.repair_request(node, decision, BOOT)
    assert request is not None and request["action"] == "replace"
    with pytest.raises(OSError):
        agent.write_request(str(tmp_path / "missing"), request)


def test_a_concurrent_change_is_retried_on_the_next_pass(
    api: tuple[agent.ApiServer, type[FakeNodeApi]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, handler = api
    report = _write_check_report(tmp_path, "h100-healthy.json", monkeypatch)
    node = agent.ApiServer.get_node(server, NODE)
    handler.node["metadata"]["resourceVersion"] = "101"  # the kubelet wrote in between
    decision = agent.decide(node, agent.read_report(str(report)), boot_id=BOOT, uptime=240)
    with pytest.raises(agent.urllib.error.HTTPError, match="409"):
        agent.apply(server, NODE, node, decision, NOW)
    assert handler.node["spec"]["taints"] == [GPU_TAINT, BURN_IN]  # nothing half-applied
    agent.once(server, NODE, str(report), boot_id=BOOT, uptime=255, now=NOW)
    assert handler.node["spec"]["taints"] == [GPU_TAINT]


# The admission policy: the agent's own node, the burn-in's fields, nothing else ----------------------------------


def _with(node: dict[str, Any], change: Any) -> dict[str, Any]:
    new = copy.deepcopy(node)
    change(new)
    return new


@pytest.mark.parametrize(
    ("change", "pod_node", "refused"),
    [
        (lambda n: n["spec"].update(taints=[GPU_TAINT]), NODE, None),
        (lambda n: n["spec"].update(taints=[GPU_TAINT, BURN_IN, UNHEALTHY]), NODE, None),
        (lambda n: n["spec"].update(taints=[GPU_TAINT, {**UNHEALTHY, "value": "check-not-finished"}]), NODE, None),
        (lambda n: n["spec"].update(taints=[GPU_TAINT, {**UNHEALTHY, "value": "anything"}]), NODE, "its own health"),
        (lambda n: n["spec"].update(taints=[GPU_TAINT, {**UNHEALTHY, "effect": "NoExecute"}]), NODE, "its own health"),
        (lambda n: n["metadata"].update(finalizers=["x/y"]), NODE, "owners or finalizers"),
        (lambda n: n["status"].update(daemonEndpoints={"kubeletEndpoint": {"Port": 1}}), NODE, "daemon endpoints"),
        (lambda n: n["metadata"]["annotations"].update({gpu_health.CHECK_ANNOTATION: "{}"}), NODE, None),
        (lambda n: n["status"]["conditions"].append({"type": "GPUHealthy", "status": "True"}), NODE, None),
        (lambda n: n["spec"].update(taints=[GPU_TAINT]), "ip-10-9-9-9.other", "only the node its pod runs on"),
        (lambda n: n["spec"].update(taints=[GPU_TAINT]), "", "only the node its pod runs on"),  # no claim
        (lambda n: n["spec"].update(taints=[BURN_IN]), NODE, "only the taints"),  # the pool's taint removed
        (lambda n: n["spec"].update(unschedulable=True), NODE, "lift only its own cordon"),  # no mark
        (lambda n: (n["spec"].update(unschedulable=True), n["metadata"]["annotations"].update(MARK)), NODE, None),
        # The GPU model labels: only to what the fleet gives the node's pool, never removed; no other label.
        (lambda n: n["metadata"]["labels"].update(GPU_LABELS["train-h100"]), NODE, None),
        (lambda n: n["metadata"]["labels"].update({"nvidia.com/gpu.product": "NVIDIA-H200"}), NODE, "GPU model labels"),
        (lambda n: n["metadata"]["labels"].update({"dlinfra.io/gpu-model": "H200"}), NODE, "GPU model labels"),
        (lambda n: n["metadata"]["labels"].pop("nvidia.com/gpu.product"), NODE, "GPU model labels"),
        (lambda n: n["metadata"]["labels"].update({"dlinfra.io/pool": "other"}), NODE, "labels other than"),
        (lambda n: n["metadata"]["labels"].update({"dlinfra.io/workload": "x"}), NODE, "labels other than"),
        (lambda n: n["metadata"]["annotations"].pop("node.alpha.kubernetes.io/ttl"), NODE, "only the annotation"),
        (lambda n: n["status"]["conditions"].clear(), NODE, "only the condition"),
        (lambda n: n["status"]["allocatable"].update({"nvidia.com/gpu": "16"}), NODE, "capacity, allocatable"),
        (lambda n: n["status"]["addresses"].append({"type": "InternalIP", "address": "10.6.6.6"}), NODE, "addresses"),
    ],
)
def test_the_agent_may_change_only_the_burn_in_on_its_own_node(change: Any, pod_node: str, refused: str | None) -> None:
    old = _node([GPU_TAINT, BURN_IN])
    refusals = _policy_refusals(old, _with(old, change), pod_node)
    assert (refusals == []) if refused is None else any(refused in r for r in refusals), refusals


def test_the_agent_relabels_only_as_the_node_s_own_pool_says() -> None:
    """A pool's labels on a node of another pool, or of a pool the fleet gives none, are refused."""
    other = _node([GPU_TAINT])
    other["metadata"]["labels"]["dlinfra.io/pool"] = "interactive"
    relabelled = _with(other, lambda n: n["metadata"]["labels"].update(GPU_LABELS["train-h100"]))
    assert any("GPU model labels" in r for r in _policy_refusals(other, relabelled, NODE))
    assert agent.relabel(other, GPU_LABELS) == {}  # and the agent does not try


def test_a_node_that_joined_before_its_labels_changed_is_relabelled_as_it_is_let_on(
    api: tuple[agent.ApiServer, type[FakeNodeApi]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, handler = api
    report = _write_check_report(tmp_path, "h100-healthy.json", monkeypatch)
    changed = agent.once(server, NODE, str(report), boot_id=BOOT, uptime=240, now=NOW, gpu_labels=GPU_LABELS)
    assert changed[0] == "labels: dlinfra.io/gpu-model=H100, nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
    node = handler.node
    assert node["metadata"]["labels"] == {"dlinfra.io/pool": "train-h100", **GPU_LABELS["train-h100"]}
    assert node["spec"]["taints"] == [GPU_TAINT]  # in the same patch: work never meets the old labels
    assert handler.patches.count(f"/api/v1/nodes/{NODE}") == 1
    # And a node let on long ago (no burn-in to do) is relabelled too, once.
    handler.node["metadata"]["labels"]["nvidia.com/gpu.product"] = "H100"
    assert agent.once(server, NODE, str(report), boot_id=BOOT, uptime=9000, now=NOW, gpu_labels=GPU_LABELS) == [
        "labels: nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
    ]
    assert agent.once(server, NODE, str(report), boot_id=BOOT, uptime=9015, now=NOW, gpu_labels=GPU_LABELS) == []


def test_the_agent_lifts_only_its_own_cordon() -> None:
    ours = _node([GPU_TAINT])
    ours["spec"]["unschedulable"] = True
    ours["metadata"]["annotations"].update(MARK)
    lifted = _with(ours, lambda n: (n["spec"].pop("unschedulable"), n["metadata"]["annotations"].pop(MARK_KEY)))
    assert _policy_refusals(ours, lifted, NODE) == []
    theirs = _node([GPU_TAINT])
    theirs["spec"]["unschedulable"] = True  # an operator's or the termination handler's cordon
    assert _policy_refusals(theirs, _with(theirs, lambda n: n["spec"].pop("unschedulable")), NODE)
    # Nor in two steps: the mark first, on another's cordon, then both off.
    assert _policy_refusals(theirs, _with(theirs, lambda n: n["metadata"]["annotations"].update(MARK)), NODE)
    # Someone lifted the agent's cordon and left the mark: the agent may cordon again while the verdict stands, and
    # may drop a stale mark from an uncordoned node.
    lifted_by_another = _node([GPU_TAINT])
    lifted_by_another["metadata"]["annotations"].update(MARK)
    again = _with(lifted_by_another, lambda n: n["spec"].update(unschedulable=True))
    assert _policy_refusals(lifted_by_another, again, NODE) == []
    stale = _with(lifted_by_another, lambda n: n["metadata"]["annotations"].pop(MARK_KEY))
    assert _policy_refusals(lifted_by_another, stale, NODE) == []


def test_the_policy_leaves_everyone_else_to_rbac() -> None:
    (match,) = gpu_burn_in.own_node_policy_spec(GPU_LABELS)["matchConditions"]
    env = celpy.Environment()
    for user, matched in ((gpu_burn_in.SERVICE_ACCOUNT_USER, True), ("system:node:" + NODE, False)):
        request = celpy.json_to_cel({"userInfo": {"username": user}})
        assert bool(env.program(env.compile(match["expression"])).evaluate({"request": request})) is matched


# What is declared --------------------------------------------------------------------------------------------------


def test_the_shipped_scripts_run_from_their_config_map_layout_with_the_standard_library_only(tmp_path: Path) -> None:
    """What the pods' ConfigMap volumes lay out, imported by a Python without site-packages (-S)."""
    for module in (agent, capacity_block_flavor, gpu_repair_script):
        files = pod_scripts.script_files(kube_api, module)
        root = tmp_path / module.__name__
        for item in pod_scripts.script_items(files):
            (root / item["path"]).parent.mkdir(parents=True, exist_ok=True)
            (root / item["path"]).write_text(files[item["key"]])
        done = subprocess.run(
            [sys.executable, "-S", "-c", f"import {module.__name__}"],
            cwd=root,
            env={"PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr


def test_the_probes_read_the_heartbeats_the_agent_writes(tmp_path: Path) -> None:
    spec = gpu_burn_in.daemon_set_spec(GPU_LABELS)["template"]["spec"]
    (container,) = spec["containers"]
    for probe, name in ((container["livenessProbe"], agent.ALIVE), (container["readinessProbe"], agent.READY)):
        command = [c.replace(agent.HEARTBEAT_DIR, str(tmp_path)) for c in probe["exec"]["command"]]
        command[0] = sys.executable
        assert subprocess.run(command, timeout=120, check=False).returncode == 1  # no heartbeat yet
        agent.beat(name, str(tmp_path))
        assert subprocess.run(command, timeout=120, check=False).returncode == 0


def test_the_daemon_set_runs_on_every_gpu_node_unprivileged_reading_the_report() -> None:
    spec = gpu_burn_in.daemon_set_spec(GPU_LABELS)["template"]["spec"]
    (container,) = spec["containers"]
    assert spec["affinity"] == nodes.GPU_NODE_AFFINITY and spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["securityContext"]["runAsNonRoot"] and not container["securityContext"]["allowPrivilegeEscalation"]
    hosts = {v["hostPath"]["path"]: v["name"] for v in spec["volumes"] if "hostPath" in v}
    assert set(hosts) == {gpu_health.REPORT_DIR, gpu_health.REPAIR_DIR}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    # The check's files read-only; the repair directory writable, for the request alone.
    assert mounts[hosts[gpu_health.REPORT_DIR]]["readOnly"] is True
    assert not mounts[hosts[gpu_health.REPAIR_DIR]].get("readOnly")
    assert container["command"][-2:] == [f"{gpu_burn_in.REPORT_MOUNT}/report.json", gpu_burn_in.REPAIR_MOUNT]
    assert mounts[hosts[gpu_health.REPAIR_DIR]]["mountPath"] == gpu_burn_in.REPAIR_MOUNT
    (labels,) = [e["value"] for e in container["env"] if e["name"] == agent.GPU_LABELS_ENV]
    assert json.loads(labels) == GPU_LABELS
    assert f"{gpu_health.REPORT_DIR}/report.json" == gpu_health.REPORT_PATH


def test_the_gpu_add_ons_run_through_the_burn_in() -> None:
    """The device plugin must run on a node under burn-in: the agent waits for the GPUs it advertises."""
    for values in (nvidia.device_plugin_values(), nvidia.dcgm_exporter_values()):
        keys = {t["key"] for t in values["tolerations"]}
        assert {BURN_IN["key"], UNHEALTHY["key"]} <= keys


def test_the_autoscaler_knows_the_burn_in_as_a_startup_taint() -> None:
    assert autoscaler.autoscaler_args("1.33")["startup-taint"] == BURN_IN["key"]
    # Kueue's wait for a job's pods covers the node's provisioning and its burn-in.
    assert kueue_chart.PODS_READY_TIMEOUT_SECONDS >= (
        autoscaler.MAX_NODE_PROVISION_SECONDS + gpu_health.BURN_IN_SECONDS + kueue_chart.POD_START_SECONDS
    )


@pytest.mark.parametrize("stack", [s for s in reference.runs() if s.endswith("-k8s")])
def test_every_in_cluster_stack_declares_the_agent_and_its_limits(stack: str) -> None:
    result = reference.runs()[stack]
    objects = [r for r in result.resources if r.type.startswith("kubernetes:") and "metadata" in r.inputs]
    names = {(r.type.rsplit(":", 1)[1], r.inputs["metadata"]["name"]) for r in objects}
    assert {
        ("DaemonSet", gpu_burn_in.NAME),
        ("ConfigMap", gpu_burn_in.NAME),
        ("ServiceAccount", gpu_burn_in.NAME),
        ("NetworkPolicy", gpu_burn_in.NAME),
        ("ClusterRole", gpu_burn_in.ROLE),
        ("ClusterRoleBinding", gpu_burn_in.ROLE),
        ("ValidatingAdmissionPolicy", gpu_burn_in.OWN_NODE_POLICY),
        ("ValidatingAdmissionPolicyBinding", gpu_burn_in.OWN_NODE_POLICY),
    } <= names
    (binding,) = [
        r
        for r in objects
        if r.type.endswith(":ClusterRoleBinding") and r.inputs["metadata"]["name"] == gpu_burn_in.ROLE
    ]
    # The rights come after their limits: the binding waits for the policy's binding.
    urns = {r.urn: r for r in result.resources}
    assert any(urns[d].type.endswith(":ValidatingAdmissionPolicyBinding") for d in binding.dependencies if d in urns)


@pytest.mark.parametrize("stack", [s for s in reference.runs() if s.endswith("-k8s")])
def test_the_agent_keeps_the_labels_the_pools_and_sites_register_with(stack: str) -> None:
    """What the agent relabels nodes to, and all its policy lets it write, is what the region's launch templates and
    site NodeConfigs give new nodes: each GPU pool's and site's model labels, NVIDIA's product name in
    nvidia.com/gpu.product."""
    result = reference.runs()[stack]
    (daemon_set,) = [
        r for r in result.resources if r.type == "kubernetes:apps/v1:DaemonSet" and r.name.endswith(gpu_burn_in.NAME)
    ]
    (container,) = daemon_set.inputs["spec"]["template"]["spec"]["containers"]
    (env,) = [e["value"] for e in container["env"] if e["name"] == agent.GPU_LABELS_ENV]
    regional = reference.runs()[stack.removesuffix("-k8s")]
    templates = [r for r in regional.resources if r.type == "aws:ec2/launchTemplate:LaunchTemplate"]
    expected = {}
    for template in templates:
        user_data = base64.b64decode(template.inputs["userData"]).decode()
        if "nvidia.com/gpu.product=" not in user_data:
            continue  # a CPU pool's
        labels = dict(kv.split("=", 1) for kv in user_data.split("--node-labels '", 1)[1].split("'", 1)[0].split(","))
        expected[labels["dlinfra.io/pool"]] = {k: labels[k] for k in ("dlinfra.io/gpu-model", "nvidia.com/gpu.product")}
    assert expected and {p: v for p, v in json.loads(env).items() if not p.startswith("site-")} == expected
    for labels in json.loads(env).values():
        assert labels["nvidia.com/gpu.product"].startswith("NVIDIA-") and " " not in labels["nvidia.com/gpu.product"]
