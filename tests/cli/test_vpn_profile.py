"""`dlinfra vpn profile` as a newcomer meets it: the --help examples work on the reference fleet, and --user on an
environment with federated sign-in says what to do instead."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest

from dlinfra.cli import main as cli
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lab folder holding the reference fleet and lock, as the working directory."""
    shutil.copy(REFERENCE_FLEET, tmp_path / "fleet.yaml")
    shutil.copy(REFERENCE_LOCK, tmp_path / "cidr-lock.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", ["vpn", "vpn profile"])
def test_help_examples_work_on_the_reference_fleet(command: str, lab: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for line in cli.EXAMPLES[command].splitlines():
        argv = shlex.split(line, comments=True)
        assert argv[0] == "dlinfra", line
        code = cli.main(argv[1:])
        captured = capsys.readouterr()
        assert code == 0, (line, captured.err)
        assert captured.out.startswith("wrote build/vpn/"), line
    assert (lab / "build" / "vpn" / "staging-us-west-2-alice.ovpn").exists()


def test_user_on_federated_sign_in_says_what_to_run(lab: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["vpn", "profile", "--region", "us-west-2", "--user", "alice", "--outputs", "o.json"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "environments.prod.client_vpn.saml" in err
    assert "--user is for certificate sign-in, and prod uses federated sign-in" in err
    assert "`dlinfra vpn profile --environment prod --region us-west-2 --outputs FILE`" in err
    assert "certificate sign-in is in staging (--environment staging)" in err
    assert not (lab / "build").exists()
