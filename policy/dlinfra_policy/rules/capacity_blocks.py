"""Rules for node pools on EC2 Capacity Blocks: the group is drained before EC2's cut, and the block's expiration
warning is routed to something that closes it (components/capacity_block.py)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .core import Context, Resource, Violation, as_int, as_object, as_objects, tags_of

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
AUTOSCALING_GROUP = "aws:autoscaling/group:Group"
SCHEDULE = "aws:autoscaling/schedule:Schedule"
EVENT_RULE = "aws:cloudwatch/eventRule:EventRule"
EVENT_TARGET = "aws:cloudwatch/eventTarget:EventTarget"
# components/capacity_block.py tags the warning rule with the block and its end (policy cannot import components).
BLOCK_TAG = "dlinfra:capacity-block"
BLOCK_END_TAG = "dlinfra:capacity-block-end"
# EC2 terminates a block's instances 30 minutes before its end ("Work with Capacity Blocks"); Auto Scaling's guide:
# scale the group to zero more than 30 minutes before, leaving the lifecycle hooks time to finish ("Use Capacity
# Blocks for machine learning workloads", operational guidelines).
CUT = datetime.timedelta(minutes=30)
WARNING = "Capacity Block Expiration Warning"  # "Monitor Capacity Blocks using EventBridge"


def _time(value: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None


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


def _hook_heartbeat(group: Resource) -> int:
    """Seconds the group's termination hook may hold an instance (0 without one)."""
    for hook in as_objects(group.inputs.get("initialLifecycleHooks")):
        if hook.get("lifecycleTransition") == "autoscaling:EC2_INSTANCE_TERMINATING":
            return as_int(hook.get("heartbeatTimeout")) or 3600  # Auto Scaling's default heartbeat is one hour
    return 0


def _closes(schedule: Resource) -> bool:
    inputs = schedule.inputs
    return all(as_int(inputs.get(k)) == 0 for k in ("minSize", "maxSize", "desiredCapacity"))


def _pattern(rule: Resource) -> Mapping[str, Any]:
    try:
        pattern = json.loads(str(rule.inputs.get("eventPattern") or "{}"))
    except ValueError:
        return {}
    return pattern if isinstance(pattern, Mapping) else {}


def capacity_block_closes_before_cut(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every group launching into a Capacity Block has a scheduled action that sets it to 0 early enough that its
    termination hook is done before EC2's cut, and the block's expiration warning is routed to a target."""
    templates = [r for r in resources if r.type == LAUNCH_TEMPLATE]
    groups = [r for r in resources if r.type == AUTOSCALING_GROUP]
    schedules = [r for r in resources if r.type == SCHEDULE]
    rules = [r for r in resources if r.type == EVENT_RULE]
    targeted = {str(t.inputs.get("rule")) for t in resources if t.type == EVENT_TARGET}
    out: list[Violation] = []
    for template in templates:
        block = _block_of(template)
        if block is None:
            continue
        guards = [r for r in rules if tags_of(r).get(BLOCK_TAG) == block]
        routed = [
            r
            for r in guards
            if WARNING in (_pattern(r).get("detail-type") or ())
            and block in as_object(_pattern(r).get("detail")).get("capacity-reservation-id", ())
            and str(r.inputs.get("name")) in targeted
        ]
        if not routed:
            out.append(
                Violation(
                    template.urn,
                    f'Capacity Block {block}: no EventBridge rule with a target routes its "{WARNING}" (40 '
                    "minutes before the end) to what closes the pool; declare the pool's CapacityBlockWindow",
                )
            )
        end = next((_time(tags_of(r).get(BLOCK_END_TAG)) for r in guards if tags_of(r).get(BLOCK_END_TAG)), None)
        for group in _groups_of(template, groups):
            name = str(group.inputs.get("name") or group.name)
            drains = [
                t
                for s in schedules
                if str(s.inputs.get("autoscalingGroupName")) == name
                and _closes(s)
                and (t := _time(s.inputs.get("startTime"))) is not None
            ]
            if not drains:
                out.append(
                    Violation(
                        group.urn,
                        f"{name} launches into Capacity Block {block} but no scheduled action sets it to 0 (min, max "
                        "and desired) before the block ends: EC2 terminates what still runs 30 minutes before the end, "
                        "without a checkpoint",
                    )
                )
                continue
            if end is None:
                out.append(Violation(group.urn, f"{name}: the block's end is unknown (no {BLOCK_END_TAG} tag)"))
                continue
            held = datetime.timedelta(seconds=_hook_heartbeat(group))
            latest = end - CUT - held
            if min(drains) > latest:
                out.append(
                    Violation(
                        group.urn,
                        f"{name} closes at {min(drains):%Y-%m-%dT%H:%M:%SZ}, but its termination hook may hold an "
                        f"instance {int(held.total_seconds())} s and EC2 cuts at {end - CUT:%Y-%m-%dT%H:%M:%SZ}: "
                        f"close by {latest:%Y-%m-%dT%H:%M:%SZ}",
                    )
                )
    return out
