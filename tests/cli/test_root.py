"""Commands typed in a subdirectory of the lab find its fleet.yaml upward, as git finds its repository."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dlinfra.cli import main as cli
from dlinfra.cli import root
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    """A copy of the reference lab: a repository with fleet.yaml and its lock at the top, and a docs/ folder."""
    top = tmp_path / "lab"
    (top / ".git").mkdir(parents=True)
    (top / "docs" / "deep").mkdir(parents=True)
    shutil.copy(REFERENCE_FLEET, top / "fleet.yaml")
    shutil.copy(REFERENCE_LOCK, top / "cidr-lock.yaml")
    return top


def test_validate_from_a_subdirectory(
    lab: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(lab / "docs" / "deep")
    code = cli.main(["validate"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "fleet.yaml: ok - 3 regions" in captured.out
    assert Path.cwd() == lab / "docs" / "deep"  # the command ran from the top, and came back


def test_defaults_resolve_from_the_top_and_given_paths_from_here(
    lab: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # --lock is typed in docs/, so it is docs/other-lock.yaml; the profile's default folder is the lab's build/.
    shutil.copy(REFERENCE_LOCK, lab / "docs" / "other-lock.yaml")
    monkeypatch.chdir(lab / "docs")
    code = cli.main(["validate", "--lock", "other-lock.yaml"])
    assert code == 0 and "other-lock.yaml: ok" in capsys.readouterr().out
    argv = ["vpn", "profile", "--environment", "staging", "--region", "us-west-2", "--user", "alice", "--offline"]
    code = cli.main(argv)
    assert code == 0, capsys.readouterr().err
    assert (lab / "build" / "vpn" / "staging-us-west-2-alice.ovpn").exists()
    assert not (lab / "docs" / "build").exists()


def test_the_search_stops_at_the_repository_top(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A fleet.yaml above the repository is another lab's: not taken.
    shutil.copy(REFERENCE_FLEET, tmp_path / "fleet.yaml")
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "repo" / "sub")
    assert root.find_root(Path.cwd()) is None
    code = cli.main(["validate"])
    assert code == 2 and "fleet.yaml: cannot read" in capsys.readouterr().err


def test_an_explicit_fleet_is_taken_as_given(
    lab: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(lab / "docs")
    code = cli.main(["validate", "--fleet", "fleet.yaml"])
    assert code == 2 and "fleet.yaml: cannot read" in capsys.readouterr().err
    assert os.path.samefile(Path.cwd(), lab / "docs")
