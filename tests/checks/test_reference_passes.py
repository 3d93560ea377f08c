"""The reference fleet passes `dlinfra check --all` with the committed skips file, checkov included."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dlinfra.checks import checkov
from dlinfra.cli import main as cli
from dlinfra.offline import plan_export
from tests import reference
from tests.conftest import REFERENCE_FLEET, ROOT


@pytest.mark.checkov
def test_reference_fleet_passes_check_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not checkov.executable(ROOT).is_file():
        message = "checkov is not installed (run .ci/setup)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: in CI a check that cannot run is a failure")
        pytest.skip(message)
    plans, manifests = tmp_path / "plans", tmp_path / "manifests"
    for result in reference.runs().values():
        plan_export.write_plan(result, reference.fleet().project, plans, reference.provenance())
        plan_export.write_manifests(result, manifests)
    argv = ["check", "--all", "--json", "--plans", str(plans), "--manifests", str(manifests)]
    code = cli.main([*argv, "--fleet", str(REFERENCE_FLEET)])
    report = json.loads(capsys.readouterr().out)
    blocking = [f for f in report["findings"] if f.get("blocking")]
    assert code == 0, blocking[:5]
    frameworks = {s["framework"]: s for s in report["checkov"]}
    # resources: those at least one check ran on (the same count whether checkov's results were cached or not)
    assert frameworks["terraform_plan"]["resources"] > 700 and frameworks["terraform_plan"]["failed"] == 0
    assert frameworks["kubernetes"]["resources"] > 50
