"""The `access` subcommand: who can reach and do what, per environment, from the offline plans.

`register` adds it to dlinfra.cli's parser. Missing plans or an unknown --env/--team raise DlinfraError
(the CLI prints it and exits 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlinfra.cli.common import Handler, err, out, working
from dlinfra.errors import DlinfraError
from dlinfra.model import stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.review import access

# Table titles for each kind of principal, in report order.
_TITLES = {
    "admin": "Cluster admins (fleet: kubernetes.admin_role_arns)",
    "ci-apply": "CI apply role",
    "ci-preview": "CI preview role",
    "team-role": "Team IAM roles",
    "team-data": "Team data: EFS paths and S3 prefixes the team's pods may use",
    "vpn-group": "Laptop VPN groups (SAML)",
    "vpn-users": "Laptop VPN users (all groups)",
    "site": "Physical sites (LAN and hybrid nodes)",
    "node-role": "Node roles (EC2 node pools)",
    "pod-identity": "Pod identities",
    "role": "Other IAM roles with access entries",
}


def register(subparsers: Any, common: argparse.ArgumentParser) -> dict[str, Handler]:
    """Add `access` to the CLI; returns command name -> handler."""
    cmd = subparsers.add_parser(
        "access",
        parents=[common],
        help="who can reach and do what: EKS access, RBAC, laptop VPN, sites, pod identities, teams' EFS paths and "
        "S3 prefixes (from the plans)",
        description="Reads the offline plans (`dlinfra preview --all`). Example: dlinfra access --env prod --json",
    )
    cmd.add_argument("--env", help="one environment (default: every environment)")
    cmd.add_argument("--team", help="only what one team holds (its IAM role and VPN group)")
    cmd.add_argument("--json", action="store_true", help="print the report as JSON (schema: docs/access.md)")
    cmd.add_argument("--plans", type=Path, default=Path("build/plans"), help="plan folder (default: build/plans)")
    cmd.add_argument("--allow-stale", action="store_true", help="use plans even if their inputs changed since")
    return {"access": cmd_access}


def cmd_access(args: argparse.Namespace) -> int:
    loaded = load_fleet(args.fleet)
    fleet = loaded.fleet
    if args.env is not None and args.env not in fleet.environments:
        raise DlinfraError(
            f"unknown environment {args.env!r}; the fleet has {', '.join(fleet.environments)}",
            file=str(loaded.path),
            key="environments",
        )
    if args.team is not None and args.team not in fleet.teams:
        raise DlinfraError(
            f"unknown team {args.team!r}; the fleet has {', '.join(fleet.teams) or 'none'}",
            file=str(loaded.path),
            key="teams",
        )
    stacks = [r.name for r in stackroles.roles(fleet) if args.env is None or r.environment == args.env]
    plans = access.load_plans(args.plans, stacks)
    from dlinfra.cli.checks import refuse_stale_plans

    stale_note = refuse_stale_plans(args, plans)
    if stale_note:
        err.print(f"note: {stale_note}", markup=False)
    # Networks as the reachability model proves them hop by hop (docs/reachability.md).
    from dlinfra.checks.reach import check as reach_check
    from dlinfra.review.principals import model_reach

    lock = args.lock if args.lock is not None else Path(args.fleet).parent / "cidr-lock.yaml"
    with working(f"proving who reaches what over {len(plans)} plan(s)"):
        _loaded, address_plan, topo = reach_check.model(Path(args.fleet), lock, [p.data for p in plans])
        reach = model_reach(topo, fleet, address_plan)
        report = access.build_report(plans, fleet, reach=reach, team=args.team)
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    else:
        print_report(report, out)
    return 0


def _clusters(p: access.Principal) -> str:
    """One line per cluster: what the principal may do there, and where."""
    by_cluster: dict[str, list[str]] = {}
    for g in p.clusters:
        where = "" if g.scope == "cluster" else f" in {g.scope}"
        by_cluster.setdefault(f"{g.cluster} ({g.region})", []).append(f"{g.access}{where}")
    return "\n".join(f"{c}: {', '.join(what)}" for c, what in by_cluster.items()) or "-"


def _networks(p: access.Principal) -> str:
    """One line per endpoint or transit gateway: the networks reached through it."""
    by_via: dict[str, list[str]] = {}
    for n in p.networks:
        by_via.setdefault(n.via, []).append(n.network + ("" if n.routed else " (authorized, no route)"))
    return "\n".join(f"{via}: {', '.join(nets)}" for via, nets in by_via.items()) or "-"


def print_report(report: access.Report, console: Console) -> None:
    """One table per environment and kind of principal."""
    envs = sorted({p.environment for p in report.principals})
    for env in envs:
        console.print(f"\n[bold]Access in {env}[/]")
        for kind, title in _TITLES.items():
            rows = [p for p in report.principals if p.environment == env and p.kind == kind]
            if not rows:
                continue
            table = Table(title=title, title_justify="left", show_lines=True)
            table.add_column("principal")
            if kind == "team-data":
                for column in ("region", "EFS path or S3 prefix", "access", "through"):
                    table.add_column(column)
                for p in rows:
                    for g in p.data:
                        where = g.location if g.store == "s3" else f"efs:{g.location}"
                        through = g.via + (f" (POSIX user {g.identity})" if g.identity.isdigit() else "")
                        table.add_row(*(Text(v) for v in (p.name, g.region, where, g.access, through)))
            elif kind == "pod-identity":
                table.add_column("IAM role")
                table.add_column("allowed actions")
                for p in rows:
                    actions = access.summarise_actions(p.actions)
                    managed = ", ".join(p.managed_policies)
                    table.add_row(
                        Text(p.name),
                        Text(access.role_name(p.arn or "")),
                        Text("\n".join(filter(None, (actions, managed)))),
                    )
            else:
                table.add_column("IAM role / group")
                table.add_column("Kubernetes")
                table.add_column("networks")
                for p in rows:
                    who = p.arn or ("(every group)" if p.group == "*" else p.group) or ""
                    if p.members:
                        who += "\n" + ", ".join(p.members)
                    if p.also:
                        who += "\nalso named by: " + "; ".join(p.also)
                    table.add_row(Text(p.name), Text(who), Text(_clusters(p)), Text(_networks(p)))
            console.print(table)
    if not report.principals:
        console.print("nobody: the selected plans grant no access")
    console.print(f"\nfrom {len(report.stacks)} plan(s): {', '.join(report.stacks)}", markup=False)
