"""The dev box's idle stop and setup, as Chef installs them (chef/cookbooks/dlinfra_devbox): the idle decision on fake
readings of /proc, nvidia-smi and time; the rendered setup script and systemd units; and the config the user data
writes is the one they read."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from components import dev_box
from dlinfra.model import dev_boxes
from tests.chef.test_cookbooks import CHEF, render, run

PATH = CHEF / "cookbooks" / "dlinfra_devbox" / "files" / "devbox_idle.py"
ATTRIBUTES = (CHEF / "cookbooks" / "dlinfra_devbox" / "attributes" / "default.rb").read_text()


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devbox_idle", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["devbox_idle"] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


idle = sys.modules.get("devbox_idle") or _load()
LIMITS = idle.Thresholds(idle_seconds=3600, load_per_cpu=0.1, gpu_percent=5)

# /proc/net/tcp as Linux writes it: local 10.3.154.114:22 (0A039A72:0016) with one established connection (st 01)
# from a Client VPN interface, one in TIME_WAIT (06), the listener (0A), and an outgoing HTTPS connection.
TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 729A030A:0016 0A0A030A:D431 01 00000000:00000000 02:00000E6B 00000000     0        0 2 4 0 20 4 30 10 -1
   2: 729A030A:0016 0B0A030A:C001 06 00000000:00000000 03:00000B2D 00000000     0        0 0 3 0 0 0 0 0 0
   3: 729A030A:9C40 0D1A2B3C:01BB 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 20 4 30 10 -1
"""
TCP6_EMPTY = "  sl  local_address                         remote_address                        st\n"


def test_ssh_connections_count_only_established_ones_to_port_22() -> None:
    assert idle.ssh_connections([TCP, TCP6_EMPTY]) == 1
    assert idle.ssh_connections([TCP.replace(" 01 00000000:00000000 02:", " 06 00000000:00000000 02:")]) == 0
    assert idle.ssh_connections([""]) == 0


def test_ssm_sessions_match_the_agents_worker_even_truncated() -> None:
    # Linux keeps 15 characters of a command name (TASK_COMM_LEN 16).
    assert idle.ssm_sessions(["ssm-session-wor\n", "amazon-ssm-agen\n", "bash\n"]) == 1
    assert idle.ssm_sessions(["sshd\n"]) == 0


def test_gpu_readings_a_box_without_gpus_and_a_broken_driver() -> None:
    assert idle.gpu_utilization("0\n87\n") == (0.0, 87.0)
    assert idle.gpu_utilization(None) == ()  # no nvidia-smi: a CPU box
    assert idle.gpu_utilization("failed") == (100.0,)  # never idle on a GPU nobody can read


def reading(**changes: object) -> object:
    base = {"ssh_sessions": 0, "ssm_sessions": 0, "gpu_utilization": (0.0,), "load5": 0.05, "cpus": 4}
    return idle.Reading(**(base | changes))


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"ssh_sessions": 1}, "1 SSH connection(s)"),
        ({"ssm_sessions": 2}, "2 SSM session(s)"),
        ({"gpu_utilization": (0.0, 40.0)}, "GPU utilization 40%"),  # a job left running in tmux
        ({"load5": 0.4, "cpus": 4}, "load 0.4 on 4 CPUs"),  # a CPU job: 0.1 per CPU x 4 CPUs
    ],
)
def test_anything_running_or_anyone_on_keeps_the_box_busy(changes: dict[str, object], why: str) -> None:
    assert why in reading(**changes).busy(LIMITS)  # type: ignore[attr-defined]


def test_an_idle_box_reads_idle() -> None:
    assert reading().busy(LIMITS) == []  # type: ignore[attr-defined]
    assert reading(gpu_utilization=(), load5=0.39).busy(LIMITS) == []  # type: ignore[attr-defined]


def test_the_box_powers_off_only_after_the_whole_idle_time() -> None:
    start, stop = idle.decide(1000.0, None, [], LIMITS)
    assert (start, stop) == (1000.0, False)  # idleness starts now
    assert idle.decide(1000.0 + 3599, start, [], LIMITS) == (1000.0, False)
    assert idle.decide(1000.0 + 3600, start, [], LIMITS) == (1000.0, True)
    # Anyone or anything busy in between starts the count again.
    assert idle.decide(1000.0 + 1800, start, ["1 SSH connection(s)"], LIMITS) == (None, False)
    assert idle.decide(1000.0 + 3600, None, [], LIMITS) == (4600.0, False)
    # A start in the future (a clock set back) counts from now, never stops at once.
    assert idle.decide(1000.0, 5000.0, [], LIMITS) == (1000.0, False)


def test_main_keeps_its_count_in_the_state_file_and_powers_off_in_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "devbox.json"
    config.write_text(json.dumps(_config(idle_minutes=15)))
    state = tmp_path / "run" / "idle-since"
    now = [10_000.0]
    readings = [reading(), reading(), reading(ssh_sessions=1), reading(), reading()]
    powered: list[list[str]] = []
    monkeypatch.setattr(idle, "read_machine", lambda: readings.pop(0))
    monkeypatch.setattr(idle.time, "time", lambda: now[0])
    monkeypatch.setattr(idle.subprocess, "run", lambda cmd, check: powered.append(cmd))
    args = ["--config", str(config), "--state", str(state)]

    def tick(minutes: float) -> None:
        now[0] += minutes * 60
        assert idle.main(args) == 0

    tick(0)
    assert state.read_text() == "10000\n" and not powered
    tick(14)
    assert not powered
    tick(1)  # someone logged in: the count is gone
    assert not state.exists() and not powered
    tick(5)
    tick(15)
    assert powered == [["systemctl", "poweroff"]]


def _config(idle_minutes: int) -> dict[str, object]:
    return dev_box.box_config(
        person="alice",
        uid=2**30 + 2**29 + 7,
        ssh_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBiJVrCp7mlBJTuY5LuvB1qSjqcBU30XWDaui5Vmjp+Y",
        file_system_id="fs-0123456789abcdef0",
        access_point_id="fsap-0123456789abcdef0",
        region="us-west-2",
        idle_minutes=idle_minutes,
    )


def test_the_config_dlinfra_renders_is_the_one_the_check_reads() -> None:
    limits = idle.thresholds(_config(idle_minutes=45))
    assert limits == idle.Thresholds(45 * 60, dev_boxes.IDLE_LOAD_PER_CPU, dev_boxes.IDLE_GPU_PERCENT)
    assert f"'{dev_box.CONFIG_PATH}'" in ATTRIBUTES and f"'{dev_box.SETUP_PATH}'" in ATTRIBUTES
    assert f"['check_interval_seconds'] = {dev_boxes.CHECK_INTERVAL_SECONDS}" in ATTRIBUTES


def test_the_user_data_writes_that_config_and_runs_the_setup() -> None:
    import yaml

    text = dev_box.render_user_data(_config(idle_minutes=60))
    assert text.startswith("#cloud-config\n")
    data = yaml.safe_load(text)
    (written,) = data["write_files"]
    assert written["path"] == dev_box.CONFIG_PATH and written["permissions"] == "0600"
    assert json.loads(written["content"]) == _config(idle_minutes=60)
    assert data["runcmd"] == [[dev_box.SETUP_PATH]]


SETUP = "dlinfra_devbox/templates/dlinfra-devbox-setup.sh.erb"
SETUP_VARIABLES = {
    "config": "/etc/dlinfra/devbox.json",
    "idle_unit": "dlinfra-devbox-idle",
    "keys_dir": "/etc/dlinfra/ssh",
}


@pytest.mark.chef
def test_the_setup_script_passes_shellcheck(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    script = tmp_path / "setup"
    text = render(require_tool("ruby"), SETUP, **SETUP_VARIABLES)
    script.write_text(text)
    result = run(require_tool("shellcheck"), "--shell=bash", str(script))
    assert result.returncode == 0, result.stdout
    # Only the fleet's key, from a root-owned file; no passwords; the home through its access point, TLS and IAM.
    wanted = (
        "AuthorizedKeysFile /etc/dlinfra/ssh/%u",
        "PasswordAuthentication no",
        "AllowUsers ${person}",
        "tls,iam,accesspoint=${access_point}",
        "systemctl enable --now 'dlinfra-devbox-idle.timer'",
    )
    for line in wanted:
        assert line in text, line


@pytest.mark.chef
@pytest.mark.parametrize("unit", ["service", "timer"])
def test_the_idle_units_are_valid_systemd_units(unit: str, tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    ruby, analyze = require_tool("ruby"), require_tool("systemd-analyze")
    config = tmp_path / "devbox.json"
    config.write_text("{}")
    service = render(
        ruby, "dlinfra_devbox/templates/dlinfra-devbox-idle.service.erb",
        script=str(PATH), config=str(config), state=str(tmp_path / "idle-since"),
    )  # fmt: skip
    timer = render(
        ruby, "dlinfra_devbox/templates/dlinfra-devbox-idle.timer.erb",
        interval_seconds=dev_boxes.CHECK_INTERVAL_SECONDS, config=str(config),
    )  # fmt: skip
    (tmp_path / "dlinfra-devbox-idle.service").write_text(service)
    (tmp_path / "dlinfra-devbox-idle.timer").write_text(timer)
    result = run(analyze, "verify", "--man=no", "--recursive-errors=no", str(tmp_path / f"dlinfra-devbox-idle.{unit}"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"OnUnitActiveSec={dev_boxes.CHECK_INTERVAL_SECONDS}" in timer
