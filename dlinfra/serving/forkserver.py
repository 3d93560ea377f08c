"""A warm fork server: a process that has imported a program once and runs each command in a fork of itself.

A dlinfra command in a new process spends most of a small change's time importing: the provider SDKs (pulumi_aws.ec2
alone takes about a second), the CLI's modules, and checkov (four seconds before it scans anything). A server started
once (`dlinfra server start`) imports them, then for every command it is sent forks a child that runs it with the
caller's argv, working directory, environment and standard streams (the file descriptors themselves, passed over the
socket), and reports the exit code. The child is a copy of the server as it was after importing, so no command sees
another's state; the server itself runs nothing. It is the Bazel server or the Gradle daemon, for Python.

A server is bound to one build of the code: its socket's name is a digest of the interpreter, the files of the
program and the installed packages (`code_key`), so after any edit or install the client finds no server for its
key and runs the command itself. The socket is in a folder only its user may enter, and the server refuses a peer
of another user. It exits after `idle` seconds with no command, or on SIGTERM (`stop`).

This module uses the standard library only: the checkov server runs it with checkov's own interpreter, by path.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import importlib
import io
import json
import os
import select
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

PROTOCOL = 1
MAX_HEADER = 4 << 20  # bytes: argv, cwd and environment
_LENGTH = struct.Struct("!I")


class ServerLostError(RuntimeError):
    """The server, or the child running the command, went away before reporting an exit code."""


def runtime_dir() -> Path:
    """The per-user folder of the sockets (mode 0700): $XDG_RUNTIME_DIR, else the temporary folder."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    return base / f"dlinfra-servers-{os.getuid()}"


def socket_path(name: str, key: str) -> Path:
    """The socket of the server called `name` for the code of `key`."""
    return runtime_dir() / f"{name}-{key[:24]}.sock"


def about(path: Path) -> Path:
    """The file beside a server's socket that says which process serves it and for what (written by its starter)."""
    return path.with_suffix(".json")


def code_key(parts: Iterable[str], roots: Iterable[Path], *, shallow: Collection[Path] = ()) -> str:
    """A digest of `parts` and of every file and folder under `roots`: its path, size and modification time (a stat,
    not a read, so that a client computes it in milliseconds). A root that is a file counts itself; a root in
    `shallow` (an installed-packages folder) counts only itself, whose time changes as packages come and go."""
    digest = hashlib.sha256(f"forkserver {PROTOCOL}\0".encode())
    for part in parts:
        digest.update(part.encode() + b"\0")
    for root in roots:
        for path in [str(root)] if root in shallow else sorted(_files(root)):
            try:
                st = os.stat(path)
            except OSError:
                continue
            digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def _files(root: Path) -> Iterable[str]:
    if not root.is_dir():
        yield str(root)
        return
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
        yield folder  # a folder's time changes when a file is added or removed
        yield from (os.path.join(folder, name) for name in names if not name.endswith((".pyc", ".sock")))


# --- the client -------------------------------------------------------------------------------------------------


def call(
    path: Path,
    argv: Sequence[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    fds: tuple[int, int, int] = (0, 1, 2),
    timeout: float | None = None,
) -> int | None:
    """Run argv in the server at `path` with these standard streams; its exit code, or None when no server listens
    there or it did not start the command (the caller runs the command itself). SIGINT, SIGTERM and SIGHUP sent to
    this process go to the child. ServerLostError when the command started and its process ended without an exit code;
    TimeoutError (the child killed) when it runs longer than `timeout` seconds."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:  # no such socket, or a stale one nobody listens on
        conn.close()
        return None
    with conn:
        header = json.dumps(
            {"protocol": PROTOCOL, "argv": list(argv), "cwd": cwd or os.getcwd(), "env": dict(env or os.environ)}
        ).encode()
        try:
            socket.send_fds(conn, [_LENGTH.pack(len(header)) + header], list(fds))
            reader = conn.makefile("rb")
            first = reader.readline().split()
        except OSError:
            return None
        if first[:1] != [b"pid"] or len(first) != 2:
            return None  # refused, or the server went away before starting it: nothing ran
        child = int(first[1])
        previous = _forward_signals(child)
        conn.settimeout(timeout)
        try:
            last = reader.readline().split()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
            raise TimeoutError(f"the command ran longer than {timeout} s; its process ({child}) was killed") from None
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if last[:1] != [b"exit"]:
            raise ServerLostError(f"the command's process ({child}) ended without an exit code")
        return int(last[1])


def _forward_signals(child: int) -> dict[int, Any]:
    previous: dict[int, Any] = {}

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    if _main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, forward)
    return previous


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


# --- the server -------------------------------------------------------------------------------------------------


def serve(
    path: Path,
    *,
    entry: str,
    kind: str = "call",
    preload: Sequence[str] = (),
    warm: Sequence[str] = (),
    idle: float = 1800.0,
) -> None:
    """Import `preload`, call each `warm` function (module:function), then serve commands at `path` until idle for
    `idle` seconds or sent SIGTERM. A command runs entry(argv) (kind "call": a main that returns its exit code) or
    entry(argv=argv).run() (kind "class", checkov's Checkov)."""
    for name in preload:
        importlib.import_module(name)
    for spec in warm:
        _resolve(spec)()
    target = _resolve(entry)
    gc.collect()
    gc.freeze()  # children share the imported modules' pages instead of copying them as the collector walks them
    listener, identity = _listen(path)
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    children: set[int] = set()
    last = time.monotonic()
    print(f"ready pid {os.getpid()} socket {path}", flush=True)
    try:
        while not stopping:
            children -= _reaped(children)
            if children:
                last = time.monotonic()
            elif time.monotonic() - last > idle or _identity(path) != identity:
                break
            with contextlib.suppress(InterruptedError):
                readable, _, _ = select.select([listener], [], [], 1.0)
            if not readable or stopping:
                continue
            conn, _ = listener.accept()
            last = time.monotonic()
            with conn:
                pid = _start(conn, target, kind, listener)
            if pid:
                children.add(pid)
    finally:
        listener.close()
        if _identity(path) == identity:  # not replaced by a later server
            for own in (path, about(path)):
                with contextlib.suppress(OSError):
                    own.unlink()


def _resolve(spec: str) -> Callable[..., Any]:
    module, _, attr = spec.partition(":")
    value: Any = importlib.import_module(module)
    for part in attr.split("."):
        value = getattr(value, part)
    return value  # type: ignore[no-any-return]


def _listen(path: Path) -> tuple[socket.socket, tuple[int, int]]:
    """A listening socket at `path`, made under a temporary name and renamed there, in a folder of mode 0700; with
    the socket file's identity, by which the server sees that it was removed (stop) or replaced."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder = path.parent.stat()
    if folder.st_uid != os.getuid() or folder.st_mode & 0o077:
        raise SystemExit(f"{path.parent}: not a folder only this user may enter; refusing to serve there")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        staging.unlink()
    listener.bind(str(staging))
    listener.listen(64)
    os.replace(staging, path)
    return listener, _identity(path)


def _identity(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_dev, st.st_ino)


def _reaped(children: set[int]) -> set[int]:
    done = set()
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                continue
        done.add(pid)
    return done


def _start(conn: socket.socket, target: Callable[..., Any], kind: str, listener: socket.socket) -> int:
    """Read one request from `conn` and fork its child; the child's pid (0 when the request was refused)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    if uid != os.getuid():
        return 0
    conn.settimeout(30.0)
    fds: list[int] = []
    try:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        while len(data) < _LENGTH.size or len(data) < _LENGTH.size + _LENGTH.unpack_from(data)[0]:
            if len(data) > MAX_HEADER:
                raise ValueError("request too large")
            more = conn.recv(1 << 16)
            if not more:
                raise ValueError("request cut short")
            data += more
        request = json.loads(data[_LENGTH.size :])
        if request.get("protocol") != PROTOCOL or len(fds) != 3:
            raise ValueError(f"protocol {request.get('protocol')!r} with {len(fds)} streams")
    except (OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            conn.sendall(f"refused {exc}\n".encode())
        for fd in fds:
            os.close(fd)
        return 0
    conn.settimeout(None)
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            listener.close()
            _run_child(conn, fds, request, target, kind)
        finally:
            os._exit(70)
    for fd in fds:
        os.close(fd)
    return pid


def _run_child(
    conn: socket.socket, fds: list[int], request: dict[str, Any], target: Callable[..., Any], kind: str
) -> None:
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL if signum != signal.SIGINT else signal.default_int_handler)
    for number, fd in enumerate(fds):
        os.dup2(fd, number)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ["DLINFRA_SERVED_BY"] = str(os.getppid())  # what ran it, for a command that reports how it ran
    sys.argv = list(request["argv"])
    sys.stdin = _stream(0, "r")
    sys.stdout = _stream(1, "w")
    sys.stderr = _stream(2, "w")
    conn.sendall(f"pid {os.getpid()}\n".encode())
    code = 1
    try:
        result = target(sys.argv[1:]) if kind == "call" else target(argv=sys.argv[1:]).run()
        code = _exit_code(result)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - the command's crash is its output, as when it runs in its own process
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    conn.sendall(f"exit {code}\n".encode())
    os._exit(0)


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _stream(fd: int, mode: str) -> io.TextIOWrapper:
    """A text stream on a descriptor, buffered as Python buffers its own: by line on a terminal."""
    tty = os.isatty(fd)
    raw = open(fd, mode + "b", buffering=0 if mode == "r" and tty else -1, closefd=False)  # noqa: SIM115
    return io.TextIOWrapper(
        raw,  # type: ignore[arg-type]
        encoding="utf-8",
        errors="strict" if mode == "r" else "backslashreplace",
        line_buffering=tty,
        write_through=False,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="forkserver", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--entry", required=True, help="module:callable run for each command")
    parser.add_argument("--kind", choices=["call", "class"], default="call")
    parser.add_argument("--preload", action="append", default=[], help="a module to import first")
    parser.add_argument("--warm", action="append", default=[], help="module:function called once before serving")
    parser.add_argument("--idle", type=float, default=1800.0, help="seconds without a command before it exits")
    args = parser.parse_args(argv)
    serve(args.socket, entry=args.entry, kind=args.kind, preload=args.preload, warm=args.warm, idle=args.idle)


if __name__ == "__main__":
    main()
