"""The `check` and `diff` subcommands, registered into dlinfra's CLI by `register`.

Bad input raises DlinfraError (the CLI prints it and exits 2); `check` exits 1 when a mandatory rule or a
checkov check that is not skipped fails; `diff` exits 0 whatever the diff holds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from dlinfra import PROJECT_ROOT as ROOT
from dlinfra.cli.common import Handler, lock_file, side, status, working
from dlinfra.errors import DlinfraError
from dlinfra.model import stackroles
from dlinfra.model.fleet.load import load_fleet

DEFAULT_SKIPS = Path("checkov-skips.yaml")


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> dict[str, Handler]:
    """Add `check` and `diff` to the CLI's subparsers; returns their handlers by command name."""
    check = subparsers.add_parser(
        "check",
        parents=[common],
        help="CrossGuard rules, checkov, reachability and quotas over the offline plans (before apply)",
    )
    which = check.add_mutually_exclusive_group(required=True)
    which.add_argument("--stack", action="append", help="stack to check (repeatable)")
    which.add_argument("--all", action="store_true", help="every stack of the fleet (each must have a plan)")
    check.add_argument("--plans", type=Path, default=Path("build/plans"), help="plan folder (default: build/plans)")
    check.add_argument("--json", action="store_true", help="print the findings as JSON instead of tables")
    check.add_argument("--sarif", type=Path, metavar="FILE", help="also write SARIF 2.1.0 (for code scanning)")
    check.add_argument(
        "--skips",
        type=Path,
        default=None,
        help="checkov skips with reasons (default: checkov-skips.yaml beside the fleet, else dlinfra's own)",
    )
    check.add_argument(
        "--manifests",
        type=Path,
        default=None,
        help="rendered Kubernetes manifests (default: manifests/ beside --plans)",
    )
    check.add_argument("--no-checkov", action="store_true", help="run the CrossGuard rules only (says so)")
    check.add_argument(
        "--no-cache",
        action="store_true",
        help="run checkov and the reachability proof on every plan again, instead of reusing the findings of plans "
        "that are unchanged (build/cache/ beside --plans, or DLINFRA_CACHE)",
    )
    check.add_argument(
        "--allow-stale",
        action="store_true",
        help="check plans even if the fleet, lock, images manifest or code changed since they were made (says so)",
    )
    check.add_argument(
        "--flows",
        type=Path,
        default=None,
        help="your own flows for the reachability check (default: flows.yaml beside the fleet)",
    )

    reach = subparsers.add_parser(
        "reach",
        parents=[common],
        help="prove every flow the fleet implies over the offline plans, hop by hop (also part of check --all)",
        description="Example: dlinfra preview --all && dlinfra reach --verbose (or --explain for every path)",
    )
    reach.add_argument("--plans", type=Path, default=Path("build/plans"), help="plan folder (default: build/plans)")
    reach.add_argument("--flows", type=Path, default=None, help="your own flows (default: flows.yaml beside the fleet)")
    reach.add_argument("--json", action="store_true", help="print the result as JSON")
    reach.add_argument("--verbose", action="store_true", help="show every hop of each failing flow")
    reach.add_argument(
        "--explain",
        action="store_true",
        help="also show the path of every allowed flow: a packet of each path and the hops it takes",
    )
    reach.add_argument("--allow-stale", action="store_true", help="use plans even if their inputs changed since")
    reach.add_argument(
        "--no-cache", action="store_true", help="prove every flow again, even when the network and flows are unchanged"
    )

    diff = subparsers.add_parser(
        "diff",
        parents=[common],
        help="offline plans of two revisions (or saved plan folders) compared, as markdown for a PR",
        description="BASE and HEAD are each a git revision or a plan folder (a copy of build/plans made by "
        "`dlinfra preview`, which keeps the fleet, lock and stack configs beside the plans): a fleet outside git "
        "compares with a saved plan folder. Unchanged stacks are reused from the plan cache, and a revision's "
        "plans are kept by commit, so a base is previewed once.",
    )
    diff.add_argument(
        "base", nargs="?", type=side, help="base: a revision or a plan folder (default: the default branch)"
    )
    diff.add_argument(
        "head", nargs="?", type=side, help="head: a revision or a plan folder (default: the working tree)"
    )
    diff.add_argument("--base", dest="base_option", type=side, metavar="BASE", help="the same as the first positional")
    diff.add_argument("--head", dest="head_option", type=side, metavar="HEAD", help="the same as the second positional")
    diff.add_argument("--out", type=Path, help="write the markdown (or JSON) to FILE instead of printing it")
    diff.add_argument("--json", action="store_true", help="the diff as JSON for tools (schema: docs/diff-json.md)")
    diff.add_argument(
        "--touched",
        action="store_true",
        help="print the head stacks a real preview should cover (changed plan or stack config) as JSON "
        "(dlinfra.touched/v1: stacks, each with where it runs, runs_on, and whether pull requests may preview it "
        "for real, preview: real|offline)",
    )
    diff.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help="exit 0 when nothing changes, 2 when something does, 1 on an error (as terraform plan does)",
    )
    diff.add_argument(
        "--no-cache", action="store_true", help="preview every stack of both sides again, keeping nothing"
    )
    return {"check": cmd_check, "diff": cmd_diff, "reach": cmd_reach}


def refuse_stale_plans(args: argparse.Namespace, selected: list[Any]) -> str:
    """PlanError when a plan's inputs changed since it was made; with --allow-stale, a note saying so instead."""
    from dlinfra.checks import plans

    try:
        plans.refuse_stale(selected, root=ROOT, fleet=args.fleet, lock=lock_file(args))
    except plans.PlanError as exc:
        if not args.allow_stale:
            raise
        return f"--allow-stale: {exc}"
    return ""


def cmd_check(args: argparse.Namespace) -> int:
    """`dlinfra check`: exit 0 clean, 1 on blocking findings (bad input raises DlinfraError)."""
    from dlinfra.checks import checkov, plans, report, runner, skips
    from policy.dlinfra_policy import context

    loaded = load_fleet(args.fleet)
    all_stacks = [r.name for r in stackroles.roles(loaded.fleet)]
    if args.stack:
        for stack in args.stack:
            stackroles.parse(loaded.fleet, stack, fleet_file=str(loaded.path))
    selected, ignored = plans.load_plans(args.plans, args.stack, [] if args.stack else all_stacks)
    stale_note = refuse_stale_plans(args, selected)
    options = runner.CheckOptions(
        root=ROOT,
        plans=selected,
        context=context.build_context(args.fleet, lock_file(args)),
        skips=skips.load_skips(args.skips or _default_skips(args), missing_ok=args.skips is None),
        manifests=args.manifests if args.manifests is not None else args.plans.parent / "manifests",
        export_dir=args.plans.parent / "checkov",
        checkov=None if args.no_checkov else checkov.executable(ROOT),
        cache=_cache_folder(args),
    )
    status = Console(stderr=True)
    spinner = (
        status.status("CrossGuard rules" + ("" if options.checkov is None else " and checkov") + " running")
        if status.is_terminal
        else contextlib.nullcontext()
    )
    with spinner:
        run = runner.run_checks(options)
    if stale_note:
        run.notes.append(stale_note)
    from dlinfra.checks.limits import check as limits
    from dlinfra.checks.limits.scope import Config

    counted = limits.analyse([p.data for p in selected], Config.of(loaded.fleet))
    run.limits = limits.summary_json(counted)
    run.findings.extend(runner.limit_findings(counted, runner.SourceIndex(ROOT)))
    run.notes.extend(counted.notes)
    if args.stack:
        run.notes.append(
            "quotas per region and per transit gateway count only the selected stacks: check --all counts them all"
        )
    if args.stack:
        run.notes.append(
            "reachability not checked: it needs every stack's plan (dlinfra check --all, or dlinfra reach)"
        )
    else:
        from dlinfra.checks.reach import check as reach

        with working("proving reachability over every plan"):
            run.reach = reach.summary(
                args.fleet, lock_file(args), [p.data for p in selected], args.flows, cache=_cache_folder(args)
            )
        run.findings.extend(runner.reach_findings(run.reach))
    if ignored:
        run.notes.append(f"ignored plans of stacks the fleet no longer has: {', '.join(ignored)}")
    if args.sarif:
        args.sarif.parent.mkdir(parents=True, exist_ok=True)
        args.sarif.write_text(json.dumps(report.to_sarif(run), indent=2) + "\n", encoding="utf-8")
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(run), indent=2) + "\n")
    else:
        report.print_summary(run, Console(highlight=False, soft_wrap=True))
    return run.exit_code


def cmd_diff(args: argparse.Namespace) -> int:
    """`dlinfra diff`: markdown of what the head changes against the base; with --detailed-exitcode, 0 when nothing
    changes and 2 when something does."""
    from dlinfra.review.diff import compare, render, revisions

    base = _one(args.base, args.base_option, "base")
    head = _one(args.head, args.head_option, "head")
    if base is None:
        repo = revisions.repository(args.fleet.resolve().parent)
        base = revisions.default_branch(repo) if repo is not None else None
        if base is None:
            raise DlinfraError(
                "no base named and no default branch to compare with; name one: a revision, or a plan folder "
                "(a copy of build/plans made by `dlinfra preview`)",
                file=str(args.fleet),
            )
    with status("diff") as say:
        result = revisions.diff_sides(
            base,
            head,
            fleet=args.fleet,
            lock=lock_file(args),
            python=sys.executable,
            cache=_cache_folder(args),
            say=say,
        )
    changed = 2 if args.detailed_exitcode and not result.empty else 0
    if args.touched:
        fleet = load_fleet(args.fleet).fleet  # the head revision's (the working tree is the head in CI)
        touched = {"schema": "dlinfra.touched/v1", "stacks": compare.touched(result, fleet)}
        sys.stdout.write(json.dumps(touched) + "\n")
        return changed
    markdown = json.dumps(render.to_json(result), indent=2) + "\n" if args.json else render.render_markdown(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(markdown, encoding="utf-8")
        Console(stderr=True).print(f"wrote {args.out}")
    else:
        sys.stdout.write(markdown)
    return changed


def _default_skips(args: argparse.Namespace) -> Path:
    """The skips beside the fleet when it has its own, else dlinfra's: its deliberate checkov decisions are about
    what its components declare, which a fleet kept in another folder previews all the same."""
    beside = Path(args.fleet).parent / DEFAULT_SKIPS
    return beside if beside.is_file() else ROOT / DEFAULT_SKIPS


def _one(positional: str | None, option: str | None, name: str) -> str | None:
    if positional is not None and option is not None and positional != option:
        raise DlinfraError(f"the {name} is given twice, as {positional!r} and as --{name} {option!r}: give it once")
    return positional if positional is not None else option


def _cache_folder(args: argparse.Namespace) -> Path | None:
    """Where answers of unchanged inputs are kept (build/cache beside the plans, or DLINFRA_CACHE); None: off."""
    from dlinfra.offline import cache

    plans = getattr(args, "plans", None) or Path(args.fleet).parent / "build" / "plans"
    return None if getattr(args, "no_cache", False) else cache.folder(plans.parent / "cache")


def cmd_reach(args: argparse.Namespace) -> int:
    """`dlinfra reach`: exit 0 when every intent holds, 1 when one does not (bad input raises DlinfraError)."""
    from dlinfra.checks import plans, report
    from dlinfra.checks.reach import check as reach

    loaded = load_fleet(args.fleet)
    all_stacks = [r.name for r in stackroles.roles(loaded.fleet)]
    selected, _ignored = plans.load_plans(args.plans, None, all_stacks)
    stale_note = refuse_stale_plans(args, selected)
    if stale_note:
        Console(stderr=True).print(f"note: {stale_note}", markup=False)
    plan_data = [p.data for p in selected]
    with working("proving reachability over every plan"):
        summary = reach.summary(
            args.fleet, lock_file(args), plan_data, args.flows, explain=args.explain, cache=_cache_folder(args)
        )
    if args.json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        console = Console(highlight=False, soft_wrap=True)
        report.print_reach(summary, console, verbose=args.verbose, explain=args.explain)
    return 1 if summary["failed_flows"] or summary["refused"] else 0
