"""Symbolic evaluation of a flow over a `Topology`: every packet of its space, both directions, hop by hop.

A flow is a set of packets (`packets.py`): every source address of one end, every destination address of the
other, the protocol, the destination ports and the source ports the client opens from. Each hop keeps the
packets it passes and records the ones it drops with where and why; routing splits the set by longest prefix,
so one flow can take several paths. What reaches the destination is answered (with source and destination
swapped) and must get back to where it came from. A flow is allowed when every packet of its space gets there
and back; a failure names one packet that does not, the hop that drops it and the resource to fix.

The semantics follow AWS's documentation, cited where they decide an answer:
- VPC route tables: the local route covers the VPC's CIDRs; otherwise the longest prefix wins; a subnet
  without an explicit association uses the main route table (VPC user guide, "Route tables", "Route priority").
- Security groups are stateful and allow only what a rule admits; a rule may name a CIDR or a group, and a
  group reference matches only traffic from an interface in the same VPC that carries the group; nothing
  crosses a transit gateway or a Client VPN by group (VPC user guide, "Security group rules"; Transit
  Gateway guide, "Security group referencing" is off by default and not used here).
- Network ACLs are stateless: rules in number order, first match decides, both directions, and traffic within
  one subnet is not filtered (VPC user guide, "Network ACLs"). A subnet with no declared ACL has the default
  ACL, which allows everything. Clients open connections from their ephemeral ports (VPC user guide,
  "Ephemeral ports": Linux 32768-60999), which the reply must be let back to.
- Transit gateways: each attachment is associated with one route table; static routes win over propagated
  ones of the same prefix; VPC attachments propagate the VPC's CIDRs, VPN attachments their BGP routes (or
  static VPN routes), peering attachments propagate nothing (Transit Gateway guide, "Route tables",
  "Transit gateway peering attachments"). Traffic reaches a transit gateway only from an Availability Zone
  where the attachment has a subnet (Transit Gateway guide, "Amazon VPC attachments"). The attachment
  subnet's ACL checks traffic into the transit gateway with its inbound rules and traffic out of it with its
  outbound rules; neither applies when the attachment subnet is the instance's own (Transit Gateway guide,
  "Network ACLs for transit gateways").
- Client VPN: a connection reaches a destination only if an authorization rule for the user's group (or all
  groups) covers it, the most specific matching rule deciding, and the endpoint's route table routes it to an
  associated subnet, where the traffic leaves from the endpoint's interface with the endpoint's security
  groups and its address (source NAT) (Client VPN admin guide, "Authorization rules", "Routes").
- The internet reaches an interface only through an internet gateway of its VPC and only when it has a public
  address (VPC user guide, "Internet gateways", "IP addressing"); its replies need the gateway as their route.
- EKS: the control plane opens connections (kubelet, webhooks) only to the VPC and to the cluster's remote
  node and pod networks (EKS user guide, "Prepare networking for hybrid nodes", remoteNetworkConfig).
- On EKS with the VPC CNI a pod has an address of its node's subnet and the node's security groups; hybrid
  pods have addresses of the site's pod range (EKS user guide, "Networking concepts for hybrid nodes").
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

from dlinfra.checks.reach import packets as pk
from dlinfra.checks.reach.packets import NOTHING, Packet, Packets
from dlinfra.checks.reach.topology import Addr, Attachment, Net, Resource, Route, SgRule, Topology

Protocol = Literal["tcp", "udp", "icmp"]
_T = TypeVar("_T")
PortRange = tuple[int, int]
LINUX_EPHEMERAL: tuple[PortRange, ...] = ((32768, 60999),)  # VPC user guide, "Ephemeral ports"
ANY_CLIENT_PORT: tuple[PortRange, ...] = ((1024, 65535),)  # NAT gateways, ELB, Lambda; unknown clients
ANY_PORT: tuple[PortRange, ...] = ((0, 65535),)
MAX_HOPS = 32
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

    def __post_init__(self) -> None:
        if isinstance(self.network, ipaddress.IPv4Address):
            object.__setattr__(self, "network", ipaddress.IPv4Network(self.network))

    @property
    def networks(self) -> tuple[Net, ...]:
        assert isinstance(self.network, ipaddress.IPv4Network)
        return (self.network, *self.extra)

    @property
    def address(self) -> Addr:
        """The first address it may have (for one-line labels)."""
        first = self.networks[0]
        return first.network_address if first.num_addresses == 1 else first.network_address + 1

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
        return node


@dataclass(frozen=True)
class Trail:
    """The hops a branch of a flow took, and the sites whose tunnels it crossed."""

    hops: tuple[str, ...] = ()
    tunnels: frozenset[str] = frozenset()
    az: str | None = None  # where the packets started, for a transit gateway's choice of attachment subnet

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


@dataclass(frozen=True)
class Path:
    """Packets that got through and back along one path."""

    packets: Packets
    trail: Trail


@dataclass
class Verdict:
    """The answer for one flow: whether every packet, and which ones, got through and back."""

    allowed: bool  # every packet of the space gets there and back
    reachable: bool = False  # at least one packet gets there (past the destination's security groups)
    space: Packets = NOTHING
    passed: Packets = NOTHING  # the packets that get there and back
    reached: Packets = NOTHING  # the packets that get there, whether or not a reply could come back
    paths: list[Path] = field(default_factory=list)  # round trips
    arrivals: list[Path] = field(default_factory=list)  # one-way deliveries
    drops: list[Drop] = field(default_factory=list)
    witness: Packet | None = None  # a packet that does not get through (or the first path's, when all do)
    hops: list[str] = field(default_factory=list)
    denied_at: str = ""
    reason: str = ""
    resource: Resource | None = None

    @property
    def tunnels(self) -> set[str]:
        return {t for p in self.paths for t in p.trail.tunnels}

    def covered(self) -> int:
        return pk.size(self.space)


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


def evaluate(
    topo: Topology,
    src: Endpoint,
    dst: Endpoint,
    protocol: Protocol,
    ports: int | Sequence[int | PortRange],
    source_ports: Sequence[PortRange] | None = None,
) -> Verdict:
    """Whether every packet from `src` to `dst` on `ports` gets through, and its replies back."""
    wanted = [ports] if isinstance(ports, int) else list(ports)
    ranges = [(p, p) if isinstance(p, int) else p for p in wanted]
    if source_ports is None:
        source_ports = src.ephemeral
        if src.ephemeral_leaving is not None and not _same_vpc(src.location, dst.location):
            source_ports = src.ephemeral_leaving
    space = pk.flow_space(protocol, src.addresses("src"), dst.addresses("dst"), ranges, source_ports)
    return evaluate_space(topo, src, dst, space)


def evaluate_space(topo: Topology, src: Endpoint, dst: Endpoint, space: Packets) -> Verdict:
    """`evaluate` over a given set of packets from `src` to `dst`."""
    walk = _Walk(topo)
    outcome = walk.flow(src, dst, space)
    verdict = Verdict(
        allowed=(space & ~outcome.passed) == NOTHING,
        reachable=outcome.reached != NOTHING,
        space=space,
        passed=outcome.passed,
        reached=outcome.reached,
    )
    verdict.paths, verdict.arrivals, verdict.drops = outcome.paths, outcome.arrivals, walk.drops
    failed = space & ~outcome.passed
    if failed != NOTHING:
        for drop in walk.drops:
            original = drop.packets if not drop.reply else pk.reply(drop.packets)
            hit = _origin(drop.nat, original) & failed
            if hit == NOTHING:
                continue
            witness = pk.pick(hit)
            assert witness is not None
            seen = pk.pick(_seen_as(drop.nat, witness, original)) or witness
            verdict.witness = witness
            verdict.denied_at = f"reply path: {drop.at}" if drop.reply else drop.at
            verdict.reason = drop.reason(_swapped(seen) if drop.reply else seen)
            verdict.resource = drop.resource
            verdict.hops = [*drop.trail.hops]
            return verdict
        verdict.witness = pk.pick(failed)
        verdict.denied_at, verdict.reason = "model", "dropped without a recorded reason"
    elif outcome.paths:
        verdict.witness = pk.pick(outcome.paths[0].packets)
        verdict.hops = [*outcome.paths[0].trail.hops]
    return verdict


def _origin(nat: tuple[Packets, Packets] | None, packets: Packets) -> Packets:
    """The flow's own packets behind `packets` as they travel (after a Client VPN's source NAT)."""
    if nat is None:
        return packets
    return nat[0] & pk.forget(packets, ("src",))


def _seen_as(nat: tuple[Packets, Packets] | None, witness: Packet, travelling: Packets) -> Packets:
    """The flow's `witness` as the hops saw it."""
    if nat is None:
        return pk.of(witness)
    return travelling & pk.forget(pk.of(witness), ("src",))


@dataclass
class _Outcome:
    passed: Packets = NOTHING
    reached: Packets = NOTHING
    paths: list[Path] = field(default_factory=list)
    arrivals: list[Path] = field(default_factory=list)


def _swapped(packet: Packet) -> Packet:
    return Packet(packet.protocol, packet.dst, packet.src, packet.dport, packet.sport)


def _flow(packet: Packet) -> str:
    return packet.flow()


class _Walk:
    """One flow's evaluation: the drops it records, and the translation a Client VPN makes."""

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

    # --- the flow -----------------------------------------------------------------------------------------
    def flow(self, src: Endpoint, dst: Endpoint, space: Packets) -> _Outcome:
        """The packets of `space` that get through (and back), and the paths they take."""
        if isinstance(src.location, OnInternet):
            public, space = self.public_api(dst, space)
            outcome = self.finish(src.location, dst, self.from_internet(dst, space, Trail()))
            if public is not None:
                outcome.passed |= public.packets
                outcome.reached |= public.packets
                outcome.paths.insert(0, public)
                outcome.arrivals.insert(0, public)
            return outcome
        if isinstance(src.location, OnClientVpn):
            return self.from_laptop(src, src.location, dst, space)
        assert isinstance(src.location, InVpc | AtSite)
        return self.leave(src, src.location, dst, space, Trail())

    def from_laptop(self, src: Endpoint, laptop: OnClientVpn, dst: Endpoint, space: Packets) -> _Outcome:
        """A laptop's connection lands on one of the endpoint's associated subnets, which one it cannot choose: a
        packet is proved when it gets through from each of them, and reaches when it does from one (Client VPN
        admin guide, "Routes": add the same routes for every associated subnet)."""
        entries = self.client_vpn(laptop, space, Trail())
        if not entries:
            return _Outcome()
        total = _Outcome(passed=space)
        for original, location, translated, trail in entries:
            if original == NOTHING:
                total.passed = NOTHING
                continue
            self._nat = (original, translated)
            travelling = pk.forget(original, ("src",)) & translated
            outcome = self.leave(src, location, dst, travelling, trail)
            self._nat = None
            # The endpoint's interface address is one of its subnet's: every one must work, one is enough to reach.
            passed = original & pk.for_every(outcome.passed | ~translated, ("src",))
            total.passed &= passed
            total.reached |= original & pk.forget(outcome.reached & translated, ("src",))
            total.paths += [Path(original & pk.forget(p.packets, ("src",)), p.trail) for p in outcome.paths]
            total.arrivals += [Path(original & pk.forget(p.packets, ("src",)), p.trail) for p in outcome.arrivals]
        return total

    def leave(self, src: Endpoint, start: InVpc | AtSite, dst: Endpoint, packets: Packets, trail: Trail) -> _Outcome:
        """From an interface in a VPC or a site: the source's limits, its security groups, then the routes."""
        if src.sends_only_to is not None:
            inside = pk.nets("dst", src.sends_only_to)
            self.drop(
                packets & ~inside,
                f"EKS cluster {src.scope_origin.name if src.scope_origin else ''}".rstrip(),
                lambda p: (
                    f"the control plane sends only to the VPC and the cluster's remote node and pod networks; "
                    f"{p.dst} is in neither (remoteNetworkConfig)"
                ),
                src.scope_origin,
                trail,
            )
            packets &= inside
        if isinstance(start, InVpc):
            peers = (
                dst.location.security_groups
                if isinstance(dst.location, InVpc) and _same_vpc(start, dst.location)
                else ()
            )
            packets = self.groups(start.security_groups, "egress", packets, peers, trail)
            trail = trail.add(f"egress allowed by {self.group_names(start.security_groups)}")
            trail = replace(trail, az=self.topo.subnets[start.subnet_id].az)
        return self.finish(start, dst, self.route(start, packets, trail))

    def finish(self, start: Location, dst: Endpoint, branches: list[_Branch]) -> _Outcome:
        """At the destination: its ACLs and security groups; then the replies, which must get back."""
        outcome = _Outcome()
        for packets, arrival, trail in branches:
            if not _arrived_at(arrival, dst.location):
                self.drop(packets, "routing", _routed_elsewhere(self.where(arrival), dst.label), None, trail)
                continue
            got = packets
            if isinstance(dst.location, InVpc):
                assert isinstance(arrival, _ArrivedVpc)
                got = self.enter(dst.location, arrival, got, trail)
                peers = start.security_groups if isinstance(start, InVpc) and _same_vpc(start, dst.location) else ()
                got = self.groups(dst.location.security_groups, "ingress", got, peers, trail)
                trail = trail.add(f"ingress allowed by {self.group_names(dst.location.security_groups)}")
            if got != NOTHING:
                outcome.arrivals.append(Path(got, trail))
                outcome.reached |= got
        if outcome.reached == NOTHING:
            return outcome
        # Security groups are stateful; the replies still need routes back, and ACLs, which are not.
        back = pk.reply(self.replies(start, dst, pk.reply(outcome.reached)))
        for arrived in outcome.arrivals:
            if arrived.packets & back != NOTHING:
                outcome.paths.append(Path(arrived.packets & back, arrived.trail.add("replies routed back")))
                outcome.passed |= arrived.packets & back
        return outcome

    def replies(self, start: Location, dst: Endpoint, packets: Packets) -> Packets:
        """The replies that get back to where the flow came from."""
        self._reply = True
        origin = dst.location
        if isinstance(origin, OnInternet):
            # Replies from the internet come back the way the flow left (through its NAT or internet gateway):
            # what stands in their way in the plans is the source subnet's ACL.
            returned = packets
            if isinstance(start, InVpc):
                returned = self.nacl(start.subnet_id, False, packets, Trail().add("replies from the internet"))
            self._reply = False
            return returned
        assert isinstance(origin, InVpc | AtSite)
        returned = NOTHING
        start_trail = Trail(az=self.topo.subnets[origin.subnet_id].az) if isinstance(origin, InVpc) else Trail()
        for got, arrival, trail in self.route(origin, packets, start_trail):
            if not _arrived_at(arrival, start):
                self.drop(
                    got,
                    "routing",
                    _replies_elsewhere(self.where(arrival)),
                    None,
                    trail,
                )
                continue
            if isinstance(start, InVpc) and isinstance(arrival, _ArrivedVpc):
                got = self.enter(start, arrival, got, trail)
            returned |= got
        self._reply = False
        return returned

    # --- security groups and ACLs ----------------------------------------------------------------------
    def group_names(self, groups: Sequence[str]) -> str:
        return ", ".join(
            self.topo.security_groups[g].origin.name if g in self.topo.security_groups else g for g in groups
        )

    def groups(
        self, groups: Sequence[str], direction: str, packets: Packets, peers: Sequence[str], trail: Trail
    ) -> Packets:
        """The packets a rule of any of `groups` admits; the rest dropped, naming the groups."""
        if not groups:
            self.drop(packets, "security groups", lambda p: "the interface has no security group", None, trail)
            return NOTHING
        admitted = NOTHING
        for group_id in groups:
            group = self.topo.security_groups.get(group_id)
            for rule in group.rules if group else ():
                if rule.direction == direction:
                    admitted |= _sg_rule(rule, peers)
        first = self.topo.security_groups.get(groups[0])
        word, side = ("ingress", "from") if direction == "ingress" else ("egress", "to")
        self.drop(
            packets & ~admitted,
            f"security group {self.group_names(groups)}",
            lambda p: f"no {word} rule admits {side} {p.src if direction == 'ingress' else p.dst} {_flow(p)}",
            first.origin if first else None,
            trail,
        )
        return packets & admitted

    def nacl(self, subnet_id: str, egress: bool, packets: Packets, trail: Trail) -> Packets:
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
            else:
                self.drop(
                    hit,
                    name,
                    _text(lambda p, n=rule.number: f"rule {n} denies {p.dst if egress else p.src} {_flow(p)}"),
                    acl.origin,
                    trail,
                )
        direction = "outbound" if egress else "inbound"
        self.drop(
            remaining,
            name,
            lambda p: f"no {direction} rule allows {p.dst if egress else p.src} {_flow(p)} (implicit deny)",
            acl.origin,
            trail,
        )
        return passed

    def enter(self, dest: InVpc, arrival: _ArrivedVpc, packets: Packets, trail: Trail) -> Packets:
        """The ACLs between where the packets came into the VPC and the destination's subnet."""
        if arrival.via_subnet == dest.subnet_id:
            return packets  # the same subnet: no ACL applies (from a transit gateway attachment there neither)
        if arrival.via == "tgw":
            packets = self.nacl(arrival.via_subnet, True, packets, trail)
        return self.nacl(dest.subnet_id, False, packets, trail)

    # --- entries that are not an interface in a VPC ---------------------------------------------------
    def client_vpn(
        self, laptop: OnClientVpn, packets: Packets, trail: Trail
    ) -> list[tuple[Packets, InVpc, Packets, Trail]]:
        """Per associated subnet: the packets authorized and routed through it, the endpoint's interface there,
        the source addresses its NAT gives them (the laptop's port is kept), and the path so far."""
        topo = self.topo
        endpoint = topo.client_vpns.get(laptop.endpoint_id)
        if endpoint is None:
            self.drop(packets, "client VPN", lambda p: f"no endpoint {laptop.endpoint_id} in the plans", None, trail)
            return []
        name = f"client VPN {endpoint.origin.name}"
        # Authorization: the most specific rule covering the destination decides, for the user's group.
        rules = sorted(endpoint.auth_rules, key=lambda r: -r.destination.prefixlen)
        remaining, authorized, by = packets, NOTHING, ""
        for prefixlen in sorted({r.destination.prefixlen for r in rules}, reverse=True):
            same = [r for r in rules if r.destination.prefixlen == prefixlen]
            for dest in sorted({r.destination for r in same}):
                covered = remaining & pk.net("dst", dest)
                if covered == NOTHING:
                    continue
                remaining &= ~pk.net("dst", dest)
                admitting = [
                    r
                    for r in same
                    if r.destination == dest and (r.group is None or (laptop.group and r.group == laptop.group))
                ]
                if admitting:
                    authorized |= covered
                    by = by or admitting[0].origin.name
                else:
                    who = f"group {laptop.group}" if laptop.group else "this user"
                    rule = next(r for r in same if r.destination == dest)
                    self.drop(
                        covered,
                        name,
                        _text(
                            lambda p, who=who: f"the most specific authorization rule for {p.dst} does not admit {who}"
                        ),
                        rule.origin,
                        trail,
                    )
        self.drop(remaining, name, lambda p: f"no authorization rule covers {p.dst}", endpoint.origin, trail)
        if authorized == NOTHING:
            return []
        trail = trail.add(f"{name}: authorized by {by}")
        entries = []
        for subnet_id in sorted(endpoint.subnets):
            subnet = topo.subnets.get(subnet_id)
            if subnet is None:
                continue
            # The routes whose target is this subnet, and the route to its VPC that associating it added.
            routes: list[tuple[Net, int, Resource]] = [
                (net, 0, origin) for net, target, origin in endpoint.routes if target == subnet_id
            ]
            routes += [(cidr, 1, endpoint.origin) for cidr in topo.vpcs[subnet.vpc_id].cidrs]
            parts, rest = _lpm(authorized, routes)
            self.drop(
                rest,
                name,
                _text(lambda p, s=subnet.origin.name: f"no route for {p.dst} through the associated subnet {s}"),
                endpoint.origin,
                trail,
            )
            routed = NOTHING
            for part, _origin in parts:
                routed |= part
            location = InVpc(subnet.vpc_id, subnet_id, endpoint.security_group_ids)
            translated = Endpoint(name, subnet.cidr, location).addresses("src")
            entries.append((routed, location, translated, trail.add(f"{name}: via {subnet.origin.name}")))
        return entries

    def public_api(self, dst: Endpoint, packets: Packets) -> tuple[Path | None, Packets]:
        """An EKS cluster's public endpoint: HTTPS from its public access CIDRs reaches the API without entering
        the VPC (EKS user guide, "Cluster API server endpoint"); the rest of `packets` goes on."""
        if dst.public_api is None:
            return None, packets
        https = pk.protocol("tcp") & pk.ports("dport", 443, 443) & pk.nets("src", dst.public_api)
        reached = packets & https
        if reached == NOTHING:
            return None, packets
        origin = dst.scope_origin.name if dst.scope_origin else "the cluster"
        cidrs = ", ".join(str(n) for n in dst.public_api)
        trail = Trail().add(f"EKS public endpoint of {origin} (publicAccessCidrs {cidrs})")
        return Path(reached, trail), packets & ~https

    def from_internet(self, dst: Endpoint, packets: Packets, trail: Trail) -> list[_Branch]:
        topo, location = self.topo, dst.location
        if not isinstance(location, InVpc):
            self.drop(
                packets, "internet", lambda p: f"{p.dst} is not an address the internet can route to", None, trail
            )
            return []
        vpc = topo.vpcs.get(location.vpc_id)
        gateways = sorted(g for g, v in topo.igws.items() if v == location.vpc_id)
        if not gateways:
            what = vpc.origin.name if vpc else location.vpc_id
            self.drop(packets, "internet", lambda p: f"VPC {what} has no internet gateway", None, trail)
            return []
        subnet = topo.subnets[location.subnet_id]
        if not location.public_ip:
            self.drop(
                packets,
                f"internet gateway {gateways[0]}",
                lambda p: (
                    f"{p.dst} in {subnet.origin.name} has no public address (none assigned on launch by the "
                    "subnet or the launch template, no Elastic IP)"
                ),
                subnet.origin,
                trail,
            )
            return []
        trail = trail.add(f"internet gateway {gateways[0]} -> public address of {dst.label}")
        return [(packets, _ArrivedVpc(location.vpc_id, "", "igw"), trail)]

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
            return self.in_vpc(nat.subnet_id, part, trail, depth + 1)
        if r.target == "igw":
            public = ~pk.nets("dst", NOT_ON_THE_INTERNET)
            self.drop(
                part & ~public,
                f"internet gateway {r.target_id}",
                lambda p: f"{p.dst} is not an internet address; it is dropped",
                r.origin,
                trail,
            )
            return [(part & public, _ArrivedInternet(), trail)] if part & public != NOTHING else []
        if r.target == "blackhole":
            self.drop(part, name, lambda p: f"the route for {r.destination} has no target (blackhole)", r.origin, trail)
            return []
        self.drop(
            part, name, lambda p: f"routes {p.dst} to {r.target_id}, which this model does not follow", r.origin, trail
        )
        return []

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
                out += self.in_tgw(str(other), att.id, part, hop, depth + 1)
            else:
                out += self.into_site(att.site or "", part, hop, att.origin)
        return out

    def into_vpc(self, tgw_name: str, att: Attachment, packets: Packets, trail: Trail, depth: int) -> list[_Branch]:
        """Into a VPC through one of the attachment's interfaces. Without appliance mode the transit gateway keeps
        traffic in the Availability Zone it came from (Transit Gateway guide, "Appliance mode"): the attachment's
        subnet there. Where that is unknown (from a VPN) or the attachment has none there, AWS does not say which
        one it takes, so the packets must pass the ACL of every one of them, and enter by the destination's AZ."""
        topo = self.topo
        subnets = [s for s in att.subnet_ids if s in topo.subnets]
        if not subnets:
            self.drop(packets, tgw_name, lambda p: f"attachment {att.origin.name} has no subnet", att.origin, trail)
            return []
        same_az = [s for s in subnets if topo.subnets[s].az == trail.az]
        if same_az:
            return self.in_vpc(same_az[0], packets, trail, depth + 1, via="tgw")
        for subnet_id in subnets:
            outside = packets & ~pk.net("dst", topo.subnets[subnet_id].cidr)
            packets = (packets & pk.net("dst", topo.subnets[subnet_id].cidr)) | self.nacl(
                subnet_id, True, outside, trail
            )
        by_entry: dict[str, Packets] = {}
        rest = packets
        for subnet in sorted(
            (s for s in topo.subnets.values() if s.vpc_id == att.vpc_id), key=lambda s: (-s.cidr.prefixlen, s.id)
        ):
            part = rest & pk.net("dst", subnet.cidr)
            if part == NOTHING:
                continue
            rest &= ~pk.net("dst", subnet.cidr)
            entry = next((s for s in subnets if topo.subnets[s].az == subnet.az), subnets[0])
            by_entry[entry] = by_entry.get(entry, NOTHING) | part
        if rest != NOTHING:
            by_entry[subnets[0]] = by_entry.get(subnets[0], NOTHING) | rest
        out: list[_Branch] = []
        for entry, part in sorted(by_entry.items()):
            out += self.in_vpc(entry, part, trail, depth + 1, via="tgw")
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


def _routed_elsewhere(where: str, label: str) -> Reason:
    return lambda p: f"{p.dst} is routed to {where}, not to {label}"


def _replies_elsewhere(where: str) -> Reason:
    return lambda p: f"replies to {p.dst} arrive at {where}, not where the flow came from"


def _same_vpc(a: object, b: object) -> bool:
    return isinstance(a, InVpc) and isinstance(b, InVpc) and a.vpc_id == b.vpc_id


def _arrived_at(arrival: _Arrival, location: Location) -> bool:
    if isinstance(location, InVpc):
        return isinstance(arrival, _ArrivedVpc) and arrival.vpc_id == location.vpc_id
    if isinstance(location, AtSite):
        return isinstance(arrival, _ArrivedSite) and arrival.site == location.site
    return isinstance(location, OnInternet) and isinstance(arrival, _ArrivedInternet)


def _sg_rule(rule: SgRule, peers: Sequence[str]) -> Packets:
    """The packets one security group rule admits (its peer is the source for ingress, the destination for
    egress)."""
    if rule.cidr is not None:
        node = pk.net("src" if rule.direction == "ingress" else "dst", rule.cidr)
    elif rule.group is not None and rule.group in peers:
        node = pk.EVERYTHING
    else:
        return NOTHING
    if rule.protocol == "-1":
        return node
    node &= pk.protocol(rule.protocol)
    if rule.protocol in ("icmp", "1") or rule.from_port is None or rule.from_port < 0:
        return node
    return node & pk.ports("dport", rule.from_port, rule.to_port if rule.to_port is not None else rule.from_port)


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


def host(network: Net, offset: int) -> Addr:
    """A representative address `offset` into a network (kept inside it for small ones)."""
    return network.network_address + min(offset, max(network.num_addresses - 2, 1))
