"""The dev box's idle stop and setup, as Chef installs them (chef/cookbooks/dlinfra_devbox): the idle decision on fake
readings of /proc, nvidia-smi and time; the rendered setup script and systemd units; and the config the user data
writes is the one they read."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from components import dev_box
from dlinfra.model import dev_boxes
from dlinfra.model.fleet.devboxes import DEFAULT_IDLE_MINUTES
from tests.chef._gpu_check import cookbook_file
from tests.chef.test_cookbooks import CHEF, render, run

PATH = CHEF / "cookbooks" / "dlinfra_devbox" / "files" / "devbox_idle.py"
ATTRIBUTES = (CHEF / "cookbooks" / "dlinfra_devbox" / "attributes" / "default.rb").read_text()
BASE_ATTRIBUTES = (CHEF / "cookbooks" / "dlinfra_base" / "attributes" / "default.rb").read_text()


idle = cookbook_file("devbox_idle", PATH)
LIMITS = idle.Thresholds(idle_seconds=3600, gpu_percent=5, load=0.5, cpu_seconds=3.0, io_bytes=1 << 20)
PERSON_UID = 2**30 + 2**29 + 7  # team_storage.posix_id's range: far above login.defs UID_MIN

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
    base = {"ssh_sessions": 0, "ssm_sessions": 0, "gpu_utilization": (0.0,), "load5": 0.05, "processes": ()}
    return idle.Reading(**(base | changes))


def proc(pid: int = 4242, *, uid: int = PERSON_UID, loginuid: int = PERSON_UID, state: str = "S", cpu: int = 0,
         io: int = 0, start: int = 1000) -> object:  # fmt: skip
    return idle.Process(pid=pid, start=start, uid=uid, loginuid=loginuid, state=state, cpu_ticks=cpu, io_bytes=io)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"ssh_sessions": 1}, "1 SSH connection(s)"),
        ({"ssm_sessions": 2}, "2 SSM session(s)"),
        ({"gpu_utilization": (0.0, 40.0)}, "GPU utilization 40%"),  # a job left running in tmux
        # One single-threaded job gives a load of 1.0 on a box of any size: busy on 4 vCPUs or 192.
        ({"load5": 1.0}, "load 1"),
        ({"processes": (proc(state="R"),)}, "process(es) of people running (pid 4242)"),
        ({"processes": (proc(state="D"),)}, "process(es) of people running"),  # waiting on the disk
        # Under sudo: root's process, started from the person's login (loginuid).
        ({"processes": (proc(uid=0, state="R"),)}, "process(es) of people running"),
    ],
)
def test_anything_running_or_anyone_on_keeps_the_box_busy(changes: dict[str, object], why: str) -> None:
    found = reading(**changes).busy(LIMITS, {})  # type: ignore[attr-defined]
    assert any(why in w for w in found), found


def test_an_idle_box_reads_idle() -> None:
    assert reading().busy(LIMITS, {}) == []  # type: ignore[attr-defined]
    assert reading(gpu_utilization=(), load5=0.49).busy(LIMITS, {}) == []  # type: ignore[attr-defined]
    # Daemons run and work (uid 0 or a system uid, no login); nobody is nobody: none of it is a person's.
    unset = idle.LOGINUID_UNSET
    daemons = (
        proc(1, uid=0, loginuid=unset, state="R", cpu=10**6, io=10**9),
        proc(2, uid=110, loginuid=unset, state="R"),
        proc(3, uid=idle.NOBODY, loginuid=unset, state="R"),
    )
    assert reading(processes=daemons).busy(LIMITS, {}) == []  # type: ignore[attr-defined]


def test_a_job_in_screen_keeps_the_box_and_a_detached_tmux_with_a_shell_does_not() -> None:
    # Between two checks: a sleeping training loop that used 280 s of CPU (28,000 ticks at 100 Hz) is busy; a
    # download or copy that moved 50 MiB with almost no CPU is busy; tmux's server and an idle shell, which moved a
    # few bytes and used a tick, are not.
    tmux, shell = proc(10, cpu=51, io=9000), proc(11, cpu=3, io=400)
    before = {tmux.key: [50, 8800], shell.key: [3, 400]}  # type: ignore[attr-defined]
    assert reading(processes=(tmux, shell)).busy(LIMITS, before) == []  # type: ignore[attr-defined]
    job = proc(12, cpu=28_000)
    assert "people's processes used 280.01 s of CPU" in reading(processes=(tmux, shell, job)).busy(  # type: ignore[attr-defined]
        LIMITS,
        before | {job.key: [0, 0]},  # type: ignore[attr-defined]
    )
    copy = proc(13, cpu=120, io=60 << 20)
    found = reading(processes=(tmux, shell, copy)).busy(LIMITS, before | {copy.key: [100, 10 << 20]})  # type: ignore[attr-defined]
    assert found == [f"people's processes read or wrote {(50 << 20) + 200} bytes"]  # tmux's 200 bytes too
    # A process new since the last check counts with all it did; on the first check of a boot (no counters yet),
    # only what runs now counts.
    assert reading(processes=(job,)).busy(LIMITS, {}) != []  # type: ignore[attr-defined]
    assert reading(processes=(job,)).busy(LIMITS, None) == []  # type: ignore[attr-defined]
    # A pid reused by another process is another process (its start time differs).
    reused = proc(12, cpu=28_000, start=99_999)
    assert reading(processes=(reused,)).busy(LIMITS, {job.key: [28_000, 0]}) != []  # type: ignore[attr-defined]


# /proc/<pid>/stat of `python3 train (v2).py` (a command name with a space and a ')'), sleeping, 1234 + 56 ticks.
STAT = "4242 (train (v2).py) S 4200 4242 4200 34816 4242 4194304 1000 0 0 0 1234 56 0 0 20 0 1 0 777 0 0\n"
STATUS = f"Name:\ttrain (v2).py\nState:\tS (sleeping)\nUid:\t{PERSON_UID}\t{PERSON_UID}\t{PERSON_UID}\t{PERSON_UID}\n"
IO = "rchar: 5000\nwchar: 700\nsyscr: 10\nsyscw: 3\nread_bytes: 4096\nwrite_bytes: 0\ncancelled_write_bytes: 0\n"


def test_a_process_is_read_from_its_proc_files() -> None:
    p = idle.process(4242, STAT, STATUS, f"{PERSON_UID}", IO)
    assert p == idle.Process(pid=4242, start=777, uid=PERSON_UID, loginuid=PERSON_UID, state="S", cpu_ticks=1290,
                             io_bytes=5700)  # fmt: skip
    assert p.of_a_person
    assert idle.process(4242, "", STATUS, "", IO) is None  # it ended while being read
    daemon = idle.process(1, STAT, STATUS.replace(str(PERSON_UID), "0"), "4294967295", "")
    assert daemon is not None and not daemon.of_a_person and daemon.io_bytes == 0


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


def test_the_settings_are_the_instance_tags_dlinfra_writes() -> None:
    assert idle.TAGS == dev_boxes.IDLE_TAGS
    limits, problems = idle.thresholds(dev_boxes.idle_tags(45))
    assert problems == []
    assert limits == idle.Thresholds(45 * 60, dev_boxes.IDLE_GPU_PERCENT, dev_boxes.IDLE_LOAD,
                                     dev_boxes.IDLE_CPU_SECONDS, dev_boxes.IDLE_IO_BYTES)  # fmt: skip
    # The check's own defaults, for tags it cannot read, are the fleet's.
    assert idle.thresholds(dev_boxes.idle_tags(DEFAULT_IDLE_MINUTES))[0] == idle.DEFAULTS
    defaults, problems = idle.thresholds(None)
    assert defaults == idle.DEFAULTS and "instance tags unreadable" in problems[0]
    tags = dev_boxes.idle_tags(45) | {dev_boxes.IDLE_TAGS["load"]: "lots"}
    limits, problems = idle.thresholds(tags)
    assert limits.load == idle.DEFAULTS.load and limits.idle_seconds == 45 * 60 and "dlinfra:idle-load" in problems[0]


def test_the_tags_are_read_over_imdsv2() -> None:
    served = {
        "meta-data/tags/instance": "Name\ndlinfra:idle-minutes\n",
        "meta-data/tags/instance/dlinfra:idle-minutes": "90",
    }
    assert idle.instance_tags(served.get) == {"dlinfra:idle-minutes": "90"}
    assert idle.instance_tags({}.get) is None  # tags not allowed in the metadata
    assert idle.instance_tags(None) is None  # no metadata service


def test_the_verdict_is_the_metric_the_alarm_watches() -> None:
    command = idle.publish_command("/snap/bin/aws", "us-west-2", "i-0abc", busy=False)
    assert command[:3] == ["/snap/bin/aws", "cloudwatch", "put-metric-data"]
    pairs = dict(zip(command[3::2], command[4::2], strict=True))
    assert pairs == {
        "--region": "us-west-2", "--namespace": dev_boxes.BUSY_NAMESPACE, "--metric-name": dev_boxes.BUSY_METRIC,
        "--dimensions": "InstanceId=i-0abc", "--unit": "Count", "--value": "0",
    }  # fmt: skip
    assert idle.publish_command("aws", "us-west-2", "i-0abc", busy=True)[-1] == "1"
    assert "aws_cli'] = '/snap/bin/aws'" in ATTRIBUTES  # dlinfra_base::node_join's snap, on both node images
    assert "['node_join']['aws_cli'] = '/snap/bin/aws'" in BASE_ATTRIBUTES


def test_main_keeps_its_count_publishes_every_verdict_and_powers_off_in_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "run" / "idle-since"
    now = [10_000.0]
    readings = [reading(), reading(), reading(ssh_sessions=1), reading(), reading()]
    calls: list[list[str]] = []
    metadata = {"meta-data/tags/instance": "", "meta-data/instance-id": "i-0abc"}
    metadata["meta-data/placement/region"] = "us-west-2"
    metadata |= {f"meta-data/tags/instance/{k}": v for k, v in dev_boxes.idle_tags(15).items()}
    monkeypatch.setattr(idle, "imds_get", lambda: metadata.get)
    monkeypatch.setattr(idle, "read_machine", lambda: readings.pop(0))
    monkeypatch.setattr(idle.time, "time", lambda: now[0])
    monkeypatch.setattr(
        idle.subprocess, "run", lambda cmd, **_: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0)
    )
    args = ["--state", str(state), "--aws-cli", "/snap/bin/aws"]

    def tick(minutes: float) -> None:
        now[0] += minutes * 60
        assert idle.main(args) == 0

    tick(0)
    assert state.read_text() == "10000\n"
    tick(14)
    tick(1)  # someone logged in: the count is gone
    assert not state.exists()
    tick(5)
    tick(15)
    verdicts = [c[-1] for c in calls if "put-metric-data" in c]
    assert verdicts == ["0", "0", "1", "0", "0"]
    assert calls[-1] == ["systemctl", "poweroff"] and calls.count(["systemctl", "poweroff"]) == 1
    assert json.loads(state.with_name("processes.json").read_text()) == {}


def _config() -> dict[str, object]:
    return dev_box.box_config(
        person="alice",
        uid=PERSON_UID,
        ssh_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBiJVrCp7mlBJTuY5LuvB1qSjqcBU30XWDaui5Vmjp+Y",
        file_system_id="fs-0123456789abcdef0",
        access_point_id="fsap-0123456789abcdef0",
        region="us-west-2",
    )


def test_the_paths_and_interval_agree_with_the_cookbook() -> None:
    assert f"'{dev_box.CONFIG_PATH}'" in ATTRIBUTES and f"'{dev_box.SETUP_PATH}'" in ATTRIBUTES
    assert f"['check_interval_seconds'] = {dev_boxes.CHECK_INTERVAL_SECONDS}" in ATTRIBUTES


def test_the_user_data_writes_that_config_and_runs_the_setup_and_holds_no_idle_setting() -> None:
    import yaml

    text = dev_box.render_user_data(_config())
    assert text.startswith("#cloud-config\n")
    data = yaml.safe_load(text)
    (written,) = data["write_files"]
    assert written["path"] == dev_box.CONFIG_PATH and written["permissions"] == "0600"
    assert json.loads(written["content"]) == _config()
    assert data["runcmd"] == [[dev_box.SETUP_PATH]]
    assert "idle" not in written["content"]  # a new idle time is a tag change, not user data (which replaces the box)


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


# Stubs of what the setup runs, each logging its command line. sshd fails as OpenSSH does on Ubuntu 24.04 at first
# boot (socket activation: nothing has made /run/sshd) unless the directory exists; getent, groupadd and useradd
# keep their users in the scratch tree.
STUB = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >>"${STUB_LOG}"
case "$(basename "$0")" in
  sshd)
    [[ -n "${SSHD_BROKEN:-}" ]] && { echo "sshd: broken config" >&2; exit 255; }
    [[ -d "${DLINFRA_ROOT}/run/sshd" ]] ||
      { echo "Missing privilege separation directory: /run/sshd" >&2; exit 255; } ;;
  getent) grep "^$2:" "${DLINFRA_ROOT}/etc/$1" ;;
  groupadd) echo "${@: -1}:x:$2:" >>"${DLINFRA_ROOT}/etc/group" ;;
  useradd) echo "${@: -1}:x:$2:$4::$6:/bin/bash" >>"${DLINFRA_ROOT}/etc/passwd" ;;
  mountpoint) exit 1 ;;
esac
"""


def _setup(
    tmp_path: Path, ruby: str, users: str = "", **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str], Path]:
    root, bin_dir = tmp_path / "root", tmp_path / "bin"
    for folder in ("etc/sudoers.d", "etc/ssh/sshd_config.d", "etc/dlinfra", "run", "home"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for name in ("passwd", "group"):
        (root / "etc" / name).write_text("root:x:0:0::/root:/bin/bash\n" + (users if name == "passwd" else ""))
    (root / "etc/fstab").write_text("LABEL=cloudimg-rootfs / ext4 discard,commit=30,errors=remount-ro 0 1\n")
    (root / dev_box.CONFIG_PATH.lstrip("/")).write_text(json.dumps(_config()))
    bin_dir.mkdir()
    for name in ("systemctl", "sshd", "getent", "groupadd", "useradd", "visudo", "mountpoint", "mount"):
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "setup"
    script.write_text(render(ruby, SETUP, **SETUP_VARIABLES))
    log = tmp_path / "stubs.log"
    environ = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DLINFRA_ROOT": str(root),
               "STUB_LOG": str(log), **env}  # fmt: skip
    done = subprocess.run(["bash", str(script)], env=environ, capture_output=True, text=True, timeout=60, check=False)
    return done, log.read_text().splitlines() if log.exists() else [], root


@pytest.mark.chef
def test_the_setup_runs_on_a_fresh_ubuntu_2404_box(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    done, calls, root = _setup(tmp_path, require_tool("ruby"))
    assert done.returncode == 0, done.stderr
    assert (root / "run/sshd").is_dir() and (root / "run/sshd").stat().st_mode & 0o777 == 0o755
    order = [c for c in calls if c.split()[0] in ("systemctl", "sshd", "mount", "useradd")]
    assert order == [
        "systemctl enable --now dlinfra-devbox-idle.timer",  # first: whatever fails later, the box stops itself
        f"useradd --uid {PERSON_UID} --gid {PERSON_UID} --home-dir /home/alice --no-create-home --shell /bin/bash "
        "alice",
        "sshd -t",
        "systemctl try-reload-or-restart ssh.service",
        f"mount {root}/home/alice",
        "systemctl mask --now kubelet.service",
    ]
    fstab = (root / "etc/fstab").read_text().splitlines()
    options = "_netdev,noresvport,tls,iam,accesspoint=fsap-0123456789abcdef0"
    assert fstab[-1] == f"fs-0123456789abcdef0:/ /home/alice efs {options} 0 0"
    assert (root / "etc/dlinfra/ssh/alice").read_text() == f"{_config()['ssh_key']}\n"


@pytest.mark.chef
def test_a_setup_that_fails_later_still_leaves_the_idle_stop_on(
    tmp_path: Path, require_tool: Callable[[str], str]
) -> None:
    done, calls, _ = _setup(tmp_path, require_tool("ruby"), SSHD_BROKEN="1")
    assert done.returncode != 0 and "broken config" in done.stderr
    assert calls[0] == "systemctl enable --now dlinfra-devbox-idle.timer"
    assert not [c for c in calls if c.startswith("mount ")]


@pytest.mark.chef
def test_the_setup_refuses_a_login_the_image_already_has_with_another_uid(
    tmp_path: Path, require_tool: Callable[[str], str]
) -> None:
    done, calls, _ = _setup(tmp_path, require_tool("ruby"), users="alice:x:1000:1000::/home/alice:/bin/bash\n")
    assert done.returncode == 1 and "already has a user alice with uid 1000" in done.stderr
    assert not [c for c in calls if c.startswith(("useradd", "sshd"))]


@pytest.mark.chef
@pytest.mark.parametrize("unit", ["service", "timer"])
def test_the_idle_units_are_valid_systemd_units(unit: str, tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    ruby, analyze = require_tool("ruby"), require_tool("systemd-analyze")
    config = tmp_path / "devbox.json"
    config.write_text("{}")
    service = render(
        ruby, "dlinfra_devbox/templates/dlinfra-devbox-idle.service.erb",
        script=str(PATH), config=str(config), state=str(tmp_path / "idle-since"), aws_cli="/snap/bin/aws",
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
