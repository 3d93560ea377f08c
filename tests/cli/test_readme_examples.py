"""Every README line that runs dlinfra (its ```sh blocks) runs as written in a fresh clone's lab, as the --help
examples do (tests/cli/test_examples.py); and the `dlinfra` command the examples name is where the README says.

A line's other tools are not run: `bash .ci/setup` (it installs packages: tests/test_ci_setup.py tests it), and the
lines of `pulumi`, `python3 ... gpu_check.py` and `pip` are not dlinfra's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cli import examples_lab as lab
from tests.conftest import ROOT

README_LINES = lab.readme_lines()


@pytest.mark.slow  # shares the lab of tests/cli/test_examples.py
@pytest.mark.parametrize(("line", "number"), README_LINES, ids=[f"README:{n}" for _, n in README_LINES])
def test_readme_example_runs(
    line: str, number: int, example_lab: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(example_lab)
    for words in lab.commands(line):
        argv = lab.dlinfra_argv(words)
        if argv is not None:
            lab.run_command(argv, example_lab, monkeypatch, capsys)


def test_the_readme_s_sh_blocks_are_found() -> None:
    assert len(README_LINES) > 20
    assert any(line.startswith(".venv/bin/dlinfra ") for line, _ in README_LINES)


def test_the_readme_says_how_to_type_dlinfra_before_anything_else() -> None:
    """--help and the guides write `dlinfra ...`; after .ci/setup only .venv/bin/dlinfra exists."""
    readme = (ROOT / "README.md").read_text()
    fresh_clone = readme.index("bash .ci/setup && bash .ci/test")
    said = readme.index("`. .venv/bin/activate`")
    assert fresh_clone < said < readme.index("\n## ")


def test_venv_dlinfra_runs() -> None:
    """`.ci/setup` installs the package editable, so `.venv/bin/dlinfra` exists: the README's first commands."""
    command = ROOT / ".venv" / "bin" / "dlinfra"
    if not command.exists():
        message = f"{command} does not exist: run .ci/setup"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    done = subprocess.run([command, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.startswith("dlinfra "), done.stderr
    assert "not installed" not in done.stdout
