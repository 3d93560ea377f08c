"""The EKS cluster of a regional stack, with hybrid-node access for the sites homed on the region."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components.cluster import Cluster, ClusterArgs
from components.hybrid import HybridNodes, HybridNodesArgs
from dlinfra.errors import DlinfraError
from dlinfra.model import instances
from dlinfra.model import sites as site_networks
from stacks.context import StackContext


@dataclass(frozen=True)
class ClusterParts:
    """What the regional stack gets back: the cluster and, when sites are homed here, their hybrid nodes."""

    cluster: Cluster
    hybrid: HybridNodes | None


def declare_cluster(
    ctx: StackContext,
    *,
    vpc_id: pulumi.Input[str],
    private_subnet_ids: dict[str, pulumi.Input[str]],
    log_kms_key_arn: pulumi.Input[str] | None = None,
    laptop_security_group_id: pulumi.Input[str] | None = None,
    lustre_security_group_id: pulumi.Input[str] | None = None,
    efs_file_system_arn: pulumi.Input[str] | None = None,
    efs_read_only_access_point_arns: Sequence[pulumi.Input[str]] = (),
    provider: pulumi.ProviderResource,
) -> ClusterParts:
    """Declare EKS with access for admins, teams and the region's physical sites (node pools add their own)."""
    env, region = ctx.role.environment, ctx.role.region
    assert region is not None
    spec = ctx.fleet.environments[env]
    upgrade_policy = spec.kubernetes.upgrade_policy
    if upgrade_policy is None:  # the fleet model refuses this; dlinfra never picks the policy for the lab
        raise DlinfraError("required: `standard` or `extended`", key=f"environments.{env}.kubernetes.upgrade_policy")
    plan = ctx.plan
    sites = ctx.fleet.sites_of(env, region)
    env_sites = ctx.fleet.sites_of(env)
    api_clients = [str(plan.vpc(env, r)) for r in spec.regions]
    api_clients += [str(plan.cidr(f"site-lan/{s}")) for s in env_sites]
    # Hybrid pods call the API too (webhooks, in-cluster clients): EKS guide "Prepare networking for hybrid nodes".
    api_clients += [str(plan.cidr(f"hybrid-pods/{s}")) for s in env_sites]
    if spec.client_vpn:
        api_clients.append(str(plan.cidr(f"client-vpn/{env}/{region}")))
    cluster_name = ctx.names.physical("eks")
    hybrid = None
    machines = {name: site.gpu_nodes for name, site in sites.items() if site.gpu_nodes > 0}
    # The hybrid role comes first (the cluster's access entries name it), so its policy names the cluster's ARN.
    invoke = pulumi.InvokeOutputOptions(provider=provider)
    cluster_arn = pulumi.Output.concat(
        "arn:",
        aws.get_partition_output(opts=invoke).partition,
        ":eks:",
        region,
        ":",
        aws.get_caller_identity_output(opts=invoke).account_id,
        ":cluster/",
        cluster_name,
    )
    if machines:
        hybrid = HybridNodes(
            "hybrid",
            HybridNodesArgs(
                names=ctx.names,
                cluster_name=cluster_name,
                cluster_arn=cluster_arn,
                machines=machines,
                activation_expiry={
                    name: site.activation_expiry.isoformat().replace("+00:00", "Z")
                    for name, site in sites.items()
                    if site.activation_expiry is not None and site.gpu_nodes > 0
                },
            ),
            opts=pulumi.ResourceOptions(providers=[provider]),
        )
    # The region at its largest, which CoreDNS's autoscaler bound is sized for. Site machines' cores are not in the
    # fleet; their node count is.
    pools = ctx.fleet.pools_in(env, region)
    max_nodes = sum(p.max_size for p in pools.values()) + sum(s.gpu_nodes for s in sites.values())
    max_cores = sum(
        p.max_size * instances.lookup(ctx.fleet.pool_types(env, region, name)[0]).vcpus for name, p in pools.items()
    )
    cluster = Cluster(
        "cluster",
        ClusterArgs(
            names=ctx.names,
            version=spec.kubernetes.version,
            upgrade_policy=upgrade_policy,
            vpc_id=vpc_id,
            subnet_ids=private_subnet_ids,
            service_cidr=str(plan.cidr(f"service/{env}/{region}")),
            api_client_cidrs=api_clients,
            remote_node_cidrs=[str(plan.cidr(f"site-lan/{s}")) for s in sorted(sites)],
            remote_pod_cidrs=[str(plan.cidr(f"hybrid-pods/{s}")) for s in sorted(sites)],
            public_access_cidrs=[str(c) for c in spec.kubernetes.public_access_cidrs],
            admin_role_arns=spec.kubernetes.admin_role_arns,
            ci_apply_role_arn=spec.ci.apply_role_arn if spec.ci else None,
            ci_preview_role_arn=spec.ci.preview_role_arn if spec.ci else None,
            hybrid_role_arn=hybrid.role_arn if hybrid else None,
            team_role_arns={t: team.role_arn for t, team in ctx.fleet.teams.items() if team.role_arn},
            log_kms_key_arn=log_kms_key_arn,
            node_peer_cidrs=[
                str(d.cidr)
                for d in site_networks.environment_networks(ctx.fleet, plan, env)
                if d.cidr != plan.vpc(env, region)
            ],
            laptop_security_group_id=laptop_security_group_id,
            lustre_security_group_id=lustre_security_group_id,
            efs_file_system_arn=efs_file_system_arn,
            efs_read_only_access_point_arns=efs_read_only_access_point_arns,
            max_nodes=max_nodes,
            max_cores=max_cores,
        ),
        opts=pulumi.ResourceOptions(providers=[provider]),
    )
    return ClusterParts(cluster=cluster, hybrid=hybrid)
