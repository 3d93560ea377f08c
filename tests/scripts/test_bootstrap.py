"""scripts/bootstrap-region.sh: the first apply of a new region over the laptop VPN, driven with fake CLIs."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REFERENCE_FLEET, ROOT

SCRIPT = ROOT / "scripts" / "bootstrap-region.sh"
FAKE = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
case "$*" in
  "stack output"*) echo "https://127.0.0.1" ;;
esac
"""


def _run(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls"
    for tool in ("pulumi", "aws"):
        fake = bin_dir / tool
        fake.write_text(FAKE.format(log=log))
        fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DLINFRA_FLEET": str(REFERENCE_FLEET)}
    proc = subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, env=env, check=False, timeout=120)
    return proc, log.read_text().splitlines() if log.exists() else []


def test_shellcheck_clean(require_tool: Callable[[str], str]) -> None:
    proc = subprocess.run([require_tool("shellcheck"), str(SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_dry_run_prints_the_steps_in_order(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, "--dry-run", "prod-eu-west-1")
    assert proc.returncode == 0, proc.stderr
    steps = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert steps == [
        # Pulumi's dynamic-provider launcher finds the venv in stacks/ only through this link (pulumi/pulumi
        # issue 7061; tests/components/test_crd_wait.py).
        "+ ln -sfn ../.venv stacks/.venv",
        f"+ pulumi up --stack prod-eu-west-1 --policy-pack {ROOT}/policy --yes",
        "+ (check) TCP eu-west-1 EKS endpoint :443",
        f"+ pulumi up --stack prod-eu-west-1-k8s --policy-pack {ROOT}/policy --yes",
        "+ aws codebuild batch-get-projects --region eu-west-1 --names dlinfra-prod-euw1-ci-apply "
        "--query projects[0].name",
    ]
    assert calls == []  # a dry run runs nothing


def test_without_the_vpn_the_in_cluster_stack_is_not_attempted(tmp_path: Path) -> None:
    # The fake stack output points the endpoint at 127.0.0.1:443, where nothing listens: like a laptop whose
    # Client VPN is down.
    proc, calls = _run(tmp_path, "prod-eu-west-1")
    assert proc.returncode == 1
    assert "connect the eu-west-1 Client VPN" in proc.stderr
    assert calls[0].startswith("pulumi up --stack prod-eu-west-1 ")
    assert not [c for c in calls if "prod-eu-west-1-k8s" in c]


@pytest.mark.parametrize(
    ("stack", "message"),
    [
        ("eu-west-1", "not a regional stack name"),
        ("prod-ap-south-1", "'ap-south-1' is not a region of environment 'prod'"),
    ],
)
def test_bad_stack_names_are_refused_before_anything_runs(tmp_path: Path, stack: str, message: str) -> None:
    proc, calls = _run(tmp_path, stack)
    assert proc.returncode == 2 and message in proc.stderr
    assert calls == []


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage_instead_of_taking_it_for_a_stack(tmp_path: Path, flag: str) -> None:
    proc, calls = _run(tmp_path, flag)
    assert proc.returncode == 0, proc.stderr
    assert "scripts/bootstrap-region.sh [--dry-run] <env>-<region>" in proc.stdout
    assert "not a regional stack name" not in proc.stderr and not calls
