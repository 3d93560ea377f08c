"""CrdWait: waits until every named CRD is Established, then creates; names the missing ones when it gives up."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

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
