"""Benchmark: `dlinfra preview --all`, then the reachability analysis over its plans, on the reference fleet and
on a generated fleet ten times larger, side by side with the bare baselines (bench/bare_replay.py: the same
resources registered through the Pulumi SDK under mocks with no component code, as generic resources and through
the provider SDK classes).

Each case runs in its own process so peak memory (max RSS) is that case's alone. Prints one line per case:
stacks, resources, preview wall and CPU seconds (this process and its workers), reachability intents, flows and
seconds (load, derive and evaluate), and peak MiB (of the main process); then the ratios the goals are stated in.
Each fleet is previewed once per --jobs value (default: 1, the sequential path, and the number of CPUs); the
bare baseline replays the plans of the last. Usage: python bench/bench_preview.py [--scale 10] [--jobs 1 2]
"""

from __future__ import annotations

import project_python

project_python.use_project_python()  # first: `python bench/<this>.py` works with any Python on the PATH

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlinfra.model import instances

REGIONS = [
    "us-west-2", "us-east-1", "eu-west-1", "us-east-2", "eu-central-1", "ap-northeast-1", "ap-southeast-2",
    "eu-west-2", "ca-central-1", "eu-north-1", "ap-south-1", "sa-east-1", "eu-west-3", "ap-northeast-2",
]  # fmt: skip


def scaled_fleet(scale: int) -> dict[str, Any]:
    """The reference fleet with about `scale` times as many (region x site) pairs."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "fleet.yaml").read_text())
    ref_pairs = len(data["regions"]) * len(data["sites"])
    n_regions = min(len(REGIONS), max(3, round((ref_pairs * scale) ** 0.5 * 1.3)))
    n_sites = max(2, round(ref_pairs * scale / n_regions))
    regions = REGIONS[:n_regions]
    data["regions"] = {r: {"primary": i == 0, "azs": 3} for i, r in enumerate(regions)}
    data["environments"]["prod"]["regions"] = {r: {"transit_asn": 64512 + i} for i, r in enumerate(regions)}
    for pool in data["environments"]["prod"]["node_pools"].values():
        pool.pop("zones", None)
        pool.pop("capacity_reservations", None)
        if pool.get("regions"):
            wanted = regions[::2] if pool.get("efa") else regions
            pool["regions"] = [r for r in wanted if any(instances.offered(t, r) for t in pool["instance_types"])]
    data["sites"] = {
        f"site{i:02d}": {
            "region": regions[i % n_regions],
            "environment": "prod",
            "public_ip": f"64.62.{140 + i // 200}.{10 + i % 200}",
            "asn": 65200 + i,
            "routing": "bgp" if i % 2 else "static",
            "gpu_nodes": 8,
        }
        for i in range(n_sites)
    }
    return data


def write_manifest(regions: list[str], path: Path) -> None:
    """A Packer manifest with an AMI for both variants in every region of a generated fleet."""
    builds = []
    for n, variant in enumerate(("cpu", "gpu")):
        amis = ",".join(f"{r}:ami-{n:01x}{i:016x}" for i, r in enumerate(regions))
        builds.append(
            {"builder_type": "amazon-ebs", "build_time": 1, "artifact_id": amis, "custom_data": {"variant": variant}}
        )
    path.write_text(json.dumps({"builds": builds}))


def write_scaled(scale: int, folder: Path) -> tuple[dict[str, Any], Path, Path]:
    """The fleet `scale` times the reference one written into `folder` with its address plan allocated and an
    images manifest for its regions: (its data, the fleet file, the manifest)."""
    from dlinfra.cli import main as cli

    data = scaled_fleet(scale)
    fleet = folder / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(data, sort_keys=False))
    if cli.main(["cidr", "--update", "--fleet", str(fleet)]) != 0:
        raise SystemExit("cidr --update failed")
    manifest = folder / "manifest.json"
    write_manifest(list(data["regions"]), manifest)
    return data, fleet, manifest


def _cpu_seconds() -> float:
    """User and system CPU of this process and of its children (the preview's worker processes) so far."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_case(fleet_path: Path, jobs: int) -> dict[str, Any]:
    """Run in a child process: allocate the plan, then time preview --all; report figures as JSON."""
    from dlinfra.cli import main as cli

    if cli.main(["cidr", "--update", "--fleet", str(fleet_path)]) != 0:
        raise SystemExit("cidr --update failed")
    manifest = fleet_path.parent / "manifest.json"
    write_manifest(list(yaml.safe_load(fleet_path.read_text())["regions"]), manifest)
    plans_dir = fleet_path.parent / f"plans-j{jobs}"
    argv = ["preview", "--all", "--summary", "--fleet", str(fleet_path), "--out", str(plans_dir)]
    cpu, started = _cpu_seconds(), time.perf_counter()
    code = cli.main([*argv, "--images-manifest", str(manifest), "--jobs", str(jobs)])
    seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
    if code != 0:
        raise SystemExit("preview failed")
    plans = [json.loads(p.read_text()) for p in sorted(plans_dir.glob("*.json"))]
    from dlinfra.checks.reach import check as reach

    started = time.perf_counter()
    result = reach.analyse(fleet_path, fleet_path.parent / "cidr-lock.yaml", plans)
    reach_seconds = time.perf_counter() - started
    if result.failures:
        raise SystemExit(f"reach: {len(result.failures)} failing flow(s), first: {result.failures[0].why}")
    return {
        "intents": len(result.intents),
        "flows": result.flows,
        "reach_seconds": round(reach_seconds, 2),
        "stacks": len(plans),
        "resources": sum(p["summary"]["resources"] for p in plans),
        "seconds": round(seconds, 2),
        "cpu": round(cpu, 2),
        "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run_bare(plans_dir: Path, typed: bool) -> dict[str, Any]:
    """Run in a child process: replay every plan of a folder bare through the SDK, one after another."""
    import bare_replay

    plans = [json.loads(p.read_text()) for p in sorted(plans_dir.glob("*.json"))]
    cpu, started = _cpu_seconds(), time.perf_counter()
    for plan in plans:
        bare_replay.replay(plan, typed)
    return {
        "stacks": len(plans),
        "resources": sum(p["summary"]["resources"] for p in plans),
        "seconds": round(time.perf_counter() - started, 2),
        "cpu": round(_cpu_seconds() - cpu, 2),
        "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _child(*args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: {proc.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, os.cpu_count() or 1], help="preview --jobs values")
    parser.add_argument("--case", type=Path, help=argparse.SUPPRESS)  # internal: run one case in this process
    parser.add_argument("--bare", type=Path, help=argparse.SUPPRESS)  # internal: replay a folder of plans
    parser.add_argument("--typed", action="store_true", help=argparse.SUPPRESS)  # internal: ... through SDK classes
    args = parser.parse_args()
    if args.case or args.bare:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            figures = run_case(args.case, args.jobs[0]) if args.case else run_bare(args.bare, args.typed)
        print(json.dumps(figures))
        return
    results: dict[tuple[str, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            "reference": yaml.safe_load((ROOT / "fleet.yaml").read_text()),
            f"x{args.scale}": scaled_fleet(args.scale),
        }
        print(
            f"{'fleet':<10} {'run':<8} {'regions':>7} {'sites':>5} {'stacks':>6} {'resources':>9} {'seconds':>8} "
            f"{'cpu s':>7} {'intents':>8} {'flows':>7} {'reach s':>8} {'peak MiB':>9}"
        )
        for label, data in cases.items():
            folder = Path(tmp) / label
            folder.mkdir()
            (folder / "fleet.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
            runs = [(f"jobs={j}", ["--case", str(folder / "fleet.yaml"), "--jobs", str(j)]) for j in args.jobs]
            plans = str(folder / f"plans-j{args.jobs[-1]}")
            runs += [("bare", ["--bare", plans]), ("typed", ["--bare", plans, "--typed"])]
            for run, argv in runs:
                f = results[label, run] = _child(*argv)
                print(
                    f"{label:<10} {run:<8} {len(data['regions']):>7} {len(data['sites']):>5} {f['stacks']:>6} "
                    f"{f['resources']:>9} {f['seconds']:>8} {f['cpu']:>7} {f.get('intents', '-'):>8} "
                    f"{f.get('flows', '-'):>7} {f.get('reach_seconds', '-'):>8} {f['peak_mib']:>9}",
                    flush=True,
                )
    scaled = f"x{args.scale}"
    print("\nratios (wall seconds; CPU seconds in brackets):")
    for label in cases:
        for baseline in ("bare", "typed"):
            bare = results[label, baseline]
            for j in args.jobs:
                f = results[label, f"jobs={j}"]
                print(
                    f"  {label} preview --jobs {j} / {baseline}: {f['seconds'] / bare['seconds']:.2f}x "
                    f"({f['cpu'] / bare['cpu']:.2f}x)   goal <= 1.3x"
                )
    for run in [f"jobs={j}" for j in args.jobs] + ["bare", "typed"]:
        big, ref = results[scaled, run], results["reference", run]
        print(
            f"  {scaled} / reference, {run}: {big['seconds'] / ref['seconds']:.2f}x ({big['cpu'] / ref['cpu']:.2f}x), "
            f"resources {big['resources'] / ref['resources']:.2f}x   goal <= {args.scale}x"
        )


if __name__ == "__main__":
    main()
