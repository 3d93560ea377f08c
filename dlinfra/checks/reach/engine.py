"""Hop-by-hop evaluation of one flow over a `Topology`: allowed, or denied at a named hop with the reason.

The semantics follow AWS's documentation, cited where they decide an answer:
- VPC route tables: the local route covers the VPC's CIDRs; otherwise the longest prefix wins; a subnet
  without an explicit association uses the main route table (VPC user guide, "Route tables", "Route priority").
- Security groups are stateful and allow only what a rule admits; a rule may name a CIDR or a group, and a
  group reference matches only traffic from an interface in the same VPC that carries the group; nothing
  crosses a transit gateway or a Client VPN by group (VPC user guide, "Security group rules"; Transit
  Gateway guide, "Security group referencing" is off by default and not used here).
- Network ACLs are stateless: rules in number order, first match decides, both directions (VPC user guide,
  "Network ACLs"). A subnet with no declared ACL has the default ACL, which allows everything.
- Transit gateways: each attachment is associated with one route table; static routes win over propagated
  ones of the same prefix; VPC attachments propagate the VPC's CIDRs, VPN attachments their BGP routes (or
  static VPN routes), peering attachments propagate nothing (Transit Gateway guide, "Route tables",
  "Transit gateway peering attachments").
- Client VPN: a connection reaches a destination only if an authorization rule for the user's group (or all
  groups) covers it, the most specific matching rule deciding, and the endpoint's route table routes it to an
  associated subnet, where the traffic leaves from the endpoint's interface with the endpoint's security
  groups and its address (source NAT) (Client VPN admin guide, "Authorization rules", "Routes").
- On EKS with the VPC CNI a pod has an address of its node's subnet and the node's security groups; hybrid
  pods have addresses of the site's pod range (EKS user guide, "Networking concepts for hybrid nodes").
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dlinfra.checks.reach.topology import Addr, Attachment, Net, Resource, Route, SgRule, Topology

Protocol = Literal["tcp", "udp", "icmp"]
EPHEMERAL_PORT = 49152  # a reply's destination port, for stateless ACLs
MAX_HOPS = 32


@dataclass(frozen=True)
class InVpc:
    """An interface in a VPC subnet, with its security groups."""

    vpc_id: str
    subnet_id: str
    security_groups: tuple[str, ...]


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
    """One end of a flow: a named thing with a representative address."""

    label: str
    address: Addr
    location: Location


@dataclass
class Verdict:
    """The answer for one flow: the hops it took and, when denied, where and why."""

    allowed: bool
    hops: list[str] = field(default_factory=list)
    denied_at: str = ""
    reason: str = ""
    resource: Resource | None = None  # the resource the denial names, when there is one
    tunnels: set[str] = field(default_factory=set)  # sites whose tunnels the flow crossed

    def deny(self, at: str, reason: str, resource: Resource | None = None) -> Verdict:
        self.allowed, self.denied_at, self.reason, self.resource = False, at, reason, resource
        return self


class _DeniedError(Exception):
    def __init__(self, at: str, reason: str, resource: Resource | None = None) -> None:
        super().__init__(f"{at}: {reason}")
        self.at, self.reason, self.resource = at, reason, resource


def _flow_text(protocol: str, port: int) -> str:
    return protocol if protocol == "icmp" else f"{protocol}/{port}"


def evaluate(topo: Topology, src: Endpoint, dst: Endpoint, protocol: Protocol, port: int) -> Verdict:
    """Whether `src` can open `protocol`/`port` to `dst` and get replies."""
    verdict = Verdict(allowed=True)
    try:
        _forward(topo, src, dst, protocol, port, verdict)
    except _DeniedError as denied:
        return verdict.deny(denied.at, denied.reason, denied.resource)
    return verdict


def _forward(topo: Topology, src: Endpoint, dst: Endpoint, protocol: Protocol, port: int, verdict: Verdict) -> None:
    source_address, source_location = src.address, src.location
    if isinstance(src.location, OnClientVpn):
        source_location, source_address = _client_vpn_entry(topo, src.location, dst.address, verdict)
    if isinstance(src.location, OnInternet):
        _from_internet(topo, dst, verdict)
        return
    same_vpc = _same_vpc(source_location, dst.location)
    if isinstance(source_location, InVpc):
        peer_groups = dst.location.security_groups if same_vpc and isinstance(dst.location, InVpc) else ()
        _security_groups(topo, source_location.security_groups, "egress", dst.address, peer_groups, protocol, port)
        verdict.hops.append(f"egress allowed by {_groups_label(topo, source_location.security_groups)}")
    arrival = _route(topo, source_location, source_address, dst.address, verdict, protocol, port)
    _arrive(topo, arrival, dst, source_address, protocol, port)
    if isinstance(dst.location, InVpc):
        peer_groups = source_location.security_groups if same_vpc and isinstance(source_location, InVpc) else ()
        _security_groups(topo, dst.location.security_groups, "ingress", source_address, peer_groups, protocol, port)
        verdict.hops.append(f"ingress allowed by {_groups_label(topo, dst.location.security_groups)}")
    # Security groups are stateful; the reply still needs a route back (and ACLs, which are not).
    back = Verdict(allowed=True)
    try:
        reply_arrival = _route(topo, dst.location, dst.address, source_address, back, protocol, EPHEMERAL_PORT)
    except _DeniedError as denied:
        raise _DeniedError(f"reply path: {denied.at}", denied.reason, denied.resource) from None
    if not _arrived_at(reply_arrival, source_location):
        raise _DeniedError(
            "reply path",
            f"replies to {source_address} arrive at {_where(topo, reply_arrival)}, not where the flow came from",
        )
    if (
        isinstance(source_location, InVpc)
        and isinstance(reply_arrival, _ArrivedVpc)
        and reply_arrival.via_subnet != source_location.subnet_id
    ):
        try:
            _nacl(topo, source_location.subnet_id, False, dst.address, protocol, EPHEMERAL_PORT)
        except _DeniedError as denied:
            raise _DeniedError(f"reply path: {denied.at}", denied.reason, denied.resource) from None
    verdict.hops.append("replies routed back")


def _same_vpc(a: object, b: object) -> bool:
    return isinstance(a, InVpc) and isinstance(b, InVpc) and a.vpc_id == b.vpc_id


def _groups_label(topo: Topology, groups: Sequence[str]) -> str:
    return ", ".join(topo.security_groups[g].origin.name if g in topo.security_groups else g for g in groups)


# --- security groups and ACLs ----------------------------------------------------------------------------
def _security_groups(
    topo: Topology,
    groups: Sequence[str],
    direction: str,
    peer: Addr,
    peer_groups: Sequence[str],
    protocol: str,
    port: int,
) -> SgRule:
    """The first rule of any of `groups` that admits the traffic; else _DeniedError naming the groups."""
    if not groups:
        raise _DeniedError("security groups", "the interface has no security group")
    for group_id in groups:
        group = topo.security_groups.get(group_id)
        if group is None:
            continue
        for rule in group.rules:
            if rule.direction != direction or not rule.admits_traffic(protocol, port):
                continue
            if (rule.cidr is not None and peer in rule.cidr) or (rule.group is not None and rule.group in peer_groups):
                return rule
    names = _groups_label(topo, groups)
    first = topo.security_groups.get(groups[0])
    word = "ingress" if direction == "ingress" else "egress"
    side = "from" if direction == "ingress" else "to"
    raise _DeniedError(
        f"security group {names}",
        f"no {word} rule admits {side} {peer} {_flow_text(protocol, port)}",
        first.origin if first else None,
    )


def _nacl(topo: Topology, subnet_id: str, egress: bool, peer: Addr, protocol: str, port: int) -> None:
    acl = topo.nacl_of(subnet_id)
    if acl is None:
        return
    for rule in sorted((r for r in acl.rules if r.egress == egress), key=lambda r: r.number):
        if peer not in rule.cidr:
            continue
        if rule.protocol not in ("-1", protocol):
            continue
        ranged = protocol != "icmp" and rule.protocol != "-1" and rule.from_port is not None
        if ranged and not (rule.from_port or 0) <= port <= (rule.to_port or rule.from_port or 0):
            continue
        if rule.allow:
            return
        raise _DeniedError(
            f"network ACL {acl.origin.name}",
            f"rule {rule.number} denies {peer} {_flow_text(protocol, port)}",
            acl.origin,
        )
    raise _DeniedError(
        f"network ACL {acl.origin.name}",
        f"no {'outbound' if egress else 'inbound'} rule allows {peer} {_flow_text(protocol, port)} (implicit deny)",
        acl.origin,
    )


# --- entries that are not an interface in a VPC ---------------------------------------------------------
def _client_vpn_entry(topo: Topology, laptop: OnClientVpn, destination: Addr, verdict: Verdict) -> tuple[InVpc, Addr]:
    endpoint = topo.client_vpns.get(laptop.endpoint_id)
    if endpoint is None:
        raise _DeniedError("client VPN", f"no endpoint {laptop.endpoint_id} in the plans")
    name = f"client VPN {endpoint.origin.name}"
    matching = [r for r in endpoint.auth_rules if destination in r.destination]
    if not matching:
        raise _DeniedError(name, f"no authorization rule covers {destination}", endpoint.origin)
    longest = max(r.destination.prefixlen for r in matching)
    best = [r for r in matching if r.destination.prefixlen == longest]
    if not any(r.group is None or (laptop.group is not None and r.group == laptop.group) for r in best):
        who = f"group {laptop.group}" if laptop.group else "this user"
        raise _DeniedError(
            name, f"the most specific authorization rule for {destination} does not admit {who}", best[0].origin
        )
    verdict.hops.append(f"{name}: authorized by {best[0].origin.name}")
    routes = [(net, subnet, origin) for net, subnet, origin in endpoint.routes if destination in net]
    # Associating a subnet adds a route to its VPC.
    for subnet_id in sorted(endpoint.subnets):
        subnet = topo.subnets.get(subnet_id)
        if subnet:
            for cidr in topo.vpcs[subnet.vpc_id].cidrs:
                if destination in cidr:
                    routes.append((cidr, subnet_id, endpoint.origin))
    routes = [r for r in routes if r[1] in endpoint.subnets]
    if not routes:
        raise _DeniedError(name, f"no route for {destination} through an associated subnet", endpoint.origin)
    net, subnet_id, origin = max(routes, key=lambda r: (r[0].prefixlen, r[1]))
    subnet = topo.subnets[subnet_id]
    verdict.hops.append(f"{name}: route {net} via {subnet.origin.name} ({origin.name})")
    address = host(subnet.cidr, 5)  # the endpoint's interface in that subnet; traffic leaves with its address
    return InVpc(subnet.vpc_id, subnet_id, endpoint.security_group_ids), address


def _from_internet(topo: Topology, dst: Endpoint, verdict: Verdict) -> None:
    if not isinstance(dst.location, InVpc):
        raise _DeniedError("internet", f"{dst.address} is not an address the internet can route to")
    vpc = topo.vpcs.get(dst.location.vpc_id)
    gateways = [g for g, v in topo.igws.items() if v == dst.location.vpc_id]
    if not gateways:
        raise _DeniedError("internet", f"VPC {vpc.origin.name if vpc else dst.location.vpc_id} has no internet gateway")
    subnet = topo.subnets[dst.location.subnet_id]
    if not subnet.public_ip_on_launch:
        raise _DeniedError(
            f"internet gateway {gateways[0]}",
            f"{dst.address} in {subnet.origin.name} has no public address (no public IP on launch, no Elastic IP)",
            subnet.origin,
        )
    table = topo.route_table_of(subnet.id)
    if table is None or not any(r.target == "igw" and r.destination.prefixlen == 0 for r in table.routes):
        raise _DeniedError(
            f"route table of {subnet.origin.name}",
            "no default route to the internet gateway for replies",
            subnet.origin,
        )
    _security_groups(
        topo, dst.location.security_groups, "ingress", ipaddress.IPv4Address("198.51.100.7"), (), "tcp", 443
    )
    verdict.hops.append("internet gateway -> public address")


# --- routing ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _ArrivedVpc:
    vpc_id: str
    via_subnet: str


@dataclass(frozen=True)
class _ArrivedSite:
    site: str


@dataclass(frozen=True)
class _ArrivedInternet:
    pass


_Arrival = _ArrivedVpc | _ArrivedSite | _ArrivedInternet


def _where(topo: Topology, arrival: _Arrival) -> str:
    if isinstance(arrival, _ArrivedVpc):
        vpc = topo.vpcs.get(arrival.vpc_id)
        return f"VPC {vpc.origin.name} ({vpc.origin.stack})" if vpc else arrival.vpc_id
    if isinstance(arrival, _ArrivedSite):
        return f"site {arrival.site}"
    return "the internet"


def _arrived_at(arrival: _Arrival, location: Location) -> bool:
    if isinstance(location, InVpc):
        return isinstance(arrival, _ArrivedVpc) and arrival.vpc_id == location.vpc_id
    if isinstance(location, AtSite):
        return isinstance(arrival, _ArrivedSite) and arrival.site == location.site
    return isinstance(location, OnInternet) and isinstance(arrival, _ArrivedInternet)


def _lpm(destination: Addr, candidates: Sequence[tuple[Net, int, Any]]) -> Any:
    """The candidate whose network holds `destination` with the longest prefix (ties: lowest rank)."""
    best: tuple[int, int, object] | None = None
    for net, rank, item in candidates:
        if destination in net and (best is None or (net.prefixlen, -rank) > (best[0], -best[1])):
            best = (net.prefixlen, rank, item)
    return best[2] if best else None


def _route(
    topo: Topology,
    start: Location,
    source: Addr,
    destination: Addr,
    verdict: Verdict,
    protocol: str,
    port: int,
) -> _Arrival:
    """Follow routes from `start` until the destination's network is reached; _DeniedError where they stop."""
    if isinstance(start, InVpc):
        if destination not in topo.subnets[start.subnet_id].cidr:
            _nacl(topo, start.subnet_id, True, destination, protocol, port)
        return _route_in_vpc(topo, start.subnet_id, source, destination, verdict, 0)
    if isinstance(start, AtSite):
        return _route_from_site(topo, start.site, source, destination, verdict, 0)
    raise _DeniedError("routing", f"cannot route from {start}")


def _route_in_vpc(
    topo: Topology, subnet_id: str, source: Addr, destination: Addr, verdict: Verdict, depth: int
) -> _Arrival:
    if depth > MAX_HOPS:
        raise _DeniedError("routing", "routing loop")
    subnet = topo.subnets[subnet_id]
    vpc = topo.vpcs[subnet.vpc_id]
    if any(destination in c for c in vpc.cidrs):
        verdict.hops.append(f"{vpc.origin.stack} local route")
        return _ArrivedVpc(vpc.id, subnet_id)
    table = topo.route_table_of(subnet_id)
    name = f"route table {table.origin.name}" if table else f"main route table of {vpc.origin.name}"
    found = _lpm(destination, [(r.destination, i, r) for i, r in enumerate(table.routes)] if table else [])
    if not isinstance(found, Route):
        raise _DeniedError(name, f"no route for {destination}", table.origin if table else vpc.origin)
    r = found
    verdict.hops.append(f"{name}: {r.destination} -> {r.target} {r.target_id}".rstrip())
    if r.target == "tgw":
        attachment = topo.vpc_attachment(vpc.id, r.target_id)
        if attachment is None:
            raise _DeniedError(
                name, f"routes {destination} to {r.target_id}, which has no attachment of {vpc.origin.name}", r.origin
            )
        return _route_in_tgw(topo, r.target_id, attachment.id, source, destination, verdict, depth + 1)
    if r.target == "nat":
        nat = topo.nats.get(r.target_id)
        if nat is None:
            raise _DeniedError(name, f"NAT gateway {r.target_id} is not in the plans (blackhole)", r.origin)
        return _route_in_vpc(topo, nat.subnet_id, source, destination, verdict, depth + 1)
    if r.target == "igw":
        if not destination.is_global:
            raise _DeniedError(
                f"internet gateway {r.target_id}", f"{destination} is not an internet address; it is dropped", r.origin
            )
        return _ArrivedInternet()
    if r.target == "blackhole":
        raise _DeniedError(name, f"the route for {r.destination} has no target (blackhole)", r.origin)
    raise _DeniedError(name, f"routes {destination} to {r.target_id}, which this model does not follow", r.origin)


def _tgw_candidates(topo: Topology, table_id: str) -> list[tuple[Net, int, object]]:
    table = topo.tgw_route_tables[table_id]
    out: list[tuple[Net, int, object]] = [
        (r.destination, 0, ("static", r.attachment_id, r.origin)) for r in table.routes
    ]
    for att_id in sorted(table.propagations):
        att = topo.attachments.get(att_id)
        if att is None:
            continue
        for net in _propagated(topo, att):
            out.append((net, 1, ("propagated", att_id, att.origin)))
    return out


def _propagated(topo: Topology, att: Attachment) -> list[Net]:
    if att.kind == "vpc" and att.vpc_id in topo.vpcs:
        return list(topo.vpcs[att.vpc_id].cidrs)
    if att.kind == "vpn":
        if att.static_routes_only:
            return list(topo.vpn_routes.get(att.connection_id, []))
        site = topo.sites.get(att.site or "")
        return list(site.announce) if site else []  # what the site's BGP announces
    return []  # peering attachments propagate nothing


def _route_in_tgw(
    topo: Topology, tgw_id: str, in_attachment: str, source: Addr, destination: Addr, verdict: Verdict, depth: int
) -> _Arrival:
    if depth > MAX_HOPS:
        raise _DeniedError("routing", "routing loop")
    tgw = topo.tgws.get(tgw_id)
    tgw_name = f"transit gateway {tgw.origin.name} ({tgw.origin.stack})" if tgw else f"transit gateway {tgw_id}"
    table = topo.associated_table(in_attachment, tgw_id)
    att_in = topo.attachments.get(in_attachment)
    att_name = att_in.origin.name if att_in else in_attachment
    if table is None:
        raise _DeniedError(
            tgw_name, f"attachment {att_name} is associated with no route table", att_in.origin if att_in else None
        )
    choice = _lpm(destination, _tgw_candidates(topo, table.id))
    if choice is None:
        raise _DeniedError(
            f"transit gateway route table {table.origin.name} ({table.origin.stack})",
            f"no route for {destination}",
            table.origin,
        )
    how, att_id, origin = choice
    assert isinstance(how, str) and isinstance(origin, Resource) and (att_id is None or isinstance(att_id, str))
    if att_id is None:
        raise _DeniedError(
            f"transit gateway route table {table.origin.name}", f"{destination} matches a blackhole route", origin
        )
    att = topo.attachments.get(att_id)
    if att is None:
        raise _DeniedError(
            f"transit gateway route table {table.origin.name}",
            f"route to attachment {att_id}, which is not in the plans",
            origin,
        )
    verdict.hops.append(f"{tgw_name}: {how} route -> {att.kind} attachment {att.origin.name}")
    if att.kind == "vpc":
        subnet = att.subnet_ids[0] if att.subnet_ids else ""
        if subnet not in topo.subnets:
            raise _DeniedError(tgw_name, f"attachment {att.origin.name} has no subnet", att.origin)
        return _route_in_vpc(topo, subnet, source, destination, verdict, depth + 1)
    if att.kind == "peering":
        if not att.accepted:
            raise _DeniedError(tgw_name, f"peering attachment {att.origin.name} is never accepted", att.origin)
        other = att.peer_tgw_id if att.tgw_id == tgw_id else att.tgw_id
        return _route_in_tgw(topo, str(other), att.id, source, destination, verdict, depth + 1)
    return _into_site(topo, att.site or "", source, destination, verdict, att.origin)


def _into_site(
    topo: Topology, site_name: str, source: Addr, destination: Addr, verdict: Verdict, origin: Resource
) -> _Arrival:
    site = topo.sites.get(site_name)
    if site is None:
        raise _DeniedError(f"VPN {origin.name}", f"site {site_name!r} is not in the fleet", origin)
    gateway = f"site {site.name} gateway"
    if destination not in site.lan and destination not in site.pods:
        raise _DeniedError(
            f"VPN {origin.name}",
            f"{destination} is routed into site {site.name}'s tunnel, which does not own it: no site's traffic may "
            "be routed through another site",
            origin,
        )
    if not any(destination in n for n in site.local_selectors) or not any(source in n for n in site.remote_selectors):
        raise _DeniedError(gateway, f"no IPsec policy carries {source} -> {destination}")
    verdict.tunnels.add(site.name)
    verdict.hops.append(f"VPN {origin.name} -> {gateway}")
    if destination in site.lan:
        return _ArrivedSite(site.name)
    if destination in site.pods:
        if site.pod_routes is None:
            raise _DeniedError(
                gateway,
                f"no route to hybrid pod {destination} inside the site "
                "(nothing gives the gateway the nodes' pod routes)",
            )
        verdict.hops.append(f"{gateway}: pod route from {site.pod_routes}")
        return _ArrivedSite(site.name)
    raise _DeniedError(gateway, f"{destination} is not in the site's networks")


def _route_from_site(
    topo: Topology, site_name: str, source: Addr, destination: Addr, verdict: Verdict, depth: int
) -> _Arrival:
    site = topo.sites[site_name]
    gateway = f"site {site.name} gateway"
    if destination in site.lan or destination in site.pods:
        return _ArrivedSite(site.name)
    if not any(source in n for n in site.local_selectors) or not any(destination in n for n in site.remote_selectors):
        raise _DeniedError(gateway, f"no IPsec policy carries {source} -> {destination}")
    attachment = topo.vpn_attachment(site.name)
    if attachment is None:
        raise _DeniedError(gateway, "the site has no VPN connection in the plans")
    verdict.tunnels.add(site.name)
    verdict.hops.append(f"{gateway} -> VPN {attachment.origin.name}")
    return _route_in_tgw(topo, attachment.tgw_id, attachment.id, source, destination, verdict, depth + 1)


def _arrive(topo: Topology, arrival: _Arrival, dst: Endpoint, source: Addr, protocol: str, port: int) -> None:
    location = dst.location
    if not _arrived_at(arrival, location):
        raise _DeniedError("routing", f"{dst.address} is routed to {_where(topo, arrival)}, not to {dst.label}")
    if isinstance(location, InVpc) and isinstance(arrival, _ArrivedVpc) and arrival.via_subnet != location.subnet_id:
        _nacl(topo, location.subnet_id, False, source, protocol, port)


def host(network: Net, offset: int) -> Addr:
    """A representative address `offset` into a network (kept inside it for small ones)."""
    return network.network_address + min(offset, max(network.num_addresses - 2, 1))
