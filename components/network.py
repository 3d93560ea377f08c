"""Network: a regional VPC from the address plan with per-AZ subnets for each tier."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import pulumi
import pulumi_aws as aws

from dlinfra.naming import Names

TIERS = ("private", "public", "transit")


@dataclass(frozen=True, kw_only=True)
class NetworkArgs:
    names: Names  # naming and tags of this stack
    vpc_cidr: str  # planned VPC block (dlinfra.planner), never computed here
    subnets: Mapping[str, Mapping[str, str]]  # tier -> AZ name -> planned CIDR; tiers: private, public, transit
    nat: Literal["per_az", "single"] = "per_az"  # NAT gateway per AZ, or one for the whole VPC

    def __post_init__(self) -> None:
        if set(self.subnets) != set(TIERS):
            raise ValueError(f"subnets: need tiers {', '.join(TIERS)}, got {', '.join(sorted(self.subnets))}")
        azs = {tier: set(by_az) for tier, by_az in self.subnets.items()}
        if len({frozenset(v) for v in azs.values()}) != 1 or not azs["private"]:
            raise ValueError(f"subnets: every tier needs the same, non-empty set of AZs, got {azs}")


class Network(pulumi.ComponentResource):
    """VPC and subnets of one regional stack."""

    vpc_id: pulumi.Output[str]
    vpc_cidr: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[dict[str, str]]
    public_subnet_ids: pulumi.Output[dict[str, str]]
    transit_subnet_ids: pulumi.Output[dict[str, str]]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:network:Network", name, None, opts)
        names = args.names
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
        subnet_ids: dict[str, dict[str, pulumi.Output[str]]] = {}
        for tier, by_az in args.subnets.items():
            subnet_ids[tier] = {}
            for az, cidr in sorted(by_az.items()):
                subnet_name = names.physical(tier, az.removeprefix(names.region or ""))
                subnet = aws.ec2.Subnet(
                    f"{name}-{tier}-{az}",
                    vpc_id=vpc.id,
                    cidr_block=cidr,
                    availability_zone=az,
                    map_public_ip_on_launch=False,
                    tags=names.tags("network", subnet_name, _subnet_role_tags(tier)),
                    opts=pulumi.ResourceOptions(parent=vpc),
                )
                subnet_ids[tier][az] = subnet.id
        self.vpc_id = vpc.id
        self.vpc_cidr = vpc.cidr_block
        self.private_subnet_ids = pulumi.Output.all(**subnet_ids["private"]).apply(dict)
        self.public_subnet_ids = pulumi.Output.all(**subnet_ids["public"]).apply(dict)
        self.transit_subnet_ids = pulumi.Output.all(**subnet_ids["transit"]).apply(dict)
        _ = child
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "vpc_cidr": self.vpc_cidr,
                "private_subnet_ids": self.private_subnet_ids,
                "public_subnet_ids": self.public_subnet_ids,
                "transit_subnet_ids": self.transit_subnet_ids,
            }
        )


def _subnet_role_tags(tier: str) -> dict[str, str]:
    """Tags EKS and the AWS Load Balancer Controller look for to place load balancers."""
    if tier == "public":
        return {"kubernetes.io/role/elb": "1", "dlinfra:tier": tier}
    if tier == "private":
        return {"kubernetes.io/role/internal-elb": "1", "dlinfra:tier": tier}
    return {"dlinfra:tier": tier}
