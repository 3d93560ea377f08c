"""The `quota` subcommand: each team's guaranteed and borrowable GPUs per environment, region and flavor, from the
fleet (dlinfra.model.gpu_quotas), with a warning on stderr for a team guaranteed nothing. How to read it:
docs/jobs.md, "Who gets which GPUs"."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlinfra.cli.common import Handler, err, load_checked
from dlinfra.errors import DlinfraError
from dlinfra.model import gpu_quotas


def register(subparsers: Any, common: argparse.ArgumentParser) -> dict[str, Handler]:
    """Add `quota` to the CLI; returns command name -> handler."""
    cmd = subparsers.add_parser(
        "quota",
        parents=[common],
        help="each team's guaranteed and borrowable GPUs per environment, region and flavor (Kueue quotas)",
        description="Reads the fleet: no preview needed. Guaranteed GPUs are the team's Kueue nominal quota; "
        "borrowable GPUs are the most it can hold on top while other teams leave theirs idle (docs/jobs.md).",
    )
    cmd.add_argument("--env", help="one environment only")
    cmd.add_argument("--team", help="one team only")
    cmd.add_argument("--json", action="store_true", help=f"print JSON (schema {gpu_quotas.SCHEMA}: docs/jobs.md)")
    return {"quota": cmd_quota}


def cmd_quota(args: argparse.Namespace) -> int:
    loaded = load_checked(args)
    fleet = loaded.fleet
    for value, known, what in ((args.env, fleet.environments, "environment"), (args.team, fleet.teams, "team")):
        if value is not None and value not in known:
            raise DlinfraError(f"no {what} {value!r}; the fleet has {', '.join(sorted(known))}", file=str(loaded.path))
    view = gpu_quotas.from_fleet(fleet).only(args.env, args.team)
    for warning in view.warnings:
        err.print(f"warning: {warning}", markup=False)
    if args.json:
        sys.stdout.write(json.dumps(view.to_json(), indent=2) + "\n")
        return 0
    # In a pipe there is no terminal width: print the table at its own width rather than cut it to 80 columns.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 10_000)
    console.print(table(view))
    return 0


def table(view: gpu_quotas.QuotaView) -> Table:
    """One row per environment, team, region and flavor, and a total per team and environment."""
    out = Table(title="Team GPU quotas (Kueue): guaranteed, and borrowable from idle GPUs", title_justify="left")
    for name, justify in (
        ("environment", "left"),
        ("team", "left"),
        ("region", "left"),
        ("flavor", "left"),
        ("guaranteed", "right"),
        ("borrowable", "right"),
    ):
        out.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for env, teams in view.teams.items():
        for team in teams:
            rows = [r for r in view.rows if (r.environment, r.team) == (env, team)]
            for r in rows:
                out.add_row(Text(env), Text(team), Text(r.region), Text(r.flavor), str(r.guaranteed), str(r.borrowable))
                if r.shares:  # a shared pool: the same GPUs as the shares the team's jobs ask for
                    in_shares = (r.share_text(r.guaranteed) or "0", r.share_text(r.borrowable) or "0")
                    out.add_row("", "", "", Text("  as shares"), *in_shares)
            total = sum(r.guaranteed for r in rows)
            style = "bold" if total else "bold red"
            out.add_row(
                Text(env),
                Text(team),
                Text("all regions", style="bold"),
                "",
                Text(str(total), style=style),
                Text(str(sum(r.borrowable for r in rows)), style="bold"),
                end_section=True,
            )
    return out
