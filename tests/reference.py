"""One offline run of the reference fleet, shared by the network component tests (about 2 s)."""

from __future__ import annotations

import functools
from typing import Any

from dlinfra.model import planner, stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet
from dlinfra.offline import engine, plan_export
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

CONFIG = {"dlinfra:fleet": str(REFERENCE_FLEET), "dlinfra:lock": str(REFERENCE_LOCK)}


@functools.cache
def fleet() -> Fleet:
    return load_fleet(REFERENCE_FLEET).fleet


@functools.cache
def plan() -> planner.Plan:
    return planner.plan(load_fleet(REFERENCE_FLEET), planner.load_lock(REFERENCE_LOCK))


@functools.cache
def runs() -> dict[str, plan_export.StackResult]:
    """Stack name -> result, every stack of the reference fleet in dependency order."""
    results = engine.run_all(ROOT, stackroles.roles(fleet()), project=fleet().project, config=CONFIG)
    return {r.role.name: r for r in results}


def of_type(result: plan_export.StackResult, type_: str) -> list[plan_export.ResourceRecord]:
    """The stack's resources of one type."""
    return [r for r in result.resources if r.type == type_]


def named(result: plan_export.StackResult, name: str) -> plan_export.ResourceRecord:
    """The stack's resource with this logical name (exactly one)."""
    (match,) = [r for r in result.resources if r.name == name]
    return match


def by_id(result: plan_export.StackResult) -> dict[str, plan_export.ResourceRecord]:
    """Resources by their (fake) id."""
    return {r.id: r for r in result.resources if r.id}


def children(result: plan_export.StackResult, parent: plan_export.ResourceRecord) -> list[plan_export.ResourceRecord]:
    return [r for r in result.resources if r.parent == parent.urn]


REGIONAL = ("prod-us-west-2", "prod-us-east-1", "prod-eu-west-1", "staging-us-west-2")


def env_region(stack: str) -> tuple[str, str]:
    env, region = stack.split("-", 1)
    return env, region


def plain(value: Any) -> Any:
    """Numbers come back from the mock engine as floats; compare them as ints."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


@functools.cache
def provenance() -> dict[str, str]:
    """What `dlinfra preview` records for the fixture fleet, lock and the example images manifest."""
    from dlinfra.model import images
    from dlinfra.offline import provenance as made_from

    return made_from.current(ROOT, REFERENCE_FLEET, REFERENCE_LOCK, ROOT / images.EXAMPLE_MANIFEST).to_json()
