#!/usr/bin/env python3
"""dlinfra dev box idle check: run by a systemd timer; powers the box off (EC2 then stops it, as its shutdown behaviour
is `stop`) once nobody has been on it and nothing has run on it for the idle time the fleet sets.

Idle means, at every check: no established SSH connection to port 22 and no SSM session, every GPU below the GPU
threshold, and the 5-minute load average below the per-CPU threshold. The time idle starts is kept in a file under
/run (a tmpfs: every boot starts a new count, so a box just started is never stopped before the idle time passes);
anything busy removes it. Standard library only; installed by Chef (dlinfra_devbox::idle), read config from the
box's /etc/dlinfra/devbox.json (written from the user data dlinfra renders).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SSH_PORT = 22
TCP_ESTABLISHED = "01"  # the `st` column of /proc/net/tcp (Linux include/net/tcp_states.h: TCP_ESTABLISHED = 1)
SSM_WORKER = "ssm-session-worker"  # the SSM agent runs one per Session Manager session
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
NVIDIA_SMI = ("nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits")


@dataclass(frozen=True)
class Thresholds:
    idle_seconds: int  # idle this long, then power off
    load_per_cpu: float  # 5-minute load average per CPU below which the box counts as idle
    gpu_percent: float  # GPU utilization below which a GPU counts as idle


@dataclass(frozen=True)
class Reading:
    """What one check saw."""

    ssh_sessions: int
    ssm_sessions: int
    gpu_utilization: tuple[float, ...]  # percent, one per GPU; () on a box without GPUs
    load5: float
    cpus: int

    def busy(self, limits: Thresholds) -> list[str]:
        """Why the box is not idle; empty when it is."""
        why = []
        if self.ssh_sessions:
            why.append(f"{self.ssh_sessions} SSH connection(s)")
        if self.ssm_sessions:
            why.append(f"{self.ssm_sessions} SSM session(s)")
        busy_gpus = [u for u in self.gpu_utilization if u >= limits.gpu_percent]
        if busy_gpus:
            why.append(f"GPU utilization {max(busy_gpus):g}%")
        if self.load5 >= limits.load_per_cpu * max(self.cpus, 1):
            why.append(f"load {self.load5:g} on {self.cpus} CPUs")
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


def decide(now: float, idle_since: float | None, busy: list[str], limits: Thresholds) -> tuple[float | None, bool]:
    """(the new start of idleness, None when busy; whether to power off now)."""
    if busy:
        return None, False
    start = now if idle_since is None or idle_since > now else idle_since
    return start, now - start >= limits.idle_seconds


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _commands() -> list[str]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            out.append(_read(f"/proc/{entry.name}/comm"))
    return out


def _nvidia_smi() -> str | None:
    try:
        result = subprocess.run(NVIDIA_SMI, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        return None
    except subprocess.TimeoutExpired:
        return "timed out"  # counted busy: never stop a box whose GPUs cannot be read
    return result.stdout if result.returncode == 0 else "failed"


def read_machine() -> Reading:
    return Reading(
        ssh_sessions=ssh_connections(_read(t) for t in TCP_TABLES),
        ssm_sessions=ssm_sessions(_commands()),
        gpu_utilization=gpu_utilization(_nvidia_smi()),
        load5=load5(_read("/proc/loadavg") or "0 0 0"),
        cpus=os.cpu_count() or 1,
    )


def thresholds(config: dict[str, object]) -> Thresholds:
    """The idle settings of the box's config (minutes and thresholds as dlinfra renders them)."""
    idle = config["idle"]
    assert isinstance(idle, dict)
    return Thresholds(
        idle_seconds=int(idle["minutes"]) * 60,
        load_per_cpu=float(idle["load_per_cpu"]),
        gpu_percent=float(idle["gpu_percent"]),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="/etc/dlinfra/devbox.json")
    parser.add_argument("--state", default="/run/dlinfra-devbox/idle-since")
    parser.add_argument("--dry-run", action="store_true", help="say what it would do, power nothing off")
    args = parser.parse_args(argv)
    limits = thresholds(json.loads(Path(args.config).read_text()))
    state = Path(args.state)
    try:
        idle_since: float | None = float(state.read_text())
    except (OSError, ValueError):
        idle_since = None
    reading = read_machine()
    busy = reading.busy(limits)
    now = time.time()
    start, stop = decide(now, idle_since, busy, limits)
    if start is None:
        state.unlink(missing_ok=True)
        print(f"busy: {', '.join(busy)}")
        return 0
    state.parent.mkdir(parents=True, exist_ok=True)
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
