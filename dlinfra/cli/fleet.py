"""`dlinfra validate`, `cidr` and `stacks`: the fleet, its address plan and its stacks."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from dlinfra.cli.common import EXIT_BAD_INPUT, Handler, err, load_checked, lock_file, out
from dlinfra.errors import DlinfraError
from dlinfra.model import eks, planner, sites, stackroles
from dlinfra.model.fleet.checks import BLOCK_WARN_DAYS, block_warnings
from dlinfra.model.fleet.load import LoadedFleet, key_line, load_fleet

# The version of each JSON output here (docs/json.md): a new one when a key changes meaning or goes.
VALIDATE_SCHEMA = "dlinfra.validate/v1"
STACKS_SCHEMA = "dlinfra.stacks/v1"
CIDR_SCHEMA = "dlinfra.cidr/v1"


def register_validate_and_cidr(sub: Any, common: argparse.ArgumentParser) -> dict[str, Handler]:
    """Add `validate` and `cidr`; returns command name -> handler."""
    validate = sub.add_parser("validate", parents=[common], help="check the fleet and the lock")
    validate.add_argument(
        "--warn-within",
        type=_days,
        default=BLOCK_WARN_DAYS,
        metavar="DAYS",
        help=f"warn of Capacity Blocks that end within this many days (default {BLOCK_WARN_DAYS})",
    )
    validate.add_argument(
        "--json",
        action="store_true",
        help=f"print the result as JSON (schema {VALIDATE_SCHEMA}, docs/json.md): ok, counts, errors and warnings",
    )
    cidr = sub.add_parser("cidr", parents=[common], help="show or update the address plan")
    cidr.add_argument(
        "--json", action="store_true", help=f"print {{schema: {CIDR_SCHEMA}, allocations: [{{name, kind, cidr, ...}}]}}"
    )
    cidr.add_argument(
        "--update", action="store_true", help="allocate what the lock lacks, write the lock and print what changed"
    )
    cidr.add_argument(
        "--release",
        nargs="+",
        metavar="KEY",
        default=[],
        help="free allocations (explicit, never automatic); a key whose fleet CIDR changed takes the new one",
    )
    cidr.add_argument(
        "--force", action="store_true", help="with --release: free a key the fleet still uses (renumbers it)"
    )
    return {"validate": cmd_validate, "cidr": cmd_cidr}


def register_stacks(sub: Any, common: argparse.ArgumentParser) -> dict[str, Handler]:
    """Add `stacks`; returns command name -> handler."""
    stacks = sub.add_parser(
        "stacks",
        parents=[common],
        help="list the fleet's stacks in apply order, with where each is applied",
        description="Regional stacks, then in-cluster stacks (applied from the region's in-VPC runner), then "
        "global stacks.",
    )
    stacks.add_argument(
        "--json", action="store_true", help=f"print {{schema: {STACKS_SCHEMA}, regional, k8s, global}}: lists of rows"
    )
    stacks.add_argument("--only", default="", help="one stack name (empty: every stack)")
    stacks.add_argument(
        "--actor-id",
        type=int,
        metavar="ID",
        help="refuse when the in-VPC runners would take none of this GitHub account's jobs for the selected "
        "in-cluster stacks (apply.yml passes github.actor_id)",
    )
    return {"stacks": cmd_stacks}


def cmd_validate(args: argparse.Namespace) -> int:
    if not args.json:
        _validate(args, warn=lambda text: err.print(f"warning: {text}", markup=False))
        return 0
    # One JSON document whatever happens; the first error stops validation, as it does without --json.
    warnings: list[str] = []
    document: dict[str, Any] = {"schema": VALIDATE_SCHEMA, "fleet": str(args.fleet), "lock": str(lock_file(args))}
    try:
        counts = _validate(args, warn=warnings.append)
    except DlinfraError as exc:
        error = {"file": exc.file, "key": exc.key, "message": exc.detail}
        document |= {"ok": False, "counts": None, "errors": [error], "warnings": warnings}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return EXIT_BAD_INPUT
    document |= {"ok": True, "counts": counts, "errors": [], "warnings": warnings}
    sys.stdout.write(json.dumps(document, indent=2) + "\n")
    return 0


def _validate(args: argparse.Namespace, *, warn: Callable[[str], None]) -> dict[str, int]:
    """Validate the fleet and the lock, print what they hold (not with --json) and return the counts; each warning
    goes to `warn` as one `file: key: problem` line."""
    loaded = load_checked(args, warn=warn)
    lock = planner.load_lock(lock_file(args))
    plan = planner.plan(loaded, lock)
    fleet = loaded.fleet
    counts = {
        "regions": len(fleet.regions),
        "environments": len(fleet.environments),
        "stacks": len(stackroles.roles(fleet)),
        "sites": len(fleet.sites),
        "node_pools": sum(len(e.node_pools) for e in fleet.environments.values()),
        "teams": len(fleet.teams),
        "allocations": len(plan.allocations),
        "orphaned": len(plan.orphans),
    }
    if not args.json:
        out.print(
            f"{args.fleet}: ok - {counts['regions']} regions, {counts['environments']} environments, "
            f"{counts['stacks']} stacks, {counts['sites']} sites, {counts['node_pools']} node pools, "
            f"{counts['teams']} teams"
        )
        out.print(f"{lock_file(args)}: ok - {counts['allocations']} allocations, {counts['orphaned']} orphaned")
    for key, net in plan.orphans.items():
        warn(f"{lock_file(args)}: {key}: {net} is no longer in the fleet; it stays reserved until "
             f"`dlinfra cidr --release {key}`")  # fmt: skip
    within = datetime.timedelta(days=getattr(args, "warn_within", BLOCK_WARN_DAYS))
    for key, message in block_warnings(fleet, _now(), within):
        line = key_line(loaded.path, key)
        warn(f"{loaded.path}{f':{line}' if line else ''}: {key}: {message}")
    for name, site in sorted(fleet.sites.items()):
        # Judged by the clock, as AWS judges it when the activation is created or replaced (`check` has the rules
        # ssm-activation-expiry-in-range and ssm-activation-not-expired on the plans).
        problem = site.activation_expiry and sites.activation_expiry_problem(site.activation_expiry, _now())
        if problem:
            key = f"sites.{name}.activation_expiry"
            line = key_line(loaded.path, key)
            warn(f"{loaded.path}{f':{line}' if line else ''}: {key}: {problem}")
    return counts


def _days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of days") from None
    if days < 0:
        raise argparse.ArgumentTypeError(f"{days}: give 0 or more days")
    return days


def _now() -> datetime.datetime:
    """The clock `validate` judges windows by: DLINFRA_TODAY at 00:00 UTC when set (tests pin it), else now."""
    if eks.TODAY_VARIABLE in os.environ:
        return datetime.datetime.combine(eks.today(), datetime.time(), datetime.UTC)
    return datetime.datetime.now(datetime.UTC)


def cmd_stacks(args: argparse.Namespace) -> int:
    loaded = load_checked(args)
    fleet = loaded.fleet
    only = args.only.strip()
    selected = [stackroles.parse(fleet, only, fleet_file=str(loaded.path))] if only else stackroles.roles(fleet)
    if args.actor_id is not None:
        refusals = stackroles.runner_refusals(fleet, selected, args.actor_id)
        if refusals:
            key, problem = refusals[0]
            line = key_line(loaded.path, key)
            more = "".join(f"\n  also {k}: {p}" for k, p in refusals[1:])
            raise DlinfraError(problem + more, file=f"{loaded.path}:{line}" if line else str(loaded.path), key=key)
    grouped = stackroles.rows(fleet, selected)
    if args.json:
        sys.stdout.write(json.dumps({"schema": STACKS_SCHEMA, **grouped}, sort_keys=True) + "\n")
        return 0
    table = Table(title="Stacks in apply order")
    for column in ("stack", "kind", "applied from"):
        table.add_column(column)
    for kind in ("regional", "k8s", "global"):
        for row in grouped[kind]:
            table.add_row(row["stack"], kind, row["runs_on"])
    out.print(table)
    return 0


def cmd_cidr(args: argparse.Namespace) -> int:
    loaded = load_fleet(args.fleet)
    lock_path = lock_file(args)
    before = planner.load_lock(lock_path, missing_ok=args.update or bool(args.release))
    lock = before
    update = args.update
    if args.release:
        _check_release(loaded, before, args.release, args.force)
        lock = planner.release(before, args.release)
        # What the release dropped (a VPC takes its subnets) is allocated again at once, from the fleet's
        # explicit CIDR where it has one: releasing a changed entry is one step, not release then --update.
        missing = {r.key for r in planner.requests(loaded.fleet)} - set(lock.allocations)
        update = update or missing <= set(before.allocations) - set(lock.allocations)
    plan = planner.plan(loaded, lock, update=update)
    new_lock = plan.to_lock(lock_path)
    old, new = dict(before.allocations), dict(new_lock.allocations)
    if old != new:
        if not (args.update or args.release):
            raise AssertionError("plan changed the lock without --update")  # plan() never allocates then
        planner.save_lock(new_lock, lock_path)
    if args.json:
        out.print_json(json.dumps({"schema": CIDR_SCHEMA, "allocations": list(planner.rows(plan))}))
    elif args.update or args.release:
        _print_lock_changes(old, new)
    else:
        _print_plan_table(plan)
    if old != new:
        err.print(f"wrote {lock_path} ({len(new)} allocations); commit it with the fleet file", markup=False)
    return 0


def _print_lock_changes(old: dict[str, Any], new: dict[str, Any]) -> None:
    """What --update or --release changed, one line a key; the whole table is `dlinfra cidr`."""
    changes = [("-", key, old[key], "released") for key in old if key not in new or new[key] != old[key]]
    changes += [("+", key, new[key], "allocated") for key in new if key not in old or new[key] != old[key]]
    if not changes:
        out.print("the lock already covers the fleet: nothing changed")
        return
    styles = {"+": "green", "-": "red"}
    for marker, key, net, what in sorted(changes, key=lambda c: (c[1], c[0])):
        line = Text(f"{marker} ", style=styles[marker])
        line.append(f"{key:<28} {net!s:<18} {what}")
        out.print(line)
    added = sum(1 for c in changes if c[0] == "+")
    out.print(f"{added} allocated, {len(changes) - added} released; `dlinfra cidr` shows the whole plan")


def _check_release(loaded: LoadedFleet, lock: planner.Lock, keys: Sequence[str], force: bool) -> None:
    """Refuse unknown keys, and freeing an allocated key the fleet still needs unless forced (it would be
    renumbered). A key with an explicit CIDR in the fleet is released and takes that CIDR."""
    for key in keys:
        if key not in lock.allocations:
            raise DlinfraError(
                f"{key}: no such allocation in the lock; `dlinfra cidr` lists the keys", file=str(_lock_of(lock))
            )
    if force:
        return
    wanted = {r.key: r for r in planner.requests(loaded.fleet)}
    for key in keys:
        req = wanted.get(key)
        if req is not None and req.explicit is None:
            raise DlinfraError(
                f"{key} is still used by {req.source}; releasing it renumbers it. Remove it from the fleet and "
                f"run `dlinfra cidr --release {key}`, or renumber it now with "
                f"`dlinfra cidr --release {key} --force`",
                file=str(loaded.path),
                key=req.source,
            )


def _lock_of(lock: planner.Lock) -> str:
    return str(lock.path) if lock.path else "cidr lock"


def _print_plan_table(plan: planner.Plan) -> None:
    """The plan as a table that fits 80 columns (the key's prefix says its kind; terminals of 100 columns or more
    show it too), boxed on a terminal and the same three plain aligned columns in every pipe, for grep and awk."""
    rows = list(planner.rows(plan))
    columns = ["name", "kind", "cidr", "state"] if out.is_terminal and out.width >= 100 else ["name", "cidr", "state"]
    if not out.is_terminal:
        widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
        for row in [dict(zip(columns, columns, strict=True)), *rows]:
            sys.stdout.write("  ".join(row[c].ljust(widths[c]) for c in columns).rstrip() + "\n")
        return
    table = Table(title="Address plan", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(Text(row[c]) for c in columns))
    out.print(table)
