"""Rules for node pools on EC2 Capacity Blocks: a keeper sizes the group from the block's window and drains it before
EC2's cut, invoked every minute and by the block's own events (components/capacity_block.py).

`block_window` reads a keeper's window from its function's environment; the cost report and the service limits read
it too, so each sees a block pool at the size it reaches inside its window rather than the declared 0.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dlinfra.model.fleet.checks import BLOCK_CUT

from .core import Context, Resource, Violation, as_int, as_object, termination_hooks

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
AUTOSCALING_GROUP = "aws:autoscaling/group:Group"
FUNCTION = "aws:lambda/function:Function"
EVENT_RULE = "aws:cloudwatch/eventRule:EventRule"
EVENT_TARGET = "aws:cloudwatch/eventTarget:EventTarget"
# EC2 terminates a block's instances 30 minutes before its end (dlinfra.model.fleet.checks BLOCK_CUT); Auto
# Scaling's guide: scale the group to zero before that, leaving the lifecycle hooks time to finish ("Use Capacity
# Blocks for machine learning workloads", operational guidelines).
CUT = BLOCK_CUT
WARNING = "Capacity Block Expiration Warning"  # "Monitor Capacity Blocks using EventBridge"
# The keeper's schedule must tick at least this often: the drain time is brought forward by one minute for it.
TICK = datetime.timedelta(minutes=1)
_RATE = re.compile(r"^rate\((\d+) (minute|minutes|hour|hours)\)$")


@dataclass(frozen=True)
class BlockWindow:
    """What a keeper's environment says (components/lambdas/capacity_block_window.py Window, plus ENDS_AT)."""

    group: str
    reservation: str
    opens_at: datetime.datetime
    drains_at: datetime.datetime
    ends_at: datetime.datetime
    max_size: int

    @property
    def hours(self) -> float:
        return (self.ends_at - self.opens_at).total_seconds() / 3600


def _time(value: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None


def block_window(function_inputs: Mapping[str, Any]) -> BlockWindow | None:
    """The window a Lambda function keeps, from its inputs (None: not a Capacity Block keeper)."""
    env = as_object(as_object(function_inputs.get("environment")).get("variables"))
    opens, drains, ends = (_time(env.get(k)) for k in ("OPENS_AT", "DRAINS_AT", "ENDS_AT"))
    size = as_int(env.get("MAX_SIZE"))
    if not env.get("GROUP_NAME") or opens is None or drains is None or ends is None or size is None:
        return None
    return BlockWindow(str(env["GROUP_NAME"]), str(env.get("CAPACITY_RESERVATION_ID", "")), opens, drains, ends, size)


def _block_of(template: Resource) -> str | None:
    inputs = template.inputs
    if as_object(inputs.get("instanceMarketOptions")).get("marketType") != "capacity-block":
        return None
    target = as_object(as_object(inputs.get("capacityReservationSpecification")).get("capacityReservationTarget"))
    return str(target.get("capacityReservationId") or "") or None


def _groups_of(template: Resource, groups: Sequence[Resource]) -> list[Resource]:
    return [
        g
        for g in groups
        if template.urn in g.dependencies
        or (template.id and as_object(g.inputs.get("launchTemplate")).get("id") == template.id)
    ]


def _hook_hold(group: Resource, resources: Sequence[Resource]) -> datetime.timedelta:
    """The longest a terminating instance of the group may be held by its termination hooks."""
    held = [
        3600 if (t := as_int(h.get("heartbeatTimeout"))) is None else t  # AWS's default heartbeat is one hour
        for h in termination_hooks(group, resources)
    ]
    return datetime.timedelta(seconds=max(held, default=0))


def _pattern(rule: Resource) -> Mapping[str, Any]:
    try:
        pattern = json.loads(str(rule.inputs.get("eventPattern") or "{}"))
    except ValueError:
        return {}
    return pattern if isinstance(pattern, Mapping) else {}


def _period(rule: Resource) -> datetime.timedelta | None:
    match = _RATE.match(str(rule.inputs.get("scheduleExpression") or ""))
    if match is None:
        return None
    count = int(match.group(1))
    return datetime.timedelta(minutes=count) if match.group(2).startswith("minute") else datetime.timedelta(hours=count)


def _invokers(function: Resource, resources: Sequence[Resource]) -> list[Resource]:
    """The EventBridge rules with a target that is this function."""
    arn = function.inputs.get("arn")
    rules = {str(r.inputs.get("name")): r for r in resources if r.type == EVENT_RULE}
    out = []
    for target in resources:
        if target.type != EVENT_TARGET:
            continue
        if function.urn in target.dependencies or (arn and target.inputs.get("arn") == arn):
            rule = rules.get(str(target.inputs.get("rule")))
            if rule is not None:
                out.append(rule)
    return out


def _group_problems(
    group: Resource, block: str, keepers: Sequence[Resource], resources: Sequence[Resource]
) -> list[str]:
    name = str(group.inputs.get("name") or group.name)
    kept = [(k, w) for k in keepers if (w := block_window(k.inputs)) is not None and w.group == name]
    if not kept:
        return [
            f"{name} launches into Capacity Block {block} but no keeper sizes it from the block's window: declared "
            "at its max it would launch before the block starts, and nothing closes it before EC2 terminates what "
            "still runs, 30 minutes before the end, without a checkpoint (declare the pool's CapacityBlockWindow)"
        ]
    out = []
    for keeper, window in kept:
        invokers = _invokers(keeper, resources)
        periods = [p for r in invokers if (p := _period(r)) is not None]
        if not periods or min(periods) > TICK:
            out.append(
                f"{name}: its keeper is not invoked every minute (an EventBridge rule with rate(1 minute) and a "
                "target): the group opens and drains only when it runs"
            )
        if not any(
            WARNING in (_pattern(r).get("detail-type") or ())
            and block in as_object(_pattern(r).get("detail")).get("capacity-reservation-id", ())
            for r in invokers
        ):
            out.append(
                f"Capacity Block {block}: no rule routes EC2's \"{WARNING}\" (40 minutes before the end) to {name}'s "
                "keeper: if the fleet's end is wrong, nothing closes the group before EC2's cut"
            )
        held = _hook_hold(group, resources)
        latest = window.ends_at - CUT - held - TICK
        if window.drains_at > latest:
            out.append(
                f"{name} drains at {window.drains_at:%Y-%m-%dT%H:%M:%SZ}, but its termination hook may hold an "
                f"instance {int(held.total_seconds())} s, the keeper may act a minute late, and EC2 cuts at "
                f"{window.ends_at - CUT:%Y-%m-%dT%H:%M:%SZ}: drain by {latest:%Y-%m-%dT%H:%M:%SZ}"
            )
        if window.reservation != block:
            out.append(f"{name}: its keeper watches {window.reservation or 'no reservation'}, the pool uses {block}")
        # The group's declared sizes are not checked: CrossGuard gives a stack rule each resource's outputs
        # (pulumi/pulumi pkg/resource/deploy/step_generator.go, AnalyzeStack "is called on the final outputs"),
        # and inside the window those are what the keeper set. tests/components/test_nodepool.py keeps the
        # declaration closed.
    return out


def capacity_block_closes_before_cut(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every group launching into a Capacity Block is declared closed and has a keeper, ticking every minute and
    hearing the block's expiration warning, that drains it early enough for its termination hook before EC2's cut."""
    groups = [r for r in resources if r.type == AUTOSCALING_GROUP]
    keepers = [r for r in resources if r.type == FUNCTION]
    out: list[Violation] = []
    for template in resources:
        if template.type != LAUNCH_TEMPLATE or (block := _block_of(template)) is None:
            continue
        for group in _groups_of(template, groups):
            out.extend(Violation(group.urn, m) for m in _group_problems(group, block, keepers, resources))
    return out
