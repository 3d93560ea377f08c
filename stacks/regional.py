"""What a regional stack (`<env>-<region>`) declares and exports."""

from __future__ import annotations

import pulumi

from components.network import Network, NetworkArgs
from dlinfra import planner
from stacks.program import StackContext


def declare(ctx: StackContext) -> None:
    """Declare the region's components and export what the global stack and site rendering read."""
    env, region = ctx.role.environment, ctx.role.region
    assert region is not None
    environment = ctx.fleet.environments[env]
    network = Network(
        "network",
        NetworkArgs(
            names=ctx.names,
            vpc_cidr=str(ctx.plan.vpc(env, region)),
            subnets={
                tier: {az: str(cidr) for az, cidr in ctx.plan.subnets(env, region, tier).items()}
                for tier in planner.SUBNET_TIERS
            },
            nat=environment.nat,
        ),
    )
    pulumi.export("environment", env)
    pulumi.export("region", region)
    pulumi.export("vpc_id", network.vpc_id)
    pulumi.export("vpc_cidr", network.vpc_cidr)
    pulumi.export("private_subnet_ids", network.private_subnet_ids)
    pulumi.export("public_subnet_ids", network.public_subnet_ids)
    pulumi.export("transit_subnet_ids", network.transit_subnet_ids)
