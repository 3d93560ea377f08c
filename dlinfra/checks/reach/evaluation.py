"""Every (source, destination, port) of every intent evaluated over the model, and each that did not come out as
expected, with where it stopped and why."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from dlinfra.checks.reach.engine import AtSite, Endpoint, Verdict, evaluate
from dlinfra.checks.reach.intents import Intent
from dlinfra.checks.reach.topology import Topology


@dataclass(frozen=True)
class Failure:
    intent: Intent
    source: Endpoint
    destination: Endpoint
    port: int
    verdict: Verdict
    why: str  # the sentence a reader needs: where it stopped and why, or that it got through


@dataclass
class ReachResult:
    intents: list[Intent] = field(default_factory=list)
    flows: int = 0
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0

    def failed_intents(self) -> set[str]:
        return {f.intent.id for f in self.failures}

    def by_family(self) -> dict[str, tuple[int, int, int]]:
        """family -> (intents, flows, failed intents)."""
        out: dict[str, list[int]] = {}
        failed = self.failed_intents()
        for intent in self.intents:
            row = out.setdefault(intent.family, [0, 0, 0])
            row[0] += 1
            row[1] += len(intent.sources) * len(intent.destinations) * len(intent.ports)
            row[2] += intent.id in failed
        return {k: (v[0], v[1], v[2]) for k, v in sorted(out.items())}


def run(topo: Topology, intents: Sequence[Intent]) -> ReachResult:
    """Evaluate every flow of every intent; failures carry the hop and reason."""
    started = time.perf_counter()
    result = ReachResult(intents=list(intents))
    for intent in intents:
        for src in intent.sources:
            for dst in intent.destinations:
                for port in intent.ports:
                    result.flows += 1
                    verdict = evaluate(topo, src, dst, intent.protocol, port)
                    failure = _judge(intent, src, dst, verdict)
                    if failure:
                        result.failures.append(Failure(intent, src, dst, port, verdict, failure))
    result.seconds = time.perf_counter() - started
    return result


def _own_sites(*endpoints: Endpoint) -> set[str]:
    return {e.location.site for e in endpoints if isinstance(e.location, AtSite)}


def _judge(intent: Intent, src: Endpoint, dst: Endpoint, verdict: Verdict) -> str | None:
    if verdict.allowed:
        transit = verdict.tunnels - _own_sites(src, dst)
        if transit:
            return (
                f"crosses site {', '.join(sorted(transit))}'s tunnel: one site's traffic is routed through another site"
            )
        if intent.expect == "deny":
            return "allowed, but must stay closed: " + " -> ".join(verdict.hops)
        return None
    if intent.expect == "allow":
        return f"denied at {verdict.denied_at}: {verdict.reason}"
    return None
