"""The Capacity Block flavors' keeper: its script against a loopback API server, and what the platform declares."""

from __future__ import annotations

import datetime
import http.server
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components import block_flavors, pod_scripts
from components.capacity_block import drain_at
from components.scripts import capacity_block_flavor as keeper
from tests.loopback import serving

UTC = datetime.UTC
OPENS = datetime.datetime(2027, 1, 4, 11, 30, tzinfo=UTC)
CLOSES = datetime.datetime(2027, 1, 18, 10, 13, tzinfo=UTC)
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
WINDOW = keeper.FlavorWindow("pool-train-h100", OPENS, CLOSES, (GPU_TAINT,))


@pytest.mark.parametrize(
    ("now", "closed"),
    [
        (OPENS - datetime.timedelta(seconds=1), True),
        (OPENS, False),
        (CLOSES - datetime.timedelta(seconds=1), False),
        (CLOSES, True),
        (CLOSES + datetime.timedelta(days=200), True),
    ],
)
def test_the_flavor_carries_the_closed_taint_exactly_outside_its_window(now: datetime.datetime, closed: bool) -> None:
    taints = WINDOW.taints_at(now)
    assert taints[0] == GPU_TAINT  # the pool's own taint, always
    assert (keeper.CLOSED_TAINT in taints) is closed
    assert len(taints) == 1 + closed


def test_the_keeper_reads_what_the_platform_writes() -> None:
    block = block_flavors.BlockFlavor(
        flavor="pool-train-h100", opens_at=OPENS, closes_at=CLOSES, taints=[("nvidia.com/gpu", "true", "NoSchedule")]
    )
    other = block_flavors.BlockFlavor(flavor="pool-a", opens_at=OPENS, closes_at=CLOSES)
    config = block_flavors.keeper_config([block, other])
    assert [f["flavor"] for f in config["flavors"]] == ["pool-a", "pool-train-h100"]  # order-free
    assert keeper.load(json.dumps(config)) == [keeper.FlavorWindow("pool-a", OPENS, CLOSES, ()), WINDOW]


def test_the_flavor_closes_ahead_of_the_group() -> None:
    end = datetime.datetime(2027, 1, 18, 11, 30, tzinfo=UTC)
    opens, closes = block_flavors.flavor_window(OPENS, end, 1800)
    assert opens == OPENS
    assert closes == drain_at(end, 1800) - block_flavors.CLOSE_LEAD
    assert datetime.timedelta(minutes=5) <= block_flavors.CLOSE_LEAD  # many autoscaler scans while the group is open


def test_a_window_must_be_utc_and_forward() -> None:
    with pytest.raises(ValueError, match="aware UTC"):
        block_flavors.BlockFlavor(flavor="f", opens_at=OPENS.replace(tzinfo=None), closes_at=CLOSES)
    with pytest.raises(ValueError, match="closes before it opens"):
        block_flavors.BlockFlavor(flavor="f", opens_at=CLOSES, closes_at=OPENS)


def test_the_keeper_may_patch_the_block_flavors_and_nothing_else() -> None:
    blocks = [block_flavors.BlockFlavor(flavor=f, opens_at=OPENS, closes_at=CLOSES) for f in ("pool-b", "pool-a")]
    (rule,) = block_flavors.cluster_role_rules(blocks)
    assert rule == {
        "apiGroups": ["kueue.x-k8s.io"],
        "resources": ["resourceflavors"],
        "resourceNames": ["pool-a", "pool-b"],
        "verbs": ["get", "patch"],  # no create: an apply to a missing flavor fails instead of making one
    }


def test_the_cron_job_runs_the_shipped_script_every_minute_as_nobody() -> None:
    spec = block_flavors.cron_job_spec()
    assert spec["schedule"] == "* * * * *" and spec["concurrencyPolicy"] == "Forbid"
    job = spec["jobTemplate"]["spec"]
    assert job["activeDeadlineSeconds"] < 60  # a stuck run ends before the next minute's
    assert job["activeDeadlineSeconds"] > keeper.TIMEOUT_SECONDS
    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["python3", "-m", keeper.__name__, f"{pod_scripts.SCRIPTS_MOUNT}/config.json"]
    assert container["image"].startswith("public.ecr.aws/docker/library/python:3.")
    assert container["image"].split(":")[1].count(".") == 2  # one exact release, no floating tag
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    scripts = pod["volumes"][0]["configMap"]
    assert scripts["name"] == block_flavors.NAME
    assert {"key": "config.json", "path": "config.json"} in scripts["items"]
    assert {"key": "components.scripts.kube_api.py", "path": "components/scripts/kube_api.py"} in scripts["items"]
    # The API token only in this pod, short-lived, where the script reads it (and its CA beside it).
    assert pod["automountServiceAccountToken"] is False
    (token,) = [v for v in pod["volumes"] if v["name"] == "api-token"]
    sources = token["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["expirationSeconds"] >= 600  # TokenRequest's minimum
    assert sources[1]["configMap"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["api-token"] == keeper.SERVICE_ACCOUNT


# The script against a loopback API server ------------------------------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    requests: list[dict[str, Any]]
    status = 200

    def do_PATCH(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"kind":"Status","message":"resourceflavors is forbidden"}' if self.status >= 400 else b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[keeper.ApiServer, type[_Recorder]]]:
    handler = type("Handler", (_Recorder,), {"requests": [], "status": 200})
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    with serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)) as url:
        yield keeper.ApiServer(url, str(token), None), handler


def test_each_flavor_is_one_server_side_apply_of_its_taints(api: tuple[keeper.ApiServer, type[_Recorder]]) -> None:
    server, handler = api
    before = OPENS - datetime.timedelta(hours=1)
    lines = keeper.run([WINDOW], server, before)
    assert lines == ["flavor pool-train-h100: closed until 2027-01-04T11:30:00Z"]
    (request,) = handler.requests
    path, _, query = request["path"].partition("?")
    assert path == "/apis/kueue.x-k8s.io/v1beta2/resourceflavors/pool-train-h100"
    assert sorted(query.split("&")) == ["fieldManager=dlinfra-capacity-block-window", "force=true"]
    assert request["headers"]["Content-Type"] == "application/apply-patch+yaml"
    assert request["headers"]["Authorization"] == "Bearer sa-token"
    assert request["body"] == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "pool-train-h100"},
        "spec": {"nodeTaints": [GPU_TAINT, keeper.CLOSED_TAINT]},
    }
    assert keeper.run([WINDOW], server, OPENS) == ["flavor pool-train-h100: open until 2027-01-18T10:13:00Z"]
    assert handler.requests[1]["body"]["spec"] == {"nodeTaints": [GPU_TAINT]}


def test_a_refused_apply_fails_the_run_after_trying_every_flavor(
    api: tuple[keeper.ApiServer, type[_Recorder]],
) -> None:
    server, handler = api
    handler.status = 403
    other = keeper.FlavorWindow("pool-b", OPENS, CLOSES, ())
    with pytest.raises(keeper.KeeperError) as refused:
        keeper.run([WINDOW, other], server, OPENS)
    assert len(handler.requests) == 2
    assert all("not applied: HTTP Error 403" in line and "forbidden" in line for line in refused.value.lines)


def test_an_unreachable_api_server_fails_the_run(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    server = keeper.ApiServer("http://127.0.0.1:9", str(token), None)  # discard port: refused on loopback
    with pytest.raises(keeper.KeeperError, match="not applied"):
        keeper.run([WINDOW], server, OPENS)


def test_main_reads_its_configuration_and_exits_1_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"flavors": [{"flavor": "f", "opens_at": "2027-01-04T11:30:00Z",
                                               "closes_at": "2027-01-18T10:13:00Z", "taints": []}]}))  # fmt: skip
    token = tmp_path / "token"
    token.write_text("t")
    monkeypatch.setattr(
        keeper.ApiServer, "in_cluster", classmethod(lambda cls: cls("http://127.0.0.1:9", str(token), None))
    )
    assert keeper.main(["keeper", str(config)]) == 1
    assert "flavor f: not applied" in capsys.readouterr().err
