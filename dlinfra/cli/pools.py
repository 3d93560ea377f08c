"""`dlinfra pool roll`: its options, and what the operator sees before anything drains (dlinfra.ops.pools rolls)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlinfra.cli.common import Handler, out, working
from dlinfra.ops import aws
from dlinfra.ops.pools import (
    DEFAULT_CHECKPOINT_DELAY,
    DEFAULT_CHECKPOINTS,
    RollOptions,
    Target,
    check_drains,
    client_for,
    describe_group,
    drain_terms,
    follow,
    group_version,
    outdated_instances,
    resolve_target,
    show_status,
    start_refresh,
)


def register(subparsers: Any, common: argparse.ArgumentParser) -> dict[str, Handler]:
    """Add `pool roll` to the CLI; returns command name -> handler."""
    pool = subparsers.add_parser("pool", help="operate node pools (roll them onto a new AMI or user data)")
    pool_sub = pool.add_subparsers(dest="pool_command", required=True, metavar="{roll}")
    roll = pool_sub.add_parser(
        "roll",
        parents=[common],
        help="replace a pool's running nodes with its current launch template version, draining each first",
    )
    roll.add_argument("--stack", required=True, help="regional stack <env>-<region> the pool belongs to")
    which = roll.add_mutually_exclusive_group(required=True)
    which.add_argument("--pool", help="pool name from the fleet; its group comes from the stack outputs")
    which.add_argument("--group", help="Auto Scaling group name, instead of --pool")
    roll.add_argument(
        "--outputs",
        type=Path,
        metavar="FILE",
        help="JSON of `pulumi stack output --json --stack <stack>` (default: run that command)",
    )
    roll.add_argument("--min-healthy", type=int, default=90, help="percent kept in service (default: 90)")
    roll.add_argument(
        "--checkpoints",
        type=_percentages,
        default=DEFAULT_CHECKPOINTS,
        help="pause after these percentages, last one 100 (default: 20,100); 'none' for no pause",
    )
    roll.add_argument(
        "--checkpoint-delay",
        type=int,
        default=DEFAULT_CHECKPOINT_DELAY,
        help=f"seconds paused at each checkpoint (default: {DEFAULT_CHECKPOINT_DELAY})",
    )
    roll.add_argument("--dry-run", action="store_true", help="show which nodes would drain; start nothing")
    roll.add_argument("--status", action="store_true", help="show the group's instance refreshes; start nothing")
    roll.add_argument("--refresh-id", help="with --status: only this refresh")
    roll.add_argument(
        "--wait", action="store_true", help="follow the refresh until it ends (exit 1 unless it succeeds)"
    )
    roll.add_argument("--interval", type=float, default=30.0, help="seconds between polls with --wait (default: 30)")
    return {"pool": cmd_pool}


def _percentages(text: str) -> tuple[int, ...]:
    if text.strip().lower() == "none":
        return ()
    try:
        return tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--checkpoints: {text!r} is not a comma-separated list of integers") from None


def cmd_pool(args: argparse.Namespace) -> int:
    return {"roll": cmd_roll}[args.pool_command](args)


def cmd_roll(args: argparse.Namespace) -> int:
    options = RollOptions(
        min_healthy=args.min_healthy, checkpoints=args.checkpoints, checkpoint_delay=args.checkpoint_delay
    )
    target = resolve_target(args.fleet, args.stack, pool=args.pool, group=args.group, outputs_file=args.outputs)
    # Whatever shape a reply takes, the operator gets one line naming it, never a traceback.
    with aws.reading(f"EC2 Auto Scaling ({target.group} in {target.region})"):
        return _roll(args, target, options)


def _roll(args: argparse.Namespace, target: Target, options: RollOptions) -> int:
    client = client_for(target.region)
    if args.status:
        return show_status(client, target, args.refresh_id, wait=args.wait, interval=args.interval)
    with working(f"reading {target.group} and its termination hook"):
        group = describe_group(client, target)
        hook_timeout = check_drains(client, target)
    outdated = outdated_instances(group)
    _print_plan(target, group, outdated, options)
    for line in drain_terms(target, hook_timeout, options):
        out.print(line, markup=False)
    if outdated == []:
        out.print("Every node already runs the group's launch template version: nothing to roll.")
        return 0
    if args.dry_run:
        out.print("Dry run: no refresh started.")
        return 0
    refresh_id = start_refresh(client, target, options)
    out.print(f"Started instance refresh {refresh_id} on {target.group}.", markup=False)
    out.print(
        f"Watch it: python -m dlinfra pool roll --stack {target.stack} --group {target.group} --status --wait",
        markup=False,
    )
    if args.wait:
        return 0 if follow(client, target, refresh_id, args.interval) == "Successful" else 1
    return 0


# --- what the operator sees before anything drains ---------------------------------------------------------


def _print_plan(
    target: Target, group: Mapping[str, Any], outdated: Sequence[Mapping[str, Any]] | None, options: RollOptions
) -> None:
    name = f"pool {target.pool} ({target.group})" if target.pool else target.group
    instances = group.get("Instances", [])
    out.print(f"Rolling {name} in {target.region}: {len(instances)} node(s), desired {group.get('DesiredCapacity')}")
    version = group_version(group)
    if outdated is None:
        out.print(f"The group uses launch template version {version}: every node may be replaced.", markup=False)
    else:
        out.print(f"{len(outdated)} node(s) are not on launch template version {version} and will drain:")
        for instance in outdated:
            lt_version = (instance.get("LaunchTemplate") or {}).get("Version", "?")
            out.print(
                f"  {instance.get('InstanceId')}  {instance.get('AvailabilityZone')}  version {lt_version}",
                markup=False,
            )
    pauses = (
        f"pauses of {options.checkpoint_delay}s after {', '.join(f'{p}%' for p in options.checkpoints)} replaced"
        if options.checkpoints
        else "no pauses"
    )
    out.print(
        f"At least {options.min_healthy}% stays in service; {pauses}. Each node is cordoned and drained "
        "(termination lifecycle hook) before it goes; running jobs get their termination grace period to checkpoint.",
        markup=False,
    )
    if target.spec is not None and target.spec.capacity_reservations.get(target.region) is not None:
        out.print(
            "This pool runs in a capacity reservation or capacity block: each node terminates before its "
            "replacement launches into the capacity it freed, and a capacity block ends at its end time whatever "
            "the roll does.",
            markup=False,
        )
