"""`dlinfra pool roll`: the explicit, documented step that replaces a node pool's running instances.

GPU pools never refresh by themselves (components/nodepool.py): after a new AMI or user data, new nodes boot
the new launch template version, and the running ones move only when someone runs this command. It starts an
EC2 Auto Scaling instance refresh that skips nodes already on the group's version, keeps a minimum share of the
pool in service, pauses at checkpoints, and drains each node first: every instance it terminates goes through
the pool's termination lifecycle hook, which the node termination handler answers after draining the node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from dlinfra.errors import DlinfraError
from dlinfra.model import stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.pools import DRAIN_MARGIN_SECONDS, NodePool
from dlinfra.model.fleet.schema import Fleet
from dlinfra.ops import aws, stack_outputs

TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
# Terminal states of an instance refresh (DescribeInstanceRefreshes); anything else is still moving.
DONE = frozenset({"Successful", "Failed", "Cancelled", "RollbackSuccessful", "RollbackFailed"})
DEFAULT_CHECKPOINTS = (20, 100)  # pause after the first fifth: check the new nodes before the rest go
DEFAULT_CHECKPOINT_DELAY = 3600  # seconds; AWS's default, and time to run an NCCL test on the new nodes

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


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


# --- finding the group ------------------------------------------------------------------------------------


def resolve_target(
    fleet_path: Path, stack: str, *, pool: str | None, group: str | None, outputs_file: Path | None
) -> Target:
    """The group to roll: --group as given, or --pool looked up in the fleet and the stack's outputs."""
    loaded = load_fleet(fleet_path)
    fleet = loaded.fleet
    role = stackroles.parse(fleet, stack, fleet_file=str(loaded.path))
    if role.kind != "regional" or role.region is None:
        raise DlinfraError(f"{stack} is not a regional stack: pools live in <env>-<region> stacks")
    env, region = role.environment, role.region
    if group:
        return Target(stack=stack, region=region, group=group, pool=None, spec=None)
    if pool is None:
        raise DlinfraError("name the pool (--pool) or its Auto Scaling group (--group)")
    spec = _pool_spec(fleet, env, region, pool, str(loaded.path))
    outputs, source = stack_outputs.read_outputs(stack, outputs_file)
    stack_outputs.check_stack(outputs, env, region, source=source)
    groups = stack_outputs.require_output(outputs, "node_pools", source=source, stack=stack)
    if not isinstance(groups, Mapping) or not isinstance(groups.get(pool), str):
        raise DlinfraError(
            f"node_pools has no group for pool {pool!r}: run `pulumi up --stack {stack}` first",
            file=source,
            key=f"node_pools.{pool}",
        )
    return Target(stack=stack, region=region, group=groups[pool], pool=pool, spec=spec)


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


def client_for(region: str) -> Any:
    import boto3  # only when AWS is called: the rest of the CLI works without credentials

    return boto3.client("autoscaling", region_name=region)


def _call(what: str, call: Callable[[], Any]) -> dict[str, Any]:
    """One AWS call; its errors, and a reply that is no object, become one clear message."""
    return aws.call(what, call)


def describe_group(client: Any, target: Target) -> dict[str, Any]:
    reply = _call(
        "DescribeAutoScalingGroups",
        lambda: client.describe_auto_scaling_groups(AutoScalingGroupNames=[target.group]),
    )
    with aws.reading("DescribeAutoScalingGroups"):
        groups = reply.get("AutoScalingGroups", [])
        if not groups:
            raise DlinfraError(f"no Auto Scaling group {target.group!r} in {target.region}")
        group: dict[str, Any] = dict(groups[0])
    return group


def check_drains(client: Any, target: Target) -> int:
    """Refuse to roll a group whose terminations would not wait for a drain: no termination lifecycle hook, or one
    that gives up before the pool's checkpoint grace and the drain margin. Returns the hook's timeout (seconds)."""
    reply = _call("DescribeLifecycleHooks", lambda: client.describe_lifecycle_hooks(AutoScalingGroupName=target.group))
    with aws.reading("DescribeLifecycleHooks"):
        hooks = [h for h in reply.get("LifecycleHooks", []) if h.get("LifecycleTransition") == TERMINATING]
    if not hooks:
        raise DlinfraError(
            f"{target.group} has no {TERMINATING} lifecycle hook: its nodes would be terminated without "
            "draining. Apply the stack (NodePool declares the hook) before rolling"
        )
    with aws.reading("DescribeLifecycleHooks"):
        timeout = min(int(h.get("HeartbeatTimeout", 3600)) for h in hooks)  # AWS's default is 3600
    if target.spec is not None and timeout < target.spec.checkpoint_grace + DRAIN_MARGIN_SECONDS:
        raise DlinfraError(
            f"{target.group}'s termination hook holds a node {timeout}s, less than the pool's checkpoint_grace "
            f"{target.spec.checkpoint_grace}s plus the {DRAIN_MARGIN_SECONDS}s drain margin: nodes would go before "
            "their jobs checkpoint. Apply the stack (the hook follows the fleet) before rolling"
        )
    return timeout


def drain_terms(target: Target, hook_timeout: int, options: RollOptions) -> list[str]:
    """What each replaced node's pods get, for the plan printed before anything drains.

    Each node an instance refresh replaces is terminated through the group's termination hook: the refresh waits
    while it is in Terminating:Wait, so the drain (the termination handler's, each pod with its own grace) ends
    the wait, or the hook's timeout does (EC2 Auto Scaling user guide, "Amazon EC2 Auto Scaling lifecycle hooks"
    and "Instance refresh": lifecycle hooks are honoured). The refresh's own settings bound no drain: the
    checkpoint delay is a pause after a checkpoint's share is replaced, and the instance warmup counts from a new
    node's InService (StartInstanceRefresh, RefreshPreferences).
    """
    lines = []
    if target.spec is not None:
        lines.append(
            f"Each node's pods get SIGTERM and their own terminationGracePeriodSeconds, which admission caps at the "
            f"pool's checkpoint_grace of {target.spec.checkpoint_grace}s; the termination hook holds each node "
            f"{hook_timeout}s (grace + {DRAIN_MARGIN_SECONDS}s margin) while it drains."
        )
    else:
        lines.append(
            f"Each node's pods get SIGTERM and their own terminationGracePeriodSeconds; the termination hook holds "
            f"each node {hook_timeout}s, so a pod gets at most {max(hook_timeout - DRAIN_MARGIN_SECONDS, 0)}s."
        )
    delay = f"the {options.checkpoint_delay}s checkpoint pauses" if options.checkpoints else "the refresh"
    lines.append(
        f"The refresh waits for each drain: {delay} and the instance warmup come between nodes, never inside a drain."
    )
    return lines


def group_version(group: Mapping[str, Any]) -> str | None:
    spec = group.get("LaunchTemplate") or (group.get("MixedInstancesPolicy") or {}).get("LaunchTemplate", {}).get(
        "LaunchTemplateSpecification"
    )
    version = (spec or {}).get("Version")
    return str(version) if version else None


def outdated_instances(group: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """Instances not on the group's launch template version; None when that cannot be told ($Latest, $Default)."""
    version = group_version(group)
    if version is None or version.startswith("$"):
        return None
    return [
        dict(i) for i in group.get("Instances", []) if str((i.get("LaunchTemplate") or {}).get("Version")) != version
    ]


def start_refresh(client: Any, target: Target, options: RollOptions) -> str:
    from botocore.exceptions import ClientError

    def start() -> Any:
        try:
            return client.start_instance_refresh(
                AutoScalingGroupName=target.group, Strategy="Rolling", Preferences=options.preferences()
            )
        except ClientError as exc:
            if aws.describe(exc).startswith("InstanceRefreshInProgress:"):
                raise DlinfraError(
                    f"{target.group} is already being refreshed: watch it with `--status --wait`, or cancel it with "
                    f"`aws autoscaling cancel-instance-refresh --auto-scaling-group-name {target.group}`"
                ) from None
            raise

    reply = _call("StartInstanceRefresh", start)
    with aws.reading("StartInstanceRefresh"):
        return str(reply["InstanceRefreshId"])


def refreshes(client: Any, group: str, refresh_id: str | None = None) -> list[dict[str, Any]]:
    """The group's instance refreshes, newest first (or only the one asked for)."""
    kwargs: dict[str, Any] = {"AutoScalingGroupName": group}
    if refresh_id:
        kwargs["InstanceRefreshIds"] = [refresh_id]
    reply = _call("DescribeInstanceRefreshes", lambda: client.describe_instance_refreshes(**kwargs))
    with aws.reading("DescribeInstanceRefreshes"):
        found = [dict(r) for r in reply.get("InstanceRefreshes", [])]
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
