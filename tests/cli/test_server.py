"""`dlinfra server`: with the servers running, a command and a checkov scan print, write and exit exactly as they do
in their own processes; they serve only their own code; `stop` leaves nothing behind (module-scoped: a start
imports the provider SDKs and checkov, seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlinfra.checks import checkov
from dlinfra.cli import main as cli
from dlinfra.cli import server
from dlinfra.serving import servers
from tests.conftest import FIXTURES, ROOT

TIMEOUT = 300  # seconds for one command; it returns as soon as it is done


@pytest.fixture(scope="module")
def started() -> Iterator[list[int]]:
    assert cli.main(["server", "start", "--idle", "900"]) == 0
    pids = [entry["pid"] for entry in server.status()]
    yield pids
    server.stop_all()


def _dlinfra(args: list[str], mode: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dlinfra", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        env={**os.environ, "DLINFRA_SERVER": mode, **env},
    )


def test_start_runs_both_servers_for_this_code(started: list[int]) -> None:
    listed = server.status()
    assert sorted(entry["name"] for entry in listed) == (["checkov", "dlinfra"] if _has_checkov() else ["dlinfra"])
    assert all(entry["current"] for entry in listed)
    assert cli.main(["server", "start"]) == 0
    assert [entry["pid"] for entry in server.status()] == started, "a second start reuses the running servers"


@pytest.mark.parametrize(
    "args",
    [
        ["validate", "--fleet", str(FIXTURES / "fleet.yaml")],
        ["validate", "--fleet", str(FIXTURES / "missing.yaml")],  # an error: its message and exit code
        ["stacks", "--fleet", str(FIXTURES / "fleet.yaml"), "--json"],
        ["--help"],
    ],
    ids=["validate", "error", "stacks-json", "help"],
)
def test_a_served_command_prints_and_exits_as_its_own_process_does(started: list[int], args: list[str]) -> None:
    for env in ({}, {"FORCE_COLOR": "1", "COLUMNS": "100"}, {"NO_COLOR": "1"}):
        alone = _dlinfra(args, "off", **env)
        served = _dlinfra(args, "require", **env)
        assert (served.returncode, served.stdout, served.stderr) == (alone.returncode, alone.stdout, alone.stderr)
    if "missing" in args[-1]:  # "error:" in bold red, from a console made when the server imported its module
        colored = _dlinfra(args, "require", FORCE_COLOR="1")
        assert "\x1b[1;31merror:" in colored.stderr, "FORCE_COLOR reaches the consoles the server made"


def test_relative_paths_are_the_callers(started: list[int], tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_bytes((FIXTURES / "fleet.yaml").read_bytes())
    (tmp_path / "cidr-lock.yaml").write_bytes((FIXTURES / "cidr-lock.yaml").read_bytes())
    served = _dlinfra(["validate"], "require", cwd=tmp_path)
    assert served.returncode == 0, served.stderr
    assert "fleet.yaml: ok" in served.stdout + served.stderr


def test_a_served_checkov_scan_reports_what_its_own_process_does(
    started: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = checkov.executable(ROOT)
    if not _has_checkov():
        if os.environ.get("CI") == "true":
            pytest.fail("checkov is not installed (run .ci/setup): in CI a check that cannot run is a failure")
        pytest.skip("checkov is not installed (run .ci/setup)")
    manifests = ROOT / "tests" / "checks" / "fixtures" / "manifests"
    alone = checkov.run("kubernetes", directory=manifests, checkov=path)
    monkeypatch.setenv("DLINFRA_SERVER", "require")  # fails unless the checkov server ran it
    served = checkov.run("kubernetes", directory=manifests, checkov=path)
    assert served == alone
    assert served.failed > 0, "the bad deployment fails checks: the comparison is not of two empty reports"


def test_status_json_and_stop(started: list[int], capsys: pytest.CaptureFixture[str]) -> None:
    assert all(entry["current"] for entry in server.status()), "the commands run so far left the servers current"
    capsys.readouterr()
    assert cli.main(["server", "status", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["schema"] == 1 and sorted(entry["pid"] for entry in listed["servers"]) == sorted(started)
    assert cli.main(["server", "stop"]) == 0
    assert f"stopped {len(started)} server(s)" in capsys.readouterr().out
    assert server.status() == []
    for pid in started:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert not servers.dlinfra_server().socket.exists()
    refused = _dlinfra(["validate", "--fleet", str(FIXTURES / "fleet.yaml")], "require")
    assert refused.returncode == 1 and "no server serves this code" in refused.stderr


def test_a_server_of_other_code_is_not_used(tmp_path: Path) -> None:
    """Another checkout's code (or this one's after an edit) has another key, so another socket."""
    other = tmp_path / "checkout"
    (other / "dlinfra").mkdir(parents=True)
    (other / "dlinfra" / "module.py").write_text("")
    assert servers.dlinfra_server(other).socket != servers.dlinfra_server(ROOT).socket
    before = servers.dlinfra_server(other).socket
    (other / "dlinfra" / "module.py").write_text("x = 1\n")
    assert servers.dlinfra_server(other).socket != before


def _has_checkov() -> bool:
    return servers.checkov_server(ROOT) is not None and checkov.executable(ROOT).is_file()
