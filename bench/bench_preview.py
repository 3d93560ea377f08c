"""Benchmark: `dlinfra preview --all`, then the reachability analysis over its plans, on the reference fleet and
on a generated fleet ten times larger.

Each case runs in its own process so peak memory (max RSS) is that case's alone. Prints one line per case:
stacks, resources, preview wall seconds, reachability intents, flows and seconds (load, derive and evaluate),
and peak MiB. Usage: python bench/bench_preview.py [--scale 10]
"""

from __future__ import annotations

import argparse
import json
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
            pool["regions"] = regions[::2] if pool.get("efa") else regions
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


def run_case(fleet_path: Path) -> dict[str, Any]:
    """Run in a child process: allocate the plan, then time preview --all; report figures as JSON."""
    from dlinfra import cli

    if cli.main(["cidr", "--update", "--fleet", str(fleet_path)]) != 0:
        raise SystemExit("cidr --update failed")
    started = time.perf_counter()
    manifest = fleet_path.parent / "manifest.json"
    write_manifest(list(yaml.safe_load(fleet_path.read_text())["regions"]), manifest)
    out = str(fleet_path.parent / "plans")
    code = cli.main(
        ["preview", "--all", "--summary", "--fleet", str(fleet_path), "--out", out, "--images-manifest", str(manifest)]
    )
    seconds = time.perf_counter() - started
    if code != 0:
        raise SystemExit("preview failed")
    plans = [json.loads(p.read_text()) for p in sorted((fleet_path.parent / "plans").glob("*.json"))]
    from dlinfra.reach import check as reach

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
        "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--case", type=Path, help=argparse.SUPPRESS)  # internal: run one case in this process
    args = parser.parse_args()
    if args.case:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            figures = run_case(args.case)
        print(json.dumps(figures))
        return
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            "reference": yaml.safe_load((ROOT / "fleet.yaml").read_text()),
            f"x{args.scale}": scaled_fleet(args.scale),
        }
        print(
            f"{'fleet':<10} {'regions':>7} {'sites':>5} {'stacks':>6} {'resources':>9} {'seconds':>8} "
            f"{'intents':>8} {'flows':>7} {'reach s':>8} {'peak MiB':>9}"
        )
        for label, data in cases.items():
            folder = Path(tmp) / label
            folder.mkdir()
            (folder / "fleet.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
            proc = subprocess.run(
                [sys.executable, __file__, "--case", str(folder / "fleet.yaml")],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                raise SystemExit(f"{label}: {proc.stderr[-2000:]}")
            f = json.loads(proc.stdout.strip().splitlines()[-1])
            print(
                f"{label:<10} {len(data['regions']):>7} {len(data['sites']):>5} {f['stacks']:>6} "
                f"{f['resources']:>9} {f['seconds']:>8} {f['intents']:>8} {f['flows']:>7} {f['reach_seconds']:>8} "
                f"{f['peak_mib']:>9}"
            )


if __name__ == "__main__":
    main()
