"""`dlinfra diff` over real revisions: a scratch copy of the project, each revision previewed by its own code."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlinfra.errors import DlinfraError
from dlinfra.model.fleet.load import load_fleet
from dlinfra.review.diff import render, revisions
from dlinfra.review.diff.compare import touched
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.mark.slow
def test_diff_of_two_revisions(tmp_path: Path) -> None:
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
    kwargs: dict[str, Any] = {"fleet": Path("fleet.yaml"), "lock": Path("cidr-lock.yaml"), "python": sys.executable}
    result = revisions.diff_revisions(repo=repo, base="main", head=None, **kwargs)
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
        revisions.diff_revisions(repo=repo, base="nope", head="HEAD", **kwargs)
