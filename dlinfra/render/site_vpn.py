"""A site's AWS VPN as the gateway renderers take it (Tunnel, SiteVpnView), checked strictly on construction.

Route-based by default, as AWS builds its VPN: one XFRM interface per tunnel, and routing picks the tunnel.
Policy-based only where a site asks for it (kernels without XFRM interfaces, appliances that cannot route into one).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from dlinfra.model import hybrid_routing
from dlinfra.render.aws_tunnel import (
    AWS_RESERVED_INSIDE_CIDRS,
    DEFAULT_ESP_PROPOSALS,
    DEFAULT_IKE_PROPOSALS,
    check_proposals,
)

# "route": XFRM interfaces and routing (default); "policy": traffic selectors pick the tunnel.
TUNNEL_MODES: Final = ("route", "policy")

# Every tunnel's inside /30 comes from the link-local range (AWS, VpnTunnelOptionsSpecification.TunnelInsideCidr).
LINK_LOCAL: Final = ipaddress.IPv4Network("169.254.0.0/16")

# Input checks. Values end up verbatim in config files, so they are validated strictly (that also
# rules out injecting config syntax through a name).
# AWS's pre-shared key rule. A leading '0' is also what would make strongSwan read "0x..." as hex or
# "0s..." as base64, so keys AWS accepts are always taken literally.
_PSK_RE: Final = re.compile(r"[A-Za-z0-9._]{8,64}")
_NAME_RE: Final = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?")
_ASN_MAX: Final = 4294967295
_AS_TRANS: Final = 23456


def _ipv4(what: str, value: str) -> ipaddress.IPv4Address:
    try:
        # ipaddress would also take an int; only the dotted form belongs in a config file.
        if not isinstance(value, str):
            raise ValueError
        return ipaddress.IPv4Address(value)
    except ValueError:
        raise ValueError(f"{what}: {value!r} is not an IPv4 address") from None


def _ipv4_net(what: str, value: str) -> ipaddress.IPv4Network:
    if not isinstance(value, str):
        raise ValueError(f"{what}: {value!r} is not an IPv4 CIDR such as 10.0.0.0/16")
    try:
        return ipaddress.IPv4Network(value)
    except ValueError:
        try:
            loose = ipaddress.IPv4Network(value, strict=False)
        except ValueError:
            raise ValueError(f"{what}: {value!r} is not an IPv4 CIDR such as 10.0.0.0/16") from None
        raise ValueError(f"{what}: {value!r} has host bits set; did you mean {loose}?") from None


def _ipv4_nets(what: str, values: Sequence[str]) -> list[ipaddress.IPv4Network]:
    if isinstance(values, str):
        raise ValueError(f"{what}: expected a tuple of CIDRs, got the single string {values!r}")
    nets = [_ipv4_net(f"{what}[{i}]", v) for i, v in enumerate(values)]
    for i, a in enumerate(nets):
        for b in nets[i + 1 :]:
            if a.overlaps(b):
                raise ValueError(f"{what}: {a} and {b} overlap")
    return nets


@dataclass(frozen=True, kw_only=True)
class Tunnel:
    """One of the two tunnels of an AWS VPN connection, as seen from the site gateway."""

    number: int  # AWS's tunnel index: 1 or 2
    outside_ip: str  # AWS endpoint's outside IPv4 address (public, or private over Direct Connect)
    inside_cidr: str  # /30 in 169.254.0.0/16, not AWS-reserved; AWS takes .1, the site .2
    preshared_key: str = field(repr=False)  # secret; AWS rules: 8-64 of [A-Za-z0-9._], no leading '0'

    def __post_init__(self) -> None:
        if isinstance(self.number, bool) or self.number not in (1, 2):
            raise ValueError(f"Tunnel.number: must be 1 or 2, got {self.number!r}")
        where = f"Tunnel {self.number}"
        _ipv4(f"{where} outside_ip", self.outside_ip)
        inside = _ipv4_net(f"{where} inside_cidr", self.inside_cidr)
        if inside.prefixlen != 30 or not inside.subnet_of(LINK_LOCAL):
            raise ValueError(f"{where} inside_cidr: {inside} must be a /30 inside 169.254.0.0/16")
        if inside in AWS_RESERVED_INSIDE_CIDRS:
            raise ValueError(f"{where} inside_cidr: {inside} is reserved by AWS; choose another /30 in 169.254.0.0/16")
        # Never echo the key: this message may reach logs and CI output.
        if not isinstance(self.preshared_key, str) or not _PSK_RE.fullmatch(self.preshared_key):
            raise ValueError(
                f"{where} preshared_key: must be 8-64 characters of letters, digits, '.' and '_' (AWS rule); "
                "value not shown"
            )
        if self.preshared_key.startswith("0"):
            raise ValueError(f"{where} preshared_key: must not start with '0' (AWS rule); value not shown")

    @property
    def aws_inside_ip(self) -> str:
        """AWS's address inside the tunnel (first host of the /30)."""
        return str(ipaddress.IPv4Network(self.inside_cidr)[1])

    @property
    def site_inside_ip(self) -> str:
        """The site gateway's address inside the tunnel (second host of the /30)."""
        return str(ipaddress.IPv4Network(self.inside_cidr)[2])


@dataclass(frozen=True, kw_only=True)
class SiteVpnView:
    """Everything the site gateway needs to terminate one AWS VPN connection (two tunnels)."""

    site: str  # site name from fleet.yaml, e.g. "sjc1"
    local_public_ip: str  # the gateway's public IPv4 address: the customer gateway IP and IKE identity
    lan_cidr: str  # the site LAN, e.g. "10.128.0.0/20"
    remote_cidrs: tuple[str, ...]  # every AWS VPC CIDR (and other site LAN) reached through the tunnels
    tunnels: tuple[Tunnel, Tunnel]  # AWS tunnels 1 and 2, in that order
    routing: str  # "static" (routes on the transit gateway) or "bgp"
    local_asn: int  # the site's BGP ASN (the customer gateway's ASN)
    remote_asn: int  # the transit gateway's Amazon-side ASN
    ike_proposals: tuple[str, ...] = DEFAULT_IKE_PROPOSALS  # strongSwan syntax; only AWS_PHASE1_* algorithms
    esp_proposals: tuple[str, ...] = DEFAULT_ESP_PROPOSALS  # strongSwan syntax; only AWS_PHASE2_* algorithms
    pod_cidrs: tuple[str, ...] = ()  # EKS hybrid-node pod CIDRs at the site; tunnelled and announced like the LAN
    connection_name: str = "aws"  # swanctl connection prefix ("<name>-tunnel1"); unique per VPN connection
    tunnel_mode: str = "route"  # "route" (XFRM interfaces, as AWS builds its VPN) or "policy" (legacy gateways)

    def __post_init__(self) -> None:
        if not isinstance(self.site, str) or not _NAME_RE.fullmatch(self.site):
            raise ValueError(f"SiteVpnView.site: {self.site!r} must be lower-case letters, digits and '-'")
        if not isinstance(self.connection_name, str) or not _NAME_RE.fullmatch(self.connection_name):
            raise ValueError(
                f"SiteVpnView.connection_name: {self.connection_name!r} must be lower-case letters, digits and '-'"
            )
        public = _ipv4("SiteVpnView.local_public_ip", self.local_public_ip)
        if public in LINK_LOCAL or public.is_loopback or public.is_multicast or public.is_unspecified:
            raise ValueError(f"SiteVpnView.local_public_ip: {public} cannot be a customer gateway address")
        lan = _ipv4_net("SiteVpnView.lan_cidr", self.lan_cidr)
        if not self.remote_cidrs:
            raise ValueError("SiteVpnView.remote_cidrs: at least one CIDR must be reachable through the tunnels")
        remote = _ipv4_nets("SiteVpnView.remote_cidrs", self.remote_cidrs)
        pods = _ipv4_nets("SiteVpnView.pod_cidrs", self.pod_cidrs)
        local = [lan, *pods]
        for name, nets in (("lan_cidr", [lan]), ("pod_cidrs", pods), ("remote_cidrs", remote)):
            for net in nets:
                if net.overlaps(LINK_LOCAL):
                    raise ValueError(f"SiteVpnView.{name}: {net} overlaps 169.254.0.0/16, kept for tunnel inside CIDRs")
        for net in remote:
            for mine in local:
                if net.overlaps(mine):
                    raise ValueError(f"SiteVpnView.remote_cidrs: {net} overlaps the site's own {mine}")
        for i, pod in enumerate(pods):
            if pod.overlaps(lan):
                raise ValueError(f"SiteVpnView.pod_cidrs[{i}]: {pod} overlaps lan_cidr {lan}")
            if pod.prefixlen > hybrid_routing.NODE_POD_PREFIX:
                raise ValueError(
                    f"SiteVpnView.pod_cidrs[{i}]: {pod} is smaller than one node's "
                    f"/{hybrid_routing.NODE_POD_PREFIX} pod block"
                )
        self._check_tunnels()
        if self.tunnel_mode not in TUNNEL_MODES:
            raise ValueError(f"SiteVpnView.tunnel_mode: must be 'route' or 'policy', got {self.tunnel_mode!r}")
        if self.routing not in ("static", "bgp"):
            raise ValueError(f"SiteVpnView.routing: must be 'static' or 'bgp', got {self.routing!r}")
        for name in ("local_asn", "remote_asn"):
            asn = getattr(self, name)
            if isinstance(asn, bool) or not isinstance(asn, int) or not 1 <= asn <= _ASN_MAX or asn == _AS_TRANS:
                raise ValueError(f"SiteVpnView.{name}: {asn!r} is not a usable BGP ASN (1-{_ASN_MAX}, not 23456)")
        if self.local_asn == self.remote_asn:
            raise ValueError(
                f"SiteVpnView.local_asn: {self.local_asn} equals remote_asn; the site and AWS peer over eBGP"
            )
        check_proposals("SiteVpnView.ike_proposals", self.ike_proposals, phase=1)
        check_proposals("SiteVpnView.esp_proposals", self.esp_proposals, phase=2)

    def _check_tunnels(self) -> None:
        if len(self.tunnels) != 2 or not all(isinstance(t, Tunnel) for t in self.tunnels):
            raise ValueError("SiteVpnView.tunnels: exactly two Tunnel values (AWS tunnels 1 and 2) are needed")
        if tuple(t.number for t in self.tunnels) != (1, 2):
            raise ValueError("SiteVpnView.tunnels: must be tunnel 1 then tunnel 2")
        first, second = self.tunnels
        if first.outside_ip == second.outside_ip:
            raise ValueError(f"SiteVpnView.tunnels: both tunnels use outside_ip {first.outside_ip}")
        if self.local_public_ip in (first.outside_ip, second.outside_ip):
            raise ValueError("SiteVpnView.local_public_ip: equals a tunnel outside_ip")
        if first.inside_cidr == second.inside_cidr:
            raise ValueError(f"SiteVpnView.tunnels: both tunnels use inside_cidr {first.inside_cidr}")

    def connection(self, tunnel: Tunnel) -> str:
        """swanctl connection (and CHILD_SA) name for one tunnel."""
        return f"{self.connection_name}-tunnel{tunnel.number}"

    @property
    def route_based(self) -> bool:
        return self.tunnel_mode == "route"

    @staticmethod
    def if_id(tunnel: Tunnel) -> int:
        """The tunnel's XFRM interface id (if_id_in = if_id_out): stable, the AWS tunnel number."""
        return tunnel.number

    @staticmethod
    def interface(tunnel: Tunnel) -> str:
        """The tunnel's XFRM interface name."""
        return f"xfrm{tunnel.number}"
