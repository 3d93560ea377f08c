"""Find order dependence: run every stack on a fleet and on shuffled copies of it, and print what changed.

Each shuffle reorders every mapping and every list but the ordered ones (tests/stacks/test_order_independence.py
ORDERED; README, "Fleet reference"); the lock stays the same, so addresses do not move. Prints one line per
changed input (stack, resource, path, before -> after) and per URN found in one run only; exits 1 if any.
Useful on a fleet richer than the test fixture, where more lists have more than one entry.
Usage: python bench/order_dependence.py [--fleet F] [--lock L] [--seed N ...]   (about 25 s per run)
"""

from __future__ import annotations

import project_python

project_python.use_project_python()  # first: `python bench/<this>.py` works with any Python on the PATH

import argparse
import json
import os
import random
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlinfra.model import stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.offline import engine
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, TEST_TODAY
from tests.stacks.test_order_independence import permuted


def inputs(fleet_path: Path, lock: Path) -> dict[str, dict[str, Any]]:
    """Stack -> URN -> exported inputs, for every stack of the fleet."""
    fleet = load_fleet(fleet_path).fleet
    config = {"dlinfra:fleet": str(fleet_path), "dlinfra:lock": str(lock)}
    results = engine.run_all(ROOT, stackroles.roles(fleet), project=fleet.project, config=config)
    return {r.role.name: {x["urn"]: x["inputs"] for x in r.plan(fleet.project)["resources"]} for r in results}


def differences(a: Any, b: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, before, after) for every leaf that differs."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            yield from differences(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{path}.{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield path, a, b


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", type=Path, default=REFERENCE_FLEET)
    parser.add_argument("--lock", type=Path, default=REFERENCE_LOCK)
    parser.add_argument("--seed", type=int, action="append", help="shuffle seed (repeatable; default 0 1 2)")
    args = parser.parse_args()
    os.environ.setdefault("DLINFRA_TODAY", TEST_TODAY)  # support-date checks as in the tests
    data = yaml.safe_load(args.fleet.read_text())
    before = inputs(args.fleet, args.lock)
    found = 0
    for seed in args.seed or [0, 1, 2]:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "fleet.yaml"
            path.write_text(yaml.safe_dump(permuted(data, random.Random(seed)), sort_keys=False))
            after = inputs(path, args.lock)
        for stack in sorted(set(before) | set(after)):
            old, new = before.get(stack, {}), after.get(stack, {})
            for urn in sorted(set(old) ^ set(new)):
                found += 1
                print(f"seed {seed} {stack}: only {'before' if urn in old else 'after'}: {urn}")
            for urn in sorted(set(old) & set(new)):
                for where, a, b in differences(old[urn], new[urn]):
                    found += 1
                    name = urn.rsplit("::", 1)[-1]
                    print(f"seed {seed} {stack} {name} {where}: {json.dumps(a)[:80]} -> {json.dumps(b)[:80]}")
    print(f"{found} differences")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
