"""The quota and capacity report of `dlinfra check` for the generated fleet about ten times the reference one
(bench/bench_preview.py's scaled_fleet): allocate its address plan, preview it offline, then check it.

Usage: python bench/limits_at_scale.py [--scale 10] [--out DIR] [--checkov]. Without --out the work folder is
temporary. Exits with `dlinfra check`'s status (1: a blocking finding, such as a quota AWS will not raise).
"""

from __future__ import annotations

import project_python

project_python.use_project_python()  # first: `python bench/<this>.py` works with any Python on the PATH

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_preview import write_scaled

from dlinfra.cli import main as cli


def report(scale: int, folder: Path, *, checkov: bool) -> int:
    """Write the scaled fleet into `folder`, preview every stack and run `dlinfra check --all` over the plans."""
    data, fleet, manifest = write_scaled(scale, folder)
    plans = folder / "plans"
    argv = ["preview", "--all", "--summary", "--fleet", str(fleet), "--out", str(plans)]
    if cli.main([*argv, "--images-manifest", str(manifest)]) != 0:
        raise SystemExit("preview failed")
    print(f"\nx{scale}: {len(data['regions'])} regions, {len(data['sites'])} sites ({fleet})\n", flush=True)
    check = ["check", "--all", "--fleet", str(fleet), "--plans", str(plans)]
    return cli.main(check if checkov else [*check, "--no-checkov"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--out", type=Path, help="keep the fleet, lock and plans here (default: a temporary folder)")
    parser.add_argument("--checkov", action="store_true", help="run checkov too (slow at this size)")
    args = parser.parse_args()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        raise SystemExit(report(args.scale, args.out, checkov=args.checkov))
    with tempfile.TemporaryDirectory() as tmp:
        raise SystemExit(report(args.scale, Path(tmp), checkov=args.checkov))


if __name__ == "__main__":
    main()
