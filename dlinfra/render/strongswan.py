"""Site side of the AWS Site-to-Site VPN: the files a site gateway runs, unmodified.

Route-based (the default, as AWS builds its VPN): one XFRM interface per tunnel, 0.0.0.0/0 selectors,
and routing (FRR: static routes or BGP) decides which tunnel carries what. Policy-based only where a
site asks for it (kernels without XFRM interfaces, appliances that cannot route into a tunnel).

The AWS side (the Pulumi VpnConnection) and the site side take their IKE/ESP algorithms from the
``AWS_*`` constants below, so the two ends cannot drift apart.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import jinja2

from dlinfra.model import hybrid_routing

__all__ = [
    "AWS_DPD_TIMEOUT_ACTION",
    "AWS_DPD_TIMEOUT_SECONDS",
    "AWS_IKE_VERSIONS",
    "AWS_PHASE1_DH",
    "AWS_PHASE1_ENCRYPTION",
    "AWS_PHASE1_INTEGRITY",
    "AWS_PHASE1_LIFETIME_SECONDS",
    "AWS_PHASE2_DH",
    "AWS_PHASE2_ENCRYPTION",
    "AWS_PHASE2_INTEGRITY",
    "AWS_PHASE2_LIFETIME_SECONDS",
    "AWS_REKEY_FUZZ_PERCENTAGE",
    "AWS_REKEY_MARGIN_TIME_SECONDS",
    "AWS_REPLAY_WINDOW_SIZE",
    "AWS_RESERVED_INSIDE_CIDRS",
    "AWS_STARTUP_ACTION",
    "BGP_CONNECT_RETRY_SECONDS",
    "BGP_HOLD_SECONDS",
    "BGP_KEEPALIVE_SECONDS",
    "CHARON_RETRANSMIT_BASE",
    "CHARON_RETRANSMIT_TIMEOUT_SECONDS",
    "CHARON_RETRANSMIT_TRIES",
    "DEFAULT_ESP_PROPOSALS",
    "DEFAULT_IKE_PROPOSALS",
    "FORMAT_VERSION",
    "SITE_CHILD_LIFE_SECONDS",
    "SITE_CHILD_REKEY_SECONDS",
    "SITE_DPD_DELAY_SECONDS",
    "SITE_IKE_OVER_SECONDS",
    "SITE_IKE_REKEY_SECONDS",
    "TUNNEL_MODES",
    "TUNNEL_MSS",
    "XFRM_SCRIPT",
    "FailoverBudget",
    "SiteVpnView",
    "Tunnel",
    "esp_proposals_from_aws",
    "failover_budget",
    "ike_give_up_seconds",
    "ike_proposals_from_aws",
    "render_charon",
    "render_frr",
    "render_nftables",
    "render_swanctl",
    "render_sysctl",
    "render_xfrm_script",
]

# Bumped whenever the rendered files change shape, so a gateway's file says which generator wrote it.
# 2: route-based tunnels (XFRM interfaces), charon retransmission settings, sysctl and nftables files.
FORMAT_VERSION: Final = 2

# ---------------------------------------------------------------------------------------------
# What dlinfra configures on the AWS side of every tunnel (aws.ec2.VpnConnection tunnel options),
# in AWS's own names. Only strong choices: IKEv2, AES-256 (GCM preferred), SHA-2 >= 256, and the
# elliptic-curve DH groups (19-21); AWS's weak groups (2, 5, 22-24) and SHA-1 are left out.
AWS_IKE_VERSIONS: Final = ("ikev2",)
AWS_PHASE1_ENCRYPTION: Final = ("AES256-GCM-16", "AES256")
AWS_PHASE1_INTEGRITY: Final = ("SHA2-384", "SHA2-256")
AWS_PHASE1_DH: Final = (20, 19, 21)
AWS_PHASE2_ENCRYPTION: Final = ("AES256-GCM-16", "AES256")
AWS_PHASE2_INTEGRITY: Final = ("SHA2-384", "SHA2-256")
AWS_PHASE2_DH: Final = (20, 19, 21)  # AWS requires PFS in phase 2
AWS_PHASE1_LIFETIME_SECONDS: Final = 28800  # AWS default and maximum
AWS_PHASE2_LIFETIME_SECONDS: Final = 3600  # AWS default and maximum
# AWS default margin; AWS starts a rekey between margin and margin x (1 + fuzz) before expiry.
AWS_REKEY_MARGIN_TIME_SECONDS: Final = 270
AWS_REKEY_FUZZ_PERCENTAGE: Final = 100  # AWS default
AWS_REPLAY_WINDOW_SIZE: Final = 1024  # AWS default; the site renders the same window
AWS_DPD_TIMEOUT_SECONDS: Final = 30  # AWS minimum and default
# The site gateway owns (re)establishment (it initiates and retries forever); AWS re-initiating as
# well would race it into duplicate IKE_SAs, so AWS only clears and waits.
AWS_DPD_TIMEOUT_ACTION: Final = "clear"
AWS_STARTUP_ACTION: Final = "add"

# Site-side timers. The site always rekeys before AWS would (AWS starts at lifetime - 2 x margin with
# 100 % fuzz), and its hard lifetime stays under AWS's, so rekeys never collide or lapse.
SITE_IKE_REKEY_SECONDS: Final = 25200  # 7 h
SITE_IKE_OVER_SECONDS: Final = 2520  # hard IKE_SA lifetime 27720 s < 28260 s, AWS's earliest rekey
SITE_CHILD_REKEY_SECONDS: Final = 2700  # 45 min
SITE_CHILD_LIFE_SECONDS: Final = 2970  # < 3060 s, AWS's earliest phase 2 rekey
# A third of AWS's DPD timeout: a silent AWS endpoint is noticed quickly, and our probes keep AWS's
# DPD satisfied even when no data flows.
SITE_DPD_DELAY_SECONDS: Final = 10

# charon's retransmission schedule (strongswan.conf charon.retransmit_*). strongSwan sends an IKE
# request, then retransmits it `tries` times, the n-th retransmission after timeout * base^(n-1), and
# gives up one more timeout * base^tries later: sum(timeout * base^n for n in 0..tries) seconds
# (strongSwan docs, "Retransmission"). Its defaults (4 s, 1.8, 5) give up after 165 s, which is what made
# a silent AWS endpoint take 170 s to fail over. These give up after 2 x (1 + 1.4 + 1.96 + 2.744) = 14.2 s:
# four packets over 14 s still ride out a lost one or two on a healthy path.
CHARON_RETRANSMIT_TIMEOUT_SECONDS: Final = 2.0
CHARON_RETRANSMIT_BASE: Final = 1.4
CHARON_RETRANSMIT_TRIES: Final = 3

# BGP with AWS: AWS's VPN BGP uses a 30 s hold time (keepalive 10 s) and the site must match ("Customer
# gateway device" BGP requirements). The connect-retry timer is FRR's own (120 s by default in
# "traditional" defaults); a short one lets the session come back soon after a tunnel does.
BGP_KEEPALIVE_SECONDS: Final = 10
BGP_HOLD_SECONDS: Final = 30
BGP_CONNECT_RETRY_SECONDS: Final = 5

# "route": XFRM interfaces and routing (default); "policy": traffic selectors pick the tunnel.
TUNNEL_MODES: Final = ("route", "policy")
# TCP MSS clamped on the tunnels: fits every algorithm AWS is configured with, with or without NAT-T
# (AWS "Best practices for your customer gateway device", MTU/MSS table; docs/site-onboarding.md).
TUNNEL_MSS: Final = 1382
# Where the gateway cookbook installs the rendered XFRM interface script; charon's updown calls it.
XFRM_SCRIPT: Final = "/usr/local/sbin/dlinfra-xfrm"

# ---------------------------------------------------------------------------------------------
# AWS algorithm names -> strongSwan proposal keywords.
_ENCRYPTION: Final[Mapping[str, str]] = {
    "AES128": "aes128",
    "AES256": "aes256",
    "AES128-GCM-16": "aes128gcm16",
    "AES256-GCM-16": "aes256gcm16",
}
_AEAD: Final = frozenset({"AES128-GCM-16", "AES256-GCM-16"})
_INTEGRITY: Final[Mapping[str, str]] = {
    "SHA1": "sha1",
    "SHA2-256": "sha256",
    "SHA2-384": "sha384",
    "SHA2-512": "sha512",
}
_DH_GROUPS: Final[Mapping[int, str]] = {
    2: "modp1024",
    5: "modp1536",
    14: "modp2048",
    15: "modp3072",
    16: "modp4096",
    17: "modp6144",
    18: "modp8192",
    19: "ecp256",
    20: "ecp384",
    21: "ecp521",
    22: "modp1024s160",
    23: "modp2048s224",
    24: "modp2048s256",
}
_PHASE1_DH_ALLOWED: Final = frozenset({2, *range(14, 25)})
_PHASE2_DH_ALLOWED: Final = frozenset({2, 5, *range(14, 25)})


def _check_aws_names(what: str, values: Sequence[Any], allowed: Sequence[Any], *, may_be_empty: bool = False) -> None:
    if not values and not may_be_empty:
        raise ValueError(f"{what}: at least one value is needed")
    if len(set(values)) != len(values):
        raise ValueError(f"{what}: duplicate values in {list(values)}")
    for value in values:
        if value not in allowed:
            raise ValueError(f"{what}: {value!r} is not an AWS name; AWS accepts {', '.join(map(str, allowed))}")


def _proposals(
    phase: int, encryption: Sequence[str], integrity: Sequence[str], dh_groups: Sequence[int]
) -> tuple[str, ...]:
    dh_allowed = sorted(_PHASE1_DH_ALLOWED if phase == 1 else _PHASE2_DH_ALLOWED)
    _check_aws_names(f"phase{phase} encryption", encryption, list(_ENCRYPTION))
    _check_aws_names(f"phase{phase} integrity", integrity, list(_INTEGRITY), may_be_empty=True)
    _check_aws_names(f"phase{phase} DH groups", dh_groups, dh_allowed)
    aead = [_ENCRYPTION[e] for e in encryption if e in _AEAD]
    classic = [_ENCRYPTION[e] for e in encryption if e not in _AEAD]
    dh = [_DH_GROUPS[g] for g in dh_groups]
    if not integrity and (classic or phase == 1):
        # IKE always needs a PRF, and non-AEAD ciphers need an integrity algorithm.
        raise ValueError(f"phase{phase} integrity: at least one value is needed with {list(encryption)}")
    # strongSwan cannot mix AEAD and classic ciphers in one proposal: one proposal per kind, in the
    # order the caller prefers them.
    built: list[tuple[bool, str]] = []
    if aead:
        prf = [f"prf{_INTEGRITY[i]}" for i in integrity] if phase == 1 else []
        built.append((True, "-".join([*aead, *prf, *dh])))
    if classic:
        built.append((False, "-".join([*classic, *(_INTEGRITY[i] for i in integrity), *dh])))
    aead_first = encryption[0] in _AEAD
    return tuple(text for is_aead, text in sorted(built, key=lambda b: b[0] != aead_first))


def ike_proposals_from_aws(
    encryption: Sequence[str], integrity: Sequence[str], dh_groups: Sequence[int]
) -> tuple[str, ...]:
    """strongSwan IKE proposals equivalent to AWS phase 1 options (e.g. AWS_PHASE1_*)."""
    return _proposals(1, encryption, integrity, dh_groups)


def esp_proposals_from_aws(
    encryption: Sequence[str], integrity: Sequence[str], dh_groups: Sequence[int]
) -> tuple[str, ...]:
    """strongSwan ESP proposals (with PFS groups) equivalent to AWS phase 2 options (e.g. AWS_PHASE2_*)."""
    return _proposals(2, encryption, integrity, dh_groups)


DEFAULT_IKE_PROPOSALS: Final = ike_proposals_from_aws(AWS_PHASE1_ENCRYPTION, AWS_PHASE1_INTEGRITY, AWS_PHASE1_DH)
DEFAULT_ESP_PROPOSALS: Final = esp_proposals_from_aws(AWS_PHASE2_ENCRYPTION, AWS_PHASE2_INTEGRITY, AWS_PHASE2_DH)


def _check_proposals(what: str, proposals: Sequence[str], phase: int) -> None:
    """Each proposal must use only algorithms that the AWS side is configured with, combined validly."""
    if phase == 1:
        enc_names, integ_names, dh_numbers = AWS_PHASE1_ENCRYPTION, AWS_PHASE1_INTEGRITY, AWS_PHASE1_DH
    else:
        enc_names, integ_names, dh_numbers = AWS_PHASE2_ENCRYPTION, AWS_PHASE2_INTEGRITY, AWS_PHASE2_DH
    aead = {_ENCRYPTION[e] for e in enc_names if e in _AEAD}
    classic = {_ENCRYPTION[e] for e in enc_names if e not in _AEAD}
    integ = {_INTEGRITY[i] for i in integ_names}
    prf = {f"prf{i}" for i in integ} if phase == 1 else set()
    dh = {_DH_GROUPS[g] for g in dh_numbers}
    if not proposals:
        raise ValueError(f"{what}: at least one proposal is needed")
    for proposal in proposals:
        tokens = proposal.split("-")
        unknown = [t for t in tokens if t not in aead | classic | integ | prf | dh]
        if unknown:
            raise ValueError(
                f"{what}: {proposal!r} uses {', '.join(unknown)}, which the AWS side is not configured "
                f"with (allowed: {', '.join(sorted(aead | classic | integ | prf | dh))})"
            )
        has_aead, has_classic = any(t in aead for t in tokens), any(t in classic for t in tokens)
        has_integ, has_prf = any(t in integ for t in tokens), any(t in prf for t in tokens)
        if not (has_aead or has_classic):
            raise ValueError(f"{what}: {proposal!r} has no encryption algorithm")
        if has_aead and has_classic:
            # strongSwan rejects such a proposal; AEAD and CBC ciphers go in separate proposals.
            raise ValueError(f"{what}: {proposal!r} mixes GCM and CBC ciphers; split it into two proposals")
        if not any(t in dh for t in tokens):
            raise ValueError(f"{what}: {proposal!r} has no DH group (AWS requires one, also for PFS)")
        if has_aead and has_integ:
            raise ValueError(f"{what}: {proposal!r} combines GCM with an integrity algorithm")
        if has_classic and not has_integ:
            raise ValueError(f"{what}: {proposal!r} needs an integrity algorithm for its CBC cipher")
        if phase == 1 and has_aead and not has_prf:
            raise ValueError(f"{what}: {proposal!r} needs a PRF (prfsha256 or stronger) with GCM")


# ---------------------------------------------------------------------------------------------
# Input checks. Values end up verbatim in config files, so they are validated strictly (that also
# rules out injecting config syntax through a name).
_LINK_LOCAL: Final = ipaddress.IPv4Network("169.254.0.0/16")
# AWS rejects these tunnel inside CIDRs (VpnTunnelOptionsSpecification.TunnelInsideCidr).
AWS_RESERVED_INSIDE_CIDRS: Final = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "169.254.0.0/30",
        "169.254.1.0/30",
        "169.254.2.0/30",
        "169.254.3.0/30",
        "169.254.4.0/30",
        "169.254.5.0/30",
        "169.254.169.252/30",
    )
)
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
        if inside.prefixlen != 30 or not inside.subnet_of(_LINK_LOCAL):
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
        if public in _LINK_LOCAL or public.is_loopback or public.is_multicast or public.is_unspecified:
            raise ValueError(f"SiteVpnView.local_public_ip: {public} cannot be a customer gateway address")
        lan = _ipv4_net("SiteVpnView.lan_cidr", self.lan_cidr)
        if not self.remote_cidrs:
            raise ValueError("SiteVpnView.remote_cidrs: at least one CIDR must be reachable through the tunnels")
        remote = _ipv4_nets("SiteVpnView.remote_cidrs", self.remote_cidrs)
        pods = _ipv4_nets("SiteVpnView.pod_cidrs", self.pod_cidrs)
        local = [lan, *pods]
        for name, nets in (("lan_cidr", [lan]), ("pod_cidrs", pods), ("remote_cidrs", remote)):
            for net in nets:
                if net.overlaps(_LINK_LOCAL):
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
        _check_proposals("SiteVpnView.ike_proposals", self.ike_proposals, phase=1)
        _check_proposals("SiteVpnView.esp_proposals", self.esp_proposals, phase=2)

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


# ---------------------------------------------------------------------------------------------
@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # config files, not HTML; inputs are validated instead
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _render(template: str, **context: Any) -> str:
    return _environment().get_template(template).render(format_version=FORMAT_VERSION, **context)


def _traffic_selectors(view: SiteVpnView, tunnel: Tunnel) -> tuple[list[str], list[str]]:
    if view.route_based:
        # AWS's route-based VPN: any traffic routed into the tunnel's interface is the tunnel's.
        return ["0.0.0.0/0"], ["0.0.0.0/0"]
    local = [view.lan_cidr, *view.pod_cidrs]
    remote = list(view.remote_cidrs)
    if view.routing == "bgp":
        local.append(f"{tunnel.site_inside_ip}/32")
        remote.append(f"{tunnel.aws_inside_ip}/32")
    return local, remote


def render_swanctl(view: SiteVpnView) -> str:
    """swanctl.conf for the site gateway: both tunnels, initiated and kept up by the site."""
    tunnels = []
    for tunnel in view.tunnels:
        local_ts, remote_ts = _traffic_selectors(view, tunnel)
        tunnels.append(
            {
                "name": view.connection(tunnel),
                "number": tunnel.number,
                "outside_ip": tunnel.outside_ip,
                "inside_cidr": tunnel.inside_cidr,
                "local_ts": local_ts,
                "remote_ts": remote_ts,
                "if_id": view.if_id(tunnel),
                "interface": view.interface(tunnel),
                "preshared_key": tunnel.preshared_key,
            }
        )
    return _render(
        "swanctl.conf.j2",
        site=view.site,
        routing=view.routing,
        route_based=view.route_based,
        xfrm_script=XFRM_SCRIPT,
        local_public_ip=view.local_public_ip,
        tunnels=tunnels,
        ike_proposals=",".join(view.ike_proposals),
        esp_proposals=",".join(view.esp_proposals),
        ike_rekey=SITE_IKE_REKEY_SECONDS,
        ike_over=SITE_IKE_OVER_SECONDS,
        child_rekey=SITE_CHILD_REKEY_SECONDS,
        child_life=SITE_CHILD_LIFE_SECONDS,
        dpd_delay=SITE_DPD_DELAY_SECONDS,
        replay_window=AWS_REPLAY_WINDOW_SIZE,
    )


def render_charon(view: SiteVpnView) -> str:
    """strongswan.conf snippet (/etc/strongswan.d/dlinfra.conf): retransmission timing and route installation."""
    give_up = ike_give_up_seconds(CHARON_RETRANSMIT_TIMEOUT_SECONDS, CHARON_RETRANSMIT_BASE, CHARON_RETRANSMIT_TRIES)
    return _render(
        "strongswan-dlinfra.conf.j2",
        site=view.site,
        route_based=view.route_based,
        timeout=CHARON_RETRANSMIT_TIMEOUT_SECONDS,
        base=CHARON_RETRANSMIT_BASE,
        tries=CHARON_RETRANSMIT_TRIES,
        give_up=round(give_up, 1),
    )


def _interfaces(view: SiteVpnView) -> list[dict[str, Any]]:
    return [
        {
            "name": view.interface(t),
            "if_id": view.if_id(t),
            "connection": view.connection(t),
            "outside_ip": t.outside_ip,
            "site_ip": t.site_inside_ip,
            "aws_ip": t.aws_inside_ip,
            "prefixlen": ipaddress.IPv4Network(t.inside_cidr).prefixlen,
        }
        for t in view.tunnels
    ]


def render_xfrm_script(view: SiteVpnView) -> str | None:
    """The gateway's XFRM interface script (start/stop at boot, updown for charon); None for policy-based sites."""
    if not view.route_based:
        return None
    return _render(
        "dlinfra-xfrm.sh.j2",
        site=view.site,
        interfaces=_interfaces(view),
        # The inner packets' MTU that the clamped MSS fits: MSS + 20 (IPv4) + 20 (TCP) bytes of headers.
        mtu=TUNNEL_MSS + 40,
    )


def render_sysctl(view: SiteVpnView) -> str:
    """sysctl.d file for the gateway: forwarding and loose reverse-path filtering."""
    return _render("sysctl-dlinfra.conf.j2", site=view.site, route_based=view.route_based)


def render_nftables(view: SiteVpnView) -> str:
    """nftables ruleset that clamps the TCP MSS of connections through the tunnels."""
    return _render(
        "dlinfra-mss.nft.j2",
        site=view.site,
        route_based=view.route_based,
        interfaces=[view.interface(t) for t in view.tunnels],
        mss=TUNNEL_MSS,
    )


def render_frr(view: SiteVpnView) -> str | None:
    """frr.conf: routes to AWS over the tunnel interfaces (route-based: static routes or eBGP with ECMP), and
    iBGP with the site's hybrid nodes; for policy-based sites, None when neither BGP nor hybrid pods apply."""
    bgp = view.routing == "bgp"
    if not view.route_based and not bgp and not view.pod_cidrs:
        return None
    hybrid = None
    if view.pod_cidrs:
        hybrid = {
            "lan": view.lan_cidr,
            "pods": list(view.pod_cidrs),
            "node_prefix": hybrid_routing.NODE_POD_PREFIX,
            "keepalive": hybrid_routing.BGP_KEEPALIVE_SECONDS,
            "hold": hybrid_routing.BGP_HOLD_SECONDS,
        }
    interfaces = _interfaces(view)
    return _render(
        "frr.conf.j2",
        site=view.site,
        route_based=view.route_based,
        hybrid=hybrid,
        local_asn=view.local_asn,
        remote_asn=view.remote_asn,
        router_id=view.local_public_ip,
        keepalive=BGP_KEEPALIVE_SECONDS,
        hold=BGP_HOLD_SECONDS,
        connect_retry=BGP_CONNECT_RETRY_SECONDS,
        announce=[view.lan_cidr, *view.pod_cidrs] if bgp else [],
        # Exactly the planned networks: a more specific route inside a VPC range would come from some other
        # attachment claiming part of it, and would win by longest match.
        accept=list(view.remote_cidrs) if bgp else [],
        static_routes=list(view.remote_cidrs) if view.route_based and not bgp else [],
        fallback_routes=list(view.remote_cidrs) if view.route_based else [],
        interfaces=interfaces,
        neighbors=[
            {"name": n["connection"], "aws_ip": n["aws_ip"], "site_ip": n["site_ip"], "interface": n["name"]}
            for n in interfaces
        ]
        if bgp
        else [],
    )


# ---------------------------------------------------------------------------------------------
# Failover arithmetic, from the rendered files (so a test checks what a gateway would run).
def ike_give_up_seconds(timeout: float, base: float, tries: int) -> float:
    """Seconds from an IKE request to charon giving up on it: sum(timeout * base^n, n = 0..tries) (strongSwan
    docs, "Retransmission": the n-th retransmission waits timeout * base^(n-1), and one more wait follows the
    last)."""
    return sum(timeout * base**n for n in range(tries + 1))


@dataclass(frozen=True, kw_only=True)
class FailoverBudget:
    """Worst case from an AWS endpoint going silent to the site routing around its tunnel, in seconds."""

    dpd_delay: float  # silence before charon sends the first DPD probe (swanctl dpd_delay)
    ike_give_up: float  # from that probe to charon declaring the peer dead (charon.retransmit_*)
    bgp_hold: float | None  # BGP sites: the hold timer, an independent detector of the same loss
    # charon keeps an SA's last-inbound time in whole seconds (time_monotonic), so a probe can go out up to 1 s
    # after dpd_delay has really passed.
    clock_granularity: float = 1.0

    @property
    def seconds(self) -> float:
        # The DPD path fires dpd_action (restart): updown takes the tunnel's interface down, and the routes
        # through it (FRR static nexthops, or the BGP session by fast external failover) go at once. A BGP
        # site also loses the session when the hold timer runs out, whichever comes first.
        dpd = self.dpd_delay + self.clock_granularity + self.ike_give_up
        return dpd if self.bgp_hold is None else min(dpd, self.bgp_hold)


def _setting(text: str, key: str, what: str) -> str:
    values = set(re.findall(rf"^\s*{re.escape(key)}\s*=\s*(\S+)\s*$", text, flags=re.MULTILINE))
    if len(values) != 1:
        raise ValueError(f"{what}: expected one value of {key}, found {sorted(values) or 'none'}")
    return str(values.pop())


def failover_budget(charon_conf: str, swanctl_conf: str, frr_conf: str | None) -> FailoverBudget:
    """The failover budget the rendered strongswan.conf snippet, swanctl.conf and frr.conf give."""
    timeout = float(_setting(charon_conf, "retransmit_timeout", "strongswan.conf"))
    base = float(_setting(charon_conf, "retransmit_base", "strongswan.conf"))
    tries = int(_setting(charon_conf, "retransmit_tries", "strongswan.conf"))
    dpd = _setting(swanctl_conf, "dpd_delay", "swanctl.conf")
    if _setting(swanctl_conf, "dpd_action", "swanctl.conf") != "restart":
        raise ValueError("swanctl.conf: dpd_action must be restart, or a dead tunnel stays down")
    hold = None
    if frr_conf and (timers := re.findall(r"^ neighbor 169\.254\.\S+ timers (\d+) (\d+)$", frr_conf, re.MULTILINE)):
        hold = float(max(int(h) for _, h in timers))
    return FailoverBudget(
        dpd_delay=float(dpd.removesuffix("s")), ike_give_up=ike_give_up_seconds(timeout, base, tries), bgp_hold=hold
    )
