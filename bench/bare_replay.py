"""The bare baseline for bench_preview.py: register a plan's recorded resources straight through the Pulumi SDK under
Pulumi's stock mocks, with no component, stack or fake-cloud code, so what is left is the SDK's own cost.

Each resource is registered with the plan's inputs as its properties and its parent, provider and dependencies as
options. Two ways, both through the offline engine's runtime harness (`under_mocks`), so each differs from the
preview only in the code that decides what to register:
- generic (the default): a plain CustomResource, ComponentResource or ProviderResource of the recorded type, with
  the recorded inputs and nothing else;
- typed (--typed): each custom resource through its provider SDK class (pulumi_aws.ec2.Vpc for aws:ec2/vpc:Vpc,
  found through the SDK's own resource-module registry), as any program that declares that resource must. The
  class also registers every output property the provider defines (a Vpc has nine), and the SDK makes an Output
  for each: that is part of the cost of registering the resource, and the generic replay leaves it out.
Usage: python bench/bare_replay.py [--typed] PLAN.json ...   (prints seconds and resources per plan)
"""

from __future__ import annotations

import project_python

project_python.use_project_python()  # first: `python bench/<this>.py` works with any Python on the PATH

import contextvars
import functools
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlinfra.offline import engine, parallel


class _Echo(mocks.Mocks):
    """Every resource's outputs are its inputs; every invoke returns nothing. Counts what it was asked to make."""

    def __init__(self) -> None:
        self.made = 0

    def new_resource(self, args: mocks.MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        self.made += 1
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: mocks.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


@functools.cache
def _sdk_class(token: str) -> tuple[type[pulumi.CustomResource], dict[str, str]] | None:
    """The provider SDK class of a resource type and its keyword arguments by normalised input name, if any."""
    cls = parallel.sdk_class(token)
    if cls is None:
        return None
    params = inspect.signature(cls._internal_init).parameters
    return cls, {p.replace("_", "").lower(): p for p in params if p not in ("__self__", "resource_name", "opts")}


def _as_asset(value: Any) -> Any:
    """A plan's record of an asset or archive ({"asset": ...} / {"archive": ...}) as an SDK asset again, which a
    typed class's outputs must be; the content does not matter under mocks."""
    if isinstance(value, dict) and value.keys() == {"archive"}:
        return pulumi.AssetArchive({name: _as_asset(item) for name, item in value["archive"].items()})
    if isinstance(value, dict) and value.keys() == {"asset"}:
        return pulumi.StringAsset(json.dumps(value["asset"]))
    return value


def _typed(r: dict[str, Any], opts: pulumi.ResourceOptions) -> pulumi.Resource | None:
    """The resource through its SDK class, its inputs given by keyword; None when the SDK has no class for it."""
    found = _sdk_class(r["type"])
    if found is None:
        return None
    cls, params = found
    kwargs = {params.get(key.replace("_", "").lower(), key): _as_asset(v) for key, v in r["inputs"].items()}
    return cls(r["name"], opts=opts, **kwargs)


def _declare(plan: dict[str, Any], typed: bool = False) -> None:
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
            resource = _typed(r, opts) if typed else None
            made[urn] = resource or pulumi.CustomResource(r["type"], r["name"], r["inputs"], opts)
        else:
            made[urn] = pulumi.ComponentResource(r["type"], r["name"], None, opts)
        return made[urn]

    for urn in sorted(records):
        make(urn)


def replay(plan: dict[str, Any], typed: bool = False) -> float:
    """Seconds to register the plan's resources bare under mocks."""
    started = time.perf_counter()
    echo = _Echo()
    monitor = mocks.MockMonitor(echo)
    contextvars.Context().run(
        engine.under_mocks,
        monitor,
        lambda: _declare(plan, typed),
        root=ROOT,
        project=plan["project"],
        stack_name=plan["stack"],
        config={},
    )
    seconds = time.perf_counter() - started
    # Every resource of the plan reached the mock monitor (which is asked for every one but the stack), typed or not.
    expected = len(plan["resources"])
    if echo.made != expected:
        raise SystemExit(f"{plan['stack']}: the replay registered {echo.made} resources, the plan has {expected}")
    return seconds


def main() -> None:
    typed = "--typed" in sys.argv
    for path in [a for a in sys.argv[1:] if a != "--typed"]:
        plan = json.loads(Path(path).read_text())
        print(f"{plan['stack']}: {len(plan['resources'])} resources, {replay(plan, typed):.2f}s")


if __name__ == "__main__":
    main()
