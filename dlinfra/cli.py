"""Command line: `python -m dlinfra validate | cidr | preview | check | pool roll ...`.

Every command takes --fleet and --lock. Bad input exits 2 with one message naming the file and key;
nothing is written when a command fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dlinfra import (
    cli_access,
    cli_checks,
    cli_cost,
    cli_network,
    cli_what_happened,
    eks,
    kueue,
    planner,
    pools,
    stackroles,
)
from dlinfra.errors import DlinfraError
from dlinfra.fleet import LoadedFleet, load_fleet, version_lifecycle

ROOT = Path(__file__).resolve().parent.parent  # the project: Pulumi.yaml, stacks/, components/
EXIT_BAD_INPUT = 2

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--fleet", default="fleet.yaml", type=Path, help="fleet file (default: fleet.yaml)")
    common.add_argument(
        "--lock", default=None, type=Path, help="address-plan lock (default: cidr-lock.yaml beside the fleet)"
    )
    parser = argparse.ArgumentParser(prog="dlinfra", description=__doc__.splitlines()[0], parents=[common])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("validate", parents=[common], help="check the fleet and the lock")
    cidr = sub.add_parser("cidr", parents=[common], help="show or update the address plan")
    cidr.add_argument("--json", action="store_true", help="print a JSON list of {name, kind, cidr, ...}")
    cidr.add_argument("--update", action="store_true", help="allocate what the lock lacks and write the lock")
    cidr.add_argument(
        "--release", nargs="+", metavar="KEY", default=[], help="free allocations (explicit, never automatic)"
    )
    cidr.add_argument(
        "--force", action="store_true", help="with --release: free a key the fleet still uses (renumbers it)"
    )
    preview = sub.add_parser("preview", parents=[common], help="offline preview: run stacks under the mock engine")
    which = preview.add_mutually_exclusive_group(required=True)
    which.add_argument("--stack", action="append", help="stack to preview (repeatable); its dependencies run first")
    which.add_argument("--all", action="store_true", help="every stack of the fleet, in dependency order")
    preview.add_argument(
        "--out",
        type=Path,
        default=Path("build/plans"),
        help="plan export folder (default: build/plans); Kubernetes manifests go to its sibling manifests/",
    )
    preview.add_argument("--summary", action="store_true", help="counts only, no resource tree")
    preview.add_argument(
        "--json",
        action="store_true",
        help="print one JSON summary of every stack instead (schema: docs/plan-export.md)",
    )
    preview.add_argument(
        "--images-manifest", type=Path, help="Packer manifest of node AMIs (default: images/manifest.example.json)"
    )
    preview.add_argument(
        "--jobs",
        type=_jobs,
        default=os.cpu_count() or 1,
        metavar="N",
        help="stacks previewed at once, in separate processes, each when the stacks it reads are done "
        "(default: the number of CPUs; 1 runs them one after another in this process). Example: --jobs 4",
    )
    stacks = sub.add_parser(
        "stacks",
        parents=[common],
        help="list the fleet's stacks in apply order, with where each is applied",
        description="Regional stacks, then in-cluster stacks (applied from the region's in-VPC runner), then "
        "global stacks. Example: dlinfra stacks --json --only prod-us-west-2-k8s",
    )
    stacks.add_argument("--json", action="store_true", help="print {regional, k8s, global} lists of rows")
    stacks.add_argument("--only", default="", help="one stack name (empty: every stack)")
    parser.set_defaults(
        extra_handlers=cli_network.register(sub, common)
        | cli_checks.register(sub, common)
        | cli_access.register(sub, common)
        | cli_cost.register(sub, common)
        | pools.register(sub, common)
        | cli_what_happened.register(sub, common)
    )
    return parser


def _lock_path(args: argparse.Namespace) -> Path:
    lock: Path = args.lock if args.lock is not None else args.fleet.parent / "cidr-lock.yaml"
    return lock


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        handlers = {
            "validate": cmd_validate,
            "cidr": cmd_cidr,
            "preview": cmd_preview,
            "stacks": cmd_stacks,
            **args.extra_handlers,
        }
        handler: Callable[[argparse.Namespace], int] = handlers[args.command]
        return handler(args)
    except DlinfraError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True)  # the user's text is never markup
        return EXIT_BAD_INPUT


def _load(args: argparse.Namespace) -> LoadedFleet:
    """The fleet, with the checks that span environments (team GPU quotas) and the cluster versions' support
    dates done before anything else; warnings go to stderr."""
    loaded = load_fleet(args.fleet)
    kueue.check_fleet(loaded.fleet, source=str(loaded.path))
    for warning in version_lifecycle(loaded, eks.today()):
        err.print(f"warning: {warning}", markup=False)
    return loaded


def cmd_validate(args: argparse.Namespace) -> int:
    loaded = _load(args)
    lock = planner.load_lock(_lock_path(args))
    plan = planner.plan(loaded, lock)
    fleet = loaded.fleet
    stacks = stackroles.roles(fleet)
    pools = sum(len(e.node_pools) for e in fleet.environments.values())
    out.print(
        f"{args.fleet}: ok - {len(fleet.regions)} regions, {len(fleet.environments)} environments, "
        f"{len(stacks)} stacks, {len(fleet.sites)} sites, {pools} node pools, {len(fleet.teams)} teams"
    )
    out.print(f"{_lock_path(args)}: ok - {len(plan.allocations)} allocations, {len(plan.orphans)} orphaned")
    for key, net in plan.orphans.items():
        err.print(
            f"warning: {_lock_path(args)}: {key}: {net} is no longer in the fleet; it stays reserved until "
            f"`dlinfra cidr --release {key}`"
        )
    return 0


def cmd_stacks(args: argparse.Namespace) -> int:
    loaded = _load(args)
    fleet = loaded.fleet
    only = args.only.strip()
    selected = [stackroles.parse(fleet, only, fleet_file=str(loaded.path))] if only else stackroles.roles(fleet)
    grouped = stackroles.rows(fleet, selected)
    if args.json:
        sys.stdout.write(json.dumps(grouped, sort_keys=True) + "\n")
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
    lock_path = _lock_path(args)
    lock = planner.load_lock(lock_path, missing_ok=args.update)
    if args.release:
        _check_release(loaded, args.release, args.force)
        lock = planner.release(lock, args.release)
    plan = planner.plan(loaded, lock, update=args.update)
    new_lock = plan.to_lock(lock_path)
    changed = dict(new_lock.allocations) != dict(planner.load_lock(lock_path, missing_ok=True).allocations)
    if changed:
        if not (args.update or args.release):
            raise AssertionError("plan changed the lock without --update")  # plan() never allocates then
        planner.save_lock(new_lock, lock_path)
    if args.json:
        out.print_json(json.dumps(list(planner.rows(plan))))
    else:
        _print_plan_table(plan)
    if changed:
        err.print(f"wrote {lock_path} ({len(new_lock.allocations)} allocations); commit it with the fleet file")
    return 0


def _check_release(loaded: LoadedFleet, keys: Sequence[str], force: bool) -> None:
    """Refuse to free an allocated key the fleet still needs unless forced: it would be renumbered."""
    if force:
        return
    wanted = {r.key: r for r in planner.requests(loaded.fleet)}
    for key in keys:
        req = wanted.get(key)
        if req is not None and req.explicit is None:
            raise DlinfraError(
                f"{key} is still used by {req.source}; releasing it would renumber it on the next --update. "
                "Remove it from the fleet first, or pass --force",
                file=str(loaded.path),
                key=req.source,
            )


def _print_plan_table(plan: planner.Plan) -> None:
    table = Table(title="Address plan", show_lines=False)
    for column in ("name", "kind", "cidr", "state"):
        table.add_column(column)
    for row in planner.rows(plan):
        table.add_row(row["name"], row["kind"], row["cidr"], row["state"])
    out.print(table)


def _jobs(text: str) -> int:
    """--jobs: a whole number of processes, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--jobs takes a whole number of processes, 1 or more; got {text!r}")
    return int(text)


def cmd_preview(args: argparse.Namespace) -> int:
    loaded = _load(args)
    lock_path = _lock_path(args)
    planner.plan(loaded, planner.load_lock(lock_path))  # fail here, once, before any stack runs
    fleet = loaded.fleet
    all_roles = stackroles.roles(fleet)
    if args.all:
        selected = all_roles
    else:
        wanted = [stackroles.parse(fleet, s, fleet_file=str(loaded.path)) for s in args.stack]
        needed = {d for w in wanted for d in stackroles.dependencies(fleet, w)} | set(wanted)
        selected = [r for r in all_roles if r in needed]
    from dlinfra.offline import engine  # imports pulumi: only when a preview is asked for

    config = {"dlinfra:fleet": str(args.fleet.resolve()), "dlinfra:lock": str(lock_path.resolve())}
    if args.images_manifest is not None:
        config["dlinfra:images_manifest"] = str(args.images_manifest.resolve())
    from dlinfra import images, provenance

    manifest = args.images_manifest if args.images_manifest is not None else ROOT / images.EXAMPLE_MANIFEST
    made_from = provenance.current(ROOT, args.fleet, lock_path, manifest).to_json()
    started = time.perf_counter()
    total = 0

    summaries: list[dict[str, Any]] = []

    def report(result: engine.StackResult) -> None:
        nonlocal total
        path = engine.write_plan(result, fleet.project, args.out, made_from)
        engine.write_manifests(result, args.out.parent / "manifests")
        total += len(result.resources)
        if args.json:
            plan = result.plan(fleet.project)
            summaries.append(
                {
                    "stack": plan["stack"],
                    "role": plan["role"],
                    "plan": str(path),
                    "resources": plan["summary"],
                    "outputs": plan["outputs"],
                    "seconds": round(result.seconds, 2),
                }
            )
        else:
            _print_stack(result, fleet.project, path, summary=args.summary)

    if args.jobs > 1 and len(selected) > 1:
        depends_on = {role: stackroles.dependencies(fleet, role) for role in selected}
        engine.run_parallel(
            ROOT, selected, depends_on, project=fleet.project, config=config, jobs=args.jobs, on_done=report
        )
    else:
        engine.run_all(ROOT, selected, project=fleet.project, config=config, on_done=report)
    if args.json:
        # Outputs come masked from the plan export: secrets read "[secret]".
        document = {"schema": "dlinfra.preview/v1", "provenance": made_from, "stacks": summaries}
        sys.stdout.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
        return 0
    out.print(
        f"\n[bold]{len(selected)} stack(s), {total} resources[/], offline preview in "
        f"{time.perf_counter() - started:.1f}s; plans in {args.out}/"
    )
    return 0


def _print_stack(result: Any, project: str, path: Path, *, summary: bool) -> None:
    out.print(f"\n[bold]Previewing {result.role.name}[/] (offline, fake cloud)")
    resources = result.resources
    if not summary:
        children: dict[str | None, list[Any]] = {}
        for r in sorted(resources, key=lambda r: r.urn):
            children.setdefault(r.parent, []).append(r)
        stack_urn = next((p for p in children if p and p.endswith(f"::{project}-{result.role.name}")), None)
        out.print(f" +   pulumi:pulumi:Stack  {project}-{result.role.name}  create")

        def walk(parent: str | None, indent: str) -> None:
            kids = children.get(parent, [])
            for i, r in enumerate(kids):
                last = i == len(kids) - 1
                out.print(f" +   {indent}{'└─ ' if last else '├─ '}{r.type}  {r.name}  create", markup=False)
                walk(r.urn, indent + ("   " if last else "│  "))

        walk(stack_urn, "")
    counts: dict[str, int] = {}
    for r in resources:
        counts[r.type] = counts.get(r.type, 0) + 1
    out.print("Resources by type:")
    for type_, n in sorted(counts.items()):
        out.print(f"    {n:4d}  {type_}", markup=False)
    out.print(f"    + {len(resources) + 1} to create ({result.seconds:.2f}s) -> {path}")
    if result.outputs:
        out.print("Outputs: " + ", ".join(sorted(result.outputs)), markup=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
