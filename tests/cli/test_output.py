"""What commands print, read by tools: tables in a pipe keep whole rows, every JSON document names its schema,
and spinners appear only on a terminal (stdout stays as a pipe reads it)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from dlinfra.cli import common
from dlinfra.cli import main as cli
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK

SCHEMA = re.compile(r"^dlinfra\.[a-z-]+/v\d+$")


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Plans of every reference stack, from the one shared offline run, with the fleet and lock beside them."""
    from dlinfra.offline import plan_export
    from tests import reference

    root = tmp_path_factory.mktemp("output")
    for result in reference.runs().values():
        plan_export.write_plan(result, reference.fleet().project, root / "plans", reference.provenance())
    return root / "plans"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_access_in_a_pipe_keeps_whole_arns(
    plan_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # capsys is a pipe to rich: without a terminal it would lay tables out in 80 columns and cut each ARN.
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(capsys, "access", "--fleet", str(REFERENCE_FLEET), "--plans", str(plan_dir), "--env", "prod")
    assert code == 0 and "…" not in out
    assert "arn:aws:iam::111122223333:role/dlinfra-apply-prod" in out


def test_cost_and_site_list_in_a_pipe_keep_whole_rows(
    plan_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(capsys, "cost", "--fleet", str(REFERENCE_FLEET), "--plans", str(plan_dir))
    assert code == 0 and "…" not in out
    code, out, _ = run(capsys, "site", "list", "--fleet", str(REFERENCE_FLEET))
    assert code == 0 and "…" not in out
    assert all(len(line.split()) >= 6 for line in out.splitlines()[2:] if line.strip())  # one row a site


def test_a_terminal_still_gets_its_own_width() -> None:
    buffer = io.StringIO()
    console = common.Output(file=buffer, force_terminal=True, width=60)
    assert console.width == 60
    assert common.Output(file=io.StringIO(), force_terminal=False).width == common.PIPE_WIDTH


def test_every_json_output_names_its_schema(plan_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = ["--fleet", str(REFERENCE_FLEET), "--lock", str(REFERENCE_LOCK)]
    plans = ["--plans", str(plan_dir)]
    commands = {
        "dlinfra.validate/v1": ["validate", *fleet],
        "dlinfra.stacks/v1": ["stacks", *fleet],
        "dlinfra.cidr/v1": ["cidr", *fleet],
        "dlinfra.sites/v1": ["site", "list", *fleet],
        "dlinfra.cost/v1": ["cost", *fleet, *plans],
        "dlinfra.access/v2": ["access", *fleet, *plans, "--env", "staging"],
        "dlinfra.check/v1": ["check", *fleet, *plans, "--stack", "staging-us-west-2", "--no-checkov"],
        "dlinfra.reach/v2": ["reach", *fleet, *plans],
    }
    for schema, argv in commands.items():
        code, out, err = run(capsys, *argv, "--json")
        assert code in (0, 1), (argv, err)
        document = json.loads(out)
        assert isinstance(document, dict) and document["schema"] == schema, argv
        assert SCHEMA.match(document["schema"])
    # Where the schemas are written down: one page lists every JSON output.
    documented = (Path(__file__).parents[2] / "docs" / "json.md").read_text()
    for schema in [*commands, "dlinfra.gpu-status/v1", "dlinfra.gpu-labels/v1", "dlinfra.what-happened/v1"]:
        assert f"`{schema}`" in documented, schema


def test_validate_json_reports_errors_and_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "validate", "--fleet", str(REFERENCE_FLEET), "--json")
    document = json.loads(out)
    assert code == 0 and document["ok"] is True and document["errors"] == []
    assert document["counts"]["stacks"] == 9 and document["counts"]["allocations"] == 56
    broken = tmp_path / "fleet.yaml"
    broken.write_text(REFERENCE_FLEET.read_text().replace("client_vpn_prefix: 22", "client_vpn_prefix: nope"))
    code, out, err = run(capsys, "validate", "--fleet", str(broken), "--json")
    document = json.loads(out)
    assert code == 2 and err == "" and document["ok"] is False and document["counts"] is None
    (error,) = document["errors"]
    assert error["file"] == str(broken) and "client_vpn_prefix" in (error["key"] or "") + error["message"]


def test_spinner_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.StringIO()
    monkeypatch.setattr(common, "err", Console(file=buffer, force_terminal=False))
    with common.working("reading the plans"):
        pass
    assert buffer.getvalue() == ""
    monkeypatch.setattr(common, "err", Console(file=buffer, force_terminal=True, width=100))
    with common.working("reading the plans"):
        pass
    assert "reading the plans" in buffer.getvalue()
