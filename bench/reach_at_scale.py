"""The reachability analysis of `dlinfra reach` on the reference fleet (tests/fixtures/fleet.yaml and its lock) and
on the generated fleet about ten times larger (bench/bench_preview.py's scaled_fleet): preview each offline, then
time only `analyse` over the plans (best of --repeat runs).

Usage: python bench/reach_at_scale.py [--scale 10] [--out DIR] [--repeat 3]. Without --out the work folder is
temporary. Goals: the reference fleet within 5 seconds, the larger one within 60; exits 1 when one is missed.
"""

from __future__ import annotations

import project_python

project_python.use_project_python()  # first: `python bench/<this>.py` works with any Python on the PATH

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_preview import write_scaled

from dlinfra.checks import plans as plan_files
from dlinfra.checks.reach import check as reach
from dlinfra.cli import main as cli

FIXTURES = ROOT / "tests" / "fixtures"
GOALS = {"reference": 5.0, "scaled": 60.0}  # seconds of analysis


def preview(fleet: Path, lock: Path, out: Path, manifest: Path | None = None) -> list[dict[str, Any]]:
    """Preview every stack of `fleet` offline into `out`; the plan exports, as `dlinfra reach` reads them."""
    argv = ["preview", "--all", "--summary", "--fleet", str(fleet), "--lock", str(lock), "--out", str(out)]
    if cli.main(argv if manifest is None else [*argv, "--images-manifest", str(manifest)]) != 0:
        raise SystemExit(f"preview of {fleet} failed")
    selected, _ignored = plan_files.load_plans(out, None)
    return [dict(p.data) for p in selected]


def scaled(scale: int, folder: Path) -> tuple[Path, Path, list[dict[str, Any]]]:
    """Write the scaled fleet into `folder`, allocate its address plan and preview it."""
    _data, fleet, manifest = write_scaled(scale, folder)
    lock = folder / "cidr-lock.yaml"
    return fleet, lock, preview(fleet, lock, folder / "plans", manifest)


def measure(label: str, fleet: Path, lock: Path, plans: list[dict[str, Any]], repeat: int, goal: float) -> bool:
    """Time `analyse` (best of `repeat`), print the figures; whether the goal was met."""
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = reach.analyse(fleet, lock, plans)
        best = min(best, time.perf_counter() - started)
    assert result is not None
    summary = reach.summary_json(result)
    met = best <= goal
    print(
        f"{label:<10} stacks {len(plans):>4}  intents {len(result.intents):>5}  flows {result.flows:>7}  "
        f"packets {result.packets()[0]:.3e}  failures {summary['failed_flows']:>3}  "
        f"analysis {best:7.2f} s (best of {repeat})  goal <= {goal:g} s: {'met' if met else 'MISSED'}",
        flush=True,
    )
    return met


def run(scale: int, folder: Path, repeat: int) -> int:
    """Preview both fleets, then time the analysis of each; 1 when a goal is missed."""
    ref_fleet, ref_lock = FIXTURES / "fleet.yaml", FIXTURES / "cidr-lock.yaml"
    ref_plans = preview(ref_fleet, ref_lock, folder / "reference" / "plans")
    big = folder / f"x{scale}"
    big.mkdir(parents=True, exist_ok=True)
    fleet, lock, big_plans = scaled(scale, big)
    print(f"\nreachability analysis (the preview is not timed; work folder {folder})\n", flush=True)
    met = measure("reference", ref_fleet, ref_lock, ref_plans, repeat, GOALS["reference"])
    met &= measure(f"x{scale}", fleet, lock, big_plans, repeat, GOALS["scaled"])
    return 0 if met else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--out", type=Path, help="keep the fleets, locks and plans here (default: a temporary folder)")
    parser.add_argument("--repeat", type=int, default=3, help="time the analysis this many times, keep the best")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        raise SystemExit(run(args.scale, args.out.resolve(), args.repeat))
    with tempfile.TemporaryDirectory() as tmp:
        raise SystemExit(run(args.scale, Path(tmp), args.repeat))


if __name__ == "__main__":
    main()
