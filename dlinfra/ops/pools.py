"""`dlinfra pool roll`: the explicit, documented step that replaces a node pool's running instances.

GPU pools never refresh by themselves (components/nodepool.py): after a new AMI or user data, new nodes boot
the new launch template version, and the running ones move only when someone runs this command. It starts an
EC2 Auto Scaling instance refresh that skips nodes already on the group's version, keeps a minimum share of the
pool in service, pauses at checkpoints, and drains each node first: every instance it terminates goes through
the pool's termination lifecycle hook, which the node termination handler answers after draining the node.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from dlinfra.errors import DlinfraError
from dlinfra.model import stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet, NodePool
from dlinfra.ops import stack_outputs

TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
# Terminal states of an instance refresh (DescribeInstanceRefreshes); anything else is still moving.
DONE = frozenset({"Successful", "Failed", "Cancelled", "RollbackSuccessful", "RollbackFailed"})
DEFAULT_CHECKPOINTS = (20, 100)  # pause after the first fifth: check the new nodes before the rest go
DEFAULT_CHECKPOINT_DELAY = 3600  # seconds; AWS's default, and time to run an NCCL test on the new nodes

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

Handler = Callable[[argparse.Namespace], int]


@dataclass(frozen=True, kw_only=True)
class RollOptions:
    """How a roll replaces nodes (StartInstanceRefresh preferences)."""

    min_healthy: int = 90  # percent of the desired capacity kept in service; 100 replaces one node at a time
    checkpoints: tuple[int, ...] = DEFAULT_CHECKPOINTS  # percent replaced at each pause, ascending, last 100
    checkpoint_delay: int = DEFAULT_CHECKPOINT_DELAY  # seconds paused at each checkpoint

    def __post_init__(self) -> None:
        if not 0 <= self.min_healthy <= 100:
            raise DlinfraError(f"--min-healthy: {self.min_healthy} is not a percentage from 0 to 100")
        if self.checkpoints:
            if list(self.checkpoints) != sorted(set(self.checkpoints)) or self.checkpoints[0] <= 0:
                raise DlinfraError(f"--checkpoints: {self.checkpoints} must be unique, ascending percentages")
            if self.checkpoints[-1] != 100:
                raise DlinfraError("--checkpoints: the last one must be 100, or the roll stops part-way")
        if not 0 <= self.checkpoint_delay <= 172800:
            raise DlinfraError(f"--checkpoint-delay: {self.checkpoint_delay} is not 0 to 172800 seconds")

    def preferences(self) -> dict[str, Any]:
        """The RefreshPreferences of the refresh."""
        prefs: dict[str, Any] = {
            "MinHealthyPercentage": self.min_healthy,
            # Nodes already on the group's launch template version stay: only outdated ones drain.
            "SkipMatching": True,
            # A node an operator protected from scale-in or put on standby is a deliberate hold: leave it (the
            # SDK default, Wait, fails the whole refresh after an hour instead).
            "ScaleInProtectedInstances": "Ignore",
            "StandbyInstances": "Ignore",
        }
        if self.checkpoints:
            prefs["CheckpointPercentages"] = list(self.checkpoints)
            prefs["CheckpointDelay"] = self.checkpoint_delay
        return prefs


@dataclass(frozen=True, kw_only=True)
class Target:
    """The Auto Scaling group to roll, and what the fleet says about it."""

    stack: str
    region: str
    group: str
    pool: str | None  # None when named by --group only
    spec: NodePool | None


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
    target = resolve_target(args)
    client = _client(target.region)
    if args.status:
        return show_status(client, target, args.refresh_id, wait=args.wait, interval=args.interval)
    group = describe_group(client, target)
    check_drains(client, target)
    outdated = outdated_instances(group)
    _print_plan(target, group, outdated, options)
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


# --- finding the group ------------------------------------------------------------------------------------


def resolve_target(args: argparse.Namespace) -> Target:
    """The group to roll: --group as given, or --pool looked up in the fleet and the stack's outputs."""
    loaded = load_fleet(args.fleet)
    fleet = loaded.fleet
    role = stackroles.parse(fleet, args.stack, fleet_file=str(loaded.path))
    if role.kind != "regional" or role.region is None:
        raise DlinfraError(f"{args.stack} is not a regional stack: pools live in <env>-<region> stacks")
    env, region = role.environment, role.region
    if args.group:
        return Target(stack=args.stack, region=region, group=args.group, pool=None, spec=None)
    spec = _pool_spec(fleet, env, region, args.pool, str(loaded.path))
    outputs, source = stack_outputs.read_outputs(args.stack, args.outputs)
    stack_outputs.check_stack(outputs, env, region, source=source)
    groups = stack_outputs.require_output(outputs, "node_pools", source=source, stack=args.stack)
    if not isinstance(groups, Mapping) or not isinstance(groups.get(args.pool), str):
        raise DlinfraError(
            f"node_pools has no group for pool {args.pool!r}: run `pulumi up --stack {args.stack}` first",
            file=source,
            key=f"node_pools.{args.pool}",
        )
    return Target(stack=args.stack, region=region, group=groups[args.pool], pool=args.pool, spec=spec)


def _pool_spec(fleet: Fleet, env: str, region: str, pool: str, fleet_file: str) -> NodePool:
    pools = fleet.pools_in(env, region)
    if pool not in pools:
        raise DlinfraError(
            f"no pool {pool!r} runs in {env}-{region} (pools there: {', '.join(pools) or 'none'})",
            file=fleet_file,
            key=f"environments.{env}.node_pools.{pool}",
        )
    return pools[pool]


# --- AWS ---------------------------------------------------------------------------------------------------


def _client(region: str) -> Any:
    import boto3  # only when AWS is called: the rest of the CLI works without credentials

    return boto3.client("autoscaling", region_name=region)


def _call(what: str, call: Callable[[], Any]) -> Any:
    """One AWS call; its errors become one clear message."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call()
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise DlinfraError(f"{what}: {error.get('Code', 'error')}: {error.get('Message', exc)}") from None
    except BotoCoreError as exc:
        raise DlinfraError(f"{what}: {exc}") from None


def describe_group(client: Any, target: Target) -> dict[str, Any]:
    reply = _call(
        "DescribeAutoScalingGroups",
        lambda: client.describe_auto_scaling_groups(AutoScalingGroupNames=[target.group]),
    )
    groups = reply.get("AutoScalingGroups", [])
    if not groups:
        raise DlinfraError(f"no Auto Scaling group {target.group!r} in {target.region}")
    group: dict[str, Any] = groups[0]
    return group


def check_drains(client: Any, target: Target) -> None:
    """Refuse to roll a group whose terminations would not wait for a drain (no termination lifecycle hook)."""
    reply = _call("DescribeLifecycleHooks", lambda: client.describe_lifecycle_hooks(AutoScalingGroupName=target.group))
    if not any(h.get("LifecycleTransition") == TERMINATING for h in reply.get("LifecycleHooks", [])):
        raise DlinfraError(
            f"{target.group} has no {TERMINATING} lifecycle hook: its nodes would be terminated without "
            "draining. Apply the stack (NodePool declares the hook) before rolling"
        )


def _group_version(group: Mapping[str, Any]) -> str | None:
    spec = group.get("LaunchTemplate") or (group.get("MixedInstancesPolicy") or {}).get("LaunchTemplate", {}).get(
        "LaunchTemplateSpecification"
    )
    version = (spec or {}).get("Version")
    return str(version) if version else None


def outdated_instances(group: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """Instances not on the group's launch template version; None when that cannot be told ($Latest, $Default)."""
    version = _group_version(group)
    if version is None or version.startswith("$"):
        return None
    return [
        dict(i) for i in group.get("Instances", []) if str((i.get("LaunchTemplate") or {}).get("Version")) != version
    ]


def start_refresh(client: Any, target: Target, options: RollOptions) -> str:
    from botocore.exceptions import ClientError

    try:
        reply = client.start_instance_refresh(
            AutoScalingGroupName=target.group, Strategy="Rolling", Preferences=options.preferences()
        )
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") == "InstanceRefreshInProgress":
            raise DlinfraError(
                f"{target.group} is already being refreshed: watch it with `--status --wait`, or cancel it with "
                f"`aws autoscaling cancel-instance-refresh --auto-scaling-group-name {target.group}`"
            ) from None
        raise DlinfraError(f"StartInstanceRefresh: {error.get('Code', 'error')}: {error.get('Message', exc)}") from None
    return str(reply["InstanceRefreshId"])


def refreshes(client: Any, group: str, refresh_id: str | None = None) -> list[dict[str, Any]]:
    """The group's instance refreshes, newest first (or only the one asked for)."""
    kwargs: dict[str, Any] = {"AutoScalingGroupName": group}
    if refresh_id:
        kwargs["InstanceRefreshIds"] = [refresh_id]
    reply = _call("DescribeInstanceRefreshes", lambda: client.describe_instance_refreshes(**kwargs))
    found: list[dict[str, Any]] = reply.get("InstanceRefreshes", [])
    return found


def follow(client: Any, target: Target, refresh_id: str, interval: float) -> str:
    """Poll one refresh until it ends, printing each change; returns its final status."""
    last: tuple[Any, ...] | None = None
    try:
        while True:
            found = refreshes(client, target.group, refresh_id)
            if not found:
                raise DlinfraError(f"no instance refresh {refresh_id} on {target.group}")
            refresh = found[0]
            state = (refresh.get("Status"), refresh.get("PercentageComplete"), refresh.get("InstancesToUpdate"))
            if state != last:
                out.print(_describe(refresh), markup=False)
                last = state
            if refresh.get("Status") in DONE:
                return str(refresh.get("Status"))
            time.sleep(interval)
    except KeyboardInterrupt:
        err.print(f"stopped watching; refresh {refresh_id} goes on (watch again with --status --wait)")
        raise SystemExit(130) from None


def show_status(client: Any, target: Target, refresh_id: str | None, *, wait: bool, interval: float) -> int:
    found = refreshes(client, target.group, refresh_id)
    if not found:
        out.print(f"{target.group}: no instance refreshes", markup=False)
        return 0
    for refresh in found[: 1 if refresh_id else 5]:
        out.print(_describe(refresh), markup=False)
    latest = found[0]
    if wait and latest.get("Status") not in DONE:
        return 0 if follow(client, target, str(latest["InstanceRefreshId"]), interval) == "Successful" else 1
    return 0 if latest.get("Status") not in {"Failed", "Cancelled", "RollbackFailed"} else 1


def _describe(refresh: Mapping[str, Any]) -> str:
    parts = [
        f"{refresh.get('InstanceRefreshId')}: {refresh.get('Status')}",
        f"{refresh.get('PercentageComplete', 0)}% done",
        f"{refresh.get('InstancesToUpdate', '?')} to update",
    ]
    if refresh.get("StatusReason"):
        parts.append(str(refresh["StatusReason"]))
    return ", ".join(parts)


# --- what the operator sees before anything drains ---------------------------------------------------------


def _print_plan(
    target: Target, group: Mapping[str, Any], outdated: Sequence[Mapping[str, Any]] | None, options: RollOptions
) -> None:
    name = f"pool {target.pool} ({target.group})" if target.pool else target.group
    instances = group.get("Instances", [])
    out.print(f"Rolling {name} in {target.region}: {len(instances)} node(s), desired {group.get('DesiredCapacity')}")
    version = _group_version(group)
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
