"""`dlinfra quota`: the table whole in a pipe, the JSON schema, the filters, and warnings on stderr."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from dlinfra.cli import main as cli
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _cells(out: str) -> list[list[str]]:
    """The table's rows as lists of cells."""
    return [[c.strip() for c in line.strip("│ ").split("│")] for line in out.splitlines() if line.startswith("│")]


def test_table_in_a_pipe_is_whole(capsys: pytest.CaptureFixture[str], write_fleet: Callable[..., Path]) -> None:
    long_name = "speech-and-audio-modelling"[:24]
    path = write_fleet(lambda d: d["teams"].__setitem__(long_name, {"gpu_quota": 8}))
    code, out, err = run(capsys, "quota", "--fleet", str(path))
    assert code == 0
    assert "…" not in out  # wider than 80 columns, and not cut to them
    rows = _cells(out)
    assert ["prod", "vision", "us-west-2", "pool-train-h100", "37", "91"] in rows
    assert ["prod", "vision", "all regions", "", "192", "464"] in rows
    assert ["prod", long_name, "all regions", "", "8", "648"] in rows
    # Warnings go to stderr, one line each, for staging's scaled quotas: the new team and robotics get nothing.
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2
    assert all("guaranteed no GPUs in environment staging" in w for w in warnings)
    assert any(f"team {long_name} " in w for w in warnings)


def test_json_has_its_schema_and_the_filters_apply(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "quota", "--fleet", str(REFERENCE_FLEET), "--env", "prod", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["schema"] == "dlinfra.quota/v1"
    assert {r["environment"] for r in data["quotas"]} == {"prod"}
    assert {
        "environment": "prod",
        "team": "language",
        "region": "eu-west-1",
        "flavor": "site-ams1",
        "guaranteed": 25,
        "borrowable": 39,
    } in data["quotas"]
    assert {"environment": "prod", "team": "vision", "region": "us-east-1"} in data["overflow"]
    assert data["warnings"] == [] and err == ""  # staging's warning is not prod's
    code, out, err = run(
        capsys, "quota", "--fleet", str(REFERENCE_FLEET), "--env", "staging", "--team", "robotics", "--json"
    )
    data = json.loads(out)
    assert [(r["team"], r["guaranteed"], r["borrowable"]) for r in data["quotas"]] == [("robotics", 0, 2)]
    assert len(data["warnings"]) == 1 and re.search(r"gpu_quotas: scaled .* 2 GPUs", data["warnings"][0])
    assert "warning: team robotics" in err


def test_an_unknown_environment_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "quota", "--fleet", str(REFERENCE_FLEET), "--env", "dev")
    assert code == 2 and out == ""
    assert "no environment 'dev'; the fleet has prod, staging" in err


def test_help_examples_run_on_the_reference_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(REFERENCE_FLEET, tmp_path / "fleet.yaml")
    shutil.copy(REFERENCE_LOCK, tmp_path / "cidr-lock.yaml")
    monkeypatch.chdir(tmp_path)
    for line in cli.EXAMPLES["quota"].splitlines():
        argv = shlex.split(line, comments=True)
        assert argv[0] == "dlinfra", line
        code, out, err = run(capsys, *argv[1:])
        assert code == 0 and out, (line, err)
