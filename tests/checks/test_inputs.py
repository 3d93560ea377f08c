"""Inputs of `dlinfra check`: plan files and the skips file; every problem is an error, never a silent pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dlinfra.checks import skips
from dlinfra.checks.plans import PlanError, load_plan, load_plans
from tests.conftest import ROOT

FIXTURE = Path(__file__).parent / "fixtures" / "test-us-west-2.json"


def test_missing_plan_folder(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="no plan folder; run `dlinfra preview --all` first"):
        load_plans(tmp_path / "nowhere", None)


def test_missing_stack_plan_is_named(tmp_path: Path) -> None:
    shutil.copy(FIXTURE, tmp_path)
    with pytest.raises(PlanError, match=r"no plan for stack\(s\) prod-us-west-2, prod-global"):
        load_plans(tmp_path, None, ["test-us-west-2", "prod-us-west-2", "prod-global"])
    with pytest.raises(PlanError, match="plan file not found"):
        load_plans(tmp_path, ["prod-us-west-2"])


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"no plan files"):
        load_plans(tmp_path, None)


def test_leftover_plans_are_ignored_and_reported(tmp_path: Path) -> None:
    shutil.copy(FIXTURE, tmp_path)
    data = json.loads(FIXTURE.read_text())
    (tmp_path / "old-eu-west-1.json").write_text(json.dumps({**data, "stack": "old-eu-west-1"}))
    plans, ignored = load_plans(tmp_path, None, ["test-us-west-2"])
    assert [p.stack for p in plans] == ["test-us-west-2"] and ignored == ["old-eu-west-1"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not a readable JSON plan export"),
        ("[]", "expected a JSON object"),
        ('{"schema": "other/v9"}', "schema: schema is 'other/v9'"),
        ('{"schema": "dlinfra.plan/v1", "stack": "test-us-west-2", "project": "p", "role": {}}', "resources: missing"),
        (
            '{"schema": "dlinfra.plan/v1", "stack": "other", "project": "p", "role": {}, "resources": []}',
            "holds stack 'other'",
        ),
        (
            '{"schema": "dlinfra.plan/v1", "stack": "test-us-west-2", "project": "p", "role": {}, "resources": [{}]}',
            r"resources\[0\]\.urn: missing",
        ),
    ],
)
def test_malformed_plan(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "test-us-west-2.json"
    path.write_text(text)
    with pytest.raises(PlanError, match=message) as err:
        load_plan(path)
    assert str(path) in str(err.value)


def _skips(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "checkov-skips.yaml"
    path.write_text(text)
    return path


def test_skip_without_reason_is_rejected(tmp_path: Path) -> None:
    path = _skips(tmp_path, "version: 1\nskips:\n  - id: CKV2_AWS_12\n")
    with pytest.raises(skips.SkipError, match=r"skips\.0\.reason: Field required \(every skip needs a reason"):
        skips.load_skips(path)


def test_skip_with_blank_reason_is_rejected(tmp_path: Path) -> None:
    path = _skips(tmp_path, "version: 1\nskips:\n  - id: CKV2_AWS_12\n    reason: '   '\n")
    with pytest.raises(skips.SkipError, match=r"skips\.0\.reason"):
        skips.load_skips(path)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("  - id: nope\n    reason: a reason long enough\n", r"skips\.0\.id"),
        ("  - id: CKV_AWS_1\n    reason: a reason long enough\n    because: x\n", r"skips\.0\.because"),
        ("  - id: CKV_AWS_1\n    reason: a reason long enough\n    frameworks: [helm]\n", "unknown framework 'helm'"),
        ("  - id: CKV_AWS_1\n    reason: a reason long enough\n" * 2, "CKV_AWS_1 is skipped twice"),
    ],
)
def test_bad_skip_entries(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(skips.SkipError, match=message):
        skips.load_skips(_skips(tmp_path, "version: 1\nskips:\n" + body))


def test_skip_scope(tmp_path: Path) -> None:
    text = (
        "version: 1\nskips:\n  - id: CKV_AWS_24\n    reason: the bastion is a honeypot by design\n"
        "    resources: ['aws_security_group.bastion-*']\n    frameworks: [terraform_plan]\n"
    )
    (skip,) = skips.load_skips(_skips(tmp_path, text))
    assert skip.matches("terraform_plan", "CKV_AWS_24", "aws_security_group.bastion-sg")
    assert not skip.matches("terraform_plan", "CKV_AWS_24", "aws_security_group.web-sg")
    assert not skip.matches("kubernetes", "CKV_AWS_24", "aws_security_group.bastion-sg")
    assert not skip.matches("terraform_plan", "CKV_AWS_25", "aws_security_group.bastion-sg")


def test_missing_skips_file(tmp_path: Path) -> None:
    assert skips.load_skips(tmp_path / "absent.yaml", missing_ok=True) == []
    with pytest.raises(skips.SkipError, match="skips file not found"):
        skips.load_skips(tmp_path / "absent.yaml")


def test_committed_skips_file_is_valid() -> None:
    for skip in skips.load_skips(ROOT / "checkov-skips.yaml"):
        assert len(skip.reason.split()) >= 5, f"{skip.check_id}: give a reason a reviewer can check"
