"""The `cost` subcommand: monthly cost of each stack at min and max size, from the offline plans.

`register` adds it to dlinfra.cli's parser. Missing plans, an unknown --assume key or an unpriced resource
raise DlinfraError (the CLI prints it and exits 2). Method and caveats: docs/cost.md.
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

from dlinfra.cli.common import Handler, err, out
from dlinfra.model import stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.review import access, cost, dev_box_cost


def register(subparsers: Any, common: argparse.ArgumentParser) -> dict[str, Handler]:
    """Add `cost` to the CLI; returns command name -> handler."""
    cmd = subparsers.add_parser(
        "cost",
        parents=[common],
        help="estimated monthly cost per stack at min and max pool size (from the plans and a dated price table)",
        description="Reads the offline plans (`dlinfra preview --all`) and dlinfra/data/prices.yaml. "
        "Example: dlinfra cost --assume nat_gb=2000 --assume s3_gb=50000",
    )
    cmd.add_argument("--plans", type=Path, default=Path("build/plans"), help="plan folder (default: build/plans)")
    cmd.add_argument("--json", action="store_true", help="print the report as JSON (schema: docs/cost.md)")
    cmd.add_argument("--allow-stale", action="store_true", help="use plans even if their inputs changed since")
    cmd.add_argument(
        "--assume",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="usage per stack and month (repeatable): "
        + ", ".join(f"{k} (default {v:g})" for k, v in cost.DEFAULT_ASSUMPTIONS.items()),
    )
    return {"cost": cmd_cost}


def cmd_cost(args: argparse.Namespace) -> int:
    assumptions = cost.parse_assumptions(args.assume)
    fleet = load_fleet(args.fleet).fleet
    stacks = [r.name for r in stackroles.roles(fleet)]
    plans = access.load_plans(args.plans, stacks)
    from dlinfra.cli.checks import refuse_stale_plans

    stale_note = refuse_stale_plans(args, plans)
    if stale_note:
        err.print(f"note: {stale_note}", markup=False)
    report = cost.estimate([p.data for p in plans], assumptions=assumptions)
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    else:
        print_report(report, out)
    return 0


def _usd(value: float) -> str:
    return f"{value:,.2f}"


def print_report(report: cost.Report, console: Console) -> None:
    """One table per stack with lines, a totals table, then assumptions, flagged prices and what is left out."""
    for stack in report.stacks:
        if not stack.items:
            continue
        table = Table(title=f"{stack.stack} ({stack.region})", title_justify="left")
        for name, justify in (
            ("item", "left"),
            ("quantity", "left"),
            ("USD each", "right"),
            ("USD/month min", "right"),
            ("USD/month max", "right"),
            ("note", "left"),
        ):
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for i in stack.items:
            each = f"{i.usd_each:g} / {i.unit}" if i.price_key else "billed separately"
            table.add_row(Text(i.label), Text(i.detail), Text(each), _usd(i.usd_min), _usd(i.usd_max), Text(i.note))
        table.add_row(Text("total", style="bold"), "", "", _usd(stack.usd_min), _usd(stack.usd_max), "")
        console.print(table)
    totals = Table(title="Total per month (USD)", title_justify="left")
    totals.add_column("stack")
    totals.add_column("min", justify="right")
    totals.add_column("max", justify="right")
    for stack in report.stacks:
        totals.add_row(Text(stack.stack), _usd(stack.usd_min), _usd(stack.usd_max))
    totals.add_row(Text("all stacks", style="bold"), _usd(report.usd_min), _usd(report.usd_max))
    console.print(totals)
    boxes = dev_box_cost.by_environment(report.stacks)
    if boxes:
        table = Table(title="Dev boxes by environment (USD, on demand)", title_justify="left")
        for name, justify in (("environment", "left"), ("boxes", "right"), ("per hour, all running", "right"),
                              ("per month at most", "right")):  # fmt: skip
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for env, b in boxes.items():
            table.add_row(Text(env), str(b.boxes), f"{b.usd_per_hour:,.4f}", _usd(b.usd_month_max))
        console.print(table)
    console.print(
        f"Prices: dlinfra/data/prices.yaml, read {report.price_date}; USD, on demand; "
        f"{report.hours_per_month:g} hours per month.",
        markup=False,
    )
    console.print(
        "Assumptions (per stack per month; set with --assume key=value): "
        + ", ".join(f"{k}={v:g}" for k, v in report.assumptions.items()),
        markup=False,
    )
    if report.unverified_prices:
        console.print("Prices not confirmed on their source page, or copied from another region:", markup=False)
        for line in report.unverified_prices:
            console.print(f"  - {line}", markup=False)
    console.print("Not counted:", markup=False)
    for line in report.not_counted:
        console.print(f"  - {line}", markup=False)
