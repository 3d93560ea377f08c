"""What an in-cluster stack (`<env>-<region>-k8s`) declares: the objects inside the region's EKS cluster.

The cluster's endpoint is private, so this stack is applied from the runner the regional stack declares inside
the VPC (or, before that runner exists, over the laptop VPN: scripts/bootstrap-region.sh). It reads the cluster
and everything it needs from the regional stack through StackReference rather than building a Kubernetes
provider from outputs of the same apply, which breaks whenever the cluster is replaced or not yet reachable.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components.charts.multikueue import multikueue_kubeconfig
from components.cluster import kubeconfig_json
from components.platform import Platform, platform_args_from_fleet
from dlinfra.model.stackroles import K8S_SUFFIX
from stacks.program import StackContext, stack_reference


@dataclass(frozen=True)
class RegionalPool:
    """A node pool of the regional stack, as the platform reads it (its Auto Scaling group name)."""

    group_name: pulumi.Output[str]


def declare(ctx: StackContext) -> None:
    """Read the regional stack, build the cluster's Kubernetes provider, declare the platform."""
    env, region = ctx.role.environment, ctx.role.region
    assert region is not None
    regional = stack_reference("regional", f"{env}-{region}")
    cluster_name = regional.require_output("cluster_name")
    kubeconfig = pulumi.Output.all(
        cluster_name,
        regional.require_output("cluster_endpoint"),
        regional.require_output("cluster_certificate_authority"),
    ).apply(lambda parts: kubeconfig_json(str(parts[0]), str(parts[1]), str(parts[2]), region))
    provider = k8s.Provider("k8s", kubeconfig=kubeconfig, enable_server_side_apply=True)
    node_pools = regional.require_output("node_pools")
    pools = {
        name: RegionalPool(group_name=node_pools.apply(lambda groups, pool=name: str(groups[pool])))
        for name in ctx.fleet.pools_in(env, region)
    }
    access_points = regional.require_output("efs_access_points")
    fleet_file = str(ctx.root / (pulumi.Config("dlinfra").get("fleet") or "fleet.yaml"))
    # The MultiKueue manager reads each worker's kubeconfig from the worker's in-cluster stack, applied before it
    # (stackroles.roles): a secret output, never in the manager's config or code.
    kubeconfigs: dict[str, pulumi.Output[str]] = {}
    if ctx.fleet.multikueue_manager(env) == region:
        for worker in ctx.fleet.multikueue_workers(env):
            reference = stack_reference(f"k8s-{worker}", f"{env}-{worker}-{K8S_SUFFIX}")
            kubeconfigs[worker] = reference.require_output("multikueue_kubeconfig")
    platform = Platform(
        "platform",
        platform_args_from_fleet(
            ctx.fleet,
            ctx.plan,
            names=ctx.names,
            provider=provider,
            cluster_name=cluster_name,
            node_pools=pools,
            efs_file_system_id=regional.require_output("efs_id"),
            efs_datasets_access_point_id=access_points.apply(lambda points: str(points["datasets"])),
            termination_queue_url=regional.require_output("termination_queue_url"),
            quota_policy=ctx.fleet.environments[env].gpu_quotas,
            fleet_file=fleet_file,
            multikueue_kubeconfigs=kubeconfigs,
        ),
        opts=pulumi.ResourceOptions(providers=[provider]),
    )
    pulumi.export("environment", env)
    pulumi.export("region", region)
    pulumi.export("cluster_name", cluster_name)
    pulumi.export("team_namespaces", platform.namespaces)
    pulumi.export("releases", platform.releases)
    if platform.multikueue_token is not None:
        token = platform.multikueue_token
        pulumi.export(
            "multikueue_kubeconfig",
            pulumi.Output.secret(
                pulumi.Output.all(
                    cluster_name,
                    regional.require_output("cluster_endpoint"),
                    regional.require_output("cluster_certificate_authority"),
                    token,
                ).apply(lambda parts: multikueue_kubeconfig(*(str(p) for p in parts)))
            ),
        )
