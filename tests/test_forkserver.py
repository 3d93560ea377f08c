"""The warm fork server (dlinfra.serving): each command runs in a fresh fork as the caller's own process would (argv,
directory, environment, streams, umask, limits, signals), and ends as it would; no server means the caller runs it."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlinfra.serving import client, forkserver

ROOT = Path(__file__).resolve().parent.parent
WAIT_SECONDS = 120.0  # a busy machine imports slowly; every wait ends as soon as its event happens
ENTRY = "tests.forkserver_target:main"


def _line(stream: object, what: str) -> str:
    """The next line of a child's pipe, waited for at most WAIT_SECONDS."""
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
        assert sel.select(WAIT_SECONDS), f"no {what} within {WAIT_SECONDS} s"
    return stream.readline().decode()  # type: ignore[attr-defined, no-any-return]


def _start(path: Path, *extra: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlinfra.serving.forkserver", "--socket", str(path), "--entry", ENTRY, *extra],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert _line(proc.stdout, "ready line").startswith("ready pid"), "the server did not start"
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(WAIT_SECONDS)


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1].startswith("Z"):
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dlfs") as name:  # short: a socket path has at most 107 bytes
        private = Path(name) / "private"
        private.mkdir(mode=0o700)
        yield private


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[Path]:
    path = folder / "target.sock"
    proc = _start(path, "--idle", "600")
    yield path
    _stop(proc)
    assert not path.exists(), "a stopped server leaves no socket behind"


def _call(path: Path, argv: list[str], *, stdin: bytes = b"", **kwargs: object) -> tuple[int | None, str, str]:
    with tempfile.TemporaryFile() as inp, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        inp.write(stdin)
        inp.seek(0)
        code = client.call(path, argv, fds=(inp.fileno(), out.fileno(), err.fileno()), **kwargs)  # type: ignore[arg-type]
        out.seek(0)
        err.seek(0)
        return code, out.read().decode(), err.read().decode()


def _client(server: Path, argv: list[str], before: str = "") -> subprocess.Popen[bytes]:
    """A `dlinfra`-like caller in its own process: forwards its signals and ends as the command ended."""
    script = (
        f"import os, signal, sys\nfrom pathlib import Path\n{before}\nfrom dlinfra.serving import client\n"
        f"code = client.call(Path({str(server)!r}), {argv!r}, forward=True)\n"
        "if code < 0:\n    signal.signal(-code, signal.SIG_DFL)\n    os.kill(os.getpid(), -code)\n"
        "sys.exit(code)\n"
    )
    return subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE)


def test_a_command_gets_argv_cwd_environment_and_streams(server: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TARGET_COLOR": "blue"}
    code, out, err = _call(server, ["target", "echo", "3"], stdin=b"from stdin\n", cwd=str(tmp_path), env=env)
    assert code == 3
    assert out == f"argv=['echo', '3'] cwd={tmp_path} calls=1 color=blue stdin=from stdin\n"
    assert err == "to stderr\n"


def test_each_command_starts_from_the_servers_state_not_the_last_commands(server: Path) -> None:
    outs = [_call(server, ["target", "echo"])[1] for _ in range(3)]
    assert all("calls=1 " in out for out in outs), outs


def test_exit_codes_and_crashes_come_back(server: Path) -> None:
    assert _call(server, ["target", "exit", "7"])[0] == 7
    code, _, err = _call(server, ["target", "crash"])
    assert code == 1
    assert "RuntimeError: the command crashed" in err and "Traceback" in err


def test_the_command_inherits_umask_limits_and_time_zone(server: Path) -> None:
    setup = "umask 077; ulimit -n 512; export TZ=Pacific/Kiritimati; "
    probe = "import sys; from tests import forkserver_target as t; t.main(['settings'])"
    alone = subprocess.run(
        ["bash", "-c", setup + f"{sys.executable} -c {probe!r}"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    served = subprocess.run(
        [
            "bash",
            "-c",
            setup + f'{sys.executable} -c "from tests.test_forkserver import _call; from pathlib import '
            f"Path; print(_call(Path({str(server)!r}), ['t', 'settings'])[1], end='')\"",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "umask=77 nofile=512" in alone.stdout
    assert served.stdout == alone.stdout


def test_stdout_and_stderr_keep_their_own_process_order(server: Path) -> None:
    """stderr is line-buffered and stdout block-buffered off a terminal, as Python's own streams are."""
    with tempfile.TemporaryFile() as both, open(os.devnull) as null:
        subprocess.run(
            [sys.executable, "-c", "from tests import forkserver_target as t; t.main(['mixed'])"],
            cwd=ROOT,
            stdin=null,
            stdout=both,
            stderr=both,
            check=True,
            env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
        )
        both.seek(0)
        alone = both.read()
        both.seek(0)
        both.truncate()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        assert client.call(server, ["t", "mixed"], fds=(null.fileno(), both.fileno(), both.fileno()), env=env) == 0
        both.seek(0)
        assert both.read() == alone


def test_commands_run_side_by_side_and_a_gone_caller_stops_its_command(server: Path) -> None:
    sleeper = _client(server, ["t", "sleep", "600"])
    try:
        child = int(_line(sleeper.stdout, "the command's start").split()[1])
        assert _call(server, ["target", "echo"])[0] == 0, "the second command waited for the first"
        assert sleeper.poll() is None
    finally:
        sleeper.kill()  # SIGKILL: the caller cannot pass anything on; the server sees its connection close
        sleeper.wait(WAIT_SECONDS)
    assert _gone(child), "the command of a caller that went away was left running"


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, -signal.SIGTERM)])
def test_a_signal_to_the_caller_ends_the_command_and_the_caller_alike(server: Path, signum: int, code: int) -> None:
    caller = _client(server, ["t", "sleep", "600"])
    try:
        child = int(_line(caller.stdout, "the command's start").split()[1])
        caller.send_signal(signum)
        assert caller.wait(WAIT_SECONDS) == code  # as a shell sees a command that died of it, and stops a loop
        assert _gone(child)
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait(WAIT_SECONDS)


def test_a_signal_the_caller_ignores_is_ignored_by_the_command(server: Path) -> None:
    caller = _client(server, ["t", "sleep", "600"], before="signal.signal(signal.SIGHUP, signal.SIG_IGN)")  # nohup
    try:
        child = int(_line(caller.stdout, "the command's start").split()[1])
        caller.send_signal(signal.SIGHUP)
        os.kill(child, signal.SIGHUP)  # as a closing terminal sends it to the whole session
        time.sleep(0.5)
        assert caller.poll() is None and not _exited(child), "SIGHUP ended a command run under nohup"
        caller.terminate()
        assert caller.wait(WAIT_SECONDS) == -signal.SIGTERM
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait(WAIT_SECONDS)


def _exited(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1].startswith("Z")
    except FileNotFoundError:
        return True


def test_a_gone_caller_stops_the_processes_its_command_started(server: Path) -> None:
    caller = _client(server, ["t", "workers"])
    try:
        words = _line(caller.stdout, "the command's start").split()
        child, worker = int(words[1]), int(words[2])
    finally:
        caller.kill()
        caller.wait(WAIT_SECONDS)
    assert _gone(child) and _gone(worker), "the command's own process outlived its caller"


def test_a_timeout_kills_the_command(server: Path) -> None:
    # The limit under test, not a wait for an event: the command sleeps 600 s, so a loaded machine only makes the
    # kill come later, never a correct run fail.
    limit = 0.5
    with pytest.raises(TimeoutError, match="was killed"):
        _call(server, ["target", "sleep", "600"], timeout=limit)


def test_a_malformed_request_is_refused_and_the_server_goes_on(server: Path) -> None:
    with socket.socket(socket.AF_UNIX) as raw, open(os.devnull) as null:
        raw.connect(str(server))
        body = b"[1]"
        socket.send_fds(raw, [struct.pack("!I", len(body)) + body], [null.fileno()] * 3)
        raw.settimeout(WAIT_SECONDS)
        assert raw.recv(4096).startswith(b"refused")
    for body in (b'{"protocol": 2, "argv": [1], "env": {}, "cwd": "/"}', b'{"protocol": 2, "argv": ["x"], "env": {}}'):
        with socket.socket(socket.AF_UNIX) as raw, open(os.devnull) as null:
            raw.connect(str(server))
            socket.send_fds(raw, [struct.pack("!I", len(body)) + body], [null.fileno()] * 3)
            raw.settimeout(WAIT_SECONDS)
            assert raw.recv(4096).startswith(b"refused"), body
    assert _call(server, ["target", "echo"])[0] == 0


def test_no_server_means_the_caller_runs_the_command(folder: Path, tmp_path: Path) -> None:
    assert client.call(folder / "none.sock", ["target"]) is None
    stale = folder / "stale.sock"  # a socket file nobody listens on: a server that was killed
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))
    assert client.call(stale, ["target"]) is None
    shared = tmp_path / "shared"  # a folder others may write: anyone could listen there, so it is not trusted
    shared.mkdir()
    shared.chmod(0o777)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(shared / "s.sock"))
        s.listen(1)
        assert client.call(shared / "s.sock", ["target"]) is None


def test_a_server_stops_when_idle_when_its_socket_goes_or_on_sigterm(folder: Path) -> None:
    idle = _start(folder / "idle.sock", "--idle", "1")
    removed = _start(folder / "removed.sock", "--idle", "600")
    busy = _start(folder / "busy.sock", "--idle", "600")
    caller = _client(folder / "busy.sock", ["t", "sleep", "600"])
    try:
        (folder / "removed.sock").unlink()  # as `dlinfra server stop` and a newer server replacing it do
        child = int(_line(caller.stdout, "the command's start").split()[1])
        busy.terminate()  # its running command gets SIGTERM, and its caller hears so
        assert caller.wait(WAIT_SECONDS) == -signal.SIGTERM
        assert _gone(child)
        for proc in (idle, removed, busy):
            assert proc.wait(WAIT_SECONDS) == 0
        assert not (folder / "idle.sock").exists() and not (folder / "busy.sock").exists()
    finally:
        for proc in (idle, removed, busy):
            _stop(proc)
        if caller.poll() is None:
            caller.kill()
            caller.wait(WAIT_SECONDS)


def test_the_socket_folder_is_private(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    proc = subprocess.run(
        [sys.executable, "-m", "dlinfra.serving.forkserver", "--socket", str(shared / "s.sock"), "--entry", ENTRY],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT_SECONDS,
        check=False,
    )
    assert proc.returncode != 0 and "not a folder only this user may enter" in proc.stderr
    assert not (shared / "s.sock").exists()


def test_the_code_key_follows_every_file_of_the_program_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    module = tmp_path / "pkg" / "mod.py"
    module.write_text("x = 1\n")
    packages = tmp_path / "site-packages"
    packages.mkdir()
    roots = [tmp_path / "pkg", packages]

    def key() -> str:
        return forkserver.code_key(["python"], roots, shallow={packages})

    first = key()
    (tmp_path / "pkg" / "__pycache__").mkdir()  # what importing it writes
    (tmp_path / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"")
    assert key() == first, "byte code written by an import leaves the key as it was"
    module.write_text("x = 2\n")
    edited = key()
    assert edited != first, "an edit changes the key"
    (tmp_path / "pkg" / "new.py").write_text("")
    added = key()
    assert added != edited, "a new file changes the key"
    (packages / "deep").mkdir()
    assert key() != added, "installing a package (a new folder in site-packages) changes the key"
    assert forkserver.code_key(["another python"], roots, shallow={packages}) != key()


def test_the_settings_read_at_start_are_part_of_the_key() -> None:
    assert forkserver.settings({"PYTHONHASHSEED": "1", "LC_ALL": "C", "HOME": "/root", "TZ": "UTC"}) == [
        "LC_ALL=C",
        "PYTHONHASHSEED=1",
    ]
    assert forkserver.settings({"PYTHONHASHSEED": "1", "LANG": "C.UTF-8"}, python=False) == ["LANG=C.UTF-8"]
