"""TransitHub: a region's transit gateway, its route table, the VPC attachment and the VPC's routes to it."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from dlinfra.model.naming import Names

# Amazon-side ASNs AWS accepts for a transit gateway (private 16- and 32-bit ranges).
_AMAZON_ASN_RANGES = ((64512, 65534), (4200000000, 4294967294))


@dataclass(frozen=True, kw_only=True)
class TransitHubArgs:
    names: Names  # naming and tags of this (regional) stack
    vpc_id: pulumi.Input[str]  # the region's VPC (Network.vpc_id)
    vpc_cidr: str  # planned VPC block; remote CIDRs must not overlap it
    transit_subnet_ids: Mapping[str, pulumi.Input[str]]  # AZ -> transit-tier subnet (one TGW ENI per AZ)
    private_route_table_ids: Mapping[str, pulumi.Input[str]]  # AZ -> private route table; gets remote routes
    amazon_side_asn: int  # the TGW's BGP ASN (fleet: environments.<env>.regions.<region>.transit_asn)
    remote_cidrs: Mapping[str, str]  # key (vpc-<region>, lan-<site>, ...) -> planned CIDR, routed via the TGW

    def __post_init__(self) -> None:
        if not self.transit_subnet_ids:
            raise ValueError("transit_subnet_ids: at least one AZ's transit subnet is needed")
        if not self.private_route_table_ids:
            raise ValueError("private_route_table_ids: at least one private route table is needed")
        if not any(lo <= self.amazon_side_asn <= hi for lo, hi in _AMAZON_ASN_RANGES):
            raise ValueError(
                f"amazon_side_asn: {self.amazon_side_asn} is not a private ASN (64512-65534 or 4200000000-4294967294)"
            )
        vpc = ipaddress.IPv4Network(self.vpc_cidr)
        seen: dict[ipaddress.IPv4Network, str] = {}
        for key, cidr in self.remote_cidrs.items():
            net = ipaddress.IPv4Network(cidr)
            if net.overlaps(vpc):
                raise ValueError(f"remote_cidrs.{key}: {net} overlaps the VPC's own {vpc}")
            clash = next((k for n, k in seen.items() if n.overlaps(net)), None)
            if clash is not None:
                raise ValueError(f"remote_cidrs.{key}: {net} overlaps remote_cidrs.{clash}")
            seen[net] = key


class TransitHub(pulumi.ComponentResource):
    """Transit gateway of one region: explicit route table (no defaults), VPC attachment, VPC routes."""

    transit_gateway_id: pulumi.Output[str]
    route_table_id: pulumi.Output[str]
    vpc_attachment_id: pulumi.Output[str]
    amazon_side_asn: pulumi.Output[int]

    def __init__(self, name: str, args: TransitHubArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:transit:TransitHub", name, None, opts)
        names = args.names
        child = pulumi.ResourceOptions(parent=self)
        tgw_name = names.physical("tgw")
        # Default association and propagation stay off: every attachment (VPC, VPN, peering) is associated
        # with our own route table explicitly, so nothing is routed that this code did not declare.
        tgw = aws.ec2transitgateway.TransitGateway(
            f"{name}-tgw",
            description=f"{names.prefix} transit hub: VPC, site VPNs and peering to the other regions",
            amazon_side_asn=args.amazon_side_asn,
            default_route_table_association="disable",
            default_route_table_propagation="disable",
            auto_accept_shared_attachments="disable",
            dns_support="enable",
            vpn_ecmp_support="enable",
            tags=names.tags("transit", tgw_name),
            opts=child,
        )
        route_table = aws.ec2transitgateway.RouteTable(
            f"{name}-rt",
            transit_gateway_id=tgw.id,
            tags=names.tags("transit", names.physical("tgw", "rt")),
            opts=child,
        )
        attachment = aws.ec2transitgateway.VpcAttachment(
            f"{name}-vpc-attachment",
            transit_gateway_id=tgw.id,
            vpc_id=args.vpc_id,
            subnet_ids=[args.transit_subnet_ids[az] for az in sorted(args.transit_subnet_ids)],
            dns_support="enable",
            appliance_mode_support="disable",
            transit_gateway_default_route_table_association=False,
            transit_gateway_default_route_table_propagation=False,
            tags=names.tags("transit", names.physical("tgw", "vpc")),
            opts=child,
        )
        aws.ec2transitgateway.RouteTableAssociation(
            f"{name}-vpc-association",
            transit_gateway_attachment_id=attachment.id,
            transit_gateway_route_table_id=route_table.id,
            opts=child,
        )
        # The VPC's CIDR reaches the table by propagation: sites (BGP) learn it, peers get static routes.
        aws.ec2transitgateway.RouteTablePropagation(
            f"{name}-vpc-propagation",
            transit_gateway_attachment_id=attachment.id,
            transit_gateway_route_table_id=route_table.id,
            opts=child,
        )
        # A route to a transit gateway is only accepted once the gateway is attached to the VPC.
        after_attachment = pulumi.ResourceOptions(parent=self, depends_on=[attachment])
        for az, table_id in sorted(args.private_route_table_ids.items()):
            for key, cidr in sorted(args.remote_cidrs.items()):
                aws.ec2.Route(
                    f"{name}-route-{az}-{key}",
                    route_table_id=table_id,
                    destination_cidr_block=cidr,
                    transit_gateway_id=tgw.id,
                    opts=after_attachment,
                )
        self.transit_gateway_id = tgw.id
        self.route_table_id = route_table.id
        self.vpc_attachment_id = attachment.id
        # The engine may hand numbers back as floats; the ASN is an integer.
        self.amazon_side_asn = tgw.amazon_side_asn.apply(
            lambda asn: int(asn if asn is not None else args.amazon_side_asn)
        )
        self.register_outputs(
            {
                "transit_gateway_id": self.transit_gateway_id,
                "route_table_id": self.route_table_id,
                "vpc_attachment_id": self.vpc_attachment_id,
                "amazon_side_asn": self.amazon_side_asn,
            }
        )
