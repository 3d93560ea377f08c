"""`dlinfra preview`: run stacks under the offline engine, write their plans, and show them as pulumi would."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.text import Text

from dlinfra import PROJECT_ROOT as ROOT
from dlinfra.cli.common import Handler, err, load_checked, lock_file, marker, out, progress, side, working
from dlinfra.model import planner, stackroles
from dlinfra.ops.stack_outputs import SECRET_PLACEHOLDER


def register(sub: Any, common: argparse.ArgumentParser) -> dict[str, Handler]:
    """Add `preview`; returns command name -> handler."""
    preview = sub.add_parser("preview", parents=[common], help="offline preview: run stacks under the mock engine")
    which = preview.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--stack", action="append", help="stack to preview (repeatable); the stacks it reads, and theirs, run first"
    )
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
    preview.add_argument(
        "--no-cache",
        action="store_true",
        help="run every stack again instead of reusing the plans of stacks whose inputs are unchanged "
        "(the cache is build/cache/ beside --out, or DLINFRA_CACHE; DLINFRA_CACHE=off is the same as this flag)",
    )
    against = preview.add_mutually_exclusive_group()
    against.add_argument(
        "--base",
        metavar="BASE",
        type=side,
        help="what to compare with, as `pulumi preview` compares with its state: a git revision, or a plan folder "
        "(a copy of build/plans) for a fleet outside git (default: the default branch, when the fleet is in git)",
    )
    against.add_argument(
        "--empty", action="store_true", help="compare with an empty cloud: every resource shows as to create"
    )
    preview.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help="exit 0 when nothing changes, 2 when something does, 1 on an error (as terraform plan does)",
    )
    return {"preview": cmd_preview}


def _jobs(text: str) -> int:
    """--jobs: a whole number of processes, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--jobs takes a whole number of processes, 1 or more; got {text!r}")
    return int(text)


def cmd_preview(args: argparse.Namespace) -> int:
    loaded = load_checked(args)
    lock_path = lock_file(args)
    planner.plan(loaded, planner.load_lock(lock_path))  # fail here, once, before any stack runs
    fleet = loaded.fleet
    all_roles = stackroles.roles(fleet)
    if args.all:
        selected = all_roles
    else:
        wanted = [stackroles.parse(fleet, s, fleet_file=str(loaded.path)) for s in args.stack]
        needed = stackroles.with_dependencies(fleet, wanted)
        selected = [r for r in all_roles if r in needed]
    from dlinfra.offline import cache, plan_export
    from dlinfra.review.diff import revisions

    repo = revisions.repository(args.fleet.resolve().parent)
    cache_folder = None if args.no_cache else cache.folder(args.out.parent / "cache")
    base = None if args.empty else _base(args, revisions, repo)
    from dlinfra.offline import preview as offline  # imports pulumi: only when a preview is asked for

    started = time.perf_counter()
    total = 0
    summaries: list[dict[str, Any]] = []
    plans: dict[str, dict[str, Any]] = {}

    def report(result: plan_export.StackResult, path: Path) -> None:
        nonlocal total
        total += len(result.resources)
        if args.json or base is not None:
            plan = result.plan(fleet.project)
            plans[plan["stack"]] = plan
        if args.json:
            summaries.append(
                {
                    "stack": plan["stack"],
                    "role": plan["role"],
                    "plan": str(path),
                    "resources": plan["summary"],
                    "outputs": plan["outputs"],
                    "seconds": round(result.seconds, 2),
                    "cached": result.cached,
                }
            )
        elif base is None:
            _print_stack(result, fleet.project, path, summary=args.summary)

    with progress("previewing", len(selected)) as advance:

        def done(result: plan_export.StackResult, path: Path) -> None:
            report(result, path)
            advance(result.role.name)

        previewed = offline.run(
            ROOT,
            loaded,
            lock_path,
            selected,
            out=args.out,
            images_manifest=args.images_manifest,
            jobs=args.jobs,
            cache_folder=cache_folder,
            on_done=done,
        )
    made_from, plan_cache = previewed.provenance, previewed.cache
    changes = None
    if base is not None:
        with working(f"comparing with {base}"):
            changes = _compare(args, base, plans, revisions, repo=repo, cache_folder=cache_folder)
    if args.json:
        # Outputs come masked from the plan export: secrets read "[secret]".
        document: dict[str, Any] = {"schema": "dlinfra.preview/v1", "provenance": made_from, "stacks": summaries}
        if plan_cache is not None:
            document["cache"] = {"reused": plan_cache.reused, "ran": plan_cache.ran}
        if changes is not None:
            document["base"] = changes.base
            for row in summaries:
                row["changes"] = _counts(changes, row["stack"])
        sys.stdout.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
        return _exit(args, changes, total)
    if changes is not None:
        _print_changes(changes, plans, summary=args.summary)
        counts = _counts(changes, None)
        said = ", ".join(
            [f"{n} to {op}" for op, n in counts.items() if n]
            + [f"{len(changes.lock)} address allocation(s) change"] * bool(changes.lock)
            + [f"the stack config of {', '.join(changes.config_changed)} changes"] * bool(changes.config_changed)
        )
        said = said or "no changes"
        out.print(
            Text.assemble(
                "\n",
                (f"{len(selected)} stack(s) against {changes.base}: ", "bold"),
                (said, "bold"),
                f"; offline preview in {time.perf_counter() - started:.1f}s; plans in {args.out}/",
                _cache_line(plan_cache),
            )
        )
        return _exit(args, changes, total)
    out.print(
        Text.assemble(
            "\n",
            (f"{len(selected)} stack(s): ", "bold"),
            marker("create"),
            (f" {total + len(selected)} to create", "bold"),
            f"; offline preview in {time.perf_counter() - started:.1f}s; plans in {args.out}/",
            _cache_line(plan_cache),
        )
    )
    return _exit(args, None, total)


def _base(args: argparse.Namespace, revisions: Any, repo: Path | None) -> str | None:
    """What to compare with: --base, else the default branch of the fleet's repository; None (an empty cloud),
    saying so, when there is neither."""
    if args.base is not None:
        revisions.check_side(args.base, repo)
        return str(args.base)
    branch = revisions.default_branch(repo) if repo is not None else None
    if branch is None:
        err.print(
            "note: no base to compare with (the fleet is not in git, or git has no default branch): every resource "
            "shows as to create; --base DIR compares with a saved plan folder",
            markup=False,
        )
    return branch


def _compare(
    args: argparse.Namespace,
    base: str,
    plans: dict[str, dict[str, Any]],
    revisions: Any,
    *,
    repo: Path | None,
    cache_folder: Path | None,
) -> Any:
    """The diff of these plans against the base's plans of the same stacks (with --all, of every stack the base
    has: one this fleet no longer has is a stack to remove, every resource deleted)."""
    import tempfile

    from dlinfra.offline.preview import INPUTS
    from dlinfra.review.diff.compare import compare
    from dlinfra.review.diff.plans import PlanSet, topology

    with tempfile.TemporaryDirectory(prefix="dlinfra-preview-") as tmp:
        before = revisions.plan_set(
            base,
            repo=repo,
            fleet=args.fleet,
            lock=lock_file(args),
            python=sys.executable,
            cache=cache_folder,
            work=Path(tmp),
            analyses=False,
        )
    lock, configs = revisions.recorded(lock_file(args), args.out / INPUTS / "stacks")
    mine = set(plans) | (set(before.plans) if args.all else set())
    before_only = PlanSet(
        label=before.label,
        plans={k: v for k, v in before.plans.items() if k in mine},
        lock=before.lock,
        topology=before.topology,
        configs={k: v for k, v in before.configs.items() if k in mine},
    )
    after = PlanSet(
        label="this preview",
        plans=plans,
        lock=lock,
        topology=topology({}),
        configs={k: v for k, v in configs.items() if k in mine},
    )
    return compare(before_only, after)


ACTIONS = ("create", "update", "replace", "delete")  # in the order pulumi preview counts them


def _counts(changes: Any, stack: str | None) -> dict[str, int]:
    counts = dict.fromkeys(ACTIONS, 0)
    for change in changes.changes:
        if stack is None or change.stack == stack:
            counts[change.action] += 1
    return counts


def _print_changes(changes: Any, plans: dict[str, dict[str, Any]], *, summary: bool) -> None:
    """Each stack as `pulumi preview` shows it against its state: what changes, or that nothing does; then the
    stacks the base has and this fleet does not, and the address-plan and stack-config changes."""
    removed = {stack: {"summary": {"resources": 0}} for stack in changes.stacks_removed}
    for stack, plan in {**plans, **removed}.items():
        mine = [c for c in changes.changes if c.stack == stack]
        resources = plan["summary"]["resources"]
        if not mine:
            note = "new stack: " if stack in changes.stacks_added else ""
            out.print(Text.assemble((f"{stack:<28}", "bold"), f" {note}no changes ({resources} resources)"))
            continue
        counts = _counts(changes, stack)
        parts: list[Any] = [(f"{stack:<28}", "bold"), " removed from the fleet:" if stack in removed else ""]
        for op, n in counts.items():
            if n:
                parts += [" ", marker(op), f" {n} to {op}"]
        unchanged = resources - counts["create"] - counts["update"] - counts["replace"]
        out.print(Text.assemble(*parts, f"; {unchanged} unchanged"))
        if summary:
            continue
        for change in mine:
            shown = [f"{key}: {value}" for key, value in change.values[:3]]
            detail = "; ".join(shown) if shown else ", ".join(change.inputs[:3])
            out.print(
                Text.assemble(
                    "    ",
                    marker(change.action),
                    f" {change.type}  {change.name}  {change.action}",
                    (f"  [{detail}]" if detail else "", "dim"),
                )
            )


def _exit(args: argparse.Namespace, changes: Any, total: int) -> int:
    """0, or with --detailed-exitcode: 2 when something changes (against an empty cloud, anything declared)."""
    if not args.detailed_exitcode:
        return 0
    if changes is None:
        return 2 if total else 0
    return 0 if changes.empty else 2


def _cache_line(plan_cache: Any) -> str:
    if plan_cache is None:
        return " (plan cache off)"
    if not plan_cache.reused:
        return ""
    reused = ", ".join(plan_cache.reused)
    return f"\n{len(plan_cache.reused)} stack(s) unchanged, reused from {plan_cache.folder}/: {reused}"


def _print_stack(result: Any, project: str, path: Path, *, summary: bool) -> None:
    """One stack the way `pulumi preview` shows it: a tree with + markers, outputs (secrets masked) and one
    resource count line; with summary, that count line alone."""
    count = len(result.resources) + 1  # and the pulumi:pulumi:Stack itself, as pulumi counts it
    line = Text.assemble(
        (f"{result.role.name:<28}", "bold"), " ", marker("create"), f" {count} to create", _when(result)
    )
    if summary:
        out.print(line)
        return
    out.print(Text.assemble("\n", ("Previewing ", "bold"), (result.role.name, "bold"), " (offline, fake cloud)"))
    children: dict[str | None, list[Any]] = {}
    for r in sorted(result.resources, key=lambda r: r.urn):
        children.setdefault(r.parent, []).append(r)
    stack_urn = next((p for p in children if p and p.endswith(f"::{project}-{result.role.name}")), None)
    out.print(Text.assemble(" ", marker("create"), f"   pulumi:pulumi:Stack  {project}-{result.role.name}  create"))

    def walk(parent: str | None, indent: str) -> None:
        kids = children.get(parent, [])
        for i, r in enumerate(kids):
            last = i == len(kids) - 1
            branch = f"{indent}{'└─ ' if last else '├─ '}"
            out.print(Text.assemble(" ", marker("create"), f"   {branch}{r.type}  {r.name}  create"))
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
    out.print(Text.assemble("Resources:\n    ", marker("create"), f" {count} to create{_when(result)} -> {path}"))


def _when(result: Any) -> str:
    return " (inputs unchanged: reused from the plan cache)" if result.cached else f" ({result.seconds:.2f}s)"


OUTPUT_WIDTH = 100  # characters of one output value shown; the plan export holds all of it
