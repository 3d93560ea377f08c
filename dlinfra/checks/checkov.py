"""Run checkov from its own virtualenv (.venv-checkov) and read its JSON report.

checkov exits 0 having scanned nothing when a file has the wrong shape or is missing, so every run must
show scanned resources and evaluated checks, or it is an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dlinfra.errors import DlinfraError
from dlinfra.files import write_atomic
from dlinfra.model.slices import digest
from dlinfra.serving import client, servers

TIMEOUT_SECONDS = 900


class CheckovError(DlinfraError):
    """checkov is missing, crashed, or scanned nothing."""


@dataclass(frozen=True)
class CheckovResult:
    """One check on one resource."""

    framework: str
    check_id: str
    check_name: str
    passed: bool
    file: str  # absolute path of the scanned file
    resource: str  # Terraform address, or Kubernetes `Kind.namespace.name`
    lines: tuple[int, int]  # lines of the resource in the scanned file (1-based; 0 when unknown)
    guideline: str


@dataclass(frozen=True)
class CheckovReport:
    """A checkov run over one framework."""

    framework: str
    version: str
    resource_count: int
    results: tuple[CheckovResult, ...]

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def failed(self) -> int:
        return sum(not r.passed for r in self.results)

    @property
    def checks(self) -> int:
        """Distinct checks that ran."""
        return len({r.check_id for r in self.results})


def executable(root: Path) -> Path:
    """checkov of the project's own checkov virtualenv."""
    return root / ".venv-checkov" / "bin" / "checkov"


def run(
    framework: str,
    *,
    files: Sequence[Path] = (),
    directory: Path | None = None,
    checkov: Path,
    cwd: Path | None = None,
) -> CheckovReport:
    """Run one framework over files or a folder; CheckovError unless resources were scanned and checked."""
    if not checkov.is_file():
        raise CheckovError(
            "checkov is not installed there; run .ci/setup (it installs checkov into .venv-checkov)",
            file=str(checkov),
        )
    if not files and directory is None:
        raise CheckovError(f"nothing to scan for framework {framework}")
    # --skip-download: no Bridgecrew/Prisma calls (and no network here); --soft-fail: failed checks exit 0,
    # so a non-zero exit means checkov itself failed. The JSON goes to stdout, logs to stderr.
    command = [str(checkov), "--framework", framework, "--skip-download", "--output", "json", "--soft-fail"]
    command += ["-d", str(directory)] if directory is not None else ["-f", *(str(f) for f in files)]
    env = {**os.environ, **servers.CHECKOV_ENV}
    try:
        proc = _served(command, checkov, env=env, cwd=cwd) or subprocess.run(
            command, capture_output=True, text=True, timeout=TIMEOUT_SECONDS, env=env, cwd=cwd, check=False
        )
    except (subprocess.TimeoutExpired, TimeoutError):
        raise CheckovError(f"checkov ({framework}) did not finish within {TIMEOUT_SECONDS}s") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise CheckovError(f"checkov ({framework}) exited {proc.returncode}:\n{tail}")
    try:
        output = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise CheckovError(f"checkov ({framework}) printed no JSON report: {proc.stdout[:300]!r}") from None
    return parse_report(framework, output)


def _served(
    command: list[str], checkov: Path, *, env: dict[str, str], cwd: Path | None
) -> subprocess.CompletedProcess[str] | None:
    """The command run by the checkov server of the venv `checkov` is in (`dlinfra server start`), when one serves
    it; None to run it in a process of its own."""
    root = checkov.parent.parent.parent  # <root>/.venv-checkov/bin/checkov
    served = servers.checkov_server(root) if servers.enabled() else None
    if served is None:
        return None
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr, open(os.devnull) as stdin:
        fds = (stdin.fileno(), stdout.fileno(), stderr.fileno())
        try:
            code = client.call(
                served.socket,
                ["checkov", *command[1:]],
                cwd=str(cwd or Path.cwd()),
                env=env,
                fds=fds,
                timeout=TIMEOUT_SECONDS,
            )
        except client.ServerLostError as exc:
            raise CheckovError(f"the checkov server lost the scan: {exc}") from None
        if code is None:
            if servers.mode() == "require":
                raise CheckovError("DLINFRA_SERVER=require, and no checkov server serves it: `dlinfra server start`")
            return None
        stdout.seek(0)
        stderr.seek(0)
        text = (stdout.read().decode(errors="replace"), stderr.read().decode(errors="replace"))
    return subprocess.CompletedProcess(command, code, *text)


def run_cached(
    framework: str, files: Sequence[Path], *, checkov: Path, cache: Path, cwd: Path | None = None
) -> CheckovReport:
    """run() over files, reusing the results of a file whose content checkov (this version) has checked before.

    Only the files not seen run through checkov, so a pull request that changes one stack's plan scans one export.
    A file's entry holds its results; the report's resource count is that of the resources with results
    (checkov's own count includes resources no check applies to, and cannot be split by file).
    """
    version = installed_version(checkov)
    keys = {
        path: digest(
            {
                "framework": framework,
                "checkov": version,
                "name": path.name,
                "content": hashlib.sha256(path.read_bytes()).hexdigest(),
            }
        )
        for path in files
    }
    found: dict[Path, list[CheckovResult]] = {}
    for path, key in keys.items():
        try:
            entry = json.loads((cache / "checkov" / f"{key}.json").read_text(encoding="utf-8"))
            found[path] = [
                CheckovResult(**{**r, "file": str(path.resolve()), "lines": tuple(r["lines"])}) for r in entry
            ]
        except (OSError, ValueError, TypeError, KeyError):
            continue
    missing = [path for path in files if path not in found]
    if missing:
        fresh = run(framework, files=missing, checkov=checkov, cwd=cwd)
        for path in missing:
            mine = [r for r in fresh.results if Path(r.file).resolve() == path.resolve()]
            found[path] = mine
            if mine:  # a file checkov checked nothing on is not kept: the caller says so, every time
                text = json.dumps([asdict(r) for r in mine], sort_keys=True)
                write_atomic(cache / "checkov" / f"{keys[path]}.json", text + "\n", mode=0o644)
    results = tuple(r for path in files for r in found[path])
    resources = sum(len({r.resource for r in found[path]}) for path in files)
    return CheckovReport(framework, version, resources, results)


def installed_version(checkov: Path) -> str:
    """The version of the checkov a virtualenv's executable runs (its package metadata's folder name)."""
    venv = checkov.parent.parent
    found = sorted(venv.glob("lib/python*/site-packages/checkov-*.dist-info"))
    if found:
        return found[-1].name.removesuffix(".dist-info").removeprefix("checkov-")
    try:  # not laid out as a virtualenv: the executable itself stands for the version, so an upgrade is a miss
        return f"unknown {checkov.resolve()} {checkov.stat().st_mtime_ns}"
    except OSError:
        return "unknown"


def parse_report(framework: str, output: Any) -> CheckovReport:
    """The report of `framework` in checkov's JSON output; CheckovError when it scanned or checked nothing."""
    reports = output if isinstance(output, list) else [output]
    mine = [r for r in reports if isinstance(r, Mapping) and r.get("check_type") == framework]
    if not mine:
        summary = next((r for r in reports if isinstance(r, Mapping) and "resource_count" in r), {})
        raise CheckovError(
            f"checkov ({framework}) scanned no resources (summary: {dict(summary) or 'none'}): the export's shape "
            "or the file list is wrong"
        )
    report = mine[0]
    summary = report.get("summary") or {}
    body = report.get("results") or {}
    if summary.get("parsing_errors"):
        files = ", ".join(str(f) for f in body.get("parsing_errors", []))
        raise CheckovError(f"checkov ({framework}) could not parse {files}")
    results = tuple(
        _result(framework, item, passed)
        for key, passed in (("passed_checks", True), ("failed_checks", False))
        for item in body.get(key, [])
    )
    resource_count = int(summary.get("resource_count") or 0)
    if resource_count <= 0 or not results:
        raise CheckovError(
            f"checkov ({framework}) scanned {resource_count} resources and evaluated {len(results)} checks: "
            "a scan that checks nothing proves nothing"
        )
    return CheckovReport(framework, str(summary.get("checkov_version", "?")), resource_count, results)


def _result(framework: str, item: Mapping[str, Any], passed: bool) -> CheckovResult:
    lines = item.get("file_line_range") or [0, 0]
    return CheckovResult(
        framework=framework,
        check_id=str(item.get("check_id")),
        check_name=str(item.get("check_name")),
        passed=passed,
        file=str(item.get("file_abs_path") or item.get("file_path") or ""),
        resource=str(item.get("resource_address") or item.get("resource") or ""),
        lines=(int(lines[0]), int(lines[-1])),
        guideline=str(item.get("guideline") or ""),
    )
