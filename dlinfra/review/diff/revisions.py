"""The plan sets a comparison reads, from one of three places:

- the working tree: previewed here, by the code that runs, reusing the plan cache for unchanged stacks;
- a git revision: exported with `git archive` (read-only on the repository) and previewed by its own code in a
  subprocess, sharing the plan cache; the whole plan set is then kept by commit, so a base is previewed once;
- a saved plan folder (a copy of build/plans): its plans, and the fleet, lock and stack configs that `preview`
  writes beside them in inputs/. This is how a fleet kept outside git is compared.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dlinfra import PROJECT_ROOT
from dlinfra.errors import DlinfraError
from dlinfra.model import kueue, planner, slices, stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.review.diff.changes import Diff
from dlinfra.review.diff.compare import compare
from dlinfra.review.diff.plans import PlanSet, topology

PREVIEW_TIMEOUT = 600
FORMAT = 1  # of a kept revision plan set; bumped when PlanSet's shape changes
KEEP_REVISIONS = 16  # kept revision plan sets, newest first
WORKING_TREE = "working tree"

Say = Callable[[str], None]  # progress: what is being done now


def _git(repo: Path, *args: str, binary: bool = False) -> Any:
    try:
        proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, check=False, text=not binary)
    except FileNotFoundError:
        raise DlinfraError("git is not installed") from None
    if proc.returncode != 0:
        err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
        raise DlinfraError(f"git {' '.join(args)}: {err.strip()}", file=str(repo))
    return proc.stdout


def repository(start: Path) -> Path | None:
    """The top of the git work tree holding `start`, or None outside git (or without git)."""
    try:
        return Path(str(_git(start, "rev-parse", "--show-toplevel")).strip())
    except DlinfraError:
        return None


def _resolve(repo: Path, rev: str) -> str:
    """The commit a revision names; DlinfraError for a revision git does not know."""
    try:
        return str(_git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")).strip()
    except DlinfraError:
        raise DlinfraError(
            f"unknown revision {rev!r} (fetch it first, e.g. `git fetch origin main`), and no plan folder of that name",
            file=str(repo),
        ) from None


def default_branch(repo: Path) -> str | None:
    """The revision a change is compared with when none is named: origin's default branch, else main or master."""
    try:
        return str(_git(repo, "symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD")).strip()
    except DlinfraError:
        pass
    for name in ("main", "master"):
        try:
            _git(repo, "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
            return name
        except DlinfraError:
            continue
    return None


def is_plan_folder(spec: str) -> bool:
    path = Path(spec)
    return path.is_dir() and any(path.glob("*.json"))


def check_side(spec: str | None, repo: Path | None) -> None:
    """Fail before anything runs when a side names neither the working tree, a plan folder nor a known revision."""
    if spec is None or is_plan_folder(spec):
        return
    if Path(spec).is_dir():
        raise DlinfraError("holds no plan (*.json); make one with `dlinfra preview --all --out DIR`", file=spec)
    _resolve(_git_repository(spec, repo), spec)


def _git_repository(spec: str, repo: Path | None) -> Path:
    if repo is None:
        raise DlinfraError(
            f"{spec!r} is not a plan folder, and the fleet is not in a git repository, so it cannot be a revision; "
            "compare with a saved plan folder (a copy of build/plans made by `dlinfra preview`)"
        )
    return repo


# libyaml's parser when PyYAML has it: the same documents as yaml.safe_load, ten times sooner (a fleet: 12 ms to 1).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise DlinfraError(f"not valid YAML ({exc})", file=str(path)) from None


def _plan_set(
    plans_dir: Path, fleet: Path, lock: Path, configs_dir: Path, label: str, *, cache: Path | None, analyses: bool
) -> PlanSet:
    """A plan set from plans on disk and the fleet, lock and stack configs they were made from; with analyses, the
    reachability summary and the cost estimate too (both by this code)."""
    plans = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(plans_dir.glob("*.json"))}
    allocations, configs = recorded(lock, configs_dir)
    reach, reach_error, estimate = None, "", None
    if analyses:
        try:
            from dlinfra.checks.reach import check as reach_check

            if not fleet.is_file():
                raise DlinfraError("the fleet these plans were made from is not beside them", file=str(fleet))
            reach = reach_check.summary(fleet, lock, list(plans.values()), cache=cache)
        except DlinfraError as exc:
            reach_error = str(exc)
        try:
            from dlinfra.model import catalog
            from dlinfra.review import cost

            catalog.install(catalog.load(catalog.beside(fleet)))  # this side's own prices
            estimate = cost.estimate(plans.values()).to_json()
        except DlinfraError:
            estimate = None  # a type the price table lacks: the cost section says it could not be estimated
    return PlanSet(
        label=label,
        plans=plans,
        lock=allocations,
        topology=topology(_read_yaml(fleet) or {}),
        configs=configs,
        reach=reach,
        reach_error=reach_error,
        cost=estimate,
    )


def recorded(lock: Path, configs_dir: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The address-plan allocations of a lock file and the stack configs in a folder, by stack."""
    lock_data = _read_yaml(lock) or {}
    allocations = {str(k): str(v) for k, v in (lock_data.get("allocations") or {}).items()}
    configs = {
        p.name[len("Pulumi.") : -len(".yaml")]: p.read_text(encoding="utf-8") for p in configs_dir.glob("Pulumi.*.yaml")
    }
    return allocations, configs


def _export(repo: Path, commit: str, dest: Path) -> None:
    """The tree of a commit, written to `dest` without touching the repository (git archive)."""
    data = _git(repo, "archive", "--format=tar", commit, binary=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(dest, filter="data")
    except tarfile.TarError as exc:  # e.g. a committed link to an absolute path, which the data filter refuses
        raise DlinfraError(f"cannot export revision {commit[:9]} to preview it: {exc}", file=str(repo)) from None


def _preview_tree(tree: Path, out: Path, fleet: Path, lock: Path, python: str, label: str, cache: Path | None) -> None:
    """Run a tree's own `dlinfra preview --all`, in a subprocess, sharing the plan cache when its code has one."""
    # Options after the subcommand: argparse lets a subcommand's defaults override options given before it.
    command = [python, "-m", "dlinfra", "preview", "--all", "--fleet", str(fleet), "--lock", str(lock)]
    command += ["--summary", "--out", str(out)]
    # DLINFRA_SERVER=off: an exported tree is previewed once, so a server of its code would never be started.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "DLINFRA_CACHE": str(cache) if cache else "off"}
    env["DLINFRA_SERVER"] = "off"
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


def _revision(
    repo: Path, rev: str, *, fleet: Path, lock: Path, python: str, cache: Path | None, analyses: bool, say: Say
) -> PlanSet:
    commit = _resolve(repo, rev)
    label = f"{rev} ({commit[:9]})"
    from dlinfra.offline import provenance

    # What this code adds (the reachability summary, the cost) is part of what is kept, so its code is in the key.
    key = slices.digest(
        {
            "format": FORMAT,
            "commit": commit,
            "fleet": fleet.as_posix(),
            "lock": lock.as_posix(),
            "analyses": analyses,
            "code": provenance.code_hash(PROJECT_ROOT),
        }
    )
    kept = cache / "revisions" / f"{key}.pickle" if cache is not None else None
    if kept is not None and kept.is_file():
        try:
            with kept.open("rb") as fh:
                found = pickle.load(fh)  # our own build output, written below
            if isinstance(found, PlanSet):
                os.utime(kept)  # recently used: kept by the pruning below
                say(f"{label}: plans kept from an earlier run")
                return found
        except (OSError, pickle.PickleError, EOFError, AttributeError, ImportError, TypeError, ValueError):
            pass
    with tempfile.TemporaryDirectory(prefix="dlinfra-diff-") as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "plans"
        tree.mkdir()
        say(f"{label}: exporting the tree")
        _export(repo, commit, tree)
        say(f"{label}: offline preview by its own code (unchanged stacks reused)")
        _preview_tree(tree, out.resolve(), fleet, lock, python, label, cache)
        say(f"{label}: reachability and cost")
        found = _plan_set(out, tree / fleet, tree / lock, tree / "stacks", label, cache=cache, analyses=analyses)
    if kept is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = kept.with_suffix(f".{os.getpid()}.tmp")
        with tmp_path.open("wb") as fh:
            pickle.dump(found, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp_path, kept)
        entries = sorted(kept.parent.glob("*.pickle"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[KEEP_REVISIONS:]:
            old.unlink(missing_ok=True)
    return found


def _folder(spec: str, *, cache: Path | None, analyses: bool) -> PlanSet:
    folder = Path(spec)
    inputs = folder / "inputs"
    if not (inputs / "fleet.yaml").is_file():
        # Without its lock and stack configs, every allocation and config would read as changed.
        raise DlinfraError(
            "holds plans but not the inputs they were made from (inputs/: fleet, lock, stack configs), so it cannot "
            "be compared; make it again with `dlinfra preview --all --out DIR` (this dlinfra keeps them)",
            file=spec,
        )
    return _plan_set(
        folder,
        inputs / "fleet.yaml",
        inputs / "cidr-lock.yaml",
        inputs / "stacks",
        f"plan folder {spec}",
        cache=cache,
        analyses=analyses,
    )


def _working_tree(
    *, repo: Path | None, fleet: Path, lock: Path, python: str, cache: Path | None, analyses: bool, work: Path, say: Say
) -> PlanSet:
    """The working tree previewed into `work`: here, by this code; or, when the repository is another checkout of
    dlinfra than the one running, by its own code in a subprocess."""
    from dlinfra.offline import preview

    if repo is not None and (repo / "dlinfra").is_dir() and repo.resolve() != PROJECT_ROOT.resolve():
        say(f"{WORKING_TREE}: offline preview by the checkout's own code (unchanged stacks reused)")
        out = (work / "plans").resolve()
        _preview_tree(repo, out, _inside(repo, fleet), _inside(repo, lock), python, WORKING_TREE, cache)
        say(f"{WORKING_TREE}: reachability and cost")
        return _plan_set(work / "plans", fleet, lock, repo / "stacks", WORKING_TREE, cache=cache, analyses=analyses)

    loaded = load_fleet(fleet)
    kueue.check_fleet(loaded.fleet, source=str(loaded.path))
    planner.plan(loaded, planner.load_lock(lock))
    roles = stackroles.roles(loaded.fleet)
    say(f"{WORKING_TREE}: offline preview (unchanged stacks reused)")
    out = work / "plans"
    jobs = os.cpu_count() or 1
    done = preview.run(PROJECT_ROOT, loaded, lock, roles, out=out, jobs=jobs, cache_folder=cache, manifests=False)
    ran = [] if done.cache is None else done.cache.ran
    say(f"{WORKING_TREE}: {len(ran)} of {len(roles)} stacks run; reachability and cost")
    return _plan_set(out, fleet, lock, out / "inputs" / "stacks", WORKING_TREE, cache=cache, analyses=analyses)


def plan_set(
    spec: str | None,
    *,
    repo: Path | None,
    fleet: Path,
    lock: Path,
    python: str,
    cache: Path | None,
    work: Path,
    analyses: bool = True,
    say: Say = lambda _: None,
) -> PlanSet:
    """The plan set of one side: None for the working tree, a plan folder, or a git revision of `repo`."""
    if spec is None:
        return _working_tree(
            repo=repo, fleet=fleet, lock=lock, python=python, cache=cache, analyses=analyses, work=work, say=say
        )
    if is_plan_folder(spec):
        return _folder(spec, cache=cache, analyses=analyses)
    top = _git_repository(spec, repo)
    relative = [_inside(top, p) for p in (fleet, lock)]
    return _revision(
        top, spec, fleet=relative[0], lock=relative[1], python=python, cache=cache, analyses=analyses, say=say
    )


def _inside(repo: Path, path: Path) -> Path:
    """A path as the repository holds it: revisions have their own copy of the fleet and the lock."""
    try:
        return path.resolve().relative_to(repo.resolve())
    except ValueError:
        raise DlinfraError(
            "is outside the git repository, so no revision holds it; compare with a saved plan folder instead "
            "(a copy of build/plans made by `dlinfra preview`)",
            file=str(path),
        ) from None


def diff_sides(
    base: str,
    head: str | None,
    *,
    fleet: Path,
    lock: Path,
    python: str,
    cache: Path | None,
    say: Say = lambda _: None,
) -> Diff:
    """What `head` (None: the working tree) changes against `base`: each a revision or a plan folder."""
    repo = repository(fleet.resolve().parent)
    for side in (base, head):
        check_side(side, repo)  # fail on a bad side before any preview starts
    with tempfile.TemporaryDirectory(prefix="dlinfra-diff-") as tmp:
        sides = []
        for n, spec in enumerate((base, head)):
            work = Path(tmp) / str(n)
            sides.append(
                plan_set(spec, repo=repo, fleet=fleet, lock=lock, python=python, cache=cache, work=work, say=say)
            )
        say("comparing")
        return compare(sides[0], sides[1])


def side(text: str) -> str:
    """A BASE or HEAD as typed: a folder that exists is made absolute here, where it was typed (commands run from
    the repository's top when started in a subdirectory); anything else is a revision, left as it is."""
    path = Path(text)
    return str(path.resolve()) if path.is_dir() else text
