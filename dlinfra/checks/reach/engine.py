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

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from dlinfra.checks.reach import packets as pk
from dlinfra.checks.reach.ends import (
    ANY_CLIENT_PORT,
    ANY_PORT,
    LINUX_EPHEMERAL,
    NOT_ON_THE_INTERNET,
    AtSite,
    Endpoint,
    InVpc,
    Location,
    OnClientVpn,
    OnInternet,
    PortRange,
    Protocol,
)
from dlinfra.checks.reach.packets import NOTHING, Packet, Packets
from dlinfra.checks.reach.routes import (
    Drop,
    Reason,
    Router,
    Trail,
    _arrived_at,
    _ArrivedVpc,
    _Branch,
    _lpm,
    _text,
)
from dlinfra.checks.reach.topology import Net, Resource, SgRule, Topology

__all__ = [
    "ANY_CLIENT_PORT",
    "ANY_PORT",
    "LINUX_EPHEMERAL",
    "NOT_ON_THE_INTERNET",
    "AtSite",
    "Drop",
    "Endpoint",
    "InVpc",
    "Location",
    "OnClientVpn",
    "OnInternet",
    "Path",
    "PortRange",
    "Protocol",
    "Trail",
    "Verdict",
    "evaluate",
    "evaluate_space",
]


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


def _combine(paths: Sequence[Path]) -> tuple[Packets, Packets]:
    """(the packets that get through whatever AWS chooses, those that do with some choice): where a path depends
    on an undocumented choice (`Trail.option`), a packet counts for the first only if every option carries it."""
    every = some = NOTHING
    by_choice: dict[str, tuple[tuple[str, ...], dict[str, Packets]]] = {}
    for path in paths:
        some |= path.packets
        if path.trail.option is None:
            every |= path.packets
            continue
        what, option, options = path.trail.option
        per_option = by_choice.setdefault(what, (options, {}))[1]
        per_option[option] = per_option.get(option, NOTHING) | path.packets
    for options, per_option in by_choice.values():
        common = pk.EVERYTHING
        for option in options:
            common &= per_option.get(option, NOTHING)
        every |= common
    return every, some


def _swapped(packet: Packet) -> Packet:
    return Packet(packet.protocol, packet.dst, packet.src, packet.dport, packet.sport)


def _flow(packet: Packet) -> str:
    return packet.flow()


class _Walk(Router):
    """One flow's evaluation: its ends, security groups, Client VPN and internet entries, and the replies."""

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
            packets, trail = self.groups(start.security_groups, "egress", packets, peers, trail)
            trail = replace(trail, az=self.topo.subnets[start.subnet_id].az, public=start.public_ip)
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
                got, trail = self.groups(dst.location.security_groups, "ingress", got, peers, trail)
            if got != NOTHING:
                outcome.arrivals.append(Path(got, trail))
        _every, outcome.reached = _combine(outcome.arrivals)
        if outcome.reached == NOTHING:
            return outcome
        # Security groups are stateful; the replies still need routes back, and ACLs, which are not.
        back = pk.reply(self.replies(start, dst, pk.reply(outcome.reached)))
        for arrived in outcome.arrivals:
            if arrived.packets & back != NOTHING:
                outcome.paths.append(Path(arrived.packets & back, arrived.trail.add("replies routed back")))
        outcome.passed, _some = _combine(outcome.paths)
        return outcome

    def replies(self, start: Location, dst: Endpoint, packets: Packets) -> Packets:
        """The replies that get back to where the flow came from."""
        self._reply = True
        origin = dst.location
        if isinstance(origin, OnInternet):
            # Replies from the internet come back the way the flow left (its NAT gateway's subnet was checked on
            # the way out): what is left is the source subnet's ACL.
            answered = packets
            if isinstance(start, InVpc):
                answered = self.nacl(start.subnet_id, False, packets, Trail().add("replies from the internet"))
            self._reply = False
            return answered
        assert isinstance(origin, InVpc | AtSite)
        returned: list[Path] = []
        start_trail = (
            Trail(az=self.topo.subnets[origin.subnet_id].az, public=origin.public_ip)
            if isinstance(origin, InVpc)
            else Trail()
        )
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
            returned.append(Path(got, trail))
        self._reply = False
        every, _some = _combine(returned)
        return every

    # --- security groups and ACLs ----------------------------------------------------------------------
    def group_names(self, groups: Sequence[str]) -> str:
        return ", ".join(
            self.topo.security_groups[g].origin.name if g in self.topo.security_groups else g for g in groups
        )

    def groups(
        self, groups: Sequence[str], direction: str, packets: Packets, peers: Sequence[str], trail: Trail
    ) -> tuple[Packets, Trail]:
        """The packets a rule of any of `groups` admits, and the trail with the hop naming the rules that do; the
        rest dropped, naming the groups."""
        if not groups:
            self.drop(packets, "security groups", lambda p: "the interface has no security group", None, trail)
            return NOTHING, trail
        admitted = NOTHING
        by: list[str] = []
        for group_id in groups:
            group = self.topo.security_groups.get(group_id)
            for rule in group.rules if group else ():
                if rule.direction == direction:
                    admits = _sg_rule(rule, peers)
                    if packets & admits != NOTHING and rule.origin.name not in by:
                        by.append(rule.origin.name)
                    admitted |= admits
        first = self.topo.security_groups.get(groups[0])
        word, side = ("ingress", "from") if direction == "ingress" else ("egress", "to")
        self.drop(
            packets & ~admitted,
            f"security group {self.group_names(groups)}",
            lambda p: f"no {word} rule admits {side} {p.src if direction == 'ingress' else p.dst} {_flow(p)}",
            first.origin if first else None,
            trail,
        )
        rules = f" ({', '.join(by[:3])}{', ...' if len(by) > 3 else ''})" if by else ""
        return packets & admitted, trail.add(f"{direction} allowed by {self.group_names(groups)}{rules}")

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
        if not endpoint.subnets:
            self.drop(
                authorized,
                name,
                lambda p: "the endpoint has no associated subnet (no NetworkAssociation): nothing leaves it",
                endpoint.origin,
                trail,
            )
        for subnet_id in sorted(endpoint.subnets):
            subnet = topo.subnets.get(subnet_id)
            if subnet is None:
                # A laptop may land there, and what then happens is not in the plans: nothing is proved.
                self.drop(
                    authorized,
                    name,
                    _text(lambda p, s=subnet_id: f"the associated subnet {s} is not in the plans"),
                    endpoint.origin,
                    trail,
                )
                entries.append((NOTHING, InVpc("", subnet_id, ()), NOTHING, trail))
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


def _routed_elsewhere(where: str, label: str) -> Reason:
    return lambda p: f"{p.dst} is routed to {where}, not to {label}"


def _replies_elsewhere(where: str) -> Reason:
    return lambda p: f"replies to {p.dst} arrive at {where}, not where the flow came from"


def _same_vpc(a: object, b: object) -> bool:
    return isinstance(a, InVpc) and isinstance(b, InVpc) and a.vpc_id == b.vpc_id


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
