"""Composition: load the fleet and the address plan, work out the stack's role, declare its components."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pulumi

from dlinfra import kueue, planner, stackroles
from dlinfra.errors import DlinfraError
from dlinfra.fleet import Fleet, load_fleet
from dlinfra.naming import Names


@dataclass(frozen=True)
class StackContext:
    """Everything a stack's composition reads: the fleet, its plan, this stack's role and names."""

    root: Path
    fleet: Fleet
    plan: planner.Plan
    role: stackroles.StackRole
    names: Names


def load_context(root: Path) -> StackContext:
    """Read fleet and lock named by stack config (defaults fleet.yaml, cidr-lock.yaml); never allocates."""
    config = pulumi.Config("dlinfra")
    loaded = load_fleet(root / (config.get("fleet") or "fleet.yaml"))
    lock = planner.load_lock(root / (config.get("lock") or "cidr-lock.yaml"))
    plan = planner.plan(loaded, lock)
    kueue.check_fleet(loaded.fleet, source=str(loaded.path))
    role = stackroles.parse(loaded.fleet, pulumi.get_stack(), fleet_file=str(loaded.path))
    names = Names(loaded.fleet.project, role.environment, role.region, loaded.fleet.tags)
    return StackContext(root=root, fleet=loaded.fleet, plan=plan, role=role, names=names)


def main(root: Path) -> None:
    """Entry point called by stacks/__main__.py."""
    try:
        ctx = load_context(root)
        if ctx.role.kind == "regional":
            from stacks import regional

            regional.declare(ctx)
        else:
            from stacks import global_stack

            global_stack.declare(ctx)
    except DlinfraError as exc:
        # RunError makes the Pulumi CLI print the message alone, without a traceback.
        raise pulumi.RunError(str(exc)) from None
