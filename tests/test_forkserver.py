"""The warm fork server (dlinfra.serving.forkserver): each command runs in a fresh fork with the caller's argv, working
directory, environment and streams, and reports its exit code; no server means the caller runs the command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlinfra.serving import forkserver

ROOT = Path(__file__).resolve().parent.parent
START_SECONDS = 120.0  # a busy machine imports slowly; the wait ends as soon as the socket is there
ENTRY = "tests.forkserver_target:main"


def _start(path: Path, *extra: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlinfra.serving.forkserver", "--socket", str(path), "--entry", ENTRY, *extra],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + START_SECONDS
    while not path.exists():
        assert proc.poll() is None, f"the server exited {proc.returncode} while starting"
        assert time.monotonic() < deadline, f"the server did not listen within {START_SECONDS} s"
        time.sleep(0.02)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(START_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(START_SECONDS)


@pytest.fixture(scope="module")
def server() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dlfs") as folder:  # short: a socket path has at most 107 bytes
        path = Path(folder) / "private" / "target.sock"
        proc = _start(path, "--idle", "600")
        yield path
        _stop(proc)
        assert not path.exists(), "a stopped server leaves no socket behind"


def _call(path: Path, argv: list[str], *, stdin: bytes = b"", **kwargs: object) -> tuple[int | None, str, str]:
    with tempfile.TemporaryFile() as inp, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        inp.write(stdin)
        inp.seek(0)
        code = forkserver.call(path, argv, fds=(inp.fileno(), out.fileno(), err.fileno()), **kwargs)  # type: ignore[arg-type]
        out.seek(0)
        err.seek(0)
        return code, out.read().decode(), err.read().decode()


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


def test_commands_run_side_by_side(server: Path) -> None:
    """A long command does not hold up the next one: each has its own process."""
    sleeper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from dlinfra.serving import forkserver; forkserver.call({str(server)!r}, ['t', 'sleep', '30'])",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == b"sleeping\n"
        started = time.monotonic()
        assert _call(server, ["target", "echo"])[0] == 0
        assert time.monotonic() - started < 30, "the second command waited for the first"
    finally:
        sleeper.kill()
        sleeper.wait(START_SECONDS)


def test_interrupting_the_client_interrupts_the_command(server: Path) -> None:
    client = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from dlinfra.serving import forkserver; "
            f"sys.exit(forkserver.call({str(server)!r}, ['t', 'sleep', '600']))",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert client.stdout is not None and client.stdout.readline() == b"sleeping\n"
        client.send_signal(signal.SIGINT)
        assert client.wait(START_SECONDS) == 130  # the command's KeyboardInterrupt, as its own process exits
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(START_SECONDS)


def test_a_timeout_kills_the_command(server: Path) -> None:
    # The limit under test, not a wait for an event: the command sleeps 600 s, so a loaded machine only makes the
    # kill come later, never a correct run fail.
    limit = 0.5
    with pytest.raises(TimeoutError, match="was killed"):
        _call(server, ["target", "sleep", "600"], timeout=limit)


def test_no_server_means_the_caller_runs_the_command(tmp_path: Path) -> None:
    assert forkserver.call(tmp_path / "none.sock", ["target"]) is None
    stale = tmp_path / "stale.sock"  # a socket file nobody listens on: a server that was killed
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))
    assert forkserver.call(stale, ["target"]) is None


def test_a_server_stops_when_idle_or_when_its_socket_goes() -> None:
    with tempfile.TemporaryDirectory(prefix="dlfs") as folder:
        idle = _start(Path(folder) / "idle.sock", "--idle", "1")
        removed = _start(Path(folder) / "removed.sock", "--idle", "600")
        try:
            (Path(folder) / "removed.sock").unlink()  # as `dlinfra server stop` and a newer server replacing it do
            assert idle.wait(START_SECONDS) == 0
            assert removed.wait(START_SECONDS) == 0
            assert not (Path(folder) / "idle.sock").exists()
        finally:
            _stop(idle)
            _stop(removed)


def test_the_socket_folder_is_private() -> None:
    with tempfile.TemporaryDirectory(prefix="dlfs") as folder:
        shared = Path(folder) / "shared"
        shared.mkdir(mode=0o777)
        shared.chmod(0o777)
        proc = subprocess.run(
            [sys.executable, "-m", "dlinfra.serving.forkserver", "--socket", str(shared / "s.sock"), "--entry", ENTRY],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=START_SECONDS,
            check=False,
        )
        assert proc.returncode != 0 and "not a folder only this user may enter" in proc.stderr
        assert not (shared / "s.sock").exists()


def test_the_code_key_follows_every_file_of_the_program(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    module = tmp_path / "pkg" / "mod.py"
    module.write_text("x = 1\n")
    packages = tmp_path / "site-packages"
    packages.mkdir()
    roots = [tmp_path / "pkg", packages]

    def key() -> str:
        return forkserver.code_key(["python"], roots, shallow={packages})

    first = key()
    assert key() == first, "the same files give the same key"
    module.write_text("x = 2\n")
    edited = key()
    assert edited != first, "an edit changes the key"
    (tmp_path / "pkg" / "new.py").write_text("")
    added = key()
    assert added != edited, "a new file changes the key"
    (packages / "deep").mkdir()
    assert key() != added, "installing a package (a new folder in site-packages) changes the key"
    assert forkserver.code_key(["another python"], roots, shallow={packages}) != key()
