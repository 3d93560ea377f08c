"""A warm fork server: a process that has imported a program once and runs each command in a fork of itself.

A dlinfra command in a new process spends most of a small change's time importing: the provider SDKs (pulumi_aws.ec2
alone takes about a second), the CLI's modules, and checkov (three seconds before it scans anything). A server started
once (`dlinfra server start`) imports them; then, for every command a client sends (dlinfra.serving.client), it forks
a child that runs it as the caller's own process would: the caller's argv, working directory, environment, umask,
resource limits, niceness, CPU affinity, ignored signals and standard streams (the descriptors themselves, passed
over the socket). The server keeps the connection and reports how the child ended (`exit N`, or `signal N` for a
child killed by a signal, as a shell sees it); when the caller goes away, the child gets SIGTERM. The child closes
every socket of the server at once, so nothing it starts holds a caller's connection open. No command sees another's
state: each child is a copy of the server as it was after importing. It is the Bazel server or the Gradle daemon,
for Python.

A server is bound to one build of the code: its socket's name is a digest of the interpreter, the Python and locale
settings of the environment, the files of the program and the installed packages (`code_key`), so after any edit or
install a client finds no server for its key and runs the command itself. The socket is in a folder only its user
may enter (client and server both check), and each side checks the other's user (SO_PEERCRED). A server exits after
`idle` seconds with no command, when its socket is removed or replaced, or on SIGTERM (its running commands get
SIGTERM, then SIGKILL after a grace).

This module uses the standard library only: the checkov server runs it with checkov's own interpreter, by path.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import hashlib
import importlib
import io
import json
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROTOCOL = 2
MAX_REQUEST = 4 << 20  # bytes: argv, cwd, environment and process settings
REQUEST_SECONDS = 30.0  # a caller that has not sent its whole request by then is dropped
STOP_GRACE_SECONDS = 60.0  # running commands' time to end after SIGTERM when the server stops
LENGTH = struct.Struct("!I")
LIMITS = ("RLIMIT_NOFILE", "RLIMIT_CORE", "RLIMIT_FSIZE", "RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_CPU")
# Signals a caller may have ignored (nohup: SIGHUP), which its command ignores too.
IGNORABLE = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGPIPE", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGUSR1", "SIGUSR2")


def runtime_dir() -> Path:
    """The per-user folder of the sockets (mode 0700): $XDG_RUNTIME_DIR, else the temporary folder."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    return base / f"dlinfra-servers-{os.getuid()}"


def socket_path(name: str, key: str) -> Path:
    """The socket of the server called `name` for the code of `key`."""
    return runtime_dir() / f"{name}-{key[:24]}.sock"


def about(path: Path) -> Path:
    """The file beside a server's socket that says which process serves it and for what (written by the server)."""
    return path.with_suffix(".json")


def private_folder(folder: Path) -> bool:
    """Whether `folder` is a real folder (not a link) of this user that no one else may enter or write."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def peer_uid(conn: socket.socket) -> int:
    """The user of the process at the other end of a Unix socket."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def settings(env: Mapping[str, str], *, python: bool = True) -> list[str]:
    """The environment a program reads once, as it starts, rather than at each use: the locale, and (unless the
    interpreter runs isolated, -I) every PYTHON* variable. Part of a server's key, so that a caller whose settings
    differ finds no server and runs the command itself, as it would have."""
    wanted = [k for k in env if k in ("LANG", "LANGUAGE") or k.startswith("LC_") or (python and k.startswith("PYTHON"))]
    return [f"{k}={env[k]}" for k in sorted(wanted)]


def code_key(parts: Iterable[str], roots: Iterable[Path], *, shallow: Collection[Path] = ()) -> str:
    """A digest of `parts` and of every file under `roots` (byte-code caches left out): its path, size and
    modification time (a stat, not a read, so that a client computes it in milliseconds). A root that is a file
    counts itself; a root in `shallow` (an installed-packages folder) counts only its own modification time, which
    changes as packages come and go. Folders' own times do not count, since importing writes __pycache__ in them."""
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
        yield from (os.path.join(folder, name) for name in names if not name.endswith((".pyc", ".sock")))


def process_settings() -> dict[str, Any]:
    """What a process inherits besides its environment, which its command must inherit too."""
    mask = os.umask(0)
    os.umask(mask)
    limits = {name: list(resource.getrlimit(getattr(resource, name))) for name in LIMITS if hasattr(resource, name)}
    ignored = [name for name in IGNORABLE if signal.getsignal(getattr(signal, name)) is signal.SIG_IGN]
    return {
        "umask": mask,
        "limits": limits,
        "nice": os.nice(0),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ignored": ignored,
    }


# --- the server -------------------------------------------------------------------------------------------------


@dataclass
class _Pending:
    """A caller whose request is still arriving."""

    deadline: float
    data: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)


@dataclass
class _Running:
    """A command's child and its caller's connection (None once the caller went away)."""

    conn: socket.socket | None


@dataclass
class _Streams:
    """The encodings and error handlers of the server's own standard streams: Python chose them from the locale and
    the PYTHON* settings, which the key makes the callers' too."""

    stdin: tuple[str, str] = ("utf-8", "strict")
    stdout: tuple[str, str] = ("utf-8", "strict")
    stderr: tuple[str, str] = ("utf-8", "backslashreplace")

    @classmethod
    def now(cls) -> _Streams:
        def of(stream: Any, default: tuple[str, str]) -> tuple[str, str]:
            return (getattr(stream, "encoding", None) or default[0], getattr(stream, "errors", None) or default[1])

        return cls(of(sys.stdin, cls.stdin), of(sys.stdout, cls.stdout), of(sys.stderr, cls.stderr))


class _Server:
    """The accept loop: requests read without blocking, one child per command, each child's end reported."""

    def __init__(self, path: Path, target: Callable[..., Any], kind: str, idle: float, record: Mapping[str, Any]):
        self.path, self.target, self.kind, self.idle = path, target, kind, idle
        self.streams = _Streams.now()
        self.listener, self.identity = _listen(path)
        about(path).write_text(
            json.dumps({**record, "pid": os.getpid(), "command": sys.orig_argv, "started": time.time()})
        )
        self.pending: dict[socket.socket, _Pending] = {}
        self.running: dict[int, _Running] = {}
        self.stopping = False
        self.last = time.monotonic()
        # A child's end wakes the loop at once (the wakeup descriptor gets a byte per signal), so its caller hears
        # of it without waiting out the select's timeout.
        self.wakeup, self.wakeup_write = os.pipe()
        os.set_blocking(self.wakeup, False)
        os.set_blocking(self.wakeup_write, False)
        signal.set_wakeup_fd(self.wakeup_write)

    def loop(self) -> None:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        print(f"ready pid {os.getpid()} socket {self.path}", flush=True)
        try:
            while not self.stopping:
                self._reap()
                now = time.monotonic()
                if self.running or self.pending:
                    self.last = now
                elif now - self.last > self.idle or _identity(self.path) != self.identity:
                    break
                for conn, pending in list(self.pending.items()):
                    if now > pending.deadline:
                        self._drop(conn)
                watched: list[Any] = [self.listener, *self.pending, *(r.conn for r in self.running.values() if r.conn)]
                with contextlib.suppress(InterruptedError):
                    readable, _, _ = select.select([*watched, self.wakeup], [], [], 1.0)
                    for ready in readable:
                        if isinstance(ready, socket.socket):
                            self._readable(ready)
                        else:
                            with contextlib.suppress(OSError):
                                os.read(self.wakeup, 4096)
            self._stop_children()
        finally:
            self.listener.close()
            if _identity(self.path) == self.identity:  # not replaced by a later server
                for own in (self.path, about(self.path)):
                    with contextlib.suppress(OSError):
                        own.unlink()

    def _stop(self, _signum: int, _frame: object) -> None:
        self.stopping = True

    def _readable(self, sock: socket.socket) -> None:
        if sock is self.listener:
            with contextlib.suppress(OSError):
                conn, _ = self.listener.accept()
                if peer_uid(conn) != os.getuid():
                    conn.close()
                    return
                conn.setblocking(False)
                self.pending[conn] = _Pending(deadline=time.monotonic() + REQUEST_SECONDS)
            return
        if sock in self.pending:
            self._receive(sock)
            return
        for pid, running in self.running.items():
            if running.conn is sock:
                try:
                    gone = sock.recv(4096) == b""  # a caller sends nothing after its request: this is its end
                except OSError:
                    gone = True
                if gone:
                    sock.close()
                    running.conn = None
                    signal_group(pid, signal.SIGTERM)  # as a terminal closing on a command
                return

    def _receive(self, conn: socket.socket) -> None:
        pending = self.pending[conn]
        try:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        pending.fds += fds
        if not data or len(pending.data) + len(data) > MAX_REQUEST:
            self._drop(conn)
            return
        pending.data += data
        if len(pending.data) < LENGTH.size or len(pending.data) < LENGTH.size + LENGTH.unpack_from(pending.data)[0]:
            return
        del self.pending[conn]
        try:
            request = json.loads(bytes(pending.data[LENGTH.size :]))
            _check(request, pending.fds)
        except (ValueError, TypeError, KeyError) as exc:
            with contextlib.suppress(OSError):
                conn.setblocking(True)
                conn.sendall(f"refused {exc}\n".encode())
            _close(conn, pending.fds)
            return
        self._fork(conn, request, pending.fds)

    def _drop(self, conn: socket.socket) -> None:
        pending = self.pending.pop(conn)
        _close(conn, pending.fds)

    def _fork(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            try:
                signal.set_wakeup_fd(-1)
                self.listener.close()
                for other in [conn, *self.pending, *(r.conn for r in self.running.values() if r.conn)]:
                    other.close()
                for other_fd in [self.wakeup, self.wakeup_write, *(fd for p in self.pending.values() for fd in p.fds)]:
                    os.close(other_fd)
                _run(request, fds, self.target, self.kind, self.streams)
            finally:
                os._exit(70)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # as the child does itself: whichever runs first, it leads its own group
        for fd in fds:
            os.close(fd)
        conn.setblocking(True)
        try:
            conn.sendall(f"pid {pid}\n".encode())
        except OSError:
            signal_group(pid, signal.SIGTERM)
            conn.close()
            self.running[pid] = _Running(None)
            return
        conn.setblocking(False)
        self.running[pid] = _Running(conn)

    def _reap(self) -> None:
        while self.running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            running = self.running.pop(pid, None)
            if running is None or running.conn is None:
                continue
            line = (
                f"signal {os.WTERMSIG(status)}"
                if os.WIFSIGNALED(status)
                else f"exit {os.waitstatus_to_exitcode(status)}"
            )
            with contextlib.suppress(OSError):
                running.conn.setblocking(True)
                running.conn.sendall(f"{line}\n".encode())
            running.conn.close()

    def _stop_children(self) -> None:
        started = list(self.running)
        for pid in started:
            signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while self.running and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
        for pid in started:  # a command's own workers too, even where the command itself has ended
            signal_group(pid, signal.SIGKILL)
        while self.running:
            self._reap()
            time.sleep(0.01)
        for conn in list(self.pending):
            self._drop(conn)


def signal_group(pid: int, signum: int) -> None:
    """Signal a command's process group (the command leads it): the command and every process it started (its
    workers), as a terminal signals its foreground job; the command alone when it leads none."""
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _check(request: Any, fds: list[int]) -> None:
    if not isinstance(request, dict) or request.get("protocol") != PROTOCOL:
        raise ValueError(f"not a protocol {PROTOCOL} request")
    if len(fds) != 3:
        raise ValueError(f"{len(fds)} streams, not 3")
    argv, env, cwd = request.get("argv"), request.get("env"), request.get("cwd")
    if not isinstance(argv, list) or not argv or not all(isinstance(word, str) for word in argv):
        raise ValueError("argv is not a list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("the environment is not a mapping of strings")
    if not isinstance(cwd, str):
        raise ValueError("no working directory")
    if not isinstance(request.get("process", {}), dict):
        raise ValueError("process settings are not a mapping")


def _close(conn: socket.socket, fds: list[int]) -> None:
    conn.close()
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _listen(path: Path) -> tuple[socket.socket, tuple[int, int]]:
    """A listening socket at `path`, made under a temporary name and renamed there, in a folder of mode 0700; with
    the socket file's identity, by which the server sees that it was removed (stop) or replaced."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not private_folder(path.parent):
        raise SystemExit(f"{path.parent}: not a folder only this user may enter; refusing to serve there")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = path.with_name(f".{os.getpid()}.s")
    with contextlib.suppress(FileNotFoundError):
        staging.unlink()
    listener.bind(str(staging))
    listener.listen(64)
    listener.setblocking(False)
    os.replace(staging, path)
    return listener, _identity(path)


def _identity(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_dev, st.st_ino)


def _run(request: dict[str, Any], fds: list[int], target: Callable[..., Any], kind: str, streams: _Streams) -> None:
    """In the child: become the caller's process (streams, directory, environment, settings), run, and exit as the
    caller's own process would have. It leads a process group of its own, which its signals go to."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    for number, fd in enumerate(fds):
        os.dup2(fd, number)
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for name in IGNORABLE:
        default = signal.default_int_handler if name == "SIGINT" else signal.SIG_DFL
        ignored = name in ((request.get("process") or {}).get("ignored") or ())
        signal.signal(getattr(signal, name), signal.SIG_IGN if ignored else default)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()  # TZ, as the caller has it
    _inherit(request)
    sys.argv = list(request["argv"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = _stream(0, "r", streams.stdin, unbuffered=False)
    sys.stdout = _stream(1, "w", streams.stdout, unbuffered=unbuffered)
    sys.stderr = _stream(2, "w", streams.stderr, unbuffered=unbuffered, lines=True)
    code = 1
    try:
        result = target(sys.argv[1:]) if kind == "call" else target(argv=sys.argv[1:]).run()
        code = _exit_code(result)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()  # then die by SIGINT, as Python does, so that a shell loop stops too
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - the command's crash is its output, as when it runs in its own process
        traceback.print_exc()
    _finish()
    os._exit(code & 0xFF)


def _inherit(request: dict[str, Any]) -> None:
    """The caller's umask, resource limits, niceness and CPU affinity, where this process may take them."""
    settings = request.get("process") or {}
    if "umask" in settings:
        os.umask(int(settings["umask"]))
    for name, (soft, hard) in (settings.get("limits") or {}).items():
        with contextlib.suppress(AttributeError, ValueError, OSError):
            resource.setrlimit(getattr(resource, name), (soft, hard))
    with contextlib.suppress(OSError, TypeError, ValueError):
        more = int(settings.get("nice", 0)) - os.nice(0)
        if more > 0:
            os.nice(more)
    if settings.get("affinity") and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError, ValueError):
            os.sched_setaffinity(0, settings["affinity"])


def _finish() -> None:
    """What a Python process does as it exits, short of freeing every object: the atexit functions (worker pools,
    temporary folders, logging), then the streams."""
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()  # noqa: SLF001 - the interpreter's own exit sequence, run without the teardown
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _stream(
    fd: int, mode: str, encoding: tuple[str, str], *, unbuffered: bool, lines: bool = False
) -> io.TextIOWrapper:
    """A text stream on a descriptor, buffered as Python buffers its own: stderr and a terminal by line, everything
    written through under PYTHONUNBUFFERED."""
    tty = os.isatty(fd)
    raw: Any = open(fd, mode + "b", buffering=0 if unbuffered or (mode == "r" and tty) else -1, closefd=False)  # noqa: SIM115
    return io.TextIOWrapper(
        raw, encoding=encoding[0], errors=encoding[1], line_buffering=lines or tty, write_through=unbuffered
    )


def serve(
    path: Path,
    *,
    entry: str,
    kind: str = "call",
    preload: Sequence[str] = (),
    warm: Sequence[str] = (),
    idle: float = 1800.0,
    record: Mapping[str, Any] | None = None,
) -> None:
    """Import `preload`, call each `warm` function (module:function), then serve commands at `path` until idle for
    `idle` seconds, its socket goes, or SIGTERM. A command runs entry(argv) (kind "call": a main that returns its
    exit code) or entry(argv=argv).run() (kind "class", checkov's Checkov). `record` is written beside the socket
    (`about`) with the server's pid and command line once it listens."""
    for name in preload:
        importlib.import_module(name)
    for spec in warm:
        _resolve(spec)()
    target = _resolve(entry)
    gc.collect()
    gc.freeze()  # children share the imported modules' pages instead of copying them as the collector walks them
    _Server(path, target, kind, idle, record or {}).loop()


def _resolve(spec: str) -> Callable[..., Any]:
    module, _, attr = spec.partition(":")
    value: Any = importlib.import_module(module)
    for part in attr.split("."):
        value = getattr(value, part)
    return value  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="forkserver", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--entry", required=True, help="module:callable run for each command")
    parser.add_argument("--kind", choices=["call", "class"], default="call")
    parser.add_argument("--preload", action="append", default=[], help="a module to import first")
    parser.add_argument("--warm", action="append", default=[], help="module:function called once before serving")
    parser.add_argument("--idle", type=float, default=1800.0, help="seconds without a command before it exits")
    parser.add_argument("--record", default="{}", help="JSON written beside the socket with the pid")
    args = parser.parse_args(argv)
    serve(
        args.socket,
        entry=args.entry,
        kind=args.kind,
        preload=args.preload,
        warm=args.warm,
        idle=args.idle,
        record=json.loads(args.record),
    )


if __name__ == "__main__":
    main()
