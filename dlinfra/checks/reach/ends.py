"""The ends of a flow as the engine sees them: where each is (a subnet with its security groups, behind a site
gateway, on a Client VPN, on the internet), every address it may have, and the ports it connects from."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

from dlinfra.checks.reach import packets as pk
from dlinfra.checks.reach.packets import NOTHING, Packets
from dlinfra.checks.reach.topology import Addr, Net, Resource

Protocol = Literal["tcp", "udp", "icmp"]
PortRange = tuple[int, int]
LINUX_EPHEMERAL: tuple[PortRange, ...] = ((32768, 60999),)  # VPC user guide, "Ephemeral ports"
ANY_CLIENT_PORT: tuple[PortRange, ...] = ((1024, 65535),)  # NAT gateways, ELB, Lambda; unknown clients
ANY_PORT: tuple[PortRange, ...] = ((0, 65535),)
NOT_ON_THE_INTERNET = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "224.0.0.0/3",
    )
)


@dataclass(frozen=True)
class InVpc:
    """An interface in a VPC subnet, with its security groups."""

    vpc_id: str
    subnet_id: str
    security_groups: tuple[str, ...]
    public_ip: bool = False  # whether it holds a public IPv4 address


@dataclass(frozen=True)
class AtSite:
    """An address behind a site gateway: its LAN or its hybrid pods."""

    site: str
    network: Literal["lan", "pods"]


@dataclass(frozen=True)
class OnClientVpn:
    """A laptop connected to a Client VPN endpoint, signed in as a member of `group` (None: any member)."""

    endpoint_id: str
    group: str | None


@dataclass(frozen=True)
class OnInternet:
    """Any host on the internet."""


Location = InVpc | AtSite | OnClientVpn | OnInternet


@dataclass(frozen=True)
class Endpoint:
    """One end of a flow: a named thing and every address it may have."""

    label: str
    network: Net | Addr  # an address is read as its /32
    location: Location
    ephemeral: tuple[PortRange, ...] = LINUX_EPHEMERAL  # the source ports it opens connections from
    ephemeral_leaving: tuple[PortRange, ...] | None = None  # ... to outside its VPC, where they differ (NAT)
    extra: tuple[Net, ...] = ()  # further ranges of its addresses (a hybrid pod pool of several CIDRs)
    sends_only_to: tuple[Net, ...] | None = None  # the EKS control plane: the VPC and remote networks
    scope_origin: Resource | None = None  # where `sends_only_to` (and `public_api`) comes from
    public_api: tuple[Net, ...] | None = None  # an EKS API's public endpoint: who may reach it on 443
    taken: tuple[Net, ...] = ()  # addresses in its ranges that other things hold (an instance's own address)

    def __post_init__(self) -> None:
        if isinstance(self.network, ipaddress.IPv4Address):
            object.__setattr__(self, "network", ipaddress.IPv4Network(self.network))

    @property
    def networks(self) -> tuple[Net, ...]:
        assert isinstance(self.network, ipaddress.IPv4Network)
        return (self.network, *self.extra)

    def where(self) -> str:
        """Its addresses, for a label: `10.2.0.0/20`."""
        return ", ".join(str(n) for n in self.networks)

    def addresses(self, which: Literal["src", "dst"]) -> Packets:
        """Packets whose `which` address is one this end may have."""
        if isinstance(self.location, OnInternet):
            return ~pk.nets(which, NOT_ON_THE_INTERNET)
        node = NOTHING
        for network in self.networks:
            node |= pk.net(which, network)
            if isinstance(self.location, InVpc | OnClientVpn) and network.prefixlen <= 28:
                # AWS keeps the first four and the last address of a subnet (VPC user guide, "Subnet CIDR blocks").
                node &= ~pk.net(which, ipaddress.IPv4Network((network.network_address, 30)))
                node &= ~pk.net(which, ipaddress.IPv4Network(network.broadcast_address))
            elif isinstance(self.location, AtSite) and self.location.network == "lan" and network.prefixlen <= 30:
                # A LAN's network and broadcast addresses are no host's.
                node &= ~pk.net(which, ipaddress.IPv4Network(network.network_address))
                node &= ~pk.net(which, ipaddress.IPv4Network(network.broadcast_address))
        for network in self.taken:
            node &= ~pk.net(which, network)
        return node
