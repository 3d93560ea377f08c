"""Reachability as part of `dlinfra check` and on its own as `dlinfra reach`: load, derive, evaluate, report."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlinfra.checks.reach import evaluation, from_plans, intents
from dlinfra.checks.reach.evaluation import ReachResult
from dlinfra.checks.reach.flows import load_flows
from dlinfra.checks.reach.topology import Topology
from dlinfra.model import planner
from dlinfra.model.fleet.load import LoadedFleet, load_fleet

FLOWS_FILE = "flows.yaml"  # beside the fleet file; optional


def model(
    fleet_path: Path, lock_path: Path, plans: Sequence[Mapping[str, Any]]
) -> tuple[LoadedFleet, planner.Plan, Topology]:
    """The fleet, its address plan, and the network model of the plan exports."""
    loaded = load_fleet(fleet_path)
    address_plan = planner.plan(loaded, planner.load_lock(lock_path))
    return loaded, address_plan, from_plans.build(plans, from_plans.site_sides(loaded.fleet, address_plan, plans))


def analyse(
    fleet_path: Path, lock_path: Path, plans: Sequence[Mapping[str, Any]], flows: Path | None = None
) -> ReachResult:
    """Every derived intent (and the flows file's, when there is one) over the given plan exports."""
    loaded, _address_plan, topo = model(fleet_path, lock_path, plans)
    derived = intents.derive(loaded.fleet, topo)
    path = flows if flows is not None else fleet_path.parent / FLOWS_FILE
    if flows is not None or path.exists():
        derived += load_flows(path, loaded.fleet, topo)
    return evaluation.run(topo, derived)


def summary_json(result: ReachResult) -> dict[str, Any]:
    """Counts per family, timing, and every failing flow with its hop and reason."""
    return {
        "intents": len(result.intents),
        "flows": result.flows,
        "failed_intents": len(result.failed_intents()),
        "failed_flows": len(result.failures),
        "seconds": round(result.seconds, 3),
        "families": {
            family: {"intents": n, "flows": flows, "failed_intents": failed}
            for family, (n, flows, failed) in result.by_family().items()
        },
        "failures": [
            {
                "intent": f.intent.id,
                "family": f.intent.family,
                "expect": f.intent.expect,
                "source": f.source.label,
                "source_address": str(f.source.address),
                "destination": f.destination.label,
                "destination_address": str(f.destination.address),
                "protocol": f.intent.protocol,
                "port": f.port,
                "denied_at": f.verdict.denied_at,
                "reason": f.why,
                "resource": f.verdict.resource.urn if f.verdict.resource else "",
                "hops": f.verdict.hops,
                "requirement": f.intent.source_doc,
            }
            for f in result.failures
        ],
    }
