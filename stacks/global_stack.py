"""What an environment's global stack (`<env>-global`) declares: what spans its regions."""

from __future__ import annotations

import pulumi

from stacks.program import StackContext


def regional_reference(ctx: StackContext, region: str) -> pulumi.StackReference:
    """StackReference to one regional stack of this environment (same organization and project)."""
    org = pulumi.Config("dlinfra").get("organization") or pulumi.get_organization()
    stack = f"{ctx.role.environment}-{region}"
    return pulumi.StackReference(f"regional-{region}", stack_name=f"{org}/{pulumi.get_project()}/{stack}")


def declare(ctx: StackContext) -> None:
    """Read every regional stack of the environment and export the environment-wide view."""
    env = ctx.fleet.environments[ctx.role.environment]
    refs = {region: regional_reference(ctx, region) for region in env.regions}
    pulumi.export("environment", ctx.role.environment)
    pulumi.export("vpc_cidrs", {region: ref.get_output("vpc_cidr") for region, ref in refs.items()})
    pulumi.export("vpc_ids", {region: ref.get_output("vpc_id") for region, ref in refs.items()})
