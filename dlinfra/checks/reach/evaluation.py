"""Every intent evaluated over the model: each (source, destination) pair over every packet of the intent's
space, and each pair that did not come out as expected, with a packet that shows it, where it stopped and why."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from dlinfra.checks.reach import packets as pk
from dlinfra.checks.reach.engine import AtSite, Endpoint, Verdict, evaluate
from dlinfra.checks.reach.intents import Intent
from dlinfra.checks.reach.packets import NOTHING, Packet
from dlinfra.checks.reach.topology import Resource, Topology


@dataclass(frozen=True)
class Failure:
    intent: Intent
    source: Endpoint
    destination: Endpoint
    packet: Packet | None  # one packet that shows the failure
    verdict: Verdict
    why: str  # the sentence a reader needs: where it stopped and why, or that it got through
    hops: tuple[str, ...] = ()  # the path of `packet` (up to the hop that dropped it)
    share: float = 1.0  # the part of the pair's packets that fail

    @property
    def port(self) -> int:
        return self.packet.dport if self.packet else 0


@dataclass(frozen=True)
class Coverage:
    """How much of an intent's packet space the evaluation covered, and how much came out as expected."""

    packets: int
    proved: int
    sources: int  # addresses
    destinations: int
    ports: int  # destination ports

    @property
    def share(self) -> float:
        return self.proved / self.packets if self.packets else 1.0


@dataclass(frozen=True)
class Refusal:
    """What the model cannot evaluate and will not guess about (IPv6, addresses it cannot know)."""

    resource: Resource
    what: str
    kind: str  # ipv6 | prefix-list

    def reason(self) -> str:
        if self.kind == "ipv6":
            return (
                f"{self.resource.name} declares IPv6 ({self.what}); this model proves IPv4 only, so no verdict about "
                "its addresses would be sound: remove the IPv6 settings or check them by hand (docs/reachability.md, "
                "'What the model does not cover')"
            )
        if self.kind == "default-acl":
            return (
                f"{self.resource.name} takes over the {self.what}: which VPC's subnets it filters is not in the plans, "
                "so no verdict about them would be sound"
            )
        return (
            f"{self.resource.name} uses {self.what}, whose addresses no plan declares (an AWS-managed or another "
            "account's list, or an entry the plan does not give): no verdict about who it admits would be sound; "
            "declare the list (aws.ec2.ManagedPrefixList) with literal CIDRs, or use CIDRs"
        )


@dataclass(frozen=True)
class Explanation:
    """The paths of one pair's packets that got through: a packet of each and the hops it took."""

    intent: str
    source: str
    destination: str
    allowed: bool
    paths: tuple[tuple[Packet | None, tuple[str, ...], int], ...]  # packet, hops, packets on this path


@dataclass
class ReachResult:
    intents: list[Intent] = field(default_factory=list)
    flows: int = 0  # (source, destination) pairs, each over its whole packet space
    failures: list[Failure] = field(default_factory=list)
    coverage: dict[str, Coverage] = field(default_factory=dict)  # intent id -> coverage
    refusals: list[Refusal] = field(default_factory=list)
    seconds: float = 0.0
    explained: list[Explanation] = field(default_factory=list)  # with run(..., explain=True)

    def failed_intents(self) -> set[str]:
        return {f.intent.id for f in self.failures}

    def packets(self) -> tuple[int, int]:
        """(packets evaluated, packets that came out as expected) over every intent."""
        return sum(c.packets for c in self.coverage.values()), sum(c.proved for c in self.coverage.values())

    def by_family(self) -> dict[str, tuple[int, int, int]]:
        """family -> (intents, flows, failed intents)."""
        out: dict[str, list[int]] = {}
        failed = self.failed_intents()
        for intent in self.intents:
            row = out.setdefault(intent.family, [0, 0, 0])
            row[0] += 1
            row[1] += len(intent.sources) * len(intent.destinations)
            row[2] += intent.id in failed
        return {k: (v[0], v[1], v[2]) for k, v in sorted(out.items())}


def run(topo: Topology, intents: Sequence[Intent], *, explain: bool = False) -> ReachResult:
    """Evaluate every pair of every intent over its whole space; failures carry a packet, the hop and reason."""
    started = time.perf_counter()
    result = ReachResult(intents=list(intents))
    result.refusals = [Refusal(origin, what, "ipv6") for origin, what in topo.ipv6]
    result.refusals += [
        Refusal(origin, what, "default-acl" if what.startswith("default network ACL") else "prefix-list")
        for origin, what in topo.unresolved
    ]
    for intent in intents:
        space = proved = 0
        union = NOTHING  # every packet of the intent
        for src in intent.sources:
            for dst in intent.destinations:
                result.flows += 1
                verdict = evaluate(topo, src, dst, intent.protocol, intent.ports, intent.source_ports)
                size, passed = pk.size(verdict.space), pk.size(verdict.passed)
                space += size
                proved += passed if intent.expect == "allow" else size - pk.size(verdict.reached)
                union |= verdict.space
                if explain:
                    result.explained.append(
                        Explanation(
                            intent.id,
                            src.label,
                            dst.label,
                            verdict.allowed,
                            tuple((pk.pick(p.packets), p.trail.hops, pk.size(p.packets)) for p in verdict.paths),
                        )
                    )
                failure = _judge(intent, src, dst, verdict, size, passed)
                if failure:
                    result.failures.append(failure)
        result.coverage[intent.id] = Coverage(
            space, proved, pk.field_size(union, "src"), pk.field_size(union, "dst"), pk.field_size(union, "dport")
        )
    result.seconds = time.perf_counter() - started
    return result


def _own_sites(*endpoints: Endpoint) -> set[str]:
    return {e.location.site for e in endpoints if isinstance(e.location, AtSite)}


def _judge(intent: Intent, src: Endpoint, dst: Endpoint, verdict: Verdict, size: int, passed: int) -> Failure | None:
    def failed(packets: Packet | None, why: str, hops: tuple[str, ...], failing: int) -> Failure:
        return Failure(intent, src, dst, packets, verdict, why, hops, failing / size if size else 1.0)

    own = _own_sites(src, dst)
    for path in [*verdict.arrivals, *verdict.paths]:
        transit = path.trail.tunnels - own
        if transit:
            sites = ", ".join(sorted(transit))
            why = f"crosses site {sites}'s tunnel: one site's traffic is routed through another site"
            return failed(pk.pick(path.packets), why, path.trail.hops, pk.size(path.packets))
    if intent.expect == "deny":
        # Closed means no packet arrives, whether or not a reply could go back (UDP needs none).
        if not verdict.reachable:
            return None
        path = verdict.arrivals[0]
        why = "reaches it, but must stay closed: " + " -> ".join(path.trail.hops)
        return failed(pk.pick(path.packets), why, path.trail.hops, pk.size(verdict.reached))
    if verdict.allowed:
        return None
    why = f"denied at {verdict.denied_at}: {verdict.reason}"
    return failed(verdict.witness, why, tuple(verdict.hops), size - passed)
