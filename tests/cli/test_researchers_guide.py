"""docs/researchers.md stays true: its dlinfra commands parse, its `dlinfra run` runs (dry) on the test fleet and
prints what the guide shows, its Python compiles, its fleet excerpts validate, and it holds no placeholder."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from dlinfra.cli import main as cli
from dlinfra.cli.run import _follow
from dlinfra.model import dev_boxes, run_job
from dlinfra.model.fleet.devboxes import DevBoxes
from dlinfra.model.fleet.images import StandardImages
from dlinfra.model.fleet.load import load_fleet
from tests.cli import examples_lab as lab
from tests.conftest import REFERENCE_FLEET, ROOT

GUIDE = (ROOT / "docs" / "researchers.md").read_text()
NAME = "my-idea-20261129-101500"
UID = "5d1c0a8e-77f2-4f0b-9a51-0e6f3c2b9d10"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE, flags=re.S)


def _dlinfra_commands() -> list[list[str]]:
    found = []
    for block in _blocks("sh"):
        for line in lab.command_lines(block):
            for words in lab.commands(line):
                argv = lab.dlinfra_argv(words)
                if argv is not None:
                    found.append(argv)
    return found


def test_every_dlinfra_command_parses() -> None:
    commands = _dlinfra_commands()
    # No `what-happened` for the researcher to run: it reads nodes and EC2, which a team's role may not.
    assert {argv[0] for argv in commands} >= {"vpn", "run", "quota"}
    assert "what-happened" not in {argv[0] for argv in commands}
    parser = cli._parser()
    for argv in commands:
        parser.parse_args(argv)  # exits (SystemExit) on an unknown option or a bad value


def test_the_run_command_runs_and_prints_what_the_guide_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (argv,) = [a for a in _dlinfra_commands() if a[0] == "run"]
    argv = [str(REFERENCE_FLEET) if word == "~/lab/fleet.yaml" else word for word in argv]
    (tmp_path / "train.py").write_text("print('hi')\n")
    extra = ["--dir", str(tmp_path), "--name", NAME, "--account", "111122223333", "--dry-run"]
    assert cli.main([*argv[:-5], *extra, *argv[-5:]]) == 0, capsys.readouterr()
    job = yaml.safe_load(capsys.readouterr().out.split("\ndry run:")[0])
    pod = job["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 900  # the guide's "900 s in us-west-2"
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert set(re.findall(r"\$(DLINFRA_[A-Z_]+)", GUIDE)) <= env
    assert pod["containers"][0]["workingDir"] == "/workspace" and "`/workspace`" in GUIDE

    fleet = load_fleet(REFERENCE_FLEET).fleet
    run = run_job.plan(
        fleet, env="prod", region=None, team="vision", name=NAME, account="111122223333", command=["python"]
    )
    _follow(replace(run, code_sha256="0" * 64), UID)
    printed = capsys.readouterr().out
    for line in printed.splitlines():
        assert line in GUIDE, f"docs/researchers.md shows another output than `dlinfra run` prints: {line!r}"
    # The context `aws eks update-kubeconfig --alias prod-us-west-2` writes: its cluster entry is the cluster's ARN.
    arn = "arn:aws:eks:us-west-2:111122223333:cluster/dlinfra-prod-usw2-eks"
    said = run_job.check_cluster(run, "prod-us-west-2", arn, "https://0123ABCD.gr7.us-west-2.eks.amazonaws.com")
    assert f"\nkubeconfig: {said}\nuploaded " in GUIDE
    assert "--name dlinfra-prod-usw2-eks" in GUIDE and "--alias prod-us-west-2" in GUIDE


def test_the_python_compiles_and_uses_the_run_environment() -> None:
    (code,) = _blocks("python")
    compile(code, "docs/researchers.md", "exec")
    assert 'os.environ.get("DLINFRA_CHECKPOINT_DIR"' in code and "signal.SIGTERM" in code


def test_the_fleet_excerpt_validates() -> None:
    (block,) = [b for b in _blocks("yaml") if "standard_images" in b]
    StandardImages.model_validate(yaml.safe_load(block)["standard_images"])


def test_no_placeholder_is_left() -> None:
    assert "placeholder" not in GUIDE.lower()


def test_the_dev_box_steps_match_the_fleet_and_the_stack() -> None:
    """The dev box entry validates and is the reference fleet's; the ssh config's user and address are the ones the
    outputs line shows; the start command is the AWS CLI's."""
    (block,) = [b for b in _blocks("yaml") if "dev_boxes" in b]
    section = yaml.safe_load(block)["environments"]["prod"]["dev_boxes"]
    fleet = load_fleet(REFERENCE_FLEET).fleet
    assert DevBoxes.model_validate(section) == fleet.environments["prod"].dev_boxes
    (config,) = re.findall(r"```\n(Host devbox\n.*?)```", GUIDE, flags=re.S)
    host = dict(line.split(None, 1) for line in config.splitlines()[1:])
    assert host["User"] == "alice" and f'"private_ip": "{host["HostName"]}"' in GUIDE
    assert "pulumi stack output dev_boxes --stack prod-us-west-2" in GUIDE  # stacks/regional.py exports dev_boxes
    assert "aws ec2 start-instances --region us-west-2 --instance-ids" in GUIDE
    assert "at most 32 characters" in GUIDE and dev_boxes.MAX_PERSON_NAME == 32


def test_the_readme_links_the_guide() -> None:
    assert "(docs/researchers.md)" in (ROOT / "README.md").read_text()


def test_commands_quote_like_a_shell() -> None:
    """Every sh line splits as a shell would (no unbalanced quote), so it can be pasted."""
    for block in _blocks("sh"):
        for line in lab.command_lines(block):
            shlex.split(line, comments=True)
