"""`dlinfra gpu status` against a recorded Kubernetes API (the loopback server the what-happened tests use): GPU
nodes in each burn-in state, cloud and site, with the node objects as the burn-in agent leaves them; and
`what-happened` telling a node's GPU check among its events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from dlinfra.cli import main as cli
from dlinfra.model import gpu_health
from dlinfra.ops import gpu_status
from dlinfra.ops import what_happened as wh
from tests.loopback import serving
from tests.ops.test_what_happened import RecordedApi, write_kubeconfig

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
BURN_IN, UNHEALTHY = (
    {"key": k, "value": v, "effect": e} for k, v, e in (gpu_health.BURN_IN_TAINT, gpu_health.UNHEALTHY_TAINT)
)


def _node(name: str, labels: dict[str, str], taints: list[dict[str, str]], condition: dict[str, str] | None,
          *, check: dict[str, Any] | None = None, gpus: str = "8") -> dict[str, Any]:  # fmt: skip
    annotations = {gpu_health.CHECK_ANNOTATION: json.dumps(check)} if check else {}
    conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": "2027-01-05T10:00:00Z"}]
    if condition:
        conditions.append({"type": gpu_health.HEALTH_CONDITION, **condition})
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations,
                     "creationTimestamp": "2027-01-05T10:00:00Z"},
        "spec": {"taints": taints},
        "status": {"capacity": {"nvidia.com/gpu": gpus}, "allocatable": {"nvidia.com/gpu": gpus},
                   "conditions": conditions},
    }  # fmt: skip


H100 = {"dlinfra.io/pool": "train-h100", "nvidia.com/gpu.product": "H100"}
NODES = [
    _node("ip-10-1-0-1", H100, [GPU_TAINT],
          {"status": "True", "reason": "CheckPassed", "message": "the GPU check passed",
           "lastTransitionTime": "2027-01-05T10:06:00Z"},
          check={"verdict": "passed", "finished_at": "2027-01-05T10:05:40Z", "problems": []}),
    _node("ip-10-1-0-2", H100, [GPU_TAINT, UNHEALTHY],
          {"status": "False", "reason": "CheckFailed", "message": "the GPU check failed: GPU 3 xid: Xid 79",
           "lastTransitionTime": "2027-01-05T10:07:00Z"},
          check={"verdict": "failed", "finished_at": "2027-01-05T10:06:50Z", "problems": ["GPU 3 xid: Xid 79"]}),
    _node("ip-10-1-0-3", H100, [GPU_TAINT, BURN_IN],
          {"status": "Unknown", "reason": "Checking", "message": "the GPU check of this boot is running",
           "lastTransitionTime": "2027-01-05T11:00:00Z"}),
    _node("mi-0123456789abcdef0", {"dlinfra.io/pool": "site-sjc1", "dlinfra.io/site": "sjc1",
                                   "nvidia.com/gpu.product": "H100"}, [GPU_TAINT], None),
    _node("mi-0123456789abcdef1", {"dlinfra.io/pool": "site-sjc1", "dlinfra.io/site": "sjc1",
                                   "nvidia.com/gpu.product": "H100"},
          [GPU_TAINT, {"key": "dlinfra.io/gpu-burn-in-site", "value": "pending", "effect": "NoSchedule"}],
          {"status": "Unknown", "reason": "Checking", "lastTransitionTime": "2027-01-05T11:00:00Z"}),
    _node("ip-10-1-0-4", H100, [GPU_TAINT, {**UNHEALTHY, "value": "check-not-judged"}],
          {"status": "Unknown", "reason": "CheckNotJudged", "message": "DCGM is paused",
           "lastTransitionTime": "2027-01-05T11:00:00Z"}),
    _node("ip-10-1-9-9", {"dlinfra.io/pool": "cpu"}, [], None, gpus=""),
]  # fmt: skip


def test_each_node_s_state_follows_what_the_agent_left() -> None:
    found = {h.node: h for h in gpu_status.gpu_nodes(NODES)}
    assert "ip-10-1-9-9" not in found  # no GPUs
    assert [(h.node, h.state) for h in gpu_status.gpu_nodes(NODES)] == [
        ("ip-10-1-0-1", "healthy"),
        ("ip-10-1-0-2", "failed"),
        ("ip-10-1-0-3", "burning in"),
        ("ip-10-1-0-4", "not judged"),
        ("mi-0123456789abcdef0", "not checked"),
        ("mi-0123456789abcdef1", "burning in"),  # a site machine, under its own burn-in taint
    ]
    assert found["ip-10-1-0-2"].last_check == "failed at 2027-01-05T10:06:50Z"
    assert "Xid 79" in found["ip-10-1-0-2"].message
    assert "is the burn-in agent running" in found["mi-0123456789abcdef0"].reason


def test_a_shared_node_shows_its_shares_and_a_pod_on_a_share_keeps_the_check_off() -> None:
    """A MIG node offers nvidia.com/mig-<profile>, no nvidia.com/gpu: its count is its shares; a notebook on one share
    uses the GPUs as much as a job on a whole one (the check loads every GPU)."""
    node = _node("ip-10-1-0-6", {"dlinfra.io/pool": "notebooks", "dlinfra.io/gpu-model": "A100"}, [GPU_TAINT],
                 {"status": "True", "reason": "CheckPassed", "lastTransitionTime": "2027-01-05T12:00:00Z"})  # fmt: skip
    shares = {"nvidia.com/mig-1g.5gb": "16", "nvidia.com/mig-3g.20gb": "8"}
    node["status"]["capacity"] = node["status"]["allocatable"] = shares
    (health,) = gpu_status.gpu_nodes([node])
    assert health.gpus == "24/24 shares" and health.state == "healthy"
    pod = {"metadata": {"namespace": "team-vision", "name": "notebook"},
           "spec": {"containers": [{"resources": {"limits": {"nvidia.com/mig-1g.5gb": "1"}}}]}}  # fmt: skip
    sliced = {"metadata": {"namespace": "team-vision", "name": "turn"},
              "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}]}}  # fmt: skip
    assert gpu_status.busy_with_gpus([pod, sliced]) == ["team-vision/notebook", "team-vision/turn"]


def test_a_fault_the_watch_found_while_the_node_worked_shows_as_failed() -> None:
    faulted = _node("ip-10-1-0-5", H100, [GPU_TAINT, {**UNHEALTHY, "value": "gpu-fault"}],
                    {"status": "False", "reason": "GPUFault", "lastTransitionTime": "2027-01-05T12:00:00Z",
                     "message": "the GPU watch found a fault at 2027-01-05T11:59:00Z, after the check passed: "
                                "GPU 3 xid: Xid 79"},
                    check={"verdict": "passed", "finished_at": "2027-01-05T10:05:40Z", "problems": []})  # fmt: skip
    (health,) = gpu_status.gpu_nodes([faulted])
    assert (health.state, health.reason, health.last_check) == ("failed", "GPUFault", "passed at 2027-01-05T10:05:40Z")
    assert "Xid 79" in health.message


NODES[0]["spec"]["providerID"] = "aws:///us-west-2a/i-0a1b2c3d4e5f60718"
NODES[1]["spec"]["providerID"] = "aws:///us-west-2b/i-0f1e2d3c4b5a69788"


def _pod(name: str, node: str, *, gpus: bool, daemon: bool = False, phase: str = "Running") -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "8"} if gpus else {}
    owner = [{"kind": "DaemonSet", "name": "nvidia-device-plugin"}] if daemon else []
    return {
        "metadata": {"namespace": "team-vision", "name": name, "ownerReferences": owner},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": phase},
    }


PODS = [
    _pod("train-0", "ip-10-1-0-1", gpus=True),
    _pod("device-plugin", "ip-10-1-0-2", gpus=True, daemon=True),
    _pod("done", "ip-10-1-0-2", gpus=True, phase="Succeeded"),
    _pod("cpu-helper", "ip-10-1-0-2", gpus=False),
]


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordedApi]:
    api = RecordedApi({"nodes": NODES, "pods": PODS, "events": []})
    with serving(api) as url:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
        yield api


def test_gpu_status_reads_the_cluster_and_exits_1_on_a_failed_node(
    cluster: RecordedApi, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["gpu", "status", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    listed = document["nodes"]
    assert document["schema"] == "dlinfra.gpu-status/v1"
    assert [(n["node"], n["state"], n["gpus"]) for n in listed][:2] == [
        ("ip-10-1-0-1", "healthy", "8/8"),
        ("ip-10-1-0-2", "failed", "8/8"),
    ]
    assert cluster.requests == [("GET", "/api/v1/nodes")]  # one read, nothing written
    assert cli.main(["gpu", "status"]) == 1
    text = capsys.readouterr().out
    assert "ip-10-1-0-3" in text and "burning in" in text
    assert "ip-10-1-0-2: the GPU check failed: GPU 3 xid: Xid 79" in text


def test_gpu_status_without_a_cluster_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert cli.main(["gpu", "status"]) == 2
    assert "cannot read the cluster's nodes: no usable kubeconfig" in capsys.readouterr().err


def test_what_happened_tells_the_gpu_check_among_a_node_s_events() -> None:
    events = wh.node_events(NODES[1]) + wh.node_now(NODES[1], datetime(2027, 1, 5, 12, tzinfo=UTC))
    told = {(e.what, e.detail) for e in events}
    assert ("GPUHealthy=False", "CheckFailed: the GPU check failed: GPU 3 xid: Xid 79") in told
    (now,) = [e for e in events if e.what == "now"]
    assert f"{gpu_health.UNHEALTHY_TAINT[0]}:NoSchedule" in now.detail


@pytest.fixture
def ssm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never the link-local metadata address
    for name in ("AWS_PROFILE", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        yield boto3.client("ssm", region_name="us-west-2")


def test_gpu_check_restarts_the_check_through_ssm_on_a_drained_node(
    cluster: RecordedApi, ssm: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["gpu", "check", "ip-10-1-0-2"]) == 0  # a DaemonSet's, a finished and a CPU pod: drained
    printed = capsys.readouterr().out
    (command,) = ssm.list_commands()["Commands"]
    assert command["InstanceIds"] == ["i-0f1e2d3c4b5a69788"] and command["DocumentName"] == "AWS-RunShellScript"
    assert command["Parameters"]["commands"] == [f"systemctl restart --no-block {gpu_health.CHECK_UNIT}"]
    assert command["CommandId"] in printed and "us-west-2" in printed
    # Nothing was written to the cluster: the burn-in agent reads the new report.
    assert {method for method, _ in cluster.requests} == {"GET"}


def test_gpu_check_refuses_a_node_whose_gpus_are_in_use(
    cluster: RecordedApi, ssm: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["gpu", "check", "ip-10-1-0-1"]) == 2
    assert "runs pods that use its GPUs (team-vision/train-0)" in capsys.readouterr().err
    assert ssm.list_commands()["Commands"] == []
    assert cli.main(["gpu", "check", "ip-10-1-0-1", "--force"]) == 0


def test_gpu_check_of_a_site_machine_needs_its_region(
    cluster: RecordedApi, ssm: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["gpu", "check", "mi-0123456789abcdef0"]) == 2
    assert "give its home region with --region" in capsys.readouterr().err
    assert cli.main(["gpu", "check", "mi-0123456789abcdef0", "--region", "us-west-2"]) == 0
    (command,) = ssm.list_commands()["Commands"]
    assert command["InstanceIds"] == ["mi-0123456789abcdef0"]
    assert cli.main(["gpu", "check", "ip-10-1-9-9"]) == 2  # a CPU node
    assert "has no GPUs" in capsys.readouterr().err
    assert cli.main(["gpu", "check", "ip-10-9-9-9"]) == 2
    assert "no node ip-10-9-9-9" in capsys.readouterr().err


# `gpu labels`: what still selects a GPU model label value that is, or would be, on no node ---------------------------

NEW_H100 = {"dlinfra.io/pool": "train-h100", "dlinfra.io/gpu-model": "H100",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}  # fmt: skip


def _selecting(kind: str, name: str, selector: dict[str, str], *, done: bool = False,
               affinity: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    pod_spec: dict[str, Any] = {"nodeSelector": {"dlinfra.io/pool": "train-h100", **selector}, "containers": []}
    if affinity:
        pod_spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": affinity}}
        }
    meta = {"namespace": "team-vision", "name": name}
    if kind == "Pod":
        return {"metadata": meta, "spec": pod_spec, "status": {"phase": "Succeeded" if done else "Pending"}}
    conditions = [{"type": "Complete", "status": "True"}] if done else []
    return {"metadata": meta, "spec": {"template": {"spec": pod_spec}}, "status": {"conditions": conditions}}


def test_gpu_labels_finds_work_that_selects_a_short_name_or_a_value_no_node_carries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    short = {"nvidia.com/gpu.product": "H100"}  # as Kueue's flavors wrote it before dlinfra.io/gpu-model
    pods = [
        _selecting("Pod", "admitted-before", short),
        _selecting("Pod", "finished-before", short, done=True),
        _selecting("Pod", "admitted-now", {"dlinfra.io/gpu-model": "H100"}),
        _selecting("Pod", "nvidia-example", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
        _selecting("Pod", "wants-h200", {}, affinity=[
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]}]}
        ]),
    ]  # fmt: skip
    jobs = [_selecting("Job", "retrying", short), _selecting("Job", "completed", short, done=True)]
    nodes = [_node("ip-10-1-0-1", NEW_H100, [GPU_TAINT], None), _node("ip-10-1-0-2", H100, [GPU_TAINT], None)]
    api = RecordedApi({"nodes": nodes, "pods": pods, "events": [], "jobs": jobs})
    with serving(api) as url:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
        assert cli.main(["gpu", "labels", "--json"]) == 1
        document = json.loads(capsys.readouterr().out)
        found = document["selections"]
        assert document["schema"] == "dlinfra.gpu-labels/v1"
        assert [(f["kind"], f["name"], f["values"]) for f in found] == [
            ("Job", "retrying", ["H100"]),
            ("Pod", "admitted-before", ["H100"]),
            ("Pod", "wants-h200", ["NVIDIA-H200"]),
        ]
        assert "short model name" in found[0]["problem"] and "no node carries it now" in found[2]["problem"]
        assert [f["blocking"] for f in found] == [True, True, False]
        assert all(method == "GET" for method, _ in api.requests)  # it only reads
        assert cli.main(["gpu", "labels"]) == 1
        assert "Pod team-vision/admitted-before: nvidia.com/gpu.product in (H100):" in capsys.readouterr().out
        # Only the short names hold the move back; a value no node carries now (a pool at zero) is a note.
        api.objects |= {"pods": pods[1:], "jobs": jobs[1:]}
        assert cli.main(["gpu", "labels"]) == 0
        assert "note: Pod team-vision/wants-h200" in capsys.readouterr().out
