"""Routing and network ACLs over sets of packets: VPC route tables, transit gateways and their attachments,
site gateways (see engine.py for the AWS semantics and their sources). `Router` records what each hop drops."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

from dlinfra.checks.reach import packets as pk
from dlinfra.checks.reach.ends import NOT_ON_THE_INTERNET, AtSite, InVpc, Location, OnInternet
from dlinfra.checks.reach.packets import NOTHING, Packet, Packets
from dlinfra.checks.reach.topology import Attachment, Nat, Net, Resource, Route, Topology

_T = TypeVar("_T")
MAX_HOPS = 32


@dataclass(frozen=True)
class Trail:
    """The hops a branch of a flow took, and the sites whose tunnels it crossed."""

    hops: tuple[str, ...] = ()
    tunnels: frozenset[str] = frozenset()
    az: str | None = None  # where the packets started, for a transit gateway's choice of attachment subnet
    public: bool = False  # the packets carry a public address (the interface's, or a public NAT gateway's)
    # A choice AWS makes and does not document (which attachment subnet): (what is chosen, this option, all options).
    # A packet is proved only if it gets through with every option, and reaches if it does with one.
    option: tuple[str, str, tuple[str, ...]] | None = None

    def add(self, hop: str) -> Trail:
        return replace(self, hops=(*self.hops, hop))

    def through(self, site: str) -> Trail:
        return replace(self, tunnels=self.tunnels | {site})


Reason = Callable[[Packet], str]


@dataclass(frozen=True)
class Drop:
    """Packets a hop dropped: where, why (given one of them), the resource to fix, and the path so far."""

    packets: Packets
    at: str
    reason: Reason
    resource: Resource | None
    trail: Trail
    reply: bool = False
    nat: tuple[Packets, Packets] | None = None  # (the flow's packets, the source space NAT gave them), if any


# --- arrivals -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _ArrivedVpc:
    vpc_id: str
    via_subnet: str  # the subnet the packets came into the destination's subnet from
    via: Literal["local", "tgw", "igw"] = "local"


@dataclass(frozen=True)
class _ArrivedSite:
    site: str


@dataclass(frozen=True)
class _ArrivedInternet:
    pass


_Arrival = _ArrivedVpc | _ArrivedSite | _ArrivedInternet
_Branch = tuple[Packets, _Arrival, Trail]


class Router:
    """Routes and ACLs for one flow's evaluation, and the drops they record (with the Client VPN translation the
    packets travel under, if any)."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.drops: list[Drop] = []
        self._nat: tuple[Packets, Packets] | None = None  # (original packets, their translated source space)
        self._reply = False

    # --- bookkeeping ------------------------------------------------------------------------------------
    def drop(self, packets: Packets, at: str, reason: Reason, resource: Resource | None, trail: Trail) -> None:
        if packets != NOTHING:
            self.drops.append(Drop(packets, at, reason, resource, trail, self._reply, self._nat))

    def stopped(self, packets: Packets, trail: Trail, depth: int) -> bool:
        """Nothing left to route, or a routing loop (the packets dropped)."""
        if depth > MAX_HOPS:
            self.drop(packets, "routing", lambda p: "routing loop", None, trail)
        return packets == NOTHING or depth > MAX_HOPS

    def nacl(self, subnet_id: str, egress: bool, packets: Packets, trail: Trail, *, record: bool = True) -> Packets:
        """The packets the subnet's network ACL lets out (egress) or in; first match, implicit deny."""
        acl = self.topo.nacl_of(subnet_id)
        if acl is None or packets == NOTHING:
            return packets
        name = f"network ACL {acl.origin.name}"
        peer: Literal["src", "dst"] = "dst" if egress else "src"
        remaining, passed = packets, NOTHING
        for rule in sorted((r for r in acl.rules if r.egress == egress), key=lambda r: r.number):
            match = pk.net(peer, rule.cidr) & pk.protocol(rule.protocol)
            if rule.protocol not in ("-1", "icmp", "1") and rule.from_port is not None:
                match &= pk.ports("dport", rule.from_port, rule.to_port if rule.to_port is not None else rule.from_port)
            hit = remaining & match
            remaining &= ~match
            if rule.allow:
                passed |= hit
            elif record:
                self.drop(
                    hit,
                    name,
                    _text(lambda p, n=rule.number: f"rule {n} denies {p.dst if egress else p.src} {p.flow()}"),
                    acl.origin,
                    trail,
                )
        direction = "outbound" if egress else "inbound"
        if not record:
            return passed
        self.drop(
            remaining,
            name,
            lambda p: f"no {direction} rule allows {p.dst if egress else p.src} {p.flow()} (implicit deny)",
            acl.origin,
            trail,
        )
        return passed

    # --- routing ----------------------------------------------------------------------------------------------
    def where(self, arrival: _Arrival) -> str:
        if isinstance(arrival, _ArrivedVpc):
            vpc = self.topo.vpcs.get(arrival.vpc_id)
            return f"VPC {vpc.origin.name} ({vpc.origin.stack})" if vpc else arrival.vpc_id
        if isinstance(arrival, _ArrivedSite):
            return f"site {arrival.site}"
        return "the internet"

    def route(self, start: InVpc | AtSite, packets: Packets, trail: Trail) -> list[_Branch]:
        """Follow routes from `start` until the destination's network; drops recorded where they stop."""
        if isinstance(start, InVpc):
            subnet = self.topo.subnets[start.subnet_id]
            inside = packets & pk.net("dst", subnet.cidr)
            outside = self.nacl(start.subnet_id, True, packets & ~pk.net("dst", subnet.cidr), trail)
            return self.in_vpc(start.subnet_id, inside | outside, trail, 0)
        return self.from_site(start.site, packets, trail, 0)

    def in_vpc(
        self, subnet_id: str, packets: Packets, trail: Trail, depth: int, via: Literal["local", "tgw"] = "local"
    ) -> list[_Branch]:
        topo = self.topo
        if self.stopped(packets, trail, depth):
            return []
        subnet = topo.subnets[subnet_id]
        vpc = topo.vpcs[subnet.vpc_id]
        local = pk.nets("dst", vpc.cidrs)
        out: list[_Branch] = []
        if packets & local != NOTHING:
            out.append(
                (packets & local, _ArrivedVpc(vpc.id, subnet_id, via), trail.add(f"{vpc.origin.stack} local route"))
            )
        packets &= ~local
        if packets == NOTHING:
            return out
        table = topo.route_table_of(subnet_id)
        name = f"route table {table.origin.name}" if table else f"main route table of {vpc.origin.name}"
        parts, rest = _lpm(packets, [(r.destination, i, r) for i, r in enumerate(table.routes)] if table else [])
        self.drop(rest, name, lambda p: f"no route for {p.dst}", table.origin if table else vpc.origin, trail)
        for part, r in parts:
            out += self.follow(subnet_id, vpc.id, name, r, part, trail, depth)
        return out

    def follow(
        self, subnet_id: str, vpc_id: str, name: str, r: Route, part: Packets, trail: Trail, depth: int
    ) -> list[_Branch]:
        topo = self.topo
        vpc = topo.vpcs[vpc_id]
        trail = trail.add(f"{name}: {r.destination} -> {r.target} {r.target_id}".rstrip())
        if r.target == "tgw":
            attachment = topo.vpc_attachment(vpc_id, r.target_id)
            if attachment is None:
                self.drop(
                    part,
                    name,
                    lambda p: f"routes {p.dst} to {r.target_id}, which has no attachment of {vpc.origin.name}",
                    r.origin,
                    trail,
                )
                return []
            az = topo.subnets[subnet_id].az
            exits = [s for s in attachment.subnet_ids if s in topo.subnets and topo.subnets[s].az == az]
            if not exits:
                self.drop(
                    part,
                    f"transit gateway attachment {attachment.origin.name}",
                    lambda p: (
                        f"the attachment has no subnet in {az}, so traffic from {p.src} never reaches the "
                        "transit gateway"
                    ),
                    attachment.origin,
                    trail,
                )
                return []
            part = self.nacl(exits[0], False, part, trail)  # into the transit gateway: its subnet's inbound rules
            return self.in_tgw(r.target_id, attachment.id, part, trail, depth + 1)
        if r.target == "nat":
            nat = topo.nats.get(r.target_id)
            if nat is None:
                self.drop(
                    part, name, lambda p: f"NAT gateway {r.target_id} is not in the plans (blackhole)", r.origin, trail
                )
                return []
            return self.through_nat(subnet_id, nat, part, trail, depth)
        if r.target == "igw":
            public = ~pk.nets("dst", NOT_ON_THE_INTERNET)
            self.drop(
                part & ~public,
                f"internet gateway {r.target_id}",
                lambda p: f"{p.dst} is not an internet address; it is dropped",
                r.origin,
                trail,
            )
            part &= public
            if not trail.public:
                # The gateway translates only interfaces with a public address (VPC user guide, "Configuration for
                # internet access"); a private NAT gateway's traffic is dropped there too (NAT gateways guide).
                self.drop(
                    part,
                    f"internet gateway {r.target_id}",
                    lambda p: f"{p.src} has no public address (nor a public NAT gateway's): the gateway drops it",
                    r.origin,
                    trail,
                )
                return []
            return [(part, _ArrivedInternet(), trail)] if part != NOTHING else []
        if r.target == "blackhole":
            self.drop(part, name, lambda p: f"the route for {r.destination} has no target (blackhole)", r.origin, trail)
            return []
        self.drop(
            part, name, lambda p: f"routes {p.dst} to {r.target_id}, which this model does not follow", r.origin, trail
        )
        return []

    def through_nat(self, subnet_id: str, nat: Nat, packets: Packets, trail: Trail, depth: int) -> list[_Branch]:
        """Through a NAT gateway, an interface in its own subnet: that subnet's ACL lets the packets in and out,
        and lets the replies in (to a port the gateway picked, 1024-65535) and back out to the instance; a public
        gateway gives the packets its public address (NAT gateways guide)."""
        where = nat.subnet_id
        if where != subnet_id:
            packets = self.nacl(where, False, packets, trail)
        inside = pk.net("dst", self.topo.subnets[where].cidr) if where in self.topo.subnets else NOTHING
        packets = (packets & inside) | self.nacl(where, True, packets & ~inside, trail)
        if packets & ~inside != NOTHING and where in self.topo.subnets:
            replies = pk.reply(packets & ~inside)
            translated = pk.net("dst", self.topo.subnets[where].cidr) & pk.ports("dport", 1024, 65535)
            self._reply = True
            back_in = self.nacl(where, False, pk.forget(replies, ("dst", "dport")) & translated, trail, record=False)
            answered = pk.for_every(back_in | ~translated, ("dst", "dport"))
            acl = self.topo.nacl_of(where)
            self.drop(
                replies & ~answered,
                f"network ACL {acl.origin.name if acl else ''} of NAT gateway {nat.origin.name}",
                lambda p: f"no inbound rule admits every reply from {p.src} to the gateway's ports 1024-65535",
                acl.origin if acl else None,
                trail,
            )
            back_out = self.nacl(where, True, replies & answered, trail) if where != subnet_id else replies & answered
            self._reply = False
            packets = (packets & inside) | (packets & pk.reply(back_out))
        trail = trail.add(f"NAT gateway {nat.origin.name}")
        if nat.public:
            trail = replace(trail, public=True)
        return self.in_vpc(where, packets, trail, depth + 1)

    def in_tgw(self, tgw_id: str, in_attachment: str, packets: Packets, trail: Trail, depth: int) -> list[_Branch]:
        topo = self.topo
        if self.stopped(packets, trail, depth):
            return []
        tgw = topo.tgws.get(tgw_id)
        tgw_name = f"transit gateway {tgw.origin.name} ({tgw.origin.stack})" if tgw else f"transit gateway {tgw_id}"
        table = topo.associated_table(in_attachment, tgw_id)
        att_in = topo.attachments.get(in_attachment)
        att_name = att_in.origin.name if att_in else in_attachment
        if table is None:
            self.drop(
                packets,
                tgw_name,
                lambda p: f"attachment {att_name} is associated with no route table",
                att_in.origin if att_in else None,
                trail,
            )
            return []
        table_name = f"transit gateway route table {table.origin.name} ({table.origin.stack})"
        parts, rest = _lpm(packets, _tgw_candidates(topo, table.id))
        self.drop(rest, table_name, lambda p: f"no route for {p.dst}", table.origin, trail)
        out: list[_Branch] = []
        for part, (how, att_id, origin) in parts:
            if att_id is None:
                self.drop(
                    part,
                    f"transit gateway route table {table.origin.name}",
                    lambda p: f"{p.dst} matches a blackhole route",
                    origin,
                    trail,
                )
                continue
            att = topo.attachments.get(att_id)
            if att is None:
                self.drop(
                    part,
                    f"transit gateway route table {table.origin.name}",
                    _text(lambda p, a=att_id: f"route to attachment {a}, which is not in the plans"),
                    origin,
                    trail,
                )
                continue
            hop = trail.add(f"{tgw_name}: {how} route -> {att.kind} attachment {att.origin.name}")
            if att.kind == "vpc":
                out += self.into_vpc(tgw_name, att, part, hop, depth)
            elif att.kind == "peering":
                if not att.accepted:
                    self.drop(
                        part,
                        tgw_name,
                        _text(lambda p, a=att: f"peering attachment {a.origin.name} is never accepted"),
                        att.origin,
                        hop,
                    )
                    continue
                other = att.peer_tgw_id if att.tgw_id == tgw_id else att.tgw_id
                hop = replace(hop, az=None)  # AZ affinity holds within one transit gateway
                out += self.in_tgw(str(other), att.id, part, hop, depth + 1)
            else:
                out += self.into_site(att.site or "", part, hop, att.origin)
        return out

    def into_vpc(self, tgw_name: str, att: Attachment, packets: Packets, trail: Trail, depth: int) -> list[_Branch]:
        """Into a VPC through one of the attachment's interfaces. Without appliance mode the transit gateway keeps
        traffic in the Availability Zone it came from (Transit Gateway guide, "Appliance mode"): the attachment's
        subnet there. Where that is unknown (from a VPN, over a peering) or the attachment has none there, AWS does
        not say which one it takes: each is an option (`Trail.option`), every one of which must work."""
        topo = self.topo
        subnets = [s for s in att.subnet_ids if s in topo.subnets]
        if not subnets:
            self.drop(packets, tgw_name, lambda p: f"attachment {att.origin.name} has no subnet", att.origin, trail)
            return []
        same_az = [s for s in subnets if topo.subnets[s].az == trail.az]
        if same_az:
            return self.in_vpc(same_az[0], packets, trail, depth + 1, via="tgw")
        out: list[_Branch] = []
        for subnet_id in subnets:
            chosen = replace(trail, option=(att.id, subnet_id, tuple(subnets)))
            out += self.in_vpc(subnet_id, packets, chosen, depth + 1, via="tgw")
        return out

    def into_site(self, site_name: str, packets: Packets, trail: Trail, origin: Resource) -> list[_Branch]:
        site = self.topo.sites.get(site_name)
        if site is None:
            self.drop(packets, f"VPN {origin.name}", lambda p: f"site {site_name!r} is not in the fleet", origin, trail)
            return []
        gateway = f"site {site.name} gateway"
        owned = pk.nets("dst", (site.lan, *site.pod_networks))
        self.drop(
            packets & ~owned,
            f"VPN {origin.name}",
            lambda p: (
                f"{p.dst} is routed into site {site.name}'s tunnel, which does not own it: no site's traffic "
                "may be routed through another site"
            ),
            origin,
            trail,
        )
        packets &= owned
        carried = pk.nets("dst", site.local_selectors) & pk.nets("src", site.remote_selectors)
        self.drop(packets & ~carried, gateway, lambda p: f"no IPsec policy carries {p.src} -> {p.dst}", None, trail)
        packets &= carried
        if packets == NOTHING:
            return []
        trail = trail.through(site.name).add(f"VPN {origin.name} -> {gateway}")
        out: list[_Branch] = []
        lan = packets & pk.net("dst", site.lan)
        if lan != NOTHING:
            out.append((lan, _ArrivedSite(site.name), trail))
        pods = packets & ~pk.net("dst", site.lan)
        routed = pk.nets("dst", [n for n, _ in site.pod_routes])
        self.drop(
            pods & ~routed,
            gateway,
            lambda p: (
                f"no route to hybrid pod {p.dst} inside the site (no BGP announcement of the site's nodes covers it)"
            ),
            None,
            trail,
        )
        if pods & routed != NOTHING:
            how = ", ".join(sorted({how for _, how in site.pod_routes}))
            out.append((pods & routed, _ArrivedSite(site.name), trail.add(f"{gateway}: pod routes from {how}")))
        return out

    def from_site(self, site_name: str, packets: Packets, trail: Trail, depth: int) -> list[_Branch]:
        topo = self.topo
        site = topo.sites[site_name]
        gateway = f"site {site.name} gateway"
        local = pk.nets("dst", (site.lan, *site.pod_networks))
        out: list[_Branch] = []
        if packets & local != NOTHING:
            out.append((packets & local, _ArrivedSite(site.name), trail))
        packets &= ~local
        carried = pk.nets("src", site.local_selectors) & pk.nets("dst", site.remote_selectors)
        self.drop(packets & ~carried, gateway, lambda p: f"no IPsec policy carries {p.src} -> {p.dst}", None, trail)
        packets &= carried
        if packets == NOTHING:
            return out
        attachment = topo.vpn_attachment(site.name)
        if attachment is None:
            self.drop(packets, gateway, lambda p: "the site has no VPN connection in the plans", None, trail)
            return out
        trail = trail.through(site.name).add(f"{gateway} -> VPN {attachment.origin.name}")
        return out + self.in_tgw(attachment.tgw_id, attachment.id, packets, trail, depth + 1)


def _text(reason: Callable[..., str]) -> Reason:
    """A reason whose lambda binds loop values as defaults (which mypy cannot infer)."""
    return reason


def _arrived_at(arrival: _Arrival, location: Location) -> bool:
    if isinstance(location, InVpc):
        return isinstance(arrival, _ArrivedVpc) and arrival.vpc_id == location.vpc_id
    if isinstance(location, AtSite):
        return isinstance(arrival, _ArrivedSite) and arrival.site == location.site
    return isinstance(location, OnInternet) and isinstance(arrival, _ArrivedInternet)


def _lpm(packets: Packets, candidates: Iterable[tuple[Net, int, _T]]) -> tuple[list[tuple[Packets, _T]], Packets]:
    """`packets` split by the longest prefix matching their destination (ties: the lowest rank), and the rest."""
    out: list[tuple[Packets, _T]] = []
    remaining = packets
    for net, _rank, item in sorted(candidates, key=lambda c: (-c[0].prefixlen, c[1])):
        if remaining == NOTHING:
            break
        covered = pk.net("dst", net)
        part = remaining & covered
        if part != NOTHING:
            out.append((part, item))
            remaining &= ~covered
    return out, remaining


def _tgw_candidates(topo: Topology, table_id: str) -> list[tuple[Net, int, tuple[str, str | None, Resource]]]:
    table = topo.tgw_route_tables[table_id]
    out: list[tuple[Net, int, tuple[str, str | None, Resource]]] = [
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
        return list(site.announce) if site else []  # what the site's gateway announces over BGP
    return []  # peering attachments propagate nothing
