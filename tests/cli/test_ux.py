"""The CLI as a newcomer meets it: shared options in either position, --version, help and examples, preview,
cidr and site output, doctor, and user text never read as terminal markup."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from dlinfra.cli import common
from dlinfra.cli import doctor as cli_doctor
from dlinfra.cli import fleet as cli_fleet
from dlinfra.cli import main as cli
from dlinfra.model import planner
from tests.conftest import REFERENCE_FLEET


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _commands(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, f"{path} {name}".strip())


# --- 1. options before the subcommand ---------------------------------------------------------------------
@pytest.mark.parametrize("option", ["--fleet", "--lock"])
def test_shared_options_are_honoured_before_and_after_every_subcommand(option: str) -> None:
    parser = cli._parser()
    for path, sub in _commands(parser):
        if not path:
            continue
        dests = {a.dest: a for a in sub._actions}
        if option.lstrip("-") in dests:
            assert dests[option.lstrip("-")].default is argparse.SUPPRESS, f"{path}: {option} would override"


def test_fleet_before_the_subcommand_is_read(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    for argv in (["--fleet", str(missing), "validate"], ["validate", "--fleet", str(missing)]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and str(missing) in err, argv
    lock = tmp_path / "other-lock.yaml"
    for argv in (
        ["--fleet", str(REFERENCE_FLEET), "--lock", str(lock), "validate"],
        ["validate", "--fleet", str(REFERENCE_FLEET), "--lock", str(lock)],
        ["--lock", str(lock), "site", "list", "--fleet", str(REFERENCE_FLEET)],
    ):
        code, _, err = run(capsys, *argv)
        if argv[-1] == str(REFERENCE_FLEET) and "site" in argv:
            assert code == 0  # site list reads no lock
        else:
            assert code == 2 and str(lock) in err, argv
    code, out, _ = run(capsys, "--fleet", str(REFERENCE_FLEET), "site", "list")
    assert code == 0 and "ams1" in out


# --- 2. --version -----------------------------------------------------------------------------------------
def test_version(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("dlinfra ")
    monkeypatch.setattr(cli.metadata, "version", lambda _name: "9.8.7")
    assert cli.version() == "dlinfra 9.8.7"

    def not_installed(name: str) -> str:
        raise cli.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli.metadata, "version", not_installed)
    assert "not installed" in cli.version() and "pip install -e" in cli.version()


def test_setup_installs_the_dlinfra_command(tmp_path: Path) -> None:
    """`.ci/setup` installs the checkout into the venv, so `dlinfra` runs from anywhere, as printed next steps say."""
    command = Path(sys.executable).parent / "dlinfra"
    if not command.exists():
        message = f"{command} does not exist: run bash .ci/setup"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    proc = subprocess.run([str(command), "--version"], cwd=tmp_path, capture_output=True, text=True, check=False)
    project = tomllib.loads((cli.ROOT / "pyproject.toml").read_text())["project"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"dlinfra {project['version']}"


# --- 3. help and examples ---------------------------------------------------------------------------------
def test_every_command_and_option_has_help_and_every_command_an_example() -> None:
    parser = cli._parser()
    for path, sub in _commands(parser):
        assert sub.epilog and sub.epilog.startswith("Example:\n  dlinfra"), path or "dlinfra"
        assert sub.formatter_class is argparse.RawDescriptionHelpFormatter, path
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    assert choice.help, f"{path} {choice.dest}: no help"
            else:
                assert action.help and action.help.strip(), f"{path}: {action.option_strings or action.dest}"
        assert "Example:" in sub.format_help()


# --- 4 and 5. preview -------------------------------------------------------------------------------------
def test_markers_are_coloured_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    def render(**kwargs: Any) -> str:
        buffer = io.StringIO()
        Console(file=buffer, **kwargs).print(common.marker("create"), common.marker("replace"))
        return buffer.getvalue()

    assert "\x1b[32m+" in render(force_terminal=True)
    assert render(force_terminal=False) == "+ +-\n"
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in render(force_terminal=True)
    assert {m for m, _ in common.MARKERS.values()} == {"+", "~", "-", "+-"}


def test_progress_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.StringIO()
    monkeypatch.setattr(common, "err", Console(file=buffer, force_terminal=False))
    with common.progress("previewing", 3) as advance:
        advance("a")
    assert buffer.getvalue() == ""
    monkeypatch.setattr(common, "err", Console(file=buffer, force_terminal=True, width=100))
    with common.progress("previewing", 3) as advance:
        advance("prod-us-west-2")
    assert "1/3" in buffer.getvalue()


def test_preview_summary_is_one_line_a_stack_and_full_preview_masks_secrets(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["preview", "--stack", "staging-us-west-2", "--empty", "--out", str(tmp_path / "plans")]
    code, out, _ = run(capsys, *argv, "--summary", "--fleet", str(REFERENCE_FLEET))
    lines = [line for line in out.splitlines() if line.strip()]
    assert code == 0 and len(lines) == 2, out
    assert lines[0].startswith("staging-us-west-2") and " to create" in lines[0]
    assert lines[1].startswith("1 stack(s): + ") and "to create" in lines[1]
    code, out, _ = run(capsys, *argv, "--fleet", str(REFERENCE_FLEET))
    assert code == 0 and "\nOutputs:\n" in out and "\nResources:\n    + " in out
    assert "    client_vpn_users: [secret]" in out and "    vpc_cidr: 10." in out
    assert "BEGIN RSA PRIVATE KEY" not in out and "PRIVATE KEY-----" not in out


# --- 6. cidr ----------------------------------------------------------------------------------------------
def test_cidr_table_in_a_pipe_fits_80_columns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(cli_fleet, "out", Console(highlight=False, soft_wrap=True))
    code, out, _ = run(capsys, "cidr", "--fleet", str(REFERENCE_FLEET))
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["name", "cidr", "state"]
    assert max(map(len, lines)) <= 80 and "…" not in out and "─" not in out
    assert any(line.split() == ["vpc/prod/us-west-2", "10.2.0.0/16", "allocated"] for line in lines)


def test_cidr_table_on_an_80_column_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.StringIO()
    monkeypatch.setattr(cli_fleet, "out", Console(file=buffer, force_terminal=True, width=80, color_system=None))
    assert cli.main(["cidr", "--fleet", str(REFERENCE_FLEET)]) == 0
    text = buffer.getvalue()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80 and "…" not in text
    assert "subnet/prod/eu-west-1/private/eu-west-1a" in text


def test_cidr_update_prints_what_changed(capsys: pytest.CaptureFixture[str], write_fleet: Callable[..., Path]) -> None:
    path = write_fleet(lambda d: d["sites"].__setitem__("lax1", {"region": "us-west-2", "public_ip": "64.62.140.99"}))
    code, out, _ = run(capsys, "cidr", "--update", "--fleet", str(path))
    assert code == 0
    added = [line for line in out.splitlines() if line.startswith("+ ")]
    assert {line.split()[1] for line in added} >= {"site-lan/lax1", "hybrid-pods/lax1"}
    assert "vpc/prod/us-west-2" not in out and "released" in out.splitlines()[-1]
    code, out, _ = run(capsys, "cidr", "--update", "--fleet", str(path))
    assert code == 0 and "nothing changed" in out


def test_release_of_a_changed_explicit_entry_is_one_step(
    capsys: pytest.CaptureFixture[str], write_fleet: Callable[..., Path]
) -> None:
    path = write_fleet(lambda d: d["sites"]["ams1"].__setitem__("lan", "10.210.8.0/22"))
    code, _, err = run(capsys, "validate", "--fleet", str(path))
    assert code == 2 and "dlinfra cidr --release site-lan/ams1" in err
    code, out, _ = run(capsys, "cidr", "--release", "site-lan/ams1", "--fleet", str(path))
    assert code == 0 and "+ site-lan/ams1" in out and "10.210.8.0/22" in out
    code, _, _ = run(capsys, "validate", "--fleet", str(path))
    assert code == 0


def test_release_messages_name_the_command_that_works(
    capsys: pytest.CaptureFixture[str], write_fleet: Callable[..., Path]
) -> None:
    path = write_fleet(lambda d: None)
    code, _, err = run(capsys, "cidr", "--release", "vpc/prod/us-west-2", "--fleet", str(path))
    assert code == 2 and "`dlinfra cidr --release vpc/prod/us-west-2 --force`" in err
    code, _, err = run(capsys, "cidr", "--release", "vpc/nope", "--fleet", str(path))
    assert code == 2 and "`dlinfra cidr` lists the keys" in err


# --- 7. site list and site add ----------------------------------------------------------------------------
def test_site_add_takes_gpus_nfs_and_pod_range(
    capsys: pytest.CaptureFixture[str], write_fleet: Callable[..., Path]
) -> None:
    path = write_fleet(lambda d: None)
    argv = ["site", "add", "lax1", "--region", "us-west-2", "--public-ip", "64.62.140.99", "--asn", "65110"]
    argv += ["--gpu-nodes", "4", "--gpus-per-node", "4", "--gpu-model", "L40S", "--pod-cidr", "10.201.0.0/20"]
    argv += ["--lan", "10.60.0.0/20", "--nfs", "10.60.0.5:/export/data:/data", "--nfs", "10.60.0.6:/scratch:/scratch"]
    code, _, err = run(capsys, *argv, "--fleet", str(path))
    assert code == 0, err
    code, out, _ = run(capsys, "site", "list", "--json", "--fleet", str(path))
    site = {s["name"]: s for s in json.loads(out)["sites"]}["lax1"]
    assert (site["gpu_nodes"], site["gpus_per_node"], site["gpu_model"]) == (4, 4, "L40S")
    assert site["pod_cidr"] == "10.201.0.0/20"
    assert [m["mount_point"] for m in site["nfs"]] == ["/data", "/scratch"]
    assert planner.load_lock(path.parent / "cidr-lock.yaml").allocations["hybrid-pods/lax1"].exploded == "10.201.0.0/20"
    code, out, _ = run(capsys, "site", "list", "--fleet", str(path))
    row = next(line for line in out.splitlines() if "lax1" in line)
    assert row.split() == ["lax1", "us-west-2", "prod", "static", "4", "x", "4", "L40S", "64.62.140.99"]


def test_site_add_of_a_model_sold_as_two_products_needs_the_product(
    capsys: pytest.CaptureFixture[str], write_fleet: Callable[..., Path]
) -> None:
    path = write_fleet(lambda d: None)
    argv = ["site", "add", "ber1", "--region", "eu-west-1", "--public-ip", "64.62.140.98", "--asn", "65111"]
    argv += ["--gpu-nodes", "2", "--gpu-model", "A100"]
    code, _, err = run(capsys, *argv, "--fleet", str(path))
    assert code == 2 and "sites.ber1.gpu_product: A100 comes as" in err, err
    code, _, err = run(capsys, *argv, "--gpu-product", "NVIDIA A100-SXM4-40GB", "--fleet", str(path))
    assert code == 0, err
    assert "gpu_product: NVIDIA A100-SXM4-40GB" in path.read_text()


def test_site_add_refuses_a_malformed_nfs_mount(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["site", "add", "x1", "--region", "r", "--public-ip", "1.1.1.1", "--asn", "1", "--nfs", "srv:data"])
    assert "SERVER:EXPORT:MOUNT" in capsys.readouterr().err


# --- 8. doctor --------------------------------------------------------------------------------------------
def _no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_doctor_with_nothing_on_path_exits_0(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_aws(monkeypatch, tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(cli_doctor, "ROOT", tmp_path)
    findings = {f.tool: f for f in cli_doctor.diagnose()}
    assert {t: f.status for t, f in findings.items() if t != "dlinfra"} == dict.fromkeys(
        ("pulumi", "AWS credentials", "checkov", "strongSwan", "packer"), "missing"
    )
    assert all(f.fix for t, f in findings.items() if f.status != "ok")
    assert findings["dlinfra"].status == "ok"
    code, out, _ = run(capsys, "doctor")
    assert code == 0 and "pulumi" in out


def test_doctor_reports_tools_on_path_and_a_broken_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_aws(monkeypatch, tmp_path)
    fake = tmp_path / "pulumi"
    fake.write_text("#!/bin/sh\necho v3.140.0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    pulumi = cli_doctor.check_command("pulumi", ["version"], fix="install it")
    assert pulumi.status == "ok" and pulumi.detail.startswith("v3.140.0")
    monkeypatch.setattr(cli_doctor, "REQUIRED", ("no_such_module_here",))
    code, out, _ = run(capsys, "doctor")
    assert code == 1 and "no_such_module_here" in out


def test_doctor_without_credentials_says_so_without_asking_instance_metadata(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Even where AWS_EC2_METADATA_DISABLED is not set (a laptop), doctor never probes 169.254.169.254: the network
    # guard (tests/netguard.py) fails this test if anything tries to connect.
    _no_aws(monkeypatch, tmp_path)
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    finding = cli_doctor.check_aws()
    assert finding.status == "missing" and finding.detail.startswith("no credentials")
    assert "instance metadata not asked" in finding.detail


def test_doctor_with_credentials_and_no_network_answers_quickly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_aws(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:9")
    finding = cli_doctor.check_aws()
    assert finding.status == "broken" and "sts:GetCallerIdentity failed" in finding.detail


# --- user text is never markup ----------------------------------------------------------------------------
def test_user_text_is_not_read_as_markup(monkeypatch: pytest.MonkeyPatch, write_fleet: Callable[..., Path]) -> None:
    # A GPU model like "[red]x" is refused (it is not a label value), and the error echoing it shows it as typed.
    path = write_fleet(lambda d: d["sites"]["ams1"].__setitem__("gpu_model", "[red]x"))
    err = io.StringIO()
    monkeypatch.setattr(cli, "err", Console(file=err, force_terminal=True, width=200))
    assert cli.main(["validate", "--fleet", str(path)]) == 2
    assert "'[red]x'" in err.getvalue()
    err.truncate(0)
    assert cli.main(["validate", "--fleet", str(path.parent / "[bold]nope.yaml")]) == 2
    assert "[bold]nope.yaml" in err.getvalue()
