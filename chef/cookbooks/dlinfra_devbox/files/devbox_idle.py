#!/usr/bin/env python3
"""dlinfra dev box idle check: run by a systemd timer; powers the box off (EC2 then stops it, as its shutdown behaviour
is `stop`) once nobody has been on it and nothing of anyone's has run on it for the idle time the fleet sets.

Busy, at a check: an established SSH connection to port 22 or an SSM session; a GPU at or over the GPU threshold; a
5-minute load average at or over the load threshold (absolute: one single-threaded job gives 1.0 on any number of
vCPUs); or a person's process (a uid from 1000, or started from a login, even under sudo: its loginuid) that is
running or in I/O wait now, or that used the CPU seconds or moved the bytes of the thresholds since the last check.
So a script left running in screen or tmux keeps the box; a detached tmux with only an idle shell does not. The time
idle starts, and the person's processes' counters, are kept under /run (a tmpfs: every boot starts a new count, so a
box just started is never stopped before the idle time passes); anything busy removes the start.

The settings are the instance's tags, read through the instance metadata service at every check (dlinfra writes
them; a change reaches the box at once, without a replacement). Each check publishes its verdict to CloudWatch (custom
metric dlinfra/DevBox Busy, 1 or 0, dimension InstanceId), which drives the backstop alarm. Standard library and the
AWS CLI only; installed by Chef (dlinfra_devbox::idle).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

SSH_PORT = 22
TCP_ESTABLISHED = "01"  # the `st` column of /proc/net/tcp (Linux include/net/tcp_states.h: TCP_ESTABLISHED = 1)
SSM_WORKER = "ssm-session-worker"  # the SSM agent runs one per Session Manager session
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
NVIDIA_SMI = ("nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits")
PERSON_UID_MIN = 1000  # login.defs UID_MIN: people's accounts (the box's login user has a far larger uid)
NOBODY = 65534
LOGINUID_UNSET = 4294967295  # (uid_t)-1 in /proc/<pid>/loginuid: not started from a login (daemons, the timer)
RUNNING_STATES = ("R", "D")  # proc(5) /proc/<pid>/stat state: running, or waiting on I/O (uninterruptible)
IMDS = "http://169.254.169.254"
# The instance tags that carry the settings (dlinfra.model.dev_boxes.IDLE_TAGS), and what a check uses for one it
# cannot read (the fleet's defaults: dlinfra.model.dev_boxes, fleet/devboxes.DEFAULT_IDLE_MINUTES).
TAGS = {
    "minutes": "dlinfra:idle-minutes",
    "gpu_percent": "dlinfra:idle-gpu-percent",
    "load": "dlinfra:idle-load",
    "cpu_seconds": "dlinfra:idle-cpu-seconds",
    "io_bytes": "dlinfra:idle-io-bytes",
}
NAMESPACE = "dlinfra/DevBox"
METRIC = "Busy"


@dataclass(frozen=True)
class Thresholds:
    idle_seconds: int  # idle this long, then power off
    gpu_percent: float  # GPU utilization at or over which a GPU is busy
    load: float  # 5-minute load average at or over which the box is busy
    cpu_seconds: float  # CPU a person's processes used since the last check, at or over which the box is busy
    io_bytes: int  # bytes they read or wrote since the last check, at or over which the box is busy


DEFAULTS = Thresholds(idle_seconds=60 * 60, gpu_percent=5.0, load=0.5, cpu_seconds=3.0, io_bytes=1 << 20)


@dataclass(frozen=True)
class Process:
    """What a check needs of one process (proc(5): stat, status, loginuid, io)."""

    pid: int
    start: int  # starttime, clock ticks after boot: with the pid, names the process across checks
    uid: int  # real uid
    loginuid: int
    state: str
    cpu_ticks: int  # utime + stime
    io_bytes: int  # rchar + wchar

    @property
    def key(self) -> str:
        return f"{self.pid}:{self.start}"

    @property
    def of_a_person(self) -> bool:
        return any(PERSON_UID_MIN <= u != NOBODY and u != LOGINUID_UNSET for u in (self.uid, self.loginuid))


Counters = dict[str, list[int]]  # process key -> [cpu ticks, io bytes]


@dataclass(frozen=True)
class Reading:
    """What one check saw."""

    ssh_sessions: int
    ssm_sessions: int
    gpu_utilization: tuple[float, ...]  # percent, one per GPU; () on a box without GPUs
    load5: float
    processes: tuple[Process, ...] = ()
    clock_ticks: int = 100  # sysconf(_SC_CLK_TCK)

    def counters(self) -> Counters:
        """The person's processes' counters, for the next check."""
        return {p.key: [p.cpu_ticks, p.io_bytes] for p in self.processes if p.of_a_person}

    def busy(self, limits: Thresholds, before: Counters | None = None) -> list[str]:
        """Why the box is not idle; empty when it is. `before`: the counters of the last check (None on the first
        check of a boot, when only what runs now can count)."""
        why = []
        if self.ssh_sessions:
            why.append(f"{self.ssh_sessions} SSH connection(s)")
        if self.ssm_sessions:
            why.append(f"{self.ssm_sessions} SSM session(s)")
        busy_gpus = [u for u in self.gpu_utilization if u >= limits.gpu_percent]
        if busy_gpus:
            why.append(f"GPU utilization {max(busy_gpus):g}%")
        if self.load5 >= limits.load:
            why.append(f"load {self.load5:g}")
        people = [p for p in self.processes if p.of_a_person]
        running = [p for p in people if p.state in RUNNING_STATES]
        if running:
            why.append(f"{len(running)} process(es) of people running (pid {', '.join(str(p.pid) for p in running)})")
        if before is not None:
            cpu = io = 0
            for p in people:
                last = before.get(p.key, [0, 0])  # a process new since the last check: all it did, it did since
                cpu += max(p.cpu_ticks - last[0], 0)
                io += max(p.io_bytes - last[1], 0)
            if cpu / max(self.clock_ticks, 1) >= limits.cpu_seconds:
                why.append(f"people's processes used {cpu / max(self.clock_ticks, 1):g} s of CPU")
            if io >= limits.io_bytes:
                why.append(f"people's processes read or wrote {io} bytes")
        return why


def ssh_connections(tables: Iterable[str], port: int = SSH_PORT) -> int:
    """Established TCP connections to the local `port`, from the text of /proc/net/tcp and tcp6."""
    count = 0
    for text in tables:
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 4 or ":" not in fields[1]:
                continue
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == TCP_ESTABLISHED:
                count += 1
    return count


def ssm_sessions(commands: Iterable[str]) -> int:
    """Processes named like the SSM agent's session worker, from each process's `comm`."""
    return sum(1 for c in commands if c.strip() == SSM_WORKER[:15] or c.strip() == SSM_WORKER)


def gpu_utilization(output: str | None) -> tuple[float, ...]:
    """Per-GPU utilization from nvidia-smi's CSV; () when there is no nvidia-smi (a CPU box). Output that does not
    parse counts as a busy GPU, so a broken driver never makes a box look idle."""
    if output is None:
        return ()
    values = []
    for line in output.splitlines():
        if not line.strip():
            continue
        try:
            values.append(float(line.strip()))
        except ValueError:
            values.append(100.0)
    return tuple(values)


def load5(loadavg: str) -> float:
    """The 5-minute load average from /proc/loadavg."""
    return float(loadavg.split()[1])


def process(pid: int, stat: str, status: str, loginuid: str, io: str) -> Process | None:
    """One process from the text of its /proc files; None when they do not parse (it ended while being read)."""
    try:
        # The command name is in parentheses and may hold spaces or ')': the fields start after the last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        uid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))
        counts = dict(line.split(": ", 1) for line in io.splitlines() if ": " in line)
        return Process(
            pid=pid,
            start=int(fields[19]),
            uid=uid,
            loginuid=int(loginuid.strip() or LOGINUID_UNSET),
            state=fields[0],
            cpu_ticks=int(fields[11]) + int(fields[12]),
            io_bytes=int(counts.get("rchar", 0)) + int(counts.get("wchar", 0)),
        )
    except (ValueError, IndexError, StopIteration):
        return None


def decide(now: float, idle_since: float | None, busy: list[str], limits: Thresholds) -> tuple[float | None, bool]:
    """(the new start of idleness, None when busy; whether to power off now)."""
    if busy:
        return None, False
    start = now if idle_since is None or idle_since > now else idle_since
    return start, now - start >= limits.idle_seconds


def thresholds(tags: Mapping[str, str] | None) -> tuple[Thresholds, list[str]]:
    """The settings from the instance's tags (None: unreadable), and what had to fall back to the defaults."""
    if tags is None:
        return DEFAULTS, ["instance tags unreadable (is instance_metadata_tags enabled?): using the defaults"]
    values: dict[str, float] = {}
    problems = []
    for field, tag in TAGS.items():
        default = DEFAULTS.idle_seconds / 60 if field == "minutes" else getattr(DEFAULTS, field)
        try:
            values[field] = float(tags[tag])
        except (KeyError, ValueError):
            problems.append(f"tag {tag} missing or not a number: using {default:g}")
            values[field] = default
    limits = Thresholds(
        idle_seconds=int(values["minutes"] * 60),
        gpu_percent=values["gpu_percent"],
        load=values["load"],
        cpu_seconds=values["cpu_seconds"],
        io_bytes=int(values["io_bytes"]),
    )
    return limits, problems


# -- the machine -----------------------------------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _processes() -> tuple[list[str], tuple[Process, ...]]:
    commands, found = [], []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        base = f"/proc/{entry.name}"
        commands.append(_read(f"{base}/comm"))
        proc = process(int(entry.name), _read(f"{base}/stat"), _read(f"{base}/status"), _read(f"{base}/loginuid"),
                       _read(f"{base}/io"))  # fmt: skip
        if proc is not None:
            found.append(proc)
    return commands, tuple(found)


def _nvidia_smi() -> str | None:
    try:
        result = subprocess.run(NVIDIA_SMI, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        return None
    except subprocess.TimeoutExpired:
        return "timed out"  # counted busy: never stop a box whose GPUs cannot be read
    return result.stdout if result.returncode == 0 else "failed"


def read_machine() -> Reading:
    commands, processes = _processes()
    return Reading(
        ssh_sessions=ssh_connections(_read(t) for t in TCP_TABLES),
        ssm_sessions=ssm_sessions(commands),
        gpu_utilization=gpu_utilization(_nvidia_smi()),
        load5=load5(_read("/proc/loadavg") or "0 0 0"),
        processes=processes,
        clock_ticks=os.sysconf("SC_CLK_TCK"),
    )


def imds_get() -> Callable[[str], str | None] | None:
    """A reader of instance metadata paths over IMDSv2 (a session token first: the box requires IMDSv2), or None
    when the service does not answer. A path it cannot read gives None."""
    try:
        request = urllib.request.Request(
            f"{IMDS}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            token = response.read().decode()
    except (OSError, urllib.error.URLError):
        return None

    def get(path: str) -> str | None:
        request = urllib.request.Request(f"{IMDS}/latest/{path}", headers={"X-aws-ec2-metadata-token": token})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return str(response.read().decode())
        except (OSError, urllib.error.URLError):
            return None

    return get


def instance_tags(get: Callable[[str], str | None] | None) -> dict[str, str] | None:
    """The idle tags of the instance (meta-data/tags/instance/<key>); None when tags are not readable at all."""
    if get is None or get("meta-data/tags/instance") is None:
        return None
    return {tag: value.strip() for tag in TAGS.values() if (value := get(f"meta-data/tags/instance/{tag}")) is not None}


def publish_command(aws_cli: str, region: str, instance_id: str, busy: bool) -> list[str]:
    """The AWS CLI call that reports one verdict (the box's role may put metrics in NAMESPACE only)."""
    return [
        aws_cli, "cloudwatch", "put-metric-data", "--region", region, "--namespace", NAMESPACE,
        "--metric-name", METRIC, "--dimensions", f"InstanceId={instance_id}", "--unit", "Count",
        "--value", "1" if busy else "0",
    ]  # fmt: skip


def publish(aws_cli: str, get: Callable[[str], str | None] | None, busy: bool) -> str | None:
    """Report the verdict; a problem, or None. A verdict that does not arrive stops nothing: the alarm takes missing
    data as not breaching."""
    instance_id = get("meta-data/instance-id") if get else None
    region = get("meta-data/placement/region") if get else None
    if not instance_id or not region:
        return "no instance id or region from the instance metadata: verdict not published"
    try:
        result = subprocess.run(
            publish_command(aws_cli, region, instance_id, busy), capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"verdict not published: {exc}"
    return None if result.returncode == 0 else f"verdict not published: {result.stderr.strip()}"


def _load_counters(path: Path) -> Counters | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", default="/run/dlinfra-devbox/idle-since")
    parser.add_argument("--aws-cli", default="aws", metavar="PATH", help="the AWS CLI, to publish the verdict")
    parser.add_argument("--dry-run", action="store_true", help="say what it would do, power nothing off")
    args = parser.parse_args(argv)
    get = imds_get()
    limits, problems = thresholds(instance_tags(get))
    state = Path(args.state)
    counters = state.with_name("processes.json")
    try:
        idle_since: float | None = float(state.read_text())
    except (OSError, ValueError):
        idle_since = None
    reading = read_machine()
    busy = reading.busy(limits, _load_counters(counters))
    state.parent.mkdir(parents=True, exist_ok=True)
    counters.write_text(json.dumps(reading.counters()))
    problem = publish(args.aws_cli, get, bool(busy))
    for line in [*problems, *([problem] if problem else [])]:
        print(f"warning: {line}", file=sys.stderr)
    now = time.time()
    start, stop = decide(now, idle_since, busy, limits)
    if start is None:
        state.unlink(missing_ok=True)
        print(f"busy: {', '.join(busy)}")
        return 0
    state.write_text(f"{start:.0f}\n")
    idle_for = int(now - start)
    if not stop:
        print(f"idle for {idle_for} s of {limits.idle_seconds} s")
        return 0
    print(f"idle for {idle_for} s (limit {limits.idle_seconds} s): powering off, so EC2 stops the box")
    if not args.dry_run:
        subprocess.run(["systemctl", "poweroff"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
