""".ci/setup is a no-op when nothing changed, driven in a temp copy with fake dpkg-query, apt-get and Python."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT

SETUP = ROOT / ".ci" / "setup"

# Every call of a fake tool is appended to $CALLS as "<tool> <args>".
FAKE_PYTHON = """#!/bin/sh
# python3 and each venv's python: `-m venv DIR` makes a venv whose python is this same script.
echo "python $*" >> "$CALLS"
case "$1 $2" in
  "-m venv") mkdir -p "$3/bin" && cp "$0" "$3/bin/python" ;;
  "-c "*) echo "${FAKE_PYTHON_VERSION:-3.12.3}" ;;
  "-m pip") [ -z "${FAKE_PIP_FAILS:-}" ] || exit 1 ;;
esac
"""
FAKE_DPKG_QUERY = """#!/bin/sh
# Lists every package given as installed, except those named in $NOT_INSTALLED.
for arg in "$@"; do
  case "$arg" in -*) continue ;; esac
  case " $NOT_INSTALLED " in
    *" $arg "*) echo "$arg install ok config-files" ;;
    *) echo "$arg install ok installed" ;;
  esac
done
"""
FAKE_LOGGER = """#!/bin/sh
echo "$(basename "$0") $*" >> "$CALLS"
"""
FAKE_SUDO = """#!/bin/sh
exec "$@"
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of .ci/setup and the requirements files, as the script sees a checkout."""
    work = tmp_path / "repo"
    (work / ".ci").mkdir(parents=True)
    (work / "stacks").mkdir()  # the program's directory (Pulumi.yaml main)
    shutil.copy(SETUP, work / ".ci" / "setup")
    for name in ("requirements.txt", "requirements-checkov.txt", "pyproject.toml"):
        shutil.copy(ROOT / name, work / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {
        "python3": FAKE_PYTHON,
        "dpkg-query": FAKE_DPKG_QUERY,
        "apt-get": FAKE_LOGGER,
        "sudo": FAKE_SUDO,
    }.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return work


def _setup(checkout: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    calls = checkout.parent / "calls"
    calls.unlink(missing_ok=True)
    path = f"{checkout.parent / 'bin'}:{os.environ['PATH']}"
    proc = subprocess.run(
        ["bash", str(checkout / ".ci" / "setup")],
        env={**os.environ, "PATH": path, "CALLS": str(calls), "NOT_INSTALLED": "", **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return proc, calls.read_text().splitlines() if calls.exists() else []


def _pip_installs(calls: list[str]) -> list[str]:
    return [c for c in calls if " -m pip install " in c]


def _installed(calls: list[str]) -> list[str]:
    """What each pip install call installed: a requirements file, or "project" for the editable checkout."""
    return [c.split(" -r ", 1)[1] if " -r " in c else "project" for c in _pip_installs(calls)]


def test_fresh_machine_installs_everything_once(checkout: Path) -> None:
    proc, calls = _setup(checkout, NOT_INSTALLED="frr packer")
    assert proc.returncode == 0, proc.stderr
    assert "apt-get install -y -qq --no-install-recommends frr packer" in calls
    assert "python -m venv .venv" in calls and "python -m venv .venv-checkov" in calls
    assert _installed(calls) == ["requirements.txt", "project", "requirements-checkov.txt"]
    # The checkout goes into the main venv only, editable and without resolving its dependencies again, so
    # the `dlinfra` command the README prints exists.
    assert "python -m pip install -q --disable-pip-version-check --no-deps -e ." in calls


def test_second_run_installs_nothing(checkout: Path) -> None:
    assert _setup(checkout)[0].returncode == 0
    proc, calls = _setup(checkout)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "setup: ok\n"
    assert [c for c in calls if c.startswith("apt-get")] == []
    assert _pip_installs(calls) == []
    assert not [c for c in calls if "-m venv" in c]


@pytest.mark.parametrize(
    ("change", "reinstalled"),
    [
        (lambda repo: (repo / "requirements.txt").write_text("pyyaml==6.0.2\n"), ["requirements.txt", "project"]),
        (
            lambda repo: (repo / "pyproject.toml").write_text('[project]\nname = "dlinfra"\nversion = "0.2.0"\n'),
            ["requirements.txt", "project"],
        ),
        (
            lambda repo: (repo / "requirements-checkov.txt").write_text("checkov==3.2.0\n"),
            ["requirements-checkov.txt"],
        ),
    ],
)
def test_changed_requirements_reinstall_that_venv_only(
    checkout: Path, change: Callable[[Path], object], reinstalled: list[str]
) -> None:
    assert _setup(checkout)[0].returncode == 0
    change(checkout)
    proc, calls = _setup(checkout)
    assert proc.returncode == 0, proc.stderr
    assert _installed(calls) == reinstalled
    assert _pip_installs(_setup(checkout)[1]) == []  # and the new stamp holds


def test_new_python_version_reinstalls(checkout: Path) -> None:
    assert _setup(checkout)[0].returncode == 0
    _, calls = _setup(checkout, FAKE_PYTHON_VERSION="3.13.1")
    assert _installed(calls) == ["requirements.txt", "project", "requirements-checkov.txt"]


def test_failed_install_is_retried(checkout: Path) -> None:
    proc, _ = _setup(checkout, FAKE_PIP_FAILS="1")
    assert proc.returncode != 0
    assert not (checkout / ".venv" / ".dlinfra-setup.sha256").exists()
    proc, calls = _setup(checkout)
    assert proc.returncode == 0, proc.stderr
    assert _installed(calls) == ["requirements.txt", "project", "requirements-checkov.txt"]


def test_deleted_venv_is_rebuilt(checkout: Path) -> None:
    assert _setup(checkout)[0].returncode == 0
    shutil.rmtree(checkout / ".venv")
    _, calls = _setup(checkout)
    assert "python -m venv .venv" in calls
    assert _installed(calls) == ["requirements.txt", "project"]


def test_stacks_venv_is_a_link_to_the_root_venv(checkout: Path) -> None:
    # Pulumi's dynamic-provider launcher looks for Pulumi.yaml's `virtualenv: .venv` in stacks/, where Pulumi starts
    # it (pulumi/pulumi issue 7061; tests/components/test_crd_wait.py follows the launcher's steps).
    for _ in range(2):  # and again on a run that installs nothing
        proc, _calls = _setup(checkout)
        assert proc.returncode == 0, proc.stderr
        link = checkout / "stacks" / ".venv"
        assert link.is_symlink() and os.readlink(link) == "../.venv"
        assert (link / "bin" / "python").samefile(checkout / ".venv" / "bin" / "python")


def test_a_venv_of_its_own_in_stacks_is_refused(checkout: Path) -> None:
    # What `pulumi install` may leave behind from stacks/ (pulumi/pulumi issue 10343): ln would link inside it.
    (checkout / "stacks" / ".venv" / "bin").mkdir(parents=True)
    proc, _ = _setup(checkout)
    assert proc.returncode == 1
    assert "stacks/.venv exists and is not a link to ../.venv: remove it" in proc.stderr


def test_shellcheck_clean(require_tool: Callable[[str], str]) -> None:
    proc = subprocess.run([require_tool("shellcheck"), str(SETUP)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout
