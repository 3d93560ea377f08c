"""`dlinfra diff` over real revisions and saved plan folders: a scratch copy of the project, each revision previewed by
its own code, a base kept by commit so that it is previewed once, and exit codes that say whether anything changed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlinfra.cli import main as cli
from dlinfra.errors import DlinfraError
from dlinfra.model.fleet.load import load_fleet
from dlinfra.review.diff import render, revisions
from dlinfra.review.diff.compare import touched
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.mark.slow
def test_diff_of_two_revisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two commits of a scratch copy of the project: each revision's own preview runs; only the change shows."""
    if shutil.which("git") is None:
        pytest.fail("git is needed for dlinfra diff")
    repo = tmp_path / "repo"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file() and not name.startswith("tests/"):
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, repo / name)
    # The fixture fleet, never the lab's own.
    shutil.copy(REFERENCE_FLEET, repo / "fleet.yaml")
    shutil.copy(REFERENCE_LOCK, repo / "cidr-lock.yaml")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q", "-m", "base")
    fleet = repo / "fleet.yaml"
    fleet.write_text(fleet.read_text().replace("owner: infra@lab.example.org", "owner: platform@lab.example.org"))
    data = yaml.safe_load(fleet.read_text())
    kwargs: dict[str, Any] = {
        "fleet": fleet,
        "lock": repo / "cidr-lock.yaml",
        "python": sys.executable,
        "cache": repo / "build" / "cache",
    }
    previews: list[Path] = []
    real_preview = revisions._preview_tree

    def counted(tree: Path, *args: Any) -> None:
        previews.append(tree)
        real_preview(tree, *args)

    monkeypatch.setattr(revisions, "_preview_tree", counted)
    result = revisions.diff_sides("main", None, **kwargs)
    assert previews[0] != repo and previews[1] == repo  # the base's exported tree, then the checkout, by their code
    working = render.render_markdown(result)
    assert [t["stack"] for t in touched(result)] == [
        "prod-eu-west-1",
        "prod-global",
        "prod-us-east-1",
        "prod-us-west-2",
        "staging-us-west-2",
    ]
    assert touched(result)[0] == {
        "stack": "prod-eu-west-1",
        "kind": "regional",
        "environment": "prod",
        "region": "eu-west-1",
    }
    # With the head fleet: where each stack runs, and whether a pull request may preview it for real
    # (environments.<env>.ci.pull_request_preview: staging yes, prod no).
    head = load_fleet(fleet).fleet
    annotated = {row["stack"]: row for row in touched(result, head)}
    assert annotated["staging-us-west-2"]["preview"] == "real"
    assert {annotated[s]["preview"] for s in annotated if s.startswith("prod-")} == {"offline"}
    assert {row["runs_on"] for row in annotated.values()} == {"github-hosted"}
    assert "`main (" in working and "→ `working tree`" in working
    assert "`tags.owner`" in working and "[!CAUTION]" not in working
    assert "| `prod-us-west-2` | 0 |" in working and "No allocation added" in working
    with pytest.raises(DlinfraError, match="unknown revision 'nope'"):
        revisions.diff_sides("nope", "HEAD", **kwargs)
    # Once previewed, the base is kept by commit: a second diff previews the working tree only.
    previews.clear()
    again = revisions.diff_sides("main", None, **kwargs)
    assert previews == [repo] and render.render_markdown(again) == working
    # The command: a positional base, and --detailed-exitcode's 0 (no change), 2 (changes) and 1 (an error).
    common = ["--fleet", str(fleet), "--detailed-exitcode", "--json"]
    assert cli.main(["diff", "main", *common]) == 2
    assert cli.main(["diff", "main", "main", *common]) == 0
    assert cli.main(["diff", "nope", *common]) == 1
    assert cli.main(["diff", "main", "--base", "HEAD", *common]) == 1  # the base given twice, differently
    assert cli.main(["diff", "--base", "main", "--fleet", str(fleet), "--json"]) == 0  # without the flag: 0 either way
    capsys.readouterr()
    assert cli.main(["diff", "main", "--touched", "--fleet", str(fleet)]) == 0
    touched_json = json.loads(capsys.readouterr().out)  # what preview.yml reads with jq '.stacks[]'
    assert touched_json["schema"] == "dlinfra.touched/v1"
    assert [row["stack"] for row in touched_json["stacks"]][:2] == ["prod-eu-west-1", "prod-global"]
    # preview compares with the default branch, as pulumi preview compares with its state.
    plans = ["--out", str(repo / "build" / "plans"), "--fleet", str(fleet), "--detailed-exitcode", "--summary"]
    assert cli.main(["preview", "--all", *plans]) == 2
    shown = capsys.readouterr().out
    assert "9 stack(s) against main (" in shown and "prod-us-west-2               ~ " in shown
    assert "staging-us-west-2-k8s        no changes (" in shown
    assert cli.main(["preview", "--all", "--base", "HEAD", *plans]) == 2  # HEAD is main: the same change
    assert cli.main(["preview", "--all", "--empty", *plans]) == 2  # everything is to create in an empty cloud
    # A whole environment gone: its stacks show as removed, every resource to delete, and the exit code says so.
    fleet.write_text(yaml.safe_dump({**data, "environments": {"prod": data["environments"]["prod"]}}, sort_keys=False))
    capsys.readouterr()
    assert cli.main(["preview", "--all", *plans]) == 2
    shown = capsys.readouterr().out
    assert "staging-us-west-2            removed from the fleet: - " in shown and " to delete" in shown


@pytest.mark.slow
def test_a_fleet_outside_git_compares_with_a_saved_plan_folder(
    write_fleet: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No git: `preview` keeps the fleet, lock and stack configs beside its plans, and that folder is a base."""
    fleet = write_fleet()
    saved = tmp_path / "deployed" / "plans"
    assert cli.main(["preview", "--all", "--summary", "--fleet", str(fleet), "--out", str(saved)]) == 0
    assert {p.name for p in (saved / "inputs").iterdir()} == {"fleet.yaml", "cidr-lock.yaml", "stacks"}
    capsys.readouterr()
    common = ["--fleet", str(fleet), "--detailed-exitcode"]
    assert cli.main(["diff", str(saved), *common]) == 0
    assert "No allocation added" in capsys.readouterr().out
    fresh = ["--fleet", str(fleet), "--out", str(tmp_path / "build" / "plans"), "--summary"]
    assert cli.main(["preview", "--all", "--base", str(saved), "--detailed-exitcode", *fresh]) == 0
    shown = capsys.readouterr().out
    assert "9 stack(s) against plan folder" in shown and ": no changes;" in shown
    # A folder typed relative to a subdirectory is the folder there (commands run from the fleet's folder).
    (tmp_path / "docs").mkdir()
    monkeypatch.chdir(tmp_path / "docs")
    assert cli.main(["diff", "../deployed/plans", "--detailed-exitcode"]) == 0
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()

    def grow(data: dict[str, Any]) -> None:
        data["environments"]["staging"]["node_pools"]["cpu"]["max_size"] += 1

    write_fleet(grow)
    assert cli.main(["diff", str(saved), *common]) == 2
    markdown = capsys.readouterr().out
    assert "| `staging-us-west-2` | 0 | 1 | 0 | 0 |" in markdown and "`maxSize`: 6 → 7" in markdown
    assert "prod-us-west-2" not in markdown.split("### Address plan")[0]
    assert cli.main(["diff", "main", *common]) == 1  # no git here: a name that is not a folder cannot be a revision
    assert "not a plan folder, and the fleet is not in a git repository" in capsys.readouterr().err
    # preview against the saved folder shows the one change; with no base named, outside git, everything is new.
    assert cli.main(["preview", "--all", "--base", str(saved), "--detailed-exitcode", *fresh]) == 2
    shown = capsys.readouterr().out
    assert "staging-us-west-2            ~ 1 to update; " in shown
    assert "prod-us-west-2               no changes" in shown
    assert cli.main(["preview", "--all", *fresh]) == 0
    captured = capsys.readouterr()
    assert "note: no base to compare with" in captured.err and "9 stack(s): + " in captured.out


def test_a_plan_folder_without_its_inputs_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old"
    old.mkdir()
    (old / "prod-us-west-2.json").write_text("{}")
    with pytest.raises(DlinfraError, match="not the inputs they were made from"):
        revisions.plan_set(
            str(old), repo=None, fleet=REFERENCE_FLEET, lock=REFERENCE_LOCK, python="", cache=None, work=tmp_path
        )


def test_a_revision_git_archive_cannot_export_is_one_clear_error(tmp_path: Path) -> None:
    """A committed link to an absolute path: tar's data filter refuses it; no traceback."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".venv-checkov").symlink_to("/usr")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q", "-m", "link")
    with pytest.raises(DlinfraError, match=r"cannot export revision \w+ to preview it"):
        revisions._export(repo, "main", tmp_path / "out")
