"""CrdWait: waits until every named CRD is Established, then creates; names the missing ones when it gives up."""

from __future__ import annotations

import fnmatch
import os
import re
import select
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import crd_wait
from tests.conftest import ROOT

ESTABLISHED = {"status": {"conditions": [{"type": "NamesAccepted", "status": "True"},
                                         {"type": "Established", "status": "True"}]}}  # fmt: skip
PENDING = {"status": {"conditions": [{"type": "Established", "status": "False"}]}}


class FakeCluster:
    """CRDs that appear after some reads, as an operator registering them at start would make them."""

    def __init__(self, timeline: Mapping[str, list[Mapping[str, Any] | None]]) -> None:
        self.timeline = {name: list(states) for name, states in timeline.items()}
        self.reads = 0

    def read(self, name: str) -> Mapping[str, Any] | None:
        self.reads += 1
        states = self.timeline.get(name, [None])
        return states.pop(0) if len(states) > 1 else states[0]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_waits_until_every_crd_is_established() -> None:
    cluster = FakeCluster({"a.cilium.io": [None, PENDING, ESTABLISHED], "b.cilium.io": [None, ESTABLISHED]})
    clock = Clock()
    crd_wait.wait_established(cluster.read, ["a.cilium.io", "b.cilium.io"], clock=clock, sleep=clock.sleep)
    assert clock.now == 2 * crd_wait.POLL_SECONDS  # two rounds of waiting, then both served


def test_gives_up_naming_the_missing_crds() -> None:
    cluster = FakeCluster({"a.cilium.io": [ESTABLISHED], "b.cilium.io": [None]})
    clock = Clock()
    with pytest.raises(TimeoutError, match=r"after 60s: b\.cilium\.io \(does their operator run"):
        crd_wait.wait_established(
            cluster.read, ["a.cilium.io", "b.cilium.io"], timeout_s=60, clock=clock, sleep=clock.sleep
        )
    assert clock.now >= 60


@pytest.mark.parametrize(
    ("crd", "served"),
    [(None, False), ({}, False), ({"status": None}, False), (PENDING, False), (ESTABLISHED, True)],
)
def test_established_reads_the_condition(crd: Mapping[str, Any] | None, served: bool) -> None:
    assert crd_wait.established(crd) is served


def test_the_provider_creates_only_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeCluster({"a.cilium.io": [None, ESTABLISHED]})
    seen: list[str] = []

    def reader(kubeconfig: str) -> crd_wait.ReadCrd:
        seen.append(kubeconfig)
        return cluster.read

    monkeypatch.setattr(crd_wait, "_reader", reader)
    provider = crd_wait.CrdWaitProvider()
    clock = Clock()
    provider.clock, provider.sleep = clock, clock.sleep  # type: ignore[method-assign]
    result = provider.create({"kubeconfig": "{}", "crds": ["a.cilium.io"]})
    assert seen == ["{}"] and cluster.reads == 2 and result.outs["crds"] == ["a.cilium.io"]
    monkeypatch.setattr(crd_wait, "_reader", lambda _k: FakeCluster({}).read)
    with pytest.raises(TimeoutError, match=r"b\.cilium\.io"):
        provider.update("id", {}, {"kubeconfig": "{}", "crds": ["b.cilium.io"]})
    assert clock.now >= crd_wait.WAIT_SECONDS


# --- the provider loads where Pulumi starts it --------------------------------------------------------------------
# Pulumi pickles the provider with dill (pulumi/dynamic/dynamic.py serialize_provider), which names an importable
# class by reference, `components.crd_wait.CrdWaitProvider`; the provider process, `python -u -m pulumi.dynamic`
# from the project's venv, starts in the program's directory, stacks/ (Pulumi.yaml main; pulumi's
# sdk/go/common/resource/plugin/plugin.go execPlugin sets cmd.Dir), so sys.path holds stacks/ and the venv, never
# the project root. The workflows build that venv from requirements.txt plus `pip install --no-deps -e .`
# (tests/test_workflows.py checks they do); here a venv holds this one's site-packages without their .pth files
# (requirements.txt's packages, not this checkout's editable install) and, for the install, the packages pyproject
# ships mapped to this checkout, as setuptools' editable finder maps them.
LOAD = "import base64, sys, dill; p = dill.loads(base64.b64decode(sys.stdin.read())); print(type(p).__module__)"


def _workflow_venv(tmp_path: Path, *, project_installed: bool) -> Path:
    import sysconfig
    import tomllib

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    site = Path(purelib)
    # A path line in a .pth file extends sys.path without reading that folder's own .pth files.
    (site / "requirements.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    if project_installed:
        include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
        for package in sorted(p for p in ROOT.iterdir() if (p / "__init__.py").is_file()):
            if any(fnmatch.fnmatch(package.name, pattern) for pattern in include["include"]):
                (site / package.name).symlink_to(package, target_is_directory=True)
    return python


@pytest.mark.parametrize("project_installed", [False, True], ids=["requirements-only", "project-installed"])
def test_the_provider_unpickles_in_the_provider_process(tmp_path: Path, project_installed: bool) -> None:
    from pulumi.dynamic.dynamic import serialize_provider

    python = _workflow_venv(tmp_path, project_installed=project_installed)
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    proc = subprocess.run(
        [python, "-c", LOAD],
        input=serialize_provider(crd_wait.CrdWaitProvider()),
        cwd=ROOT / "stacks",
        env=env | {"AWS_EC2_METADATA_DISABLED": "true"},
        capture_output=True,
        text=True,
        check=False,
    )
    if project_installed:
        assert proc.returncode == 0 and proc.stdout.strip() == "components.crd_wait", proc.stderr
    else:  # what the workflows' venvs did before they installed the project
        assert proc.returncode != 0 and "No module named 'components'" in proc.stderr, proc.stdout + proc.stderr


# --- Pulumi's launcher finds the project's venv from stacks/ ------------------------------------------------------
# Pulumi starts a Python dynamic provider through a shell script it ships with the CLI, not in the pip package
# (pulumi/pulumi sdk/python/dist/pulumi-resource-pulumi-python), in the program's directory (Pulumi.yaml main:
# stacks/; pkg/engine/project.go getPwdMain, and plugin.go's newPlugin sets cmd.Dir to it), with each runtime option
# of Pulumi.yaml in its environment as PULUMI_RUNTIME_<OPTION>, as written (provider_plugin.go NewProvider). The
# script makes a relative virtualenv absolute against its $PWD, so `virtualenv: .venv` means stacks/.venv there,
# while the program resolves it against the project root (pulumi/pulumi issue 7061, open). No Pulumi CLI can be had
# here, so `launcher_python` takes the script's steps one by one.
STACKS_VENV_LINK = "ln -sfn ../.venv stacks/.venv"


class LauncherError(Exception):
    """The launcher's complaint when the virtualenv it resolved has no bin/python (it exits 1)."""


def provider_start(project: Path) -> tuple[Path, dict[str, str]]:
    """The working directory Pulumi starts the project's dynamic provider in, and the runtime options it passes."""
    settings = yaml.safe_load((project / "Pulumi.yaml").read_text())
    options = settings["runtime"].get("options", {})
    return project / settings.get("main", "."), {f"PULUMI_RUNTIME_{k.upper()}": str(v) for k, v in options.items()}


def launcher_python(pwd: Path, env: Mapping[str, str]) -> Path:
    """The interpreter the launcher runs `-u -m pulumi.dynamic` with when started in pwd with env."""
    venv = env.get("PULUMI_RUNTIME_VIRTUALENV", "")
    if not venv and env.get("PULUMI_RUNTIME_TOOLCHAIN") == "uv":
        venv = ".venv"  # (poetry: it asks `poetry env info --path`; this project uses pip)
    if not venv:
        found = shutil.which(env.get("PULUMI_PYTHON_CMD", "python3"), path=env.get("PATH"))
        if found is None:
            raise LauncherError("no python3 on PATH")
        return Path(found)
    venv = venv.removesuffix("/")  # `${VAR%/}`: one trailing slash
    if not venv.startswith("/"):
        venv = f"{pwd}/{venv}"  # `$PWD/$VAR`, kept as written: no normalising, links not resolved
    python = Path(venv, "bin", "python")
    if not python.is_file():  # `[ -f ... ]`, which follows links
        state = "doesn't appear to be a virtual environment" if Path(venv).is_dir() else "doesn't exist"
        raise LauncherError(f'The \'virtualenv\' option in Pulumi.yaml is set to "{venv}", but "{venv}" {state}.')
    return python


def test_the_launcher_finds_the_venv_in_stacks_once_setup_links_it(tmp_path: Path) -> None:
    # A project laid out as this one: Pulumi.yaml, the venv at the root, the program in stacks/.
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    (tmp_path / "stacks").mkdir()
    (tmp_path / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    pwd, env = provider_start(tmp_path)
    assert pwd == tmp_path / "stacks" and env["PULUMI_RUNTIME_VIRTUALENV"] == ".venv"
    # What the real CLI did before: the launcher looks for stacks/.venv and exits.
    with pytest.raises(LauncherError, match=rf'"{re.escape(str(tmp_path))}/stacks/\.venv" doesn\'t exist'):
        launcher_python(pwd, env)
    # The link .ci/setup, the workflows and bootstrap-region.sh make (tests/test_ci_setup.py, test_workflows.py,
    # scripts/test_bootstrap.py) makes stacks/.venv the root venv.
    subprocess.run(["bash", "-c", STACKS_VENV_LINK], cwd=tmp_path, check=True)
    python = launcher_python(pwd, env)
    assert python == tmp_path / "stacks" / ".venv" / "bin" / "python"
    assert python.samefile(Path(sys.prefix) / "bin" / "python")
    # The link is a file to git, so an ignore pattern with a trailing slash would not keep it out of commits.
    ignored = subprocess.run(["git", "check-ignore", "-q", "stacks/.venv"], cwd=ROOT, check=False)
    assert ignored.returncode == 0, ".gitignore: add /stacks/.venv (no trailing slash: it is a link)"


def test_the_provider_starts_from_this_checkouts_stacks_dir() -> None:
    """The launcher's steps in this checkout (after .ci/setup) reach the venv, whose `python -m pulumi.dynamic` then
    serves on a loopback port, the first thing Pulumi reads from a plugin."""
    pwd, env = provider_start(ROOT)
    try:
        python = launcher_python(pwd, env)
    except LauncherError as refused:
        pytest.fail(f"{refused} (run .ci/setup, which links stacks/.venv to ../.venv)")
    assert python.samefile(ROOT / ".venv" / "bin" / "python")
    child_env = {k: v for k, v in os.environ.items() if k not in {"PYTHONHOME", "PYTHONPATH", "VIRTUAL_ENV"}}
    child_env |= env | {"PATH": f"{python.parent}:{os.environ['PATH']}", "AWS_EC2_METADATA_DISABLED": "true"}
    proc = subprocess.Popen(
        [str(python), "-u", "-m", "pulumi.dynamic"], cwd=pwd, env=child_env, stdout=subprocess.PIPE, text=True
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)  # generous: imports grpc on a busy machine
        assert ready, "pulumi.dynamic printed no port within 120 s"
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        assert port.isdigit() and 0 < int(port) < 65536, port
    finally:
        proc.terminate()
        proc.wait(timeout=60)  # it exits at once on SIGTERM; generous all the same (tests/test_waits.py)
