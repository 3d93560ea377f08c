"""`dlinfra doctor`: which tools this machine has, and what to do about each one that is missing.

Optional tools missing still exit 0 (each command that needs one says so when run); only a broken dlinfra
install (a required library that will not import) exits 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlinfra import PROJECT_ROOT as ROOT
from dlinfra.cli.common import Handler

# Libraries every dlinfra command needs (requirements.txt); one missing means the install is broken.
REQUIRED = ("pulumi", "pulumi_aws", "pydantic", "ruamel.yaml", "jinja2", "rich", "boto3")
TIMEOUT = 5.0  # seconds for any one probe (a `--version` call, the STS request)

Status = Literal["ok", "missing", "broken"]

out = Console(highlight=False, soft_wrap=True)


@dataclass(frozen=True)
class Finding:
    """One tool: what was found, and what to do when it is not ok."""

    tool: str
    status: Status
    detail: str
    fix: str = ""
    required: bool = False


def register(subparsers: Any) -> dict[str, Handler]:
    """Add `doctor` to the CLI; returns command name -> handler."""
    subparsers.add_parser(
        "doctor",
        help="which tools are present (pulumi, AWS credentials, checkov, strongSwan, packer) and what to do",
    )
    return {"doctor": cmd_doctor}


def cmd_doctor(args: argparse.Namespace) -> int:
    findings = diagnose()
    table = Table(title="dlinfra doctor", title_justify="left")
    for column in ("tool", "status", "found", "what to do"):
        table.add_column(column, overflow="fold")
    styles = {"ok": "green", "missing": "yellow", "broken": "red"}
    for f in findings:
        status = Text(f.status, style=styles[f.status])
        table.add_row(Text(f.tool), status, Text(f.detail), Text(f.fix))
    out.print(table)
    broken = [f.tool for f in findings if f.required and f.status != "ok"]
    if broken:
        out.print(Text(f"the dlinfra install is broken ({', '.join(broken)}): run .ci/setup", style="bold red"))
        return 1
    return 0


def diagnose() -> list[Finding]:
    """Every check, in the order a newcomer needs them."""
    return [
        check_install(),
        check_command("pulumi", ["version"], fix="install the Pulumi CLI: https://www.pulumi.com/docs/install/"),
        check_aws(),
        check_checkov(ROOT),
        check_strongswan(),
        check_command(
            "packer", ["version"], fix="install Packer to build node AMIs: https://developer.hashicorp.com/packer"
        ),
    ]


def check_install() -> Finding:
    missing = [name for name in REQUIRED if not _importable(name)]
    if missing:
        return Finding(
            "dlinfra",
            "broken",
            f"cannot import {', '.join(missing)}",
            "run .ci/setup (pip install -r requirements.txt)",
            True,
        )
    try:
        return Finding("dlinfra", "ok", metadata.version("dlinfra"), required=True)
    except metadata.PackageNotFoundError:
        return Finding(
            "dlinfra",
            "ok",
            "running from source; the `dlinfra` command is not installed",
            f"pip install -e {ROOT} (or run python -m dlinfra)",
            required=True,
        )


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def check_command(tool: str, version_args: list[str] | None, *, fix: str, names: tuple[str, ...] = ()) -> Finding:
    """A program on PATH and the first line of its version output."""
    for name in names or (tool,):
        path = shutil.which(name)
        if path is None:
            continue
        if version_args is None:
            return Finding(tool, "ok", path)
        try:
            run = subprocess.run([path, *version_args], capture_output=True, text=True, timeout=TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Finding(tool, "broken", f"{path}: {exc}", f"reinstall it; {fix}")
        first = (run.stdout or run.stderr).strip().splitlines()
        if run.returncode != 0:
            return Finding(tool, "broken", f"{path} exited {run.returncode}", f"reinstall it; {fix}")
        return Finding(tool, "ok", f"{first[0] if first else '?'} ({path})")
    return Finding(tool, "missing", "not on PATH", fix)


def check_strongswan() -> Finding:
    finding = check_command(
        "strongSwan",
        None,  # swanctl --version talks to a running charon; being on PATH is what matters here
        names=("swanctl", "charon"),
        fix="only needed to test site gateways locally: apt-get install strongswan-swanctl charon-systemd",
    )
    return finding


def check_checkov(root: Path) -> Finding:
    executable = root / ".venv-checkov" / "bin" / "checkov"
    if executable.exists():
        return Finding("checkov", "ok", str(executable))
    return Finding(
        "checkov",
        "missing",
        f"no {executable}",
        "run .ci/setup (installs checkov into .venv-checkov); until then `dlinfra check --no-checkov`",
    )


def check_aws() -> Finding:
    """Credentials from boto3's chain without the instance metadata service; only when some exist, one
    sts:GetCallerIdentity with a short timeout."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    fix = "only needed for pulumi up and what-happened: aws configure sso (or set AWS_PROFILE)"
    try:
        session = boto3.Session(botocore_session=_session_without_instance_metadata())
        credentials = session.get_credentials()
    except (BotoCoreError, ClientError, ValueError) as exc:
        return Finding("AWS credentials", "broken", str(exc), fix)
    if credentials is None:
        return Finding(
            "AWS credentials",
            "missing",
            "no credentials (environment, config and credentials files, SSO; instance metadata not asked)",
            fix,
        )
    config = Config(connect_timeout=TIMEOUT, read_timeout=TIMEOUT, retries={"max_attempts": 1})
    try:
        sts = session.client("sts", region_name=session.region_name or "us-east-1", config=config)
        arn = sts.get_caller_identity()["Arn"]
    except (BotoCoreError, ClientError) as exc:
        return Finding(
            "AWS credentials",
            "broken",
            f"found ({credentials.method}) but sts:GetCallerIdentity failed: {exc}",
            "check the network and that the credentials have not expired (aws sso login)",
        )
    return Finding("AWS credentials", "ok", f"{arn} ({credentials.method})")


def _session_without_instance_metadata() -> Any:
    """A botocore session whose credential chain stops before the instance metadata service.

    With nothing else found, boto3's chain ends by asking 169.254.169.254 for an instance role (botocore's
    InstanceMetadataProvider, method "iam-role"), which off EC2 sends packets that wait for a timeout. doctor
    runs on laptops and CI: it reports what is configured, and says that it did not ask.
    """
    import botocore.session
    from botocore.credentials import InstanceMetadataProvider

    session = botocore.session.get_session()
    session.get_component("credential_provider").remove(InstanceMetadataProvider.METHOD)
    return session
