"""Network: a regional VPC from the address plan: subnets per AZ and tier, egress, endpoints and flow logs."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import pulumi
import pulumi_aws as aws

from components.iam import protected_key
from dlinfra.model.naming import Names

TIERS = ("private", "public", "transit")
# Interface endpoints every node pool needs without a NAT hop: image pulls (ECR), IRSA/Pod Identity (STS),
# Session Manager (SSM), logs and EFS mounts by DNS name.
DEFAULT_INTERFACE_ENDPOINTS = (
    "ecr.api",
    "ecr.dkr",
    "sts",
    "ssm",
    "ssmmessages",
    "ec2messages",
    "logs",
    "elasticfilesystem",
)
# Retention periods CloudWatch Logs accepts (days).
LOG_RETENTION_DAYS = frozenset(
    {1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653}
)


@dataclass(frozen=True, kw_only=True)
class NetworkArgs:
    names: Names  # naming and tags of this (regional) stack; names.region is the VPC's region
    vpc_cidr: str  # planned VPC block (dlinfra.model.planner), never computed here
    subnets: Mapping[str, Mapping[str, str]]  # tier (private, public, transit) -> AZ -> planned CIDR
    # AZ -> zone id (Fleet.zone_id): subnets are placed by zone id, the same zone in every account, since AZ names
    # map to zones per account (dlinfra/data/regions.yaml); EKS, reservations and Lustre then land where planned.
    zone_ids: Mapping[str, str]
    nat: Literal["per_az", "single"] = "per_az"  # NAT gateway per AZ, or one (in the first AZ) for the VPC
    cluster_name: str | None = None  # EKS cluster sharing the subnets (kubernetes.io/cluster/<name>=shared)
    interface_endpoints: Sequence[str] = DEFAULT_INTERFACE_ENDPOINTS  # services: com.amazonaws.<region>.X
    flow_log_retention_days: int = 365  # days VPC flow logs are kept; a value CloudWatch Logs accepts

    def __post_init__(self) -> None:
        if not self.names.region:
            raise ValueError("names: a Network belongs to a regional stack; names.region is not set")
        try:
            vpc = ipaddress.IPv4Network(self.vpc_cidr)
        except ValueError as exc:
            raise ValueError(f"vpc_cidr: {self.vpc_cidr!r} is not an IPv4 CIDR ({exc})") from None
        if set(self.subnets) != set(TIERS):
            raise ValueError(f"subnets: need tiers {', '.join(TIERS)}, got {', '.join(sorted(self.subnets))}")
        azs = {tier: set(by_az) for tier, by_az in self.subnets.items()}
        if len({frozenset(v) for v in azs.values()}) != 1 or not azs["private"]:
            raise ValueError(f"subnets: every tier needs the same, non-empty set of AZs, got {azs}")
        for tier, by_az in self.subnets.items():
            for az, cidr in by_az.items():
                if not az.startswith(self.names.region):
                    raise ValueError(f"subnets.{tier}.{az}: not an AZ of {self.names.region}")
                if not ipaddress.IPv4Network(cidr).subnet_of(vpc):
                    raise ValueError(f"subnets.{tier}.{az}: {cidr} is outside vpc_cidr {vpc}")
        missing = sorted(set(self.azs) - set(self.zone_ids))
        if missing:
            raise ValueError(f"zone_ids: no zone id for {', '.join(missing)}")
        if self.nat not in ("per_az", "single"):
            raise ValueError(f"nat: must be 'per_az' or 'single', got {self.nat!r}")
        if isinstance(self.interface_endpoints, str) or len(set(self.interface_endpoints)) != len(
            self.interface_endpoints
        ):
            raise ValueError(
                f"interface_endpoints: need a sequence of distinct names, got {self.interface_endpoints!r}"
            )
        if self.flow_log_retention_days not in LOG_RETENTION_DAYS:
            raise ValueError(
                f"flow_log_retention_days: {self.flow_log_retention_days} is not a CloudWatch Logs retention "
                f"period ({', '.join(map(str, sorted(LOG_RETENTION_DAYS)))})"
            )

    @property
    def azs(self) -> list[str]:
        """The AZs of the VPC, sorted."""
        return sorted(self.subnets["private"])


class Network(pulumi.ComponentResource):
    """VPC of one regional stack: subnets, internet and NAT egress, route tables, endpoints and flow logs."""

    vpc_id: pulumi.Output[str]
    vpc_cidr: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[dict[str, str]]
    public_subnet_ids: pulumi.Output[dict[str, str]]
    transit_subnet_ids: pulumi.Output[dict[str, str]]
    subnet_ids: dict[str, dict[str, pulumi.Output[str]]]  # tier -> AZ -> id, for per-AZ children elsewhere
    private_route_table_ids: dict[str, pulumi.Output[str]]  # AZ -> private table (gets transit routes)
    route_table_ids: pulumi.Output[dict[str, dict[str, str]]]  # tier -> AZ -> route table id
    nat_gateway_ids: pulumi.Output[dict[str, str]]  # AZ the NAT gateway lives in -> id
    nat_public_ips: pulumi.Output[dict[str, str]]  # AZ -> the NAT gateway's Elastic IP
    vpc_endpoint_ids: pulumi.Output[dict[str, str]]  # service suffix (s3, ecr.api, ...) -> endpoint id
    log_key_arn: pulumi.Output[str]  # KMS key that CloudWatch log groups of this region encrypt with
    flow_log_group_name: pulumi.Output[str]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:network:Network", name, None, opts)
        names = args.names
        region = names.region or ""
        child = pulumi.ResourceOptions(parent=self)
        vpc_name = names.physical("vpc")
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=args.vpc_cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags=names.tags("network", vpc_name),
            opts=child,
        )
        # Adopt the VPC's default security group with no rules, so nothing attached to it by accident talks.
        aws.ec2.DefaultSecurityGroup(
            f"{name}-default-sg",
            vpc_id=vpc.id,
            tags=names.tags("network", names.physical("default-sg-closed")),
            opts=pulumi.ResourceOptions(parent=vpc),
        )
        subnet_ids: dict[str, dict[str, pulumi.Output[str]]] = {}
        for tier, by_az in args.subnets.items():
            subnet_ids[tier] = {}
            for az, cidr in sorted(by_az.items()):
                subnet_name = names.physical(tier, az.removeprefix(region))
                subnet = aws.ec2.Subnet(
                    f"{name}-{tier}-{az}",
                    vpc_id=vpc.id,
                    cidr_block=cidr,
                    # By zone id, not name: the name is dlinfra's label and may be another zone in this account
                    # (AWS RAM guide, "Availability Zone IDs for your AWS resources"; pulumi-aws Subnet
                    # availability_zone_id).
                    availability_zone_id=args.zone_ids[az],
                    map_public_ip_on_launch=False,
                    tags=names.tags("network", subnet_name, _subnet_role_tags(tier, args.cluster_name)),
                    opts=pulumi.ResourceOptions(parent=vpc),
                )
                subnet_ids[tier][az] = subnet.id

        # Egress: the internet gateway for public subnets, NAT gateways (with Elastic IPs) in them.
        igw = aws.ec2.InternetGateway(
            f"{name}-igw", vpc_id=vpc.id, tags=names.tags("network", names.physical("igw")), opts=child
        )
        nat_azs = args.azs if args.nat == "per_az" else args.azs[:1]
        nats: dict[str, aws.ec2.NatGateway] = {}
        eips: dict[str, aws.ec2.Eip] = {}
        for az in nat_azs:
            nat_name = names.physical("nat", az.removeprefix(region))
            eips[az] = aws.ec2.Eip(
                f"{name}-nat-eip-{az}", domain="vpc", tags=names.tags("network", nat_name), opts=child
            )
            nats[az] = aws.ec2.NatGateway(
                f"{name}-nat-{az}",
                allocation_id=eips[az].allocation_id,
                subnet_id=subnet_ids["public"][az],
                connectivity_type="public",
                tags=names.tags("network", nat_name),
                # AWS needs the internet gateway attached before a public NAT gateway can work.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]),
            )

        # Route tables. Routes are separate aws.ec2.Route resources, never inline `routes=`: the transit
        # hub adds routes to the private tables, and inline routes would fight over them on every update.
        public_rt = aws.ec2.RouteTable(
            f"{name}-rt-public",
            vpc_id=vpc.id,
            tags=names.tags("network", names.physical("rt", "public")),
            opts=child,
        )
        aws.ec2.Route(
            f"{name}-route-public-default",
            route_table_id=public_rt.id,
            destination_cidr_block="0.0.0.0/0",
            gateway_id=igw.id,
            opts=child,
        )
        private_rts: dict[str, aws.ec2.RouteTable] = {}
        for az in args.azs:
            private_rts[az] = aws.ec2.RouteTable(
                f"{name}-rt-private-{az}",
                vpc_id=vpc.id,
                tags=names.tags("network", names.physical("rt", "private", az.removeprefix(region))),
                opts=child,
            )
            nat = nats.get(az) or nats[nat_azs[0]]
            aws.ec2.Route(
                f"{name}-route-private-{az}-default",
                route_table_id=private_rts[az].id,
                destination_cidr_block="0.0.0.0/0",
                nat_gateway_id=nat.id,
                opts=child,
            )
        # The transit tier only holds the transit gateway's attachment interfaces: the VPC's local route is
        # all it needs, and keeping it apart stops the NAT default route from applying to TGW traffic.
        transit_rt = aws.ec2.RouteTable(
            f"{name}-rt-transit",
            vpc_id=vpc.id,
            tags=names.tags("network", names.physical("rt", "transit")),
            opts=child,
        )
        table_of = {
            "public": {az: public_rt for az in args.azs},
            "private": private_rts,
            "transit": {az: transit_rt for az in args.azs},
        }
        for tier in TIERS:
            for az in args.azs:
                aws.ec2.RouteTableAssociation(
                    f"{name}-rta-{tier}-{az}",
                    subnet_id=subnet_ids[tier][az],
                    route_table_id=table_of[tier][az].id,
                    opts=child,
                )

        # Endpoints: S3 through the private route tables, the rest as interfaces in the private subnets.
        endpoint_ids: dict[str, pulumi.Output[str]] = {}
        s3 = aws.ec2.VpcEndpoint(
            f"{name}-endpoint-s3",
            vpc_id=vpc.id,
            service_name=f"com.amazonaws.{region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=[private_rts[az].id for az in args.azs],
            tags=names.tags("network", names.physical("vpce", "s3")),
            opts=child,
        )
        endpoint_ids["s3"] = s3.id
        endpoint_sg = aws.ec2.SecurityGroup(
            f"{name}-endpoints-sg",
            name=names.physical("vpce"),
            description="Interface VPC endpoints: HTTPS from inside the VPC only",
            vpc_id=vpc.id,
            tags=names.tags("network", names.physical("vpce")),
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-endpoints-sg-https",
            security_group_id=endpoint_sg.id,
            description="HTTPS from the VPC",
            ip_protocol="tcp",
            from_port=443,
            to_port=443,
            cidr_ipv4=args.vpc_cidr,
            tags=names.tags("network", names.physical("vpce", "https")),
            opts=child,
        )
        private_subnets = [subnet_ids["private"][az] for az in args.azs]
        for service in args.interface_endpoints:
            endpoint = aws.ec2.VpcEndpoint(
                f"{name}-endpoint-{service.replace('.', '-')}",
                vpc_id=vpc.id,
                service_name=f"com.amazonaws.{region}.{service}",
                vpc_endpoint_type="Interface",
                private_dns_enabled=True,
                subnet_ids=private_subnets,
                security_group_ids=[endpoint_sg.id],
                tags=names.tags("network", names.physical("vpce", service)),
                opts=child,
            )
            endpoint_ids[service] = endpoint.id

        # Flow logs to a CloudWatch log group encrypted with a customer-managed key (rotated yearly).
        identity = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self))
        partition = aws.get_partition_output(opts=pulumi.InvokeOutputOptions(parent=self))
        # Every log group of the region is encrypted with it: losing it loses their contents.
        log_key = protected_key(
            f"{name}-log-key",
            description=f"CloudWatch Logs encryption for {names.prefix}",
            tags=names.tags("network", names.physical("logs")),
            parent=self,
            statements=(_logs_statement(identity.account_id, partition.partition, region),),
        )
        aws.kms.Alias(
            f"{name}-log-key-alias",
            name=f"alias/{names.physical('logs')}",
            target_key_id=log_key.key_id,
            opts=child,
        )
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-flow-logs",
            name=f"/vpc-flow-logs/{vpc_name}",
            retention_in_days=args.flow_log_retention_days,
            kms_key_id=log_key.arn,
            tags=names.tags("network", vpc_name),
            opts=child,
        )
        role = aws.iam.Role(
            f"{name}-flow-logs-role",
            name=names.physical("flow-logs", max_len=64),
            description=f"VPC flow logs of {vpc_name} deliver to CloudWatch Logs",
            assume_role_policy=pulumi.Output.json_dumps(_flow_logs_trust(identity.account_id)),
            tags=names.tags("network", names.physical("flow-logs", max_len=64)),
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-flow-logs-policy",
            role=role.id,
            policy=pulumi.Output.json_dumps(_flow_logs_policy(log_group.arn)),
            opts=child,
        )
        aws.ec2.FlowLog(
            f"{name}-flow-log",
            vpc_id=vpc.id,
            traffic_type="ALL",
            log_destination_type="cloud-watch-logs",
            log_destination=log_group.arn,
            iam_role_arn=role.arn,
            max_aggregation_interval=60,
            tags=names.tags("network", vpc_name),
            opts=child,
        )

        self.vpc_id = vpc.id
        self.vpc_cidr = vpc.cidr_block
        self.subnet_ids = subnet_ids
        self.private_subnet_ids = _collect(subnet_ids["private"])
        self.public_subnet_ids = _collect(subnet_ids["public"])
        self.transit_subnet_ids = _collect(subnet_ids["transit"])
        self.private_route_table_ids = {az: rt.id for az, rt in private_rts.items()}
        self.route_table_ids = pulumi.Output.all(
            **{tier: _collect({az: rt.id for az, rt in by_az.items()}) for tier, by_az in table_of.items()}
        ).apply(dict)
        self.nat_gateway_ids = _collect({az: nat.id for az, nat in nats.items()})
        self.nat_public_ips = _collect({az: eip.public_ip for az, eip in eips.items()})
        self.vpc_endpoint_ids = _collect(endpoint_ids)
        self.log_key_arn = log_key.arn
        self.flow_log_group_name = log_group.name
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "vpc_cidr": self.vpc_cidr,
                "private_subnet_ids": self.private_subnet_ids,
                "public_subnet_ids": self.public_subnet_ids,
                "transit_subnet_ids": self.transit_subnet_ids,
                "route_table_ids": self.route_table_ids,
                "nat_gateway_ids": self.nat_gateway_ids,
                "nat_public_ips": self.nat_public_ips,
                "vpc_endpoint_ids": self.vpc_endpoint_ids,
                "log_key_arn": self.log_key_arn,
                "flow_log_group_name": self.flow_log_group_name,
            }
        )


def _collect(outputs: Mapping[str, pulumi.Input[str]]) -> pulumi.Output[dict[str, str]]:
    """One output of a mapping of outputs (keys sorted, so exports read the same every run)."""
    return pulumi.Output.all(**dict(sorted(outputs.items()))).apply(dict)


def _subnet_role_tags(tier: str, cluster_name: str | None) -> dict[str, str]:
    """Tags EKS and the AWS Load Balancer Controller look for to place load balancers and discover subnets."""
    tags = {"dlinfra:tier": tier}
    if tier == "public":
        tags["kubernetes.io/role/elb"] = "1"
    elif tier == "private":
        tags["kubernetes.io/role/internal-elb"] = "1"
    if cluster_name and tier in ("public", "private"):
        tags[f"kubernetes.io/cluster/{cluster_name}"] = "shared"
    return tags


def _logs_statement(account_id: pulumi.Input[str], partition: pulumi.Input[str], region: str) -> dict[str, object]:
    """Key policy statement: CloudWatch Logs uses the key for this account's log groups in this region."""
    log_groups = pulumi.Output.concat("arn:", partition, ":logs:", region, ":", account_id, ":log-group:*")
    return {
        "Sid": "CloudWatchLogsEncrypts",
        "Effect": "Allow",
        "Principal": {"Service": f"logs.{region}.amazonaws.com"},
        "Action": ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
        "Resource": "*",
        "Condition": {"ArnLike": {"kms:EncryptionContext:aws:logs:arn": log_groups}},
    }


def _flow_logs_trust(account_id: pulumi.Input[str]) -> dict[str, object]:
    """Only the VPC Flow Logs service, acting for this account (no confused deputy), assumes the role."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "vpc-flow-logs.amazonaws.com"},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": account_id}},
            }
        ],
    }


def _flow_logs_policy(log_group_arn: pulumi.Input[str]) -> dict[str, object]:
    """Write access to the one log group (and its streams)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                "Resource": [log_group_arn, pulumi.Output.concat(log_group_arn, ":*")],
            },
            {"Effect": "Allow", "Action": "logs:DescribeLogGroups", "Resource": "*"},
        ],
    }
