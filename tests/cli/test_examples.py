"""Every --help example (dlinfra.cli.main.EXAMPLES) runs as written in a fresh clone's lab and exits as it promises.

Each line of an example is one case; a line's commands (`a && b`) run in order. How each command runs, and the line
it must print, is in tests/cli/examples_lab.RUNS: a new example without a runner fails here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dlinfra.cli import main as cli
from dlinfra.cli.main import EXAMPLES
from tests.cli import examples_lab as lab

CASES = [(path, line.strip()) for path, text in EXAMPLES.items() for line in lab.command_lines(text)]


def _command_paths(parser: argparse.ArgumentParser, path: str = "") -> list[str]:
    found = [path]
    for action in parser._actions:  # argparse has no public way to walk its subcommands
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _command_paths(child, f"{path} {name}".strip())
    return found


def test_every_command_path_has_an_example() -> None:
    """So a new command gets an example, and with it a case here that fails until it has a runner."""
    assert sorted(_command_paths(cli._parser())) == sorted(EXAMPLES)


def test_every_runner_is_used() -> None:
    """A runner no example or README line needs any more is stale: remove it."""
    lines = [line for _, line in CASES] + [line for line, _ in lab.readme_lines()]
    used = {lab.key(argv) for line in lines for words in lab.commands(line) if (argv := lab.dlinfra_argv(words))}
    used |= {before for key in used if key in lab.RUNS for before in lab.RUNS[key].before}
    assert sorted(set(lab.RUNS) - used) == []


@pytest.mark.slow  # the first preview, checkov and diff's base: about a minute for both example modules
@pytest.mark.parametrize(("path", "line"), CASES, ids=[f"{p or 'dlinfra'}: {line}" for p, line in CASES])
def test_help_example_runs(
    path: str, line: str, example_lab: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(example_lab)
    commands = lab.commands(line)
    assert commands, f"EXAMPLES[{path!r}] has an empty line"
    for words in commands:
        argv = lab.dlinfra_argv(words)
        assert argv is not None and words[0] == "dlinfra", f"EXAMPLES[{path!r}]: {line!r} is not a dlinfra command"
        lab.run_command(argv, example_lab, monkeypatch, capsys)
