"""SiteVpn: AWS side of a physical site's IPsec link: customer gateway, VPN on the TGW, routes."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pulumi
import pulumi_aws as aws
import pulumi_random as random

from components.network import LOG_RETENTION_DAYS
from dlinfra.model.naming import Names
from dlinfra.render.aws_tunnel import (
    AWS_DPD_TIMEOUT_ACTION,
    AWS_DPD_TIMEOUT_SECONDS,
    AWS_IKE_VERSIONS,
    AWS_PHASE1_DH,
    AWS_PHASE1_ENCRYPTION,
    AWS_PHASE1_INTEGRITY,
    AWS_PHASE1_LIFETIME_SECONDS,
    AWS_PHASE2_DH,
    AWS_PHASE2_ENCRYPTION,
    AWS_PHASE2_INTEGRITY,
    AWS_PHASE2_LIFETIME_SECONDS,
    AWS_REKEY_FUZZ_PERCENTAGE,
    AWS_REKEY_MARGIN_TIME_SECONDS,
    AWS_REPLAY_WINDOW_SIZE,
    AWS_RESERVED_INSIDE_CIDRS,
    AWS_STARTUP_ACTION,
)

# AWS pre-shared key rule: 8-64 characters of letters, digits, '.' and '_', not starting with '0'.
PSK_LENGTH = 40
PSK_SPECIAL = "._"
_LINK_LOCAL = ipaddress.IPv4Network("169.254.0.0/16")
_CGW_ASN_MAX = 2147483647  # customer gateways above this need bgp_asn_extended; the fleet caps it here
_SITE_NAME = re.compile(r"^[a-z][a-z0-9-]{0,22}[a-z0-9]$")


@dataclass(frozen=True, kw_only=True)
class SiteVpnArgs:
    names: Names  # naming and tags of the site's home regional stack
    site: str  # site name from the fleet (sites.<name>)
    public_ip: str  # the site gateway's public IPv4 address: the customer gateway
    asn: int  # the site's BGP ASN (AWS requires one for static routing too); 1-2147483647
    routing: Literal["static", "bgp"]  # static: TGW routes to the site; bgp: the site announces its networks
    transit_gateway_id: pulumi.Input[str]  # the home region's transit gateway (TransitHub)
    transit_route_table_id: pulumi.Input[str]  # its route table; the VPN attachment is associated with it
    transit_asn: int  # the transit gateway's Amazon-side ASN (must differ from asn)
    lan_cidr: str  # planned site LAN (site-lan/<site>)
    pod_cidr: str | None = None  # planned hybrid-node pod CIDR (hybrid-pods/<site>), routed like the LAN
    tunnel_inside_cidrs: tuple[str, str]  # planned /30s of tunnels 1 and 2 (tunnel/<site>/1|2)
    remote_cidrs: Sequence[str]  # networks the site reaches through the tunnels (exported for rendering)
    log_kms_key_arn: pulumi.Input[str]  # KMS key for the tunnel log group (Network.log_key_arn)
    log_retention_days: int = 365  # days tunnel logs are kept; a value CloudWatch Logs accepts

    def __post_init__(self) -> None:
        if not _SITE_NAME.match(self.site):
            raise ValueError(f"site: {self.site!r} is not a fleet name (lower-case letters, digits, '-')")
        try:
            ip = ipaddress.IPv4Address(self.public_ip)
        except ValueError:
            raise ValueError(f"public_ip: {self.public_ip!r} is not an IPv4 address") from None
        if not ip.is_global or ip.is_multicast:
            raise ValueError(f"public_ip: {ip} is not a public address")
        if not 1 <= self.asn <= _CGW_ASN_MAX:
            raise ValueError(f"asn: {self.asn} is out of range for a customer gateway (1-{_CGW_ASN_MAX})")
        if self.asn == self.transit_asn:
            raise ValueError(f"asn: {self.asn} is the transit gateway's own ASN; the site peers over eBGP")
        if self.routing not in ("static", "bgp"):
            raise ValueError(f"routing: must be 'static' or 'bgp', got {self.routing!r}")
        if isinstance(self.remote_cidrs, str):
            raise ValueError("remote_cidrs: need a sequence of CIDRs, not a single string")
        local = [ipaddress.IPv4Network(c) for c in self.site_cidrs.values()]
        if len(local) == 2 and local[0].overlaps(local[1]):
            raise ValueError(f"pod_cidr: {local[1]} overlaps lan_cidr {local[0]}")
        for cidr in self.remote_cidrs:
            net = ipaddress.IPv4Network(cidr)
            if any(net.overlaps(mine) for mine in local):
                raise ValueError(f"remote_cidrs: {net} overlaps the site's own networks")
        if len(self.tunnel_inside_cidrs) != 2 or self.tunnel_inside_cidrs[0] == self.tunnel_inside_cidrs[1]:
            raise ValueError(f"tunnel_inside_cidrs: need two different /30s, got {self.tunnel_inside_cidrs!r}")
        for n, cidr in enumerate(self.tunnel_inside_cidrs, start=1):
            inside = ipaddress.IPv4Network(cidr)
            if inside.prefixlen != 30 or not inside.subnet_of(_LINK_LOCAL):
                raise ValueError(f"tunnel_inside_cidrs[{n}]: {inside} must be a /30 inside 169.254.0.0/16")
            if any(inside.overlaps(r) for r in AWS_RESERVED_INSIDE_CIDRS):
                raise ValueError(f"tunnel_inside_cidrs[{n}]: {inside} is reserved by AWS")
        if self.log_retention_days not in LOG_RETENTION_DAYS:
            raise ValueError(f"log_retention_days: {self.log_retention_days} is not a CloudWatch Logs retention")

    @property
    def site_cidrs(self) -> dict[str, str]:
        """The site's own networks by role (lan, pods): what static routes point at the VPN."""
        return {"lan": self.lan_cidr} | ({"pods": self.pod_cidr} if self.pod_cidr else {})


class SiteVpn(pulumi.ComponentResource):
    """Customer gateway, two-tunnel IKEv2 VPN connection on the transit gateway, and the site's TGW routes."""

    customer_gateway_id: pulumi.Output[str]
    vpn_connection_id: pulumi.Output[str]
    transit_gateway_attachment_id: pulumi.Output[str]
    connection: pulumi.Output[dict[str, Any]]  # what `dlinfra site render` reads; secret (holds the PSKs)

    def __init__(self, name: str, args: SiteVpnArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:vpn:SiteVpn", name, None, opts)
        names = args.names
        child = pulumi.ResourceOptions(parent=self)
        site_name = names.physical("site", args.site)
        cgw = aws.ec2.CustomerGateway(
            f"{name}-cgw",
            ip_address=args.public_ip,
            bgp_asn=str(args.asn),
            type="ipsec.1",
            device_name=f"{args.site} site gateway (strongSwan)",
            tags=names.tags("vpn", site_name, {"dlinfra:site": args.site}),
            opts=child,
        )
        keys = {n: self._preshared_key(f"{name}-psk-{n}", child) for n in (1, 2)}
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs",
            name=f"/site-vpn/{site_name}",
            retention_in_days=args.log_retention_days,
            kms_key_id=args.log_kms_key_arn,
            tags=names.tags("vpn", site_name, {"dlinfra:site": args.site}),
            opts=child,
        )
        tunnel_options: dict[str, Any] = {}
        for n, inside in enumerate(args.tunnel_inside_cidrs, start=1):
            tunnel_options |= _tunnel_options(n, inside, keys[n], log_group.arn)
        vpn = aws.ec2.VpnConnection(
            f"{name}-vpn",
            customer_gateway_id=cgw.id,
            transit_gateway_id=args.transit_gateway_id,
            type="ipsec.1",
            static_routes_only=args.routing == "static",
            tunnel_inside_ip_version="ipv4",
            tags=names.tags("vpn", site_name, {"dlinfra:site": args.site}),
            # The connection echoes the keys back as outputs; keep them secret there too.
            opts=pulumi.ResourceOptions(
                parent=self, additional_secret_outputs=["tunnel1PresharedKey", "tunnel2PresharedKey"]
            ),
            **tunnel_options,
        )
        # The transit gateway has no default route table: associate the VPN attachment with ours.
        association = aws.ec2transitgateway.RouteTableAssociation(
            f"{name}-association",
            transit_gateway_attachment_id=vpn.transit_gateway_attachment_id,
            transit_gateway_route_table_id=args.transit_route_table_id,
            opts=child,
        )
        if args.routing == "bgp":
            aws.ec2transitgateway.RouteTablePropagation(
                f"{name}-propagation",
                transit_gateway_attachment_id=vpn.transit_gateway_attachment_id,
                transit_gateway_route_table_id=args.transit_route_table_id,
                opts=child,
            )
        else:
            for key, cidr in args.site_cidrs.items():
                aws.ec2transitgateway.Route(
                    f"{name}-route-{key}",
                    destination_cidr_block=cidr,
                    transit_gateway_attachment_id=vpn.transit_gateway_attachment_id,
                    transit_gateway_route_table_id=args.transit_route_table_id,
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[association]),
                )
        tunnels = [
            {
                "number": 1,
                "outside_address": vpn.tunnel1_address,
                "inside_cidr": args.tunnel_inside_cidrs[0],
                "cgw_inside_address": vpn.tunnel1_cgw_inside_address,
                "vgw_inside_address": vpn.tunnel1_vgw_inside_address,
                "preshared_key": keys[1],
            },
            {
                "number": 2,
                "outside_address": vpn.tunnel2_address,
                "inside_cidr": args.tunnel_inside_cidrs[1],
                "cgw_inside_address": vpn.tunnel2_cgw_inside_address,
                "vgw_inside_address": vpn.tunnel2_vgw_inside_address,
                "preshared_key": keys[2],
            },
        ]
        self.customer_gateway_id = cgw.id
        self.vpn_connection_id = vpn.id
        self.transit_gateway_attachment_id = vpn.transit_gateway_attachment_id
        self.connection = pulumi.Output.from_input(
            {
                "site": args.site,
                "public_ip": args.public_ip,
                "customer_gateway_id": cgw.id,
                "vpn_connection_id": vpn.id,
                "transit_gateway_attachment_id": vpn.transit_gateway_attachment_id,
                "routing": args.routing,
                "asn": args.asn,
                "transit_asn": args.transit_asn,
                "lan": args.lan_cidr,
                "pod_cidrs": [args.pod_cidr] if args.pod_cidr else [],
                "remote_cidrs": list(args.remote_cidrs),
                "tunnels": tunnels,
                "log_group": log_group.name,
            }
        )
        self.register_outputs(
            {
                "customer_gateway_id": self.customer_gateway_id,
                "vpn_connection_id": self.vpn_connection_id,
                "transit_gateway_attachment_id": self.transit_gateway_attachment_id,
                "connection": self.connection,
            }
        )

    def _preshared_key(self, name: str, opts: pulumi.ResourceOptions) -> pulumi.Output[str]:
        """A PSK AWS accepts: a letter (never '0'), then letters, digits, '.' and '_'; secret throughout."""
        # random cannot constrain the first character alone, so the key is a one-letter head and a body.
        head = random.RandomPassword(
            f"{name}-head", length=1, lower=True, upper=True, numeric=False, special=False, opts=opts
        )
        body = random.RandomPassword(
            f"{name}-body",
            length=PSK_LENGTH - 1,
            lower=True,
            upper=True,
            numeric=True,
            special=True,
            override_special=PSK_SPECIAL,
            opts=opts,
        )
        return pulumi.Output.secret(pulumi.Output.concat(head.result, body.result))


def _tunnel_options(
    n: int, inside_cidr: str, psk: pulumi.Output[str], log_group_arn: pulumi.Output[str]
) -> dict[str, Any]:
    """The `tunnel<n>_*` arguments of aws.ec2.VpnConnection; the algorithms are the ones the site renders."""
    log_options: Any
    if n == 1:
        log_options = aws.ec2.VpnConnectionTunnel1LogOptionsArgs(
            cloudwatch_log_options=aws.ec2.VpnConnectionTunnel1LogOptionsCloudwatchLogOptionsArgs(
                log_enabled=True, log_group_arn=log_group_arn, log_output_format="json"
            )
        )
    else:
        log_options = aws.ec2.VpnConnectionTunnel2LogOptionsArgs(
            cloudwatch_log_options=aws.ec2.VpnConnectionTunnel2LogOptionsCloudwatchLogOptionsArgs(
                log_enabled=True, log_group_arn=log_group_arn, log_output_format="json"
            )
        )
    return {
        f"tunnel{n}_inside_cidr": inside_cidr,
        f"tunnel{n}_preshared_key": psk,
        f"tunnel{n}_ike_versions": list(AWS_IKE_VERSIONS),
        f"tunnel{n}_phase1_encryption_algorithms": list(AWS_PHASE1_ENCRYPTION),
        f"tunnel{n}_phase1_integrity_algorithms": list(AWS_PHASE1_INTEGRITY),
        f"tunnel{n}_phase1_dh_group_numbers": list(AWS_PHASE1_DH),
        f"tunnel{n}_phase1_lifetime_seconds": AWS_PHASE1_LIFETIME_SECONDS,
        f"tunnel{n}_phase2_encryption_algorithms": list(AWS_PHASE2_ENCRYPTION),
        f"tunnel{n}_phase2_integrity_algorithms": list(AWS_PHASE2_INTEGRITY),
        f"tunnel{n}_phase2_dh_group_numbers": list(AWS_PHASE2_DH),
        f"tunnel{n}_phase2_lifetime_seconds": AWS_PHASE2_LIFETIME_SECONDS,
        f"tunnel{n}_rekey_margin_time_seconds": AWS_REKEY_MARGIN_TIME_SECONDS,
        f"tunnel{n}_rekey_fuzz_percentage": AWS_REKEY_FUZZ_PERCENTAGE,
        f"tunnel{n}_replay_window_size": AWS_REPLAY_WINDOW_SIZE,
        f"tunnel{n}_dpd_timeout_seconds": AWS_DPD_TIMEOUT_SECONDS,
        f"tunnel{n}_dpd_timeout_action": AWS_DPD_TIMEOUT_ACTION,
        f"tunnel{n}_startup_action": AWS_STARTUP_ACTION,
        f"tunnel{n}_log_options": log_options,
    }
