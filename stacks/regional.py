"""What a regional stack (`<env>-<region>`) declares and exports."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components.ci_runner import CiRunner, CiRunnerArgs
from components.client_vpn import ClientVpn, ClientVpnArgs
from components.network import Network, NetworkArgs
from components.platform_aws import PlatformAws, PlatformAwsArgs, PoolGroup
from components.site_vpn import SiteVpn, SiteVpnArgs
from components.transit import TransitHub, TransitHubArgs
from dlinfra.model import ci, dns, planner, sites, stackroles, team_storage
from dlinfra.model.fleet.checks import ADMINS_ACCESS_KEY
from dlinfra.model.fleet.schema import Environment
from stacks.cluster import declare_cluster
from stacks.compute import declare_block_windows, declare_pools
from stacks.context import StackContext, aws_provider
from stacks.dev_boxes import declare_dev_boxes
from stacks.storage import declare_storage


def declare(ctx: StackContext) -> None:
    """Declare the region's components and export what the global stack and site rendering read."""
    env, region = ctx.role.environment, ctx.role.region
    assert region is not None
    fleet, plan, names = ctx.fleet, ctx.plan, ctx.names
    environment = fleet.environments[env]
    # Every AWS resource of the stack goes through this provider, so the region is the stack name's, whatever
    # the profile or environment of whoever runs `pulumi up` says (default providers are disabled).
    provider = aws_provider(region)
    in_region = pulumi.ResourceOptions(providers=[provider])
    region_spec = environment.regions[region]
    vpc_cidr = str(plan.vpc(env, region))
    network = Network(
        "network",
        NetworkArgs(
            names=names,
            vpc_cidr=vpc_cidr,
            subnets={
                tier: {az: str(cidr) for az, cidr in plan.subnets(env, region, tier).items()}
                for tier in planner.SUBNET_TIERS
            },
            zone_ids={az: fleet.zone_id(region, az) for az in fleet.azs(region)},
            nat=environment.nat,
            cluster_name=names.physical("eks"),
        ),
        opts=in_region,
    )
    # Everything of the environment beyond this VPC: the other regions' VPCs and every site's networks.
    remote = {d.key: str(d.cidr) for d in sites.environment_networks(fleet, plan, env) if d.key != f"vpc-{region}"}
    transit = TransitHub(
        "transit",
        TransitHubArgs(
            names=names,
            vpc_id=network.vpc_id,
            vpc_cidr=vpc_cidr,
            transit_subnet_ids=network.subnet_ids["transit"],
            private_route_table_ids=network.private_route_table_ids,
            amazon_side_asn=region_spec.transit_asn,
            remote_cidrs=remote,
        ),
        opts=in_region,
    )
    site_vpns: dict[str, pulumi.Output[dict[str, object]]] = {}
    for site_name, site in fleet.sites_of(env, region).items():
        tunnel1, tunnel2 = sites.tunnel_cidrs(plan, site_name)
        vpn = SiteVpn(
            f"site-{site_name}",
            SiteVpnArgs(
                names=names,
                site=site_name,
                public_ip=str(site.public_ip),
                asn=site.asn,
                routing=site.routing,
                transit_gateway_id=transit.transit_gateway_id,
                transit_route_table_id=transit.route_table_id,
                transit_asn=region_spec.transit_asn,
                lan_cidr=str(sites.site_lan(plan, site_name)),
                pod_cidr=str(sites.site_pods(plan, site_name)),
                tunnel_inside_cidrs=(str(tunnel1), str(tunnel2)),
                remote_cidrs=[str(c) for c in sites.site_remote_cidrs(fleet, plan, site_name)],
                log_kms_key_arn=network.log_key_arn,
            ),
            opts=in_region,
        )
        site_vpns[site_name] = vpn.connection

    pulumi.export("environment", env)
    pulumi.export("region", region)
    pulumi.export("vpc_id", network.vpc_id)
    pulumi.export("vpc_cidr", network.vpc_cidr)
    pulumi.export("private_subnet_ids", network.private_subnet_ids)
    pulumi.export("public_subnet_ids", network.public_subnet_ids)
    pulumi.export("transit_subnet_ids", network.transit_subnet_ids)
    pulumi.export("route_table_ids", network.route_table_ids)
    pulumi.export("nat_gateway_ids", network.nat_gateway_ids)
    pulumi.export("vpc_endpoint_ids", network.vpc_endpoint_ids)
    pulumi.export("log_key_arn", network.log_key_arn)
    pulumi.export("transit_gateway_id", transit.transit_gateway_id)
    pulumi.export("transit_route_table_id", transit.route_table_id)
    pulumi.export("transit_asn", transit.amazon_side_asn)
    # Secret as a whole (it holds the tunnels' pre-shared keys): `dlinfra site render` reads it from
    # `pulumi stack output --json --show-secrets`.
    pulumi.export("site_vpns", site_vpns)

    # Before the cluster: its node security group admits the laptops' interfaces by group.
    laptop_group = endpoint_id = None
    if environment.client_vpn is not None:
        saml = environment.client_vpn.saml
        groups = {t: team.vpn_group for t, team in fleet.teams.items() if team.vpn_group} if saml else {}
        if saml is not None and saml.admin_group:
            groups[ADMINS_ACCESS_KEY] = saml.admin_group
        client_vpn = ClientVpn(
            "client-vpn",
            ClientVpnArgs(
                names=names,
                vpc_id=network.vpc_id,
                vpc_cidr=vpc_cidr,
                client_cidr=str(plan.cidr(f"client-vpn/{env}/{region}")),
                subnet_ids=network.subnet_ids["private"],
                remote_cidrs=remote,
                log_kms_key_arn=network.log_key_arn,
                saml_provider_arn=saml.provider_arn if saml else None,
                self_service_saml_provider_arn=saml.self_service_provider_arn if saml else None,
                access_groups=groups,
                users=environment.client_vpn.users,
            ),
            opts=in_region,
        )
        laptop_group, endpoint_id = client_vpn.security_group_id, client_vpn.endpoint_id
        pulumi.export("client_vpn_endpoint_id", client_vpn.endpoint_id)
        pulumi.export("client_vpn_dns_name", client_vpn.dns_name)
        pulumi.export("client_vpn_server_name", client_vpn.server_name)
        pulumi.export("client_vpn_ca_cert_pem", client_vpn.ca_cert_pem)
        pulumi.export("client_vpn_authentication", client_vpn.authentication)
        # Secret: each person's certificate and key; `dlinfra vpn profile --user NAME` renders one profile.
        pulumi.export("client_vpn_users", client_vpn.user_credentials)

    private = network.subnet_ids["private"]
    storage = declare_storage(ctx, vpc_id=network.vpc_id, private_subnet_ids=private, provider=provider)
    parts = declare_cluster(
        ctx,
        vpc_id=network.vpc_id,
        private_subnet_ids=private,
        log_kms_key_arn=network.log_key_arn,
        laptop_security_group_id=laptop_group,
        lustre_security_group_id=storage.lustre_security_group_id,
        efs_file_system_arn=storage.efs_arn,
        # The datasets are read-only to the cluster, down to EFS: the node's role may not write through them.
        efs_read_only_access_point_arns=[storage.access_point_arns.apply(lambda arns: arns[team_storage.DATASETS])],
        provider=provider,
    )
    cluster = parts.cluster
    pools = declare_pools(ctx, vpc_id=network.vpc_id, private_subnet_ids=private, cluster=cluster, provider=provider)
    declare_block_windows(ctx, pools, log_kms_key_arn=network.log_key_arn, provider=provider)
    pulumi.export("node_pools", {name: pool.group_name for name, pool in pools.items()})
    pulumi.export("storage_kms_key_arn", storage.kms_key_arn)
    pulumi.export("efs_id", storage.efs_id)
    # Access point ids by key (dlinfra.model.team_storage): the in-cluster stack's volumes name them.
    pulumi.export("efs_access_points", storage.access_point_ids)
    pulumi.export("buckets", storage.bucket_names)
    if storage.fsx_id is not None:
        pulumi.export("fsx_id", storage.fsx_id)
    boxes = declare_dev_boxes(
        ctx,
        vpc_id=network.vpc_id,
        private_subnet_ids=private,
        laptop_security_group_id=laptop_group,
        client_vpn_endpoint_id=endpoint_id,
        storage=storage,
        provider=provider,
    )
    if boxes:
        # The ssh config of docs/dev-boxes.md and docs/researchers.md reads these (`pulumi stack output dev_boxes`).
        pulumi.export(
            "dev_boxes",
            {
                person: {"instance_id": b.instance_id, "private_ip": b.private_ip, "private_dns": b.private_dns}
                for person, b in boxes.items()
            },
        )
    pulumi.export("cluster_name", cluster.name)
    # What every kubelet points pods at; `dlinfra site render` writes it into the hybrid nodes' NodeConfig.
    pulumi.export("cluster_dns", list(dns.node_dns_servers(str(plan.cidr(f"service/{env}/{region}")))))
    pulumi.export("cluster_endpoint", cluster.endpoint)
    pulumi.export("cluster_certificate_authority", cluster.certificate_authority)
    platform = PlatformAws(
        "platform",
        PlatformAwsArgs(
            names=names,
            cluster_name=cluster.name,
            pools={name: PoolGroup(name=pool.group_name, arn=pool.group_arn) for name, pool in pools.items()},
            team_namespaces={team: fleet.team_namespace(team) for team in fleet.teams},
            team_prefixes=team_storage.plan(fleet, env).s3_prefixes,
            bucket_arns=storage.bucket_arns,
            storage_key_arn=storage.kms_key_arn,
            team_role_arns={team: spec.role_arn for team, spec in fleet.teams.items() if spec.role_arn},
            account=_stack_account(environment, provider),
        ),
        opts=pulumi.ResourceOptions(providers=[provider], depends_on=[cluster]),
    )
    # Read by the in-cluster stack (`<env>-<region>-k8s`) through StackReference.
    pulumi.export("termination_queue_url", platform.termination_queue_url)
    # Each team's `dlinfra run` upload policy: a lab whose teams sign in with IAM Identity Center adds it, by name, to
    # the team's permission set (docs/researchers.md, "What the lab declares for this").
    pulumi.export("team_run_policy_arns", platform.team_run_policy_arns)
    if environment.ci is not None:
        # The runners that apply (apply.yml, job k8s) and, where pull requests get real previews, preview (preview.yml,
        # job preview-in-vpc) this region's in-cluster stack from inside the VPC: separate projects and roles.
        purposes = [p for p in ci.PURPOSES if p == "apply" or environment.ci.pull_request_preview]
        runners = {
            purpose: CiRunner(
                stackroles.RUNNER_COMPONENTS[purpose],
                CiRunnerArgs(
                    names=names,
                    purpose=purpose,
                    filters=ci.webhook_filters(purpose, actor_ids=environment.ci.runner_actor_ids),
                    vpc_id=network.vpc_id,
                    vpc_cidr=vpc_cidr,
                    subnet_ids=private,
                    repository=environment.ci.repository,
                    connection_arn=environment.ci.connection_arn,
                    log_kms_key_arn=network.log_key_arn,
                ),
                opts=in_region,
            )
            for purpose in purposes
        }
        pulumi.export("ci_runner_projects", {p: r.project_name for p, r in runners.items()})
        pulumi.export("ci_runner_labels", {p: r.runner_label for p, r in runners.items()})
    if parts.hybrid is not None:
        pulumi.export("hybrid_role_arn", parts.hybrid.role_arn)
        # Secret: `dlinfra site render` turns it into each site's nodeadm NodeConfig.
        pulumi.export("hybrid_activations", parts.hybrid.activations)


def _stack_account(environment: Environment, provider: aws.Provider) -> str:
    """The account this stack applies to: the fleet's (`account`), else that of the role CI applies it with (a role
    of the account it applies to), else the caller's. The `dlinfra run` upload policy is attached to a team role by
    the role's name, so a team role of another account must never be attached here (run_policy_attachable)."""
    if environment.account:
        return environment.account
    if environment.ci is not None:
        return environment.ci.apply_role_arn.split(":")[4]
    return str(aws.get_caller_identity(opts=pulumi.InvokeOptions(provider=provider)).account_id)
