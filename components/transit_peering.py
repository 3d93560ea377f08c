"""TransitPeering: one edge of an environment's transit gateway mesh (two regions), with routes both ways."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from dlinfra.model.naming import Names, region_code


@dataclass(frozen=True, kw_only=True)
class PeerSide:
    """One end of a peering: a region's transit gateway and the networks that live behind it."""

    region: str  # AWS region of the transit gateway
    provider: pulumi.ProviderResource  # AWS provider for that region (logical name aws-<region>)
    transit_gateway_id: pulumi.Input[str]  # from the regional stack's exports
    route_table_id: pulumi.Input[str]  # the transit gateway's own route table (regional export)
    cidrs: Mapping[str, str]  # stable key (vpc-<region>, lan-<site>, ...) -> CIDR reached through this side


@dataclass(frozen=True, kw_only=True)
class TransitPeeringArgs:
    names: Names  # naming and tags of the environment's global stack
    requester: PeerSide  # creates the peering attachment (the stack picks the lexicographically first region)
    accepter: PeerSide  # accepts it

    def __post_init__(self) -> None:
        if self.requester.region == self.accepter.region:
            raise ValueError(f"accepter.region: both sides are {self.requester.region}; peering joins two regions")
        seen: dict[ipaddress.IPv4Network, str] = {}
        for side_name, side in (("requester", self.requester), ("accepter", self.accepter)):
            if not side.cidrs:
                raise ValueError(f"{side_name}.cidrs: at least the region's VPC CIDR is needed")
            for key, cidr in side.cidrs.items():
                net = ipaddress.IPv4Network(cidr)
                clash = next((k for n, k in seen.items() if n.overlaps(net)), None)
                if clash is not None:
                    raise ValueError(f"{side_name}.cidrs.{key}: {net} overlaps {clash}")
                seen[net] = f"{side_name}.cidrs.{key}"


class TransitPeering(pulumi.ComponentResource):
    """Peering attachment, its acceptance, association with both route tables, and static routes both ways.

    Peering attachments do not propagate routes, so every network behind the far side gets a static route.
    """

    attachment_id: pulumi.Output[str]

    def __init__(self, name: str, args: TransitPeeringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:transit:TransitPeering", name, None, opts)
        names = args.names
        req, acc = args.requester, args.accepter
        peering_name = names.physical("peering", region_code(req.region), region_code(acc.region))
        tags = names.tags("transit", peering_name, {"dlinfra:peer-regions": f"{req.region},{acc.region}"})
        attachment = aws.ec2transitgateway.PeeringAttachment(
            f"{name}-attachment",
            transit_gateway_id=req.transit_gateway_id,
            peer_region=acc.region,
            peer_transit_gateway_id=acc.transit_gateway_id,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, provider=req.provider),
        )
        accepter = aws.ec2transitgateway.PeeringAttachmentAccepter(
            f"{name}-accepter",
            transit_gateway_attachment_id=attachment.id,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, provider=acc.provider),
        )
        # Associations and routes need an accepted (available) attachment on both sides.
        for side, far in ((req, acc), (acc, req)):
            on_side = pulumi.ResourceOptions(parent=self, provider=side.provider, depends_on=[accepter])
            association = aws.ec2transitgateway.RouteTableAssociation(
                f"{name}-association-{side.region}",
                transit_gateway_attachment_id=accepter.transit_gateway_attachment_id,
                transit_gateway_route_table_id=side.route_table_id,
                opts=on_side,
            )
            for key, cidr in sorted(far.cidrs.items()):
                aws.ec2transitgateway.Route(
                    f"{name}-route-{side.region}-{key}",
                    destination_cidr_block=cidr,
                    transit_gateway_attachment_id=accepter.transit_gateway_attachment_id,
                    transit_gateway_route_table_id=side.route_table_id,
                    opts=pulumi.ResourceOptions(parent=self, provider=side.provider, depends_on=[association]),
                )
        self.attachment_id = attachment.id
        self.register_outputs({"attachment_id": self.attachment_id})
