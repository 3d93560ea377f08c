"""Reachability as part of `dlinfra check` and on its own as `dlinfra reach`: load, derive, evaluate, report."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlinfra.checks.reach import evaluation, from_plans, intents, sites
from dlinfra.checks.reach.evaluation import ReachResult
from dlinfra.checks.reach.flows import load_flows
from dlinfra.checks.reach.intents import Intent
from dlinfra.checks.reach.topology import Topology
from dlinfra.files import write_atomic
from dlinfra.model import planner, slices
from dlinfra.model.fleet.load import LoadedFleet, load_fleet

FLOWS_FILE = "flows.yaml"  # beside the fleet file; optional


def model(
    fleet_path: Path, lock_path: Path, plans: Sequence[Mapping[str, Any]]
) -> tuple[LoadedFleet, planner.Plan, Topology]:
    """The fleet, its address plan, and the network model of the plan exports."""
    loaded = load_fleet(fleet_path)
    address_plan = planner.plan(loaded, planner.load_lock(lock_path))
    return loaded, address_plan, from_plans.build(plans, sites.site_sides(loaded.fleet, address_plan, plans))


def analyse(
    fleet_path: Path,
    lock_path: Path,
    plans: Sequence[Mapping[str, Any]],
    flows: Path | None = None,
    *,
    explain: bool = False,
) -> ReachResult:
    """Every derived intent (and the flows file's, when there is one) over the given plan exports."""
    topo, derived = _questions(fleet_path, lock_path, plans, flows)
    return evaluation.run(topo, derived, explain=explain)


def _questions(
    fleet_path: Path, lock_path: Path, plans: Sequence[Mapping[str, Any]], flows: Path | None
) -> tuple[Topology, list[Intent]]:
    loaded, _address_plan, topo = model(fleet_path, lock_path, plans)
    derived = intents.derive(loaded.fleet, topo)
    path = flows if flows is not None else fleet_path.parent / FLOWS_FILE
    if flows is not None or path.exists():
        derived += load_flows(path, loaded.fleet, topo)
    return topo, derived


def summary(
    fleet_path: Path,
    lock_path: Path,
    plans: Sequence[Mapping[str, Any]],
    flows: Path | None = None,
    *,
    explain: bool = False,
    cache: Path | None = None,
) -> dict[str, Any]:
    """summary_json of analyse(), reused from `cache` when the same questions were asked of the same network.

    The key is the network model built from the plans and every intent asked of it (not the plans: a pool's new
    maximum changes a plan but not one route, rule or address), with the code that answers: the evaluation is a
    pure function of those. The answer is marked `"cached": true`.
    """
    from dlinfra import PROJECT_ROOT
    from dlinfra.offline import provenance

    topo, derived = _questions(fleet_path, lock_path, plans, flows)
    if cache is None:
        return summary_json(evaluation.run(topo, derived, explain=explain))
    key = slices.digest(
        {
            "schema": SCHEMA,
            "code": provenance.code_hash(PROJECT_ROOT),
            "explain": explain,
            "network": topo,
            "ask": derived,
        }
    )
    path = cache / "reach" / f"{key}.json"
    try:
        stored: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return {**stored, "cached": True}
    except (OSError, ValueError):
        pass
    answer = summary_json(evaluation.run(topo, derived, explain=explain))
    write_atomic(path, json.dumps(answer, sort_keys=True) + "\n", mode=0o644)
    return {**answer, "cached": False}


SCHEMA = "dlinfra.reach/v2"


def summary_json(result: ReachResult) -> dict[str, Any]:
    """Counts per family, how much of each intent's packet space was proved, timing, every failing flow with a
    packet, its hop and reason, and what the model refused to evaluate."""
    packets, proved = result.packets()
    return {
        "schema": SCHEMA,
        "intents": len(result.intents),
        "flows": result.flows,
        "packets": packets,
        "proved_packets": proved,
        "failed_intents": len(result.failed_intents()) + (1 if result.refusals else 0),
        "failed_flows": len(result.failures),
        "seconds": round(result.seconds, 3),
        "families": {
            family: {"intents": n, "flows": flows, "failed_intents": failed}
            for family, (n, flows, failed) in result.by_family().items()
        },
        "coverage": {
            intent.id: {
                "family": intent.family,
                "expect": intent.expect,
                "protocol": intent.protocol,
                "ports": intent.port_text(),
                "source_addresses": c.sources,
                "destination_addresses": c.destinations,
                "destination_ports": c.ports,
                "packets": c.packets,
                "proved": c.proved,
                "share": round(c.share, 6),
            }
            for intent in result.intents
            if (c := result.coverage.get(intent.id)) is not None
        },
        "refused": [
            {
                "resource": r.resource.urn,
                "name": r.resource.name,
                "stack": r.resource.stack,
                "kind": r.kind,
                "what": r.what,
                "reason": r.reason(),
            }
            for r in result.refusals
        ],
        "failures": [
            {
                "intent": f.intent.id,
                "family": f.intent.family,
                "expect": f.intent.expect,
                "source": f.source.label,
                "source_network": f.source.where(),
                "source_address": str(f.packet.src) if f.packet else "",
                "source_port": f.packet.sport if f.packet else 0,
                "destination": f.destination.label,
                "destination_network": f.destination.where(),
                "destination_address": str(f.packet.dst) if f.packet else "",
                "protocol": f.intent.protocol,
                "port": f.port,
                "ports": f.intent.port_text(),
                "packet": f.packet.as_json() if f.packet else None,
                "share": round(f.share, 6),
                "denied_at": f.verdict.denied_at if f.intent.expect == "allow" else "",
                "reason": f.why,
                "resource": f.verdict.resource.urn if f.verdict.resource and f.intent.expect == "allow" else "",
                "hops": list(f.hops),
                "requirement": f.intent.source_doc,
            }
            for f in result.failures
        ],
        "explained": [
            {
                "intent": e.intent,
                "source": e.source,
                "destination": e.destination,
                "allowed": e.allowed,
                "paths": [
                    {"packet": p.as_json() if p else None, "packets": n, "hops": list(hops)} for p, hops, n in e.paths
                ],
            }
            for e in result.explained
        ],
    }
