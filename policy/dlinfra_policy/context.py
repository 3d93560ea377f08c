"""What the policy rules need to know beyond a plan: the address plan, the instance table, the provider SDK.

Shared by `dlinfra check` and the CrossGuard pack (policy/__main__.py), so both judge with the same facts.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

from dlinfra.errors import DlinfraError
from dlinfra.model import instances, planner, stackroles, taggable
from dlinfra.model.fleet.load import load_fleet
from policy.dlinfra_policy.rules.core import AddressPlan, Context

# Kinds that live inside another block (subnets in their VPC) or outside the RFC 1918 plan (tunnel /30s).
_NESTED_KINDS = ("subnet", "tunnel")


def address_plan(fleet_path: Path, lock_path: Path) -> AddressPlan:
    """The committed address plan of a fleet, as the VPC rule reads it; DlinfraError when fleet or lock is bad."""
    loaded = load_fleet(fleet_path)
    plan = planner.plan(loaded, planner.load_lock(lock_path))
    vpcs, keys = {}, {}
    for role in stackroles.roles(loaded.fleet):
        if role.kind == "regional" and role.region is not None:
            key = planner.vpc_key(role.environment, role.region)
            vpcs[role.name], keys[role.name] = plan.cidr(key), key
    blocks = {a.key: a.cidr for a in plan.allocations.values() if a.kind not in _NESTED_KINDS}
    # Orphans stay reserved until released, so a VPC must not overlap them either.
    blocks |= {k: n for k, n in plan.orphans.items() if planner.kind_of(k) not in _NESTED_KINDS}
    return AddressPlan(vpcs=vpcs, vpc_keys=keys, blocks=blocks, source=str(lock_path))


@functools.cache
def sdk_taggable(type_token: str) -> bool:
    """True when the provider SDK's Args class of an AWS type has a `tags` input."""
    if not type_token.startswith("aws:"):
        return False
    known = taggable.listed(type_token)  # the table read from the SDK (tests/model/test_taggable.py keeps it true)
    if known is not None:
        return known
    importlib.import_module("pulumi_aws")  # registers the SDK's resource modules, which load lazily
    from dlinfra.offline import schema  # imports pulumi: only when a rule asks

    shape = schema.resource_shape(type_token)
    return shape is not None and "tags" in (shape.fields or {})


def gpu_count(instance_type: str) -> int | None:
    """NVIDIA GPUs of an instance type from dlinfra's table; None for a type the table lacks."""
    try:
        return instances.lookup(instance_type).gpus
    except instances.UnknownInstanceType:
        return None


def build_context(fleet_path: Path, lock_path: Path, *, strict: bool = True) -> Context:
    """The rules' context; with strict=False a bad fleet or lock becomes a violation instead of an error."""
    try:
        plan = address_plan(fleet_path, lock_path)
    except DlinfraError as exc:
        if strict:
            raise
        return Context(taggable=sdk_taggable, gpu_count=gpu_count, address_plan_error=str(exc))
    return Context(taggable=sdk_taggable, gpu_count=gpu_count, address_plan=plan)
