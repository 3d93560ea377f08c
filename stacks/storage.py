"""Storage of a regional stack: EFS, S3 buckets and (when the fleet asks) FSx for Lustre."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components.storage import FsxArgs, Storage, StorageArgs
from dlinfra.model import team_storage
from stacks.context import StackContext


def declare_storage(
    ctx: StackContext,
    *,
    vpc_id: pulumi.Input[str],
    private_subnet_ids: dict[str, pulumi.Input[str]],
    provider: pulumi.ProviderResource,
) -> Storage:
    """Declare the region's shared storage; NFS and Lustre admit only the private (node and pod) subnets."""
    env, region = ctx.role.environment, ctx.role.region
    assert region is not None
    spec = ctx.fleet.environments[env].storage
    private = ctx.plan.subnets(env, region, "private")
    return Storage(
        "storage",
        StorageArgs(
            names=ctx.names,
            account_id=aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(provider=provider)).account_id,
            vpc_id=vpc_id,
            subnet_ids=private_subnet_ids,
            client_cidrs=[str(private[az]) for az in sorted(private)],
            access_points=team_storage.plan(ctx.fleet, env).access_points,
            checkpoint_retention_days=spec.checkpoint_retention_days,
            fsx=FsxArgs(
                storage_capacity_gib=spec.fsx.storage_capacity_gib, throughput_per_tib=spec.fsx.throughput_per_tib
            )
            if spec.fsx
            else None,
        ),
        opts=pulumi.ResourceOptions(providers=[provider]),
    )
