"""`dlinfra server start|stop|status`: the warm servers that run dlinfra's commands and checkov without importing
them again for each one (dlinfra.serving, docs/server.md)."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from dlinfra import PROJECT_ROOT
from dlinfra.cli.common import Handler
from dlinfra.errors import DlinfraError
from dlinfra.serving import servers
from dlinfra.serving.forkserver import STOP_GRACE_SECONDS, about, private_folder, runtime_dir
from dlinfra.serving.servers import Served

START_TIMEOUT = 180.0  # seconds for a server to import its program (about 5 s on a quiet 2-core machine)
STOP_TIMEOUT = STOP_GRACE_SECONDS + 60.0  # the server gives its running commands STOP_GRACE_SECONDS

out = Console(highlight=False, soft_wrap=True)


def register(subparsers: Any) -> dict[str, Handler]:
    """Add `server` to the CLI; returns command name -> handler."""
    cmd = subparsers.add_parser(
        "server",
        help="start, stop or list the warm servers that run commands and checkov without re-importing them",
        description="A server imports dlinfra, the provider SDKs and checkov once; every later command of this "
        "checkout runs in a fork of it (docs/server.md). It serves one build of the code and exits after "
        f"{servers.IDLE_SECONDS / 60:.0f} minutes unused; DLINFRA_SERVER=off runs commands without it.",
    )
    cmd.add_argument(
        "action",
        choices=["start", "stop", "status"],
        help="start this checkout's servers (and wait until they listen), stop them, or list them",
    )
    cmd.add_argument(
        "--idle", type=float, default=servers.IDLE_SECONDS, help="seconds unused before a server exits (start)"
    )
    cmd.add_argument("--json", action="store_true", help="status as JSON (schema: docs/server.md)")
    return {"server": cmd_server}


def cmd_server(args: argparse.Namespace) -> int:
    if args.action == "start":
        if not hasattr(socket, "SO_PEERCRED") or not Path("/proc/self/cmdline").exists():
            raise DlinfraError("the warm servers need Linux (a socket's peer credentials, /proc); commands run without")
        for served in wanted(idle=args.idle):
            pid = start(served)
            out.print(f"{served.name} server: pid {pid}, socket {served.socket}")
        return 0
    if args.action == "stop":
        stopped = stop_all()
        out.print(f"stopped {len(stopped)} server(s)" + (f": pids {', '.join(map(str, stopped))}" if stopped else ""))
        return 0
    listed = status()
    if args.json:
        print(json.dumps({"schema": 1, "servers": listed}, indent=2))
        return 0
    if not listed:
        out.print("no server runs for this checkout; `dlinfra server start` starts one")
    for entry in listed:
        state = "serves this code" if entry["current"] else "serves older code: `dlinfra server stop`, then start"
        out.print(f"{entry['name']} server: pid {entry['pid']}, up {entry['up_seconds']:.0f} s, {state}")
    return 0


def wanted(*, idle: float = servers.IDLE_SECONDS) -> list[Served]:
    """The servers of this checkout's code: dlinfra's, and checkov's when its venv is there."""
    checkov = servers.checkov_server(PROJECT_ROOT, idle=idle)
    return [servers.dlinfra_server(PROJECT_ROOT, idle=idle), *([checkov] if checkov is not None else [])]


def start(served: Served) -> int:
    """Start the server (unless it runs) and wait until it listens; its pid. One start at a time per socket."""
    folder = served.socket.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not private_folder(folder):
        raise DlinfraError("not a folder only this user may enter; the servers refuse it", file=str(folder))
    with _locked(served.socket.with_suffix(".lock")):
        running = _live(about(served.socket))
        if running is not None:
            return int(running["pid"])
        for stale in (served.socket, about(served.socket)):  # a killed server's leftovers
            stale.unlink(missing_ok=True)
        log = served.socket.with_suffix(".log")
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                served.command,
                cwd=PROJECT_ROOT,
                env={**os.environ, **dict(served.env), "DLINFRA_SERVER": "off"},
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # not stopped by the terminal's Ctrl-C, nor waited for by the shell
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-15:]
                raise DlinfraError(
                    f"the {served.name} server exited {proc.returncode} while starting:\n" + "\n".join(tail)
                )
            record = _live(about(served.socket))
            if record is not None and record["pid"] == proc.pid:  # written once it listens
                return proc.pid
            time.sleep(0.05)
        _signal(proc.pid, signal.SIGKILL)
        raise DlinfraError(f"the {served.name} server did not listen within {START_TIMEOUT:.0f} s (log: {log})")


def status() -> list[dict[str, Any]]:
    """Every live server of this checkout and interpreter, with whether it serves their current code."""
    current = {served.socket for served in wanted()}
    listed = []
    folder = runtime_dir()
    for record_path in sorted(folder.glob("*.json")) if private_folder(folder) else []:
        record = _live(record_path)
        if record is None or record.get("root") != str(PROJECT_ROOT) or record.get("prefix") != sys.prefix:
            continue
        sock = record_path.with_suffix(".sock")
        listed.append(
            {
                "name": record["name"],
                "pid": record["pid"],
                "socket": str(sock),
                "current": sock in current,
                "up_seconds": round(time.time() - float(record["started"]), 1),
            }
        )
    return listed


def stop_all() -> list[int]:
    """Stop every server of this checkout and interpreter (current code or older), by the pid it recorded; the
    pids. A server gives the commands it runs STOP_GRACE_SECONDS to end."""
    stopped = []
    for entry in status():
        pid = int(entry["pid"])
        _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _running(pid):
            _signal(pid, signal.SIGKILL)
        for own in (Path(entry["socket"]), about(Path(entry["socket"]))):
            own.unlink(missing_ok=True)
        stopped.append(pid)
    return stopped


@contextlib.contextmanager
def _locked(path: Path) -> Any:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _live(path: Path) -> dict[str, Any] | None:
    """The record a server wrote beside its socket, when that server still runs (not a reused pid: its command
    line is the one recorded)."""
    try:
        record = json.loads(path.read_text())
        cmdline = Path(f"/proc/{int(record['pid'])}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(record, dict) or not {"pid", "name", "root", "started", "command"} <= record.keys():
        return None
    command = [part.decode(errors="replace") for part in cmdline if part]
    return record if command == list(record["command"]) and _running(int(record["pid"])) else None


def _running(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # our own child when this process started it: reap it
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return not state.startswith("Z")


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
