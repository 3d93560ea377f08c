"""The caller's side of the fork server (dlinfra.serving.forkserver): send a command, pass on signals, and end as the
command ended."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlinfra.serving.forkserver import LENGTH, PROTOCOL, peer_uid, private_folder, process_settings, signal_group

HANDSHAKE_SECONDS = 10.0  # a server that has not started the command by then is passed by: the caller runs it
# Signals a terminal or a job runner sends that the command must get; Ctrl-Z (SIGTSTP) stops both (below).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
HELD = (*FORWARDED, signal.SIGTSTP, signal.SIGCONT)


class ServerLostError(RuntimeError):
    """The server went away mid-command, before saying how the command ended."""


def call(
    path: Path,
    argv: Sequence[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    fds: tuple[int, int, int] = (0, 1, 2),
    timeout: float | None = None,
    forward: bool = False,
) -> int | None:
    """Run argv in the server at `path` with these standard streams, as this process's own child would run.

    Returns its exit code, negative (-N) when a signal N ended it, or None when no server of this user listens in a
    private folder there or it did not start the command (the caller then runs it itself). With `forward` (the
    `dlinfra` command itself, in its main thread), the signals a terminal sends go to the command: from before the
    request leaves, so none is lost. Without it, this process keeps its signals, and the command gets SIGTERM when
    this process goes. ServerLostError when the server went away mid-command; TimeoutError (the command killed) when
    it runs longer than `timeout` seconds.
    """
    if not private_folder(path.parent):
        return None
    forward = forward and threading.current_thread() is threading.main_thread()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD) if forward else None
    handlers: dict[int, Any] = {}
    try:
        started = _started(path, argv, cwd=cwd, env=env, fds=fds)
        if started is None:
            return None
        conn, reader, child = started
        if forward:
            handlers = _forwarding(child)
    finally:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # what arrived meanwhile is handled now
    with conn:
        conn.settimeout(timeout)
        try:
            last = reader.readline().split()
        except TimeoutError:
            signal_group(child, signal.SIGKILL)
            raise TimeoutError(f"the command ran longer than {timeout} s; its process ({child}) was killed") from None
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
    if len(last) == 2 and last[0] == b"exit":
        return int(last[1])
    if len(last) == 2 and last[0] == b"signal":
        return -int(last[1])
    raise ServerLostError(f"the server at {path} went away while the command (pid {child}) ran")


def _started(
    path: Path, argv: Sequence[str], *, cwd: str | None, env: Mapping[str, str] | None, fds: tuple[int, int, int]
) -> tuple[socket.socket, Any, int] | None:
    """The connection, its reader and the command's pid once the server has started it; None when it did not."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(HANDSHAKE_SECONDS)
    try:
        conn.connect(str(path))
        if peer_uid(conn) != os.getuid():
            raise ConnectionRefusedError(f"{path} is served by another user")
        request = {
            "protocol": PROTOCOL,
            "argv": list(argv),
            "cwd": cwd or os.getcwd(),
            "env": dict(os.environ if env is None else env),
            "process": process_settings(),
        }
        body = json.dumps(request).encode()
        socket.send_fds(conn, [LENGTH.pack(len(body)) + body], list(fds))
        reader = conn.makefile("rb")
        first = reader.readline().split()
    except (OSError, ValueError):  # no socket, a stale one nobody listens on, a stuck server, another user's
        conn.close()
        return None
    if len(first) != 2 or first[0] != b"pid":
        conn.close()
        return None  # refused, or the server went away before starting it: nothing ran
    return conn, reader, int(first[1])


def _forwarding(child: int) -> dict[int, Any]:
    """Handlers that pass this process's signals on to the command; the ones they replace. A signal this process
    ignores (nohup: SIGHUP) stays ignored here, as the command ignores it too (forkserver's request)."""

    def forward(signum: int, _frame: object) -> None:
        signal_group(child, signum)

    def stop(_signum: int, _frame: object) -> None:  # Ctrl-Z: the command stops, then this process; fg resumes both
        signal_group(child, signal.SIGTSTP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)
        signal.signal(signal.SIGTSTP, stop)
        signal_group(child, signal.SIGCONT)

    replaced: dict[int, Any] = {}
    for signum in FORWARDED:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            replaced[signum] = signal.signal(signum, forward)
    if signal.getsignal(signal.SIGTSTP) is not signal.SIG_IGN:
        replaced[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, stop)
    replaced[signal.SIGCONT] = signal.signal(signal.SIGCONT, forward)
    return replaced
