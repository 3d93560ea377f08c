"""What every stack's composition reads: the fleet, its address plan, the stack's role and names (StackContext), and
the explicit providers and stack references it declares resources and reads other stacks through."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws

from dlinfra.errors import StackNameError
from dlinfra.model import eks, kueue, planner, stackroles
from dlinfra.model.fleet.load import load_fleet, version_lifecycle
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.naming import Names


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
    for warning in version_lifecycle(loaded, eks.today()):
        pulumi.log.warn(warning)
    role = stackroles.parse(loaded.fleet, pulumi.get_stack(), fleet_file=str(loaded.path))
    check_region_config(role, pulumi.Config("aws").get("region"), stack_file=f"stacks/Pulumi.{role.name}.yaml")
    names = Names(loaded.fleet.project, role.environment, role.region, loaded.fleet.tags)
    return StackContext(root=root, fleet=loaded.fleet, plan=plan, role=role, names=names)


def check_region_config(role: stackroles.StackRole, configured: str | None, *, stack_file: str) -> None:
    """Refuse a stack whose `aws:region` config names another region than its stack name.

    The stack name is what pins the region (every AWS resource goes through an explicit provider for it), so a
    disagreeing `aws:region` is a mistake in the stack's config, or a sign the stack is being run somewhere else.
    """
    if role.region is None or configured is None or configured == role.region:
        return
    raise StackNameError(
        f"stack {role.name!r} is in {role.region} by its name, but its config sets aws:region to {configured!r}; "
        f"remove aws:region (the region comes from the stack name) or set it to {role.region}",
        file=stack_file,
        key="config.aws:region",
    )


def aws_provider(region: str) -> aws.Provider:
    """The explicit AWS provider of a region. Default providers are disabled (Pulumi.yaml), so nothing can fall
    back to the region of whoever runs `pulumi up`."""
    return aws.Provider(f"aws-{region}", region=region)


def stack_reference(name: str, stack: str) -> pulumi.StackReference:
    """StackReference to another stack of this project, in the same organization (or `dlinfra:organization`)."""
    org = pulumi.Config("dlinfra").get("organization") or pulumi.get_organization()
    return pulumi.StackReference(name, stack_name=f"{org}/{pulumi.get_project()}/{stack}")
