"""The bare baseline for bench_preview.py: register a plan's recorded resources straight through the Pulumi SDK under
Pulumi's stock mocks, with no component, stack or fake-cloud code, so what is left is the SDK's own cost.

Each resource is registered as a generic CustomResource, ComponentResource or ProviderResource with the plan's
inputs as its properties and its parent, provider and dependencies as options. The runtime harness is the offline
engine's (`under_mocks`), so the two differ only in the code that decides what to register.
Usage: python bench/bare_replay.py PLAN.json ...   (prints seconds and resources per plan)
"""

from __future__ import annotations

import contextvars
import json
import sys
import time
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlinfra.offline import engine  # noqa: E402


class _Echo(mocks.Mocks):
    """Every resource's outputs are its inputs; every invoke returns nothing."""

    def new_resource(self, args: mocks.MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: mocks.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


def _declare(plan: dict[str, Any]) -> None:
    """Register every resource of the plan, each after its parent, provider and dependencies."""
    records = {r["urn"]: r for r in plan["resources"]}
    made: dict[str, pulumi.Resource] = {}

    def make(urn: str) -> pulumi.Resource | None:
        if urn in made or urn not in records:
            return made.get(urn)
        r = records[urn]
        provider_urn = (r["provider"] or "").rsplit("::", 1)[0]
        opts = pulumi.ResourceOptions(
            parent=make(r["parent"]) if r["parent"] else None,
            provider=make(provider_urn) if provider_urn in records else None,  # type: ignore[arg-type]
            depends_on=[d for d in (make(u) for u in r["dependencies"]) if d is not None],
        )
        if r["type"].startswith("pulumi:providers:"):
            package = r["type"].removeprefix("pulumi:providers:")
            made[urn] = pulumi.ProviderResource(package, r["name"], r["inputs"], opts)
        elif r["custom"]:
            made[urn] = pulumi.CustomResource(r["type"], r["name"], r["inputs"], opts)
        else:
            made[urn] = pulumi.ComponentResource(r["type"], r["name"], None, opts)
        return made[urn]

    for urn in sorted(records):
        make(urn)


def replay(plan: dict[str, Any]) -> float:
    """Seconds to register the plan's resources bare under mocks."""
    started = time.perf_counter()
    monitor = mocks.MockMonitor(_Echo())
    contextvars.Context().run(
        engine.under_mocks,
        monitor,
        lambda: _declare(plan),
        root=ROOT,
        project=plan["project"],
        stack_name=plan["stack"],
        config={},
    )
    return time.perf_counter() - started


def main() -> None:
    for path in sys.argv[1:]:
        plan = json.loads(Path(path).read_text())
        print(f"{plan['stack']}: {len(plan['resources'])} resources, {replay(plan):.2f}s")


if __name__ == "__main__":
    main()
