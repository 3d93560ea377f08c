"""The `check` subcommand as registered by dlinfra.cli.checks.register (CrossGuard rules only: no checkov here)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from dlinfra.checks import checkov
from dlinfra.cli import checks as cli_checks
from dlinfra.errors import DlinfraError
from tests.conftest import REFERENCE_FLEET, ROOT

FIXTURE = Path(__file__).parent.parent / "checks" / "fixtures" / "test-us-west-2.json"


def _cli(*argv: str) -> int:
    """Parse and dispatch like dlinfra's CLI does once cli.py registers these subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--fleet", default=Path("fleet.yaml"), type=Path)
    common.add_argument("--lock", default=None, type=Path)
    parser = argparse.ArgumentParser(prog="dlinfra", parents=[common])
    handlers = cli_checks.register(parser.add_subparsers(dest="command", required=True), common)
    assert set(handlers) == {"check", "diff", "reach"}
    args = parser.parse_args(list(argv))
    return handlers[args.command](args)


@pytest.fixture
def plan_dir(tmp_path: Path) -> Path:
    """A plan folder holding the bad fixture plan as stack prod-us-west-2 (a stack of the reference fleet)."""
    folder = tmp_path / "plans"
    folder.mkdir()
    data = json.loads(FIXTURE.read_text().replace("test-us-west-2", "prod-us-west-2"))
    (folder / "prod-us-west-2.json").write_text(json.dumps(data))
    return folder


def _check(plan_dir: Path, *extra: str) -> int:
    # The fixture plan is hand-made: it records no provenance, so it is used as stale on purpose.
    return _cli(
        "--fleet",
        str(REFERENCE_FLEET),
        "check",
        "--stack",
        "prod-us-west-2",
        "--plans",
        str(plan_dir),
        "--allow-stale",
        *extra,
    )


def test_check_reports_violations_and_exits_1(plan_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sarif = plan_dir.parent / "out" / "check.sarif"
    code = _check(plan_dir, "--no-checkov", "--sarif", str(sarif))
    out = capsys.readouterr().out
    assert code == 1
    assert "efs-encrypted" in out and "FAIL" in out and "checkov not run (--no-checkov)" in out
    assert "MANDATORY no-world-ingress  prod-us-west-2  aws:ec2/securityGroup:SecurityGroup bastion-sg" in out
    assert json.loads(sarif.read_text())["version"] == "2.1.0"


def test_check_json(plan_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = _check(plan_dir, "--no-checkov", "--json")
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert code == report["exit_code"] == 1
    assert {f["rule"] for f in report["findings"]} >= {"efs-encrypted", "no-world-ingress"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "--stack", "nowhere-us-west-2"], "matches no environment and region"),
        (["check", "--all"], "no plan for stack(s) prod-us-west-2"),
        (["check", "--stack", "prod-us-west-2"], "plan file not found"),
    ],
)
def test_check_bad_input(tmp_path: Path, argv: list[str], message: str) -> None:
    shutil.copy(FIXTURE, tmp_path)
    with pytest.raises(DlinfraError) as err:
        _cli("--fleet", str(REFERENCE_FLEET), *argv, "--plans", str(tmp_path))
    assert message in str(err.value)


def test_check_with_checkov_missing_is_an_error(plan_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkov, "executable", lambda root: root / "no-such-venv" / "checkov")
    with pytest.raises(checkov.CheckovError, match="checkov is not installed there"):
        _check(plan_dir)


@pytest.mark.parametrize(
    "output",
    [
        {"passed": 0, "failed": 0, "skipped": 0, "parsing_errors": 0, "resource_count": 0, "checkov_version": "3"},
        [],
        {"check_type": "terraform_plan", "results": {}, "summary": {"resource_count": 3, "passed": 0, "failed": 0}},
        {"check_type": "terraform_plan", "results": {"parsing_errors": ["x.json"]}, "summary": {"parsing_errors": 1}},
    ],
)
def test_a_scan_that_checked_nothing_fails_loudly(output: Any) -> None:
    with pytest.raises(checkov.CheckovError):
        checkov.parse_report("terraform_plan", output)


# --- stale plans ------------------------------------------------------------------------------------------
def _fresh_plan_dir(tmp_path: Path) -> Path:
    from dlinfra.offline import plan_export
    from tests import reference

    folder = tmp_path / "plans"
    plan_export.write_plan(reference.runs()["prod-us-west-2"], "dlinfra", folder, reference.provenance())
    return folder


def test_a_plan_without_provenance_is_refused(plan_dir: Path) -> None:
    with pytest.raises(DlinfraError) as caught:
        _cli("check", "--stack", "prod-us-west-2", "--plans", str(plan_dir), "--fleet", str(REFERENCE_FLEET))
    assert caught.value.key == "provenance" and caught.value.file == str(plan_dir / "prod-us-west-2.json")
    assert "records no provenance" in str(caught.value) and "dlinfra preview --all" in str(caught.value)


def test_plans_of_a_changed_fleet_or_lock_are_refused_naming_the_input(tmp_path: Path) -> None:
    plans = _fresh_plan_dir(tmp_path)
    # --fleet after the subcommand: the subcommand's own default would replace one given before it.
    argv = ["check", "--stack", "prod-us-west-2", "--plans", str(plans), "--no-checkov", "--json"]
    assert _cli(*argv, "--fleet", str(REFERENCE_FLEET)) in (0, 1)  # fresh: accepted
    edited = tmp_path / "fleet.yaml"
    edited.write_text(REFERENCE_FLEET.read_text() + "\n# a comment is a change too\n")
    shutil.copy(REFERENCE_FLEET.parent / "cidr-lock.yaml", tmp_path / "cidr-lock.yaml")
    with pytest.raises(DlinfraError) as caught:
        _cli(*argv, "--fleet", str(edited))
    assert "stale: the fleet file changed since this plan was made" in str(caught.value)
    (tmp_path / "cidr-lock.yaml").write_text((tmp_path / "cidr-lock.yaml").read_text() + "\n")
    with pytest.raises(DlinfraError) as caught:
        _cli(*argv, "--fleet", str(edited))
    assert "the fleet file, the address-plan lock changed" in str(caught.value)


def test_plans_of_changed_code_are_refused(tmp_path: Path) -> None:
    from dlinfra.checks import plans
    from dlinfra.offline import provenance

    folder = _fresh_plan_dir(tmp_path)
    plan = plans.load_plan(folder / "prod-us-west-2.json")
    lock = REFERENCE_FLEET.parent / "cidr-lock.yaml"
    plans.refuse_stale([plan], root=ROOT, fleet=REFERENCE_FLEET, lock=lock)  # fresh
    older = {**plan.data, "provenance": {**plan.data["provenance"], "code": "0" * 64, "revision": "abc1234"}}
    with pytest.raises(plans.PlanError) as caught:
        plans.refuse_stale([plans.Plan(plan.path, plan.stack, older)], root=ROOT, fleet=REFERENCE_FLEET, lock=lock)
    assert "dlinfra's code (stacks/, components/, dlinfra/) changed since this plan was made at abc1234" in str(
        caught.value
    )
    assert provenance.code_hash(ROOT) == plan.data["provenance"]["code"]


def test_allow_stale_checks_anyway_and_says_so(plan_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _check(plan_dir, "--no-checkov")
    assert "note: --allow-stale:" in capsys.readouterr().out


def test_check_reads_the_skips_beside_the_fleet_else_dlinfras_own(tmp_path: Path) -> None:
    """A fleet kept in another folder still gets dlinfra's deliberate checkov skips (they are about what its
    components declare); a lab's own file beside the fleet replaces them."""
    import argparse

    from dlinfra.cli import checks

    args = argparse.Namespace(fleet=tmp_path / "fleet.yaml")
    assert checks._default_skips(args) == ROOT / "checkov-skips.yaml"
    (tmp_path / "checkov-skips.yaml").write_text("skips: []\n")
    assert checks._default_skips(args) == tmp_path / "checkov-skips.yaml"
