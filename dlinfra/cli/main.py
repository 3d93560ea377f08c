"""Command line: `python -m dlinfra validate | cidr | preview | check | pool roll ...`.

Every command takes --fleet and --lock. Bad input exits 2 with one message naming the file and key;
nothing is written when a command fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from dlinfra import PROJECT_ROOT as ROOT
from dlinfra.cli import access as cli_access
from dlinfra.cli import checks as cli_checks
from dlinfra.cli import cost as cli_cost
from dlinfra.cli import doctor as cli_doctor
from dlinfra.cli import network as cli_network
from dlinfra.cli import what_happened as cli_what_happened
from dlinfra.errors import DlinfraError
from dlinfra.model import eks, kueue, planner, stackroles
from dlinfra.model.fleet.load import LoadedFleet, load_fleet, version_lifecycle
from dlinfra.ops import pools
from dlinfra.ops.stack_outputs import SECRET_PLACEHOLDER

EXIT_BAD_INPUT = 2

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _shared_options(*, subcommand: bool) -> argparse.ArgumentParser:
    """--fleet and --lock. On subcommands they default to SUPPRESS: argparse copies a subparser's defaults over
    the parent's values, so `dlinfra --fleet F validate` would silently read fleet.yaml otherwise."""
    shared = argparse.ArgumentParser(add_help=False)
    fleet_default: Any = argparse.SUPPRESS if subcommand else Path("fleet.yaml")
    lock_default: Any = argparse.SUPPRESS if subcommand else None
    shared.add_argument("--fleet", default=fleet_default, type=Path, help="fleet file (default: fleet.yaml)")
    shared.add_argument(
        "--lock", default=lock_default, type=Path, help="address-plan lock (default: cidr-lock.yaml beside the fleet)"
    )
    return shared


def version() -> str:
    """The installed package's version, or a note saying the package is not installed."""
    try:
        return f"dlinfra {metadata.version('dlinfra')}"
    except metadata.PackageNotFoundError:
        return f"dlinfra (not installed as a package: run `pip install -e {ROOT}`; running from source)"


def _parser() -> argparse.ArgumentParser:
    common = _shared_options(subcommand=True)
    parser = argparse.ArgumentParser(
        prog="dlinfra",
        description=__doc__.splitlines()[0],
        parents=[_shared_options(subcommand=False)],
    )
    parser.add_argument("--version", action="version", version=version(), help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("validate", parents=[common], help="check the fleet and the lock")
    cidr = sub.add_parser("cidr", parents=[common], help="show or update the address plan")
    cidr.add_argument("--json", action="store_true", help="print a JSON list of {name, kind, cidr, ...}")
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
    preview.add_argument("--summary", action="store_true", help="one line per stack and a total, no resource tree")
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
        "global stacks.",
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
        | cli_doctor.register(sub)
    )
    _add_examples(parser, "")
    return parser


# One example per command, shown under its --help; keyed by the command path ("site add").
EXAMPLES: dict[str, str] = {
    "": "dlinfra --fleet fleet.yaml validate\n  dlinfra preview --all --summary\n  dlinfra check --all",
    "validate": "dlinfra validate --fleet fleet.yaml",
    "cidr": "dlinfra cidr --update            # after adding a region or site\n  dlinfra cidr --release site-lan/ams1",
    "preview": "dlinfra preview --all --summary\n  dlinfra preview --stack prod-us-west-2",
    "stacks": "dlinfra stacks --json --only prod-us-west-2-k8s",
    "site": "dlinfra site list",
    "site list": "dlinfra site list --json",
    "site add": "dlinfra site add lax1 --region us-west-2 --public-ip 198.51.100.7 --asn 65110 --bgp \\\n"
    "      --gpu-nodes 4 --gpus-per-node 8 --gpu-model H100 --nfs 10.60.0.5:/export/data:/data",
    "site remove": "dlinfra site remove lax1            # keeps its address ranges reserved",
    "site render": "dlinfra site render ams1 --offline",
    "vpn": "dlinfra vpn profile --region us-west-2 --user alice --outputs outputs.json",
    "vpn profile": "dlinfra vpn profile --region us-west-2 --user alice --outputs outputs.json",
    "check": "dlinfra preview --all && dlinfra check --all",
    "reach": "dlinfra reach --verbose",
    "diff": "dlinfra diff --base origin/main --out plan-diff.md",
    "access": "dlinfra access --env prod --team vision",
    "cost": "dlinfra preview --all && dlinfra cost --json",
    "pool": "dlinfra pool roll --stack prod-us-west-2 --pool train-h100",
    "pool roll": "dlinfra pool roll --stack prod-us-west-2 --pool train-h100",
    "what-happened": "dlinfra what-happened i-0123456789abcdef0 --since 6h",
    "doctor": "dlinfra doctor",
}


def _add_examples(parser: argparse.ArgumentParser, path: str) -> None:
    """Give every command an example epilog kept as written (RawDescriptionHelpFormatter)."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    example = EXAMPLES.get(path)
    if example is not None and not parser.epilog:
        parser.epilog = f"Example:\n  {example}"
    # argparse has no public way to walk its subcommands.
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, child in action.choices.items():
                _add_examples(child, f"{path} {name}".strip())


def _lock_path(args: argparse.Namespace) -> Path:
    lock: Path = args.lock if args.lock is not None else Path(args.fleet).parent / "cidr-lock.yaml"
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
        err.print(Text.assemble(("error:", "bold red"), " ", str(exc)))  # Text: the message echoes user input
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
            f"`dlinfra cidr --release {key}`",
            markup=False,
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
        out.print_json(json.dumps(list(planner.rows(plan))))
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
    """The plan as a table that fits 80 columns (the key's prefix says its kind; wider terminals show it too),
    boxed on a terminal and plain aligned columns in a pipe, for grep and awk."""
    rows = list(planner.rows(plan))
    columns = ["name", "kind", "cidr", "state"] if out.width >= 100 else ["name", "cidr", "state"]
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
    from dlinfra.offline import engine, parallel, plan_export  # imports pulumi: only when a preview is asked for

    config = {"dlinfra:fleet": str(args.fleet.resolve()), "dlinfra:lock": str(lock_path.resolve())}
    if args.images_manifest is not None:
        config["dlinfra:images_manifest"] = str(args.images_manifest.resolve())
    from dlinfra.model import images
    from dlinfra.offline import provenance

    manifest = args.images_manifest if args.images_manifest is not None else ROOT / images.EXAMPLE_MANIFEST
    made_from = provenance.current(ROOT, args.fleet, lock_path, manifest).to_json()
    started = time.perf_counter()
    total = 0

    summaries: list[dict[str, Any]] = []

    def report(result: plan_export.StackResult) -> None:
        nonlocal total
        path = plan_export.write_plan(result, fleet.project, args.out, made_from)
        plan_export.write_manifests(result, args.out.parent / "manifests")
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

    with _progress("previewing", len(selected)) as advance:

        def done(result: plan_export.StackResult) -> None:
            report(result)
            advance(result.role.name)

        if args.jobs > 1 and len(selected) > 1:
            depends_on = {role: stackroles.dependencies(fleet, role) for role in selected}
            parallel.run_parallel(
                ROOT, selected, depends_on, project=fleet.project, config=config, jobs=args.jobs, on_done=done
            )
        else:
            engine.run_all(ROOT, selected, project=fleet.project, config=config, on_done=done)
    if args.json:
        # Outputs come masked from the plan export: secrets read "[secret]".
        document = {"schema": "dlinfra.preview/v1", "provenance": made_from, "stacks": summaries}
        sys.stdout.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
        return 0
    out.print(
        Text.assemble(
            "\n",
            (f"{len(selected)} stack(s): ", "bold"),
            _marker("create"),
            (f" {total + len(selected)} to create", "bold"),
            f"; offline preview in {time.perf_counter() - started:.1f}s; plans in {args.out}/",
        )
    )
    return 0


# pulumi preview's markers and colours, by operation.
MARKERS = {"create": ("+", "green"), "update": ("~", "yellow"), "delete": ("-", "red"), "replace": ("+-", "magenta")}


def _marker(op: str) -> Text:
    symbol, style = MARKERS[op]
    return Text(symbol, style=style)


@contextlib.contextmanager
def _progress(what: str, total: int) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr (stacks done out of total), only on a terminal; yields advance(name)."""
    if not err.is_terminal or total < 2:
        yield lambda _name: None
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(what, total=total)

        def advance(name: str) -> None:
            progress.update(task, advance=1, description=escape(f"{what}: {name} done"))

        yield advance


def _print_stack(result: Any, project: str, path: Path, *, summary: bool) -> None:
    """One stack the way `pulumi preview` shows it: a tree with + markers, outputs (secrets masked) and one
    resource count line; with summary, that count line alone."""
    count = len(result.resources) + 1  # and the pulumi:pulumi:Stack itself, as pulumi counts it
    line = Text.assemble((f"{result.role.name:<28}", "bold"), " ", _marker("create"), f" {count} to create")
    if summary:
        out.print(line)
        return
    out.print(Text.assemble("\n", ("Previewing ", "bold"), (result.role.name, "bold"), " (offline, fake cloud)"))
    children: dict[str | None, list[Any]] = {}
    for r in sorted(result.resources, key=lambda r: r.urn):
        children.setdefault(r.parent, []).append(r)
    stack_urn = next((p for p in children if p and p.endswith(f"::{project}-{result.role.name}")), None)
    out.print(Text.assemble(" ", _marker("create"), f"   pulumi:pulumi:Stack  {project}-{result.role.name}  create"))

    def walk(parent: str | None, indent: str) -> None:
        kids = children.get(parent, [])
        for i, r in enumerate(kids):
            last = i == len(kids) - 1
            branch = f"{indent}{'└─ ' if last else '├─ '}"
            out.print(Text.assemble(" ", _marker("create"), f"   {branch}{r.type}  {r.name}  create"))
            walk(r.urn, indent + ("   " if last else "│  "))

    walk(stack_urn, "")
    outputs = result.masked_outputs()
    if outputs:
        out.print("Outputs:")
        for name, value in outputs.items():
            shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            if "\n" in shown:  # a PEM or a script: its first line says what it is
                shown = shown.splitlines()[0] + " …"
            if len(shown) > OUTPUT_WIDTH:
                shown = shown[: OUTPUT_WIDTH - 1] + "…"
            style = "dim" if value == SECRET_PLACEHOLDER else ""
            out.print(Text.assemble(f"    {name}: ", (shown, style)))
    out.print(
        Text.assemble("Resources:\n    ", _marker("create"), f" {count} to create ({result.seconds:.2f}s) -> {path}")
    )


OUTPUT_WIDTH = 100  # characters of one output value shown; the plan export holds all of it


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
