"""Plan sets of git revisions: each exported with `git archive` (read-only on the repository) and previewed
offline by its own code in a subprocess, then compared."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from dlinfra.errors import DlinfraError
from dlinfra.review.diff.changes import Diff
from dlinfra.review.diff.compare import compare
from dlinfra.review.diff.plans import PlanSet, topology

PREVIEW_TIMEOUT = 600


def _git(repo: Path, *args: str, binary: bool = False) -> Any:
    try:
        proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, check=False, text=not binary)
    except FileNotFoundError:
        raise DlinfraError("git is not installed") from None
    if proc.returncode != 0:
        err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
        raise DlinfraError(f"git {' '.join(args)}: {err.strip()}", file=str(repo))
    return proc.stdout


def _resolve(repo: Path, rev: str) -> str:
    """The commit a revision names; DlinfraError for a revision git does not know."""
    try:
        return str(_git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")).strip()
    except DlinfraError:
        raise DlinfraError(
            f"unknown revision {rev!r} (fetch it first, e.g. `git fetch origin main`)", file=str(repo)
        ) from None


def _export(repo: Path, commit: str, dest: Path) -> None:
    """The tree of a commit, written to `dest` without touching the repository (git archive)."""
    data = _git(repo, "archive", "--format=tar", commit, binary=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")


def _preview(tree: Path, out: Path, fleet: Path, lock: Path, python: str, label: str) -> None:
    """Run a tree's own `dlinfra preview --all` with the given interpreter (the current venv)."""
    # Options after the subcommand: argparse lets a subcommand's defaults override options given before it.
    command = [python, "-m", "dlinfra", "preview", "--all", "--fleet", str(fleet), "--lock", str(lock)]
    command += ["--summary", "--out", str(out)]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)  # the revision's own packages, from its tree, must win
    try:
        proc = subprocess.run(
            command, cwd=tree, capture_output=True, text=True, check=False, timeout=PREVIEW_TIMEOUT, env=env
        )
    except subprocess.TimeoutExpired:
        raise DlinfraError(f"offline preview of {label} took longer than {PREVIEW_TIMEOUT}s") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        raise DlinfraError(f"offline preview of {label} failed:\n{tail}")


def _plan_set(tree: Path, out: Path, fleet: Path, lock: Path, label: str) -> PlanSet:
    plans = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(out.glob("*.json"))}
    lock_data = _read_yaml(tree / lock) or {}
    allocations = {str(k): str(v) for k, v in (lock_data.get("allocations") or {}).items()}
    configs = {
        p.name[len("Pulumi.") : -len(".yaml")]: p.read_text(encoding="utf-8") for p in tree.glob("stacks/Pulumi.*.yaml")
    }
    reach, reach_error = None, ""
    try:
        from dlinfra.checks.reach import check as reach_check

        reach = reach_check.summary_json(reach_check.analyse(tree / fleet, tree / lock, list(plans.values())))
    except DlinfraError as exc:
        reach_error = str(exc)
    estimate = None
    try:
        from dlinfra.review import cost

        estimate = cost.estimate(plans.values()).to_json()
    except DlinfraError:
        estimate = None  # a type the price table lacks: the cost section says it could not be estimated
    return PlanSet(
        label=label,
        plans=plans,
        lock=allocations,
        topology=topology(_read_yaml(tree / fleet) or {}),
        configs=configs,
        reach=reach,
        reach_error=reach_error,
        cost=estimate,
    )


def _read_yaml(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise DlinfraError(f"not valid YAML ({exc})", file=str(path)) from None


def revision_plans(repo: Path, rev: str | None, *, fleet: Path, lock: Path, python: str, work: Path) -> PlanSet:
    """Offline plans of a revision (None: the working tree as it is, uncommitted changes included)."""
    if rev is None:
        tree, label = repo, "working tree"
    else:
        commit = _resolve(repo, rev)
        label = f"{rev} ({commit[:9]})"
        tree = work / f"tree-{commit[:12]}"
        tree.mkdir(parents=True, exist_ok=True)
        _export(repo, commit, tree)
    out = work / f"plans-{'worktree' if rev is None else _resolve(repo, rev)[:12]}"
    _preview(tree, out.resolve(), fleet, lock, python, label)
    return _plan_set(tree, out, fleet, lock, label)


def diff_revisions(*, repo: Path, base: str, head: str | None, fleet: Path, lock: Path, python: str) -> Diff:
    """What `head` (None: the working tree) changes against `base`."""
    top = Path(str(_git(repo, "rev-parse", "--show-toplevel")).strip())
    for rev in (base, head):
        if rev is not None:
            _resolve(top, rev)  # fail on a bad revision before any preview starts
    with tempfile.TemporaryDirectory(prefix="dlinfra-diff-") as tmp, ThreadPoolExecutor(max_workers=2) as pool:
        # The two previews are independent subprocesses: run them side by side.
        jobs = [
            pool.submit(revision_plans, top, rev, fleet=fleet, lock=lock, python=python, work=Path(tmp))
            for rev in (base, head)
        ]
        before, after = (job.result() for job in jobs)
        return compare(before, after)
