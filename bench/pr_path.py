"""Benchmark: what a pull request that changes one line of the fleet costs, with and without the plan cache.

In a scratch git repository holding the project and its reference fleet, side by side in one run:
- `preview --all` of every stack from scratch (--empty --no-cache): the yardstick;
- `diff main` of a one-line change (a pool's maximum in staging) with nothing kept: both revisions previewed from
  scratch, as every diff was before the cache;
- the same diff once main has been previewed, checked and diffed (as main's own CI run leaves it);
- the whole pull-request path on that change: `preview --all` (against main), `diff main`, `check --all`, `cost`;
- the last two again with the warm servers running (`dlinfra server start`, docs/server.md), as a developer's
  machine or a CI job that starts them first has them.

Every command runs as `python -m dlinfra ...` in its own process, timed wall-clock. Each repetition (--repeat N)
makes a new one-line change (the maximum goes 6 -> 7, then 8, ...), so no repetition finds its head already kept;
the best repetition counts.
Usage: python bench/pr_path.py [--repeat 2] [--keep DIR]
"""

from __future__ import annotations

import project_python

project_python.use_project_python()  # first: `python bench/<this>.py` works with any Python on the PATH

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER = "off"  # DLINFRA_SERVER of the commands timed: "require" while the warm servers run (a run they did not
# serve fails instead of being timed as served)
BASE_LINES = "        min_size: 1\n        max_size: 6\n"  # staging's cpu pool: the line a pull request changes


def _changed(text: str, n: int) -> str:
    """The fleet with staging's cpu pool maximum at 6 + n."""
    return text.replace(BASE_LINES, f"        min_size: 1\n        max_size: {6 + n}\n")


def _scratch(repo: Path) -> None:
    """The project's files (as git lists them, tests left out) committed on main in a new repository."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file() and not name.startswith("tests/"):
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-c", "user.name=b", "-c", "user.email=b@example.org", *args], cwd=repo, check=True)
    os.symlink(ROOT / ".venv-checkov", repo / ".venv-checkov")  # after the commit: checkov, not part of a revision


def _timed(repo: Path, *args: str, env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)) -> float:
    """Wall-clock seconds of one `python -m dlinfra ...` in the scratch repository; stops the bench on a failure."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "dlinfra", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true", "DLINFRA_SERVER": SERVER, **(env or {})},
    )
    took = time.perf_counter() - started
    if proc.returncode not in ok:
        sys.exit(f"dlinfra {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="repetitions, each with a new change; the best counts")
    parser.add_argument("--keep", type=Path, help="build the scratch repository here and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dlinfra-bench-pr-") as tmp:
        repo = (args.keep or Path(tmp)) / "repo"
        repo.mkdir(parents=True)
        _scratch(repo)
        fleet = repo / "fleet.yaml"
        text = fleet.read_text()
        if text.count(BASE_LINES) != 1:
            sys.exit("fleet.yaml: staging's cpu pool (min_size 1, max_size 6) is not where this benchmark expects it")
        full = _timed(repo, "preview", "--all", "--empty", "--no-cache", "--summary", "--out", "build/full/plans")
        no_cache = {"DLINFRA_CACHE": "off"}
        before = after = float("inf")
        for n in range(1, args.repeat + 1):
            fleet.write_text(_changed(text, n))
            before = min(before, _timed(repo, "diff", "main", "--no-cache", "--out", "build/diff.md", env=no_cache))
        # main's own CI run: its plans previewed, checked and diffed once (the cache then holds them).
        fleet.write_text(text)
        _timed(repo, "preview", "--all", "--summary")
        _timed(repo, "check", "--all")
        _timed(repo, "diff", "main", "--out", "build/diff.md")
        change = args.repeat
        after, change = _diffs(repo, text, change, args.repeat)
        path, change = _paths(repo, text, change, args.repeat)
        global SERVER
        _timed(repo, "server", "start")
        SERVER = "require"
        try:
            _timed(repo, "diff", "main", "--out", "build/diff.md")  # the children's first fork, after the import
            served, change = _diffs(repo, text, change, args.repeat)
            served_path, change = _paths(repo, text, change, args.repeat)
        finally:
            SERVER = "off"
            _timed(repo, "server", "stop")
        print(f"preview --all from scratch (9 stacks, no cache):  {full:6.2f} s")
        print(
            f"diff of a one-line change, nothing kept:          {before:6.2f} s  ({before / full:.2f} of preview --all)"
        )
        print(
            f"diff of such a change, main previewed before:     {after:6.2f} s  ({after / full:.2f} of preview --all)"
        )
        print(
            f"the same, with the warm server running:           {served:6.2f} s  ({served / full:.2f} of preview --all)"
        )
        for title, best in (("the pull-request path on that change", path), ("the same, served", served_path)):
            print(f"{title}:")
            for name, seconds in best.items():
                print(f"  {name:<30} {seconds:6.2f} s")
            print(f"  {'total':<30} {sum(best.values()):6.2f} s")


def _diffs(repo: Path, text: str, change: int, repeat: int) -> tuple[float, int]:
    """The best `diff main` of `repeat` new one-line changes; the last change made."""
    best = float("inf")
    for _ in range(repeat):
        change += 1
        (repo / "fleet.yaml").write_text(_changed(text, change))
        best = min(best, _timed(repo, "diff", "main", "--out", "build/diff.md"))
    return best, change


def _paths(repo: Path, text: str, change: int, repeat: int) -> tuple[dict[str, float], int]:
    """The best whole pull-request path of `repeat` new one-line changes; the last change made."""
    best: dict[str, float] = {}
    for _ in range(repeat):
        change += 1
        (repo / "fleet.yaml").write_text(_changed(text, change))
        path = {
            "preview --all (against main)": _timed(repo, "preview", "--all", "--summary"),
            "diff main": _timed(repo, "diff", "main", "--out", "build/diff.md"),
            "check --all": _timed(repo, "check", "--all"),
            "cost": _timed(repo, "cost"),
        }
        if not best or sum(path.values()) < sum(best.values()):
            best = path
    return best, change


if __name__ == "__main__":
    main()
