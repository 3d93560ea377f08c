"""What an in-cluster stack (`<env>-<region>-k8s`) declares: the objects inside the region's EKS cluster.

The cluster's endpoint is private, so this stack is applied from the runner the regional stack declares inside
the VPC (or, before that runner exists, over the laptop VPN: scripts/bootstrap-region.sh). It reads the cluster
and everything it needs from the regional stack through StackReference rather than building a Kubernetes
provider from outputs of the same apply, which breaks whenever the cluster is replaced or not yet reachable.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import pulumi
import pulumi_kubernetes as k8s

from components.block_flavors import flavor_window
from components.charts.multikueue import multikueue_kubeconfig
from components.charts.nodes import SITE_GPU_TAINT
from components.cluster import kubeconfig_json, team_group
from components.platform import Platform, PlatformArgs, PoolView, SiteView, TeamView
from dlinfra.model import dns, gpu_health, hybrid_routing, instances, kueue, planner, sites, team_storage
from dlinfra.model.fleet.pools import NodePool
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.naming import Names
from dlinfra.model.stackroles import K8S_SUFFIX
from stacks.context import StackContext, stack_reference


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
            efs_access_point_ids=access_points,
            termination_queue_url=regional.require_output("termination_queue_url"),
            quota_policy=ctx.fleet.environments[env].gpu_quotas,
            fleet_file=fleet_file,
            multikueue_kubeconfigs=kubeconfigs,
            kubeconfig=kubeconfig,
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


class PoolOutputs(Protocol):
    """What platform_args_from_fleet reads from each declared pool (a components.nodepool.NodePool)."""

    group_name: pulumi.Output[str]


def platform_args_from_fleet(
    fleet: Fleet,
    plan: planner.Plan,
    *,
    names: Names,
    provider: pulumi.ProviderResource,
    cluster_name: pulumi.Input[str],
    node_pools: Mapping[str, PoolOutputs],
    efs_file_system_id: pulumi.Input[str],
    efs_access_point_ids: pulumi.Input[Mapping[str, str]],
    termination_queue_url: pulumi.Input[str],
    quota_policy: kueue.QuotaPolicy,
    fleet_file: str | None = None,
    multikueue_kubeconfigs: Mapping[str, pulumi.Input[str]] | None = None,
    kubeconfig: pulumi.Input[str] | None = None,
) -> PlatformArgs:
    """PlatformArgs of a region from the fleet, its address plan and the regional stack's pools (no resources)."""
    env, region = names.environment, names.region
    if region is None:
        raise ValueError("names: the platform belongs to a regional stack")
    fleet_pools = fleet.pools_in(env, region)
    missing = sorted(set(fleet_pools) - set(node_pools))
    if missing:
        raise ValueError(f"node_pools: pools {', '.join(missing)} of {env}/{region} were not passed")
    quota_plan = kueue.plan(fleet, env, quota_policy, source=fleet_file)
    pools: dict[str, PoolView] = {}
    for pool_name, pool in fleet_pools.items():
        spec = instances.lookup(fleet.pool_types(env, region, pool_name)[0])
        outputs = node_pools[pool_name]
        pools[pool_name] = PoolView(
            kind=pool.kind,
            instance_type=spec.name,
            gpus_per_node=spec.gpus,
            gpu_model=spec.gpu_model,
            gpu_labels=(
                gpu_health.gpu_labels(spec.gpu_model, spec.gpu_product, fleet.environments[env].gpu_product_label)
                if spec.gpu_model and spec.gpu_product and pool.kind == "gpu"
                else {}
            ),
            repair_share=pool.burn_in.repair_share,
            gpu_sharing=pool.gpu_sharing,
            efa=pool.efa,
            capacity_class=kueue.capacity_class(fleet, env, region, pool_name),
            max_size=pool.max_size,
            taints=tuple((t.key, t.value, t.effect) for t in pool.taints),
            checkpoint_grace=pool.checkpoint_grace,
            block_window=_block_window(pool, region),
            asg_name=outputs.group_name,
        )
    return PlatformArgs(
        names=names,
        region=region,
        cluster_name=cluster_name,
        kubernetes_version=fleet.environments[env].kubernetes.version,
        provider=provider,
        pools=pools,
        teams={t: TeamView(namespace=fleet.team_namespace(t), group=team_group(t)) for t in fleet.teams},
        sites={
            name: SiteView(
                gpu_nodes=site.gpu_nodes,
                gpus_per_node=site.gpus_per_node,
                gpu_model=site.gpu_model,
                gpu_labels=gpu_health.site_gpu_labels(site, fleet.environments[env].gpu_product_label),
                repair_share=site.gpu_check.repair_share,
                pod_cidr=str(sites.site_pods(plan, name)),
                asn=site.asn,
                gateway_ip=str(hybrid_routing.gateway_lan_ip(sites.site_lan(plan, name))),
                # The taint dlinfra/render/nodeadm.py registers GPU machines with, as on the cloud GPU pools.
                taints=(SITE_GPU_TAINT,) if site.gpu_nodes else (),
            )
            for name, site in fleet.sites_of(env, region).items()
        },
        quotas=quota_plan.region(region),
        overflow=kueue.overflow(fleet, quota_plan, source=fleet_file),
        multikueue_kubeconfigs=dict(multikueue_kubeconfigs or {}),
        kubeconfig=kubeconfig,
        job_operators=fleet.environments[env].kubernetes.job_operators,
        efs_file_system_id=efs_file_system_id,
        efs_access_point_ids=efs_access_point_ids,
        efs_volumes=team_storage.plan(fleet, env).volumes,
        termination_queue_url=termination_queue_url,
        kube_dns_ip=dns.kube_dns_ip(str(plan.cidr(f"service/{env}/{region}"))),
    )


def _block_window(pool: NodePool, region: str) -> tuple[datetime.datetime, datetime.datetime] | None:
    """When the flavor of the pool's Capacity Block in `region` admits work (components/block_flavors.flavor_window);
    None where the pool has no block there."""
    block = pool.capacity_reservations.get(region)
    window = block.block_window() if block else None
    return flavor_window(*window, pool.checkpoint_grace) if window else None
