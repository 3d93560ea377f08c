"""What the plan exports declare about the network, as one model across every stack of an environment.

Ids are the fake cloud's, derived from URNs, so a route in the global stack names the same transit gateway route
table as the regional stack that declares it. Sites are not in the plans: `SiteSide` describes each one's gateway.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Literal

Net = ipaddress.IPv4Network
Addr = ipaddress.IPv4Address

RouteTarget = Literal["local", "igw", "nat", "tgw", "blackhole", "other"]
AttachmentKind = Literal["vpc", "vpn", "peering"]


@dataclass(frozen=True)
class Resource:
    """Where a fact came from, so a denial can name the resource to fix."""

    stack: str
    name: str  # logical name, e.g. pool-cpu-sg
    urn: str


@dataclass(frozen=True)
class SgRule:
    """One security group rule: a direction, a protocol and port range, and a CIDR or group peer."""

    origin: Resource
    direction: Literal["ingress", "egress"]
    protocol: str  # "-1" (all), "tcp", "udp", "icmp"
    from_port: int | None
    to_port: int | None
    cidr: Net | None = None
    group: str | None = None  # referenced security group id

    def admits_traffic(self, protocol: str, port: int) -> bool:
        if self.protocol == "-1":
            return True
        if self.protocol != protocol:
            return False
        if protocol == "icmp" or self.from_port is None or self.from_port < 0:
            return True
        return self.from_port <= port <= (self.to_port if self.to_port is not None else self.from_port)


@dataclass
class SecurityGroup:
    id: str
    origin: Resource
    vpc_id: str
    rules: list[SgRule] = field(default_factory=list)


@dataclass(frozen=True)
class NaclRule:
    number: int
    egress: bool
    allow: bool
    protocol: str
    cidr: Net
    from_port: int | None
    to_port: int | None
    origin: Resource


@dataclass
class NetworkAcl:
    id: str
    origin: Resource
    vpc_id: str
    subnet_ids: set[str] = field(default_factory=set)
    rules: list[NaclRule] = field(default_factory=list)


@dataclass(frozen=True)
class Route:
    destination: Net
    target: RouteTarget
    target_id: str
    origin: Resource


@dataclass
class RouteTable:
    id: str
    origin: Resource
    vpc_id: str
    routes: list[Route] = field(default_factory=list)


@dataclass
class Subnet:
    id: str
    origin: Resource
    vpc_id: str
    cidr: Net
    az: str
    public_ip_on_launch: bool


@dataclass
class Vpc:
    id: str
    origin: Resource
    region: str
    environment: str
    cidrs: list[Net] = field(default_factory=list)
    main_route_table: str | None = None
    default_acl: str | None = None  # a declared DefaultNetworkAcl: it filters every subnet no other ACL has
    default_route_table: str = ""  # the id AWS gives the VPC's own main route table (a DefaultRouteTable's)
    default_acl_id: str = ""  # the id AWS gives the VPC's own default network ACL


@dataclass
class Nat:
    id: str
    origin: Resource
    subnet_id: str
    public: bool


@dataclass
class Attachment:
    id: str
    origin: Resource
    kind: AttachmentKind
    tgw_id: str  # for peering: the requester's transit gateway
    vpc_id: str | None = None
    subnet_ids: tuple[str, ...] = ()
    site: str | None = None  # VPN attachments: the site whose gateway is the customer gateway
    static_routes_only: bool = False
    peer_tgw_id: str | None = None  # peering: the accepter's transit gateway
    accepted: bool = False  # peering: an accepter exists
    connection_id: str = ""  # VPN attachments: the VPN connection (its static routes are keyed by it)


@dataclass
class TgwRoute:
    destination: Net
    attachment_id: str | None  # None: blackhole
    origin: Resource


@dataclass
class TgwRouteTable:
    id: str
    origin: Resource
    tgw_id: str
    associations: set[str] = field(default_factory=set)
    propagations: set[str] = field(default_factory=set)
    routes: list[TgwRoute] = field(default_factory=list)


@dataclass
class TransitGateway:
    id: str
    origin: Resource
    region: str
    default_association: bool
    default_propagation: bool


@dataclass(frozen=True)
class AuthRule:
    destination: Net
    group: str | None  # None: authorizes all groups
    origin: Resource


@dataclass
class ClientVpn:
    id: str
    origin: Resource
    region: str
    environment: str
    client_cidr: Net
    security_group_ids: tuple[str, ...]
    federated: bool
    subnets: set[str] = field(default_factory=set)
    routes: list[tuple[Net, str, Resource]] = field(default_factory=list)  # destination, target subnet, origin
    auth_rules: list[AuthRule] = field(default_factory=list)


@dataclass(frozen=True)
class Place:
    """Something with addresses in a VPC: a node pool, the control plane ENIs, mount targets, endpoints."""

    kind: str  # pool | control-plane | efs | fsx | endpoint | ci-runner | instance | dev-box
    name: str  # pool name, endpoint service, ...
    environment: str
    region: str
    vpc_id: str
    subnet_ids: tuple[str, ...]
    security_group_ids: tuple[str, ...]
    origin: Resource
    public_ip: bool | None = None  # a launch template's or instance's own setting; None: the subnet's default
    remote_networks: tuple[Net, ...] | None = None  # control plane: the cluster's remote node and pod networks
    public_api: tuple[Net, ...] | None = None  # control plane with a public endpoint: its publicAccessCidrs
    address: Net | None = None  # an instance's own private address (/32) when the plan knows it; else its subnets


@dataclass(frozen=True)
class SiteSide:
    """A physical site's gateway as rendered for it: what it routes and which IPsec policies it holds."""

    name: str
    environment: str
    region: str  # home region (the VPN connection's)
    lan: Net
    pods: Net  # the site's pod range in the address plan
    announce: tuple[Net, ...]  # what the gateway's BGP announces to AWS (its rendered frr.conf)
    local_selectors: tuple[Net, ...]  # IPsec traffic selectors, site side (its rendered swanctl.conf)
    remote_selectors: tuple[Net, ...]  # IPsec traffic selectors, AWS side
    pod_routes: tuple[tuple[Net, str], ...] = ()  # what the gateway learns of the hybrid pods, and from what
    pod_networks: tuple[Net, ...] = ()  # where hybrid pods take addresses (Cilium's pod IP pools); () = pods

    def __post_init__(self) -> None:
        if not self.pod_networks:
            object.__setattr__(self, "pod_networks", (self.pods,))


@dataclass
class Topology:
    """Everything of the network the plans declare, indexed by id."""

    vpcs: dict[str, Vpc] = field(default_factory=dict)
    subnets: dict[str, Subnet] = field(default_factory=dict)
    route_tables: dict[str, RouteTable] = field(default_factory=dict)
    subnet_route_table: dict[str, str] = field(default_factory=dict)
    igws: dict[str, str] = field(default_factory=dict)  # igw id -> vpc id
    nats: dict[str, Nat] = field(default_factory=dict)
    security_groups: dict[str, SecurityGroup] = field(default_factory=dict)
    nacls: dict[str, NetworkAcl] = field(default_factory=dict)
    tgws: dict[str, TransitGateway] = field(default_factory=dict)
    attachments: dict[str, Attachment] = field(default_factory=dict)
    tgw_route_tables: dict[str, TgwRouteTable] = field(default_factory=dict)
    vpn_routes: dict[str, list[Net]] = field(default_factory=dict)  # VPN connection id -> static routes
    client_vpns: dict[str, ClientVpn] = field(default_factory=dict)
    places: list[Place] = field(default_factory=list)
    sites: dict[str, SiteSide] = field(default_factory=dict)
    cluster_groups: set[str] = field(default_factory=set)  # EKS-created cluster security groups
    public_ips: set[str] = field(default_factory=set)  # network interfaces and instances with an Elastic IP
    ipv6: list[tuple[Resource, str]] = field(default_factory=list)  # what declares IPv6, which is not modelled
    prefix_lists: dict[str, list[Net]] = field(default_factory=dict)  # declared managed prefix lists' CIDRs
    unresolved: list[tuple[Resource, str]] = field(default_factory=list)  # rules naming an undeclared prefix list

    # --- lookups -------------------------------------------------------------------------------------
    def route_table_of(self, subnet_id: str) -> RouteTable | None:
        rt = self.subnet_route_table.get(subnet_id)
        if rt is None:
            main = self.vpcs[self.subnets[subnet_id].vpc_id].main_route_table
            rt = main
        return self.route_tables.get(rt) if rt else None

    def vpc_of_address(self, address: Addr) -> Vpc | None:
        for vpc in self.vpcs.values():
            if any(address in c for c in vpc.cidrs):
                return vpc
        return None

    def subnet_of_address(self, vpc_id: str, address: Addr) -> Subnet | None:
        for subnet in self.subnets.values():
            if subnet.vpc_id == vpc_id and address in subnet.cidr:
                return subnet
        return None

    def nacl_of(self, subnet_id: str) -> NetworkAcl | None:
        """The subnet's network ACL: the one associated with it, else its VPC's default ACL when the plans declare
        its rules (an undeclared default ACL allows everything)."""
        for acl in self.nacls.values():
            if subnet_id in acl.subnet_ids and acl.id not in self.default_acls():
                return acl
        subnet = self.subnets.get(subnet_id)
        vpc = self.vpcs.get(subnet.vpc_id) if subnet else None
        return self.nacls.get(vpc.default_acl or "") if vpc else None

    def default_acls(self) -> set[str]:
        return {v.default_acl for v in self.vpcs.values() if v.default_acl}

    def vpc_attachment(self, vpc_id: str, tgw_id: str) -> Attachment | None:
        for att in self.attachments.values():
            if att.kind == "vpc" and att.vpc_id == vpc_id and att.tgw_id == tgw_id:
                return att
        return None

    def vpn_attachment(self, site: str) -> Attachment | None:
        for att in self.attachments.values():
            if att.kind == "vpn" and att.site == site:
                return att
        return None

    def associated_table(self, attachment_id: str, tgw_id: str) -> TgwRouteTable | None:
        for table in self.tgw_route_tables.values():
            if table.tgw_id == tgw_id and attachment_id in table.associations:
                return table
        return None
