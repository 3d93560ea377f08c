"""Node pools of a regional stack: one NodePool per fleet pool that runs in the region."""

from __future__ import annotations

import pulumi

from components.capacity_block import CapacityBlockWindow, CapacityBlockWindowArgs
from components.cluster import Cluster
from components.nodepool import NodePool, NodePoolArgs
from dlinfra.errors import DlinfraError
from dlinfra.model import dns, images, sites
from stacks.context import StackContext

DEFAULT_MANIFEST = "images/manifest.example.json"


def load_manifest(ctx: StackContext) -> images.AmiManifest:
    """The Packer manifest named by `dlinfra:images_manifest` (default: the committed example)."""
    return images.load_manifest(ctx.root / (pulumi.Config("dlinfra").get("images_manifest") or DEFAULT_MANIFEST))


def declare_pools(
    ctx: StackContext,
    *,
    vpc_id: pulumi.Input[str],
    private_subnet_ids: dict[str, pulumi.Input[str]],
    cluster: Cluster | None = None,
    provider: pulumi.ProviderResource,
) -> dict[str, NodePool]:
    """Declare every pool of the environment that runs in this region; AMIs come from the images manifest.

    With the cluster given, nodes carry its node security group and launch only once it is ready.
    """
    env, region = ctx.role.environment, ctx.role.region
    assert region is not None
    manifest = load_manifest(ctx)
    cluster_name = ctx.names.physical("eks")
    internal = [str(d.cidr) for d in sites.environment_networks(ctx.fleet, ctx.plan, env)]
    pools: dict[str, NodePool] = {}
    for pool_name, pool in ctx.fleet.pools_in(env, region).items():
        key = f"environments.{env}.node_pools.{pool_name}"
        variant = "gpu" if pool.kind == "gpu" else "cpu"
        try:
            ami = images.ami_for(manifest, variant, region)
        except DlinfraError as exc:
            raise DlinfraError(f"{exc.detail} (needed by this pool in {region})", file=exc.file, key=key) from None
        zones = ctx.fleet.pool_zones(env, region, pool_name)
        reservation = pool.capacity_reservations.get(region)
        try:
            args = NodePoolArgs(
                names=ctx.names,
                pool=pool_name,
                kind=pool.kind,
                cluster_name=cluster_name,
                ami_id=ami,
                instance_types=ctx.fleet.pool_types(env, region, pool_name),
                subnet_ids={az: private_subnet_ids[az] for az in zones},
                vpc_id=vpc_id,
                min_size=pool.min_size,
                max_size=pool.max_size,
                efa=pool.efa,
                capacity_reservation_id=reservation.id if reservation else None,
                capacity_block=bool(reservation and reservation.type == "capacity_block"),
                reservation_placement_group=reservation.placement_group if reservation else None,
                spot=pool.spot is not None,
                on_demand_base=pool.spot.on_demand_base if pool.spot else 0,
                on_demand_percentage_above_base=pool.spot.on_demand_percentage_above_base if pool.spot else 0,
                spot_allocation_strategy=pool.spot.allocation_strategy if pool.spot else "price-capacity-optimized",
                labels=pool.labels,
                taints=tuple((t.key, t.value, t.effect) for t in pool.taints),
                pod_imds_access=pool.pod_imds_access,
                root_volume_gib=pool.root_volume_gib,
                checkpoint_grace=pool.checkpoint_grace,
                gpu_check=pool.burn_in,
                gpu_sharing=pool.gpu_sharing,
                gpu_product_label=ctx.fleet.environments[env].gpu_product_label,
                internal_cidrs=internal,
                node_security_group_id=cluster.node_security_group_id if cluster else None,
                join_after=cluster.join_prerequisites if cluster else (),
                cluster_dns=dns.node_dns_servers(str(ctx.plan.cidr(f"service/{env}/{region}"))),
            )
        except ValueError as exc:
            raise DlinfraError(str(exc), file=str(ctx.root / "fleet.yaml"), key=key) from None
        pools[pool_name] = NodePool(f"pool-{pool_name}", args, opts=pulumi.ResourceOptions(providers=[provider]))
    return pools


def declare_block_windows(
    ctx: StackContext,
    pools: dict[str, NodePool],
    *,
    log_kms_key_arn: pulumi.Input[str],
    provider: pulumi.ProviderResource,
) -> dict[str, CapacityBlockWindow]:
    """A CapacityBlockWindow for every pool of this region on a Capacity Block: its group is open only inside the
    block's window and drains before EC2's cut (components/capacity_block.py)."""
    env, region = ctx.role.environment, ctx.role.region
    assert region is not None
    windows: dict[str, CapacityBlockWindow] = {}
    for pool_name, pool in ctx.fleet.pools_in(env, region).items():
        block = pool.capacity_reservations.get(region)
        window = block.block_window() if block else None
        if block is None or window is None or pool_name not in pools:
            continue
        key = f"environments.{env}.node_pools.{pool_name}"
        try:
            args = CapacityBlockWindowArgs(
                names=ctx.names,
                pool=pool_name,
                reservation_id=block.id,
                start=window[0],
                end=window[1],
                group_name=pools[pool_name].group_name,
                group_arn=pools[pool_name].group_arn,
                min_size=pool.min_size,
                max_size=pool.max_size,
                checkpoint_grace=pool.checkpoint_grace,
                log_kms_key_arn=log_kms_key_arn,
            )
        except ValueError as exc:
            raise DlinfraError(str(exc), file=str(ctx.root / "fleet.yaml"), key=key) from None
        windows[pool_name] = CapacityBlockWindow(
            f"block-{pool_name}", args, opts=pulumi.ResourceOptions(providers=[provider])
        )
    return windows
