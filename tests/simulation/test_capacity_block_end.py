"""A Capacity Block ending under a running job, simulated on the planned configuration (issue 22, item 4).

Everything the scenario relies on is read from the offline plan of the reference fleet (tests/reference.py runs()):
the pool's group and its termination lifecycle hook, the window's scheduled actions, the expiration-warning rule
and the termination handler's lifecycle rule (matched with moto's EventBridge matcher). Only the block's times come
from the fleet. Simulated time, no sleeping. Where it stands in for a controller it copies documented behaviour:

- EC2: the block's instances exist only inside its window; EC2 sends "Capacity Block Expiration Warning" 40
  minutes before the end and terminates whatever still runs 30 minutes before it (EC2 guide, "Monitor Capacity
  Blocks using EventBridge"; "Work with Capacity Blocks").
- Auto Scaling: a one-time scheduled action sets min, max and desired at its start time (Auto Scaling guide,
  "Scheduled scaling"); a group whose desired drops terminates instances, each held in Terminating:Wait by the
  termination hook until the hook is completed or its heartbeat runs out, then its default result applies
  ("Amazon EC2 Auto Scaling lifecycle hooks"). The group never exceeds its max, so a closed group launches nothing.
- The node termination handler (v1.25.6, queue mode): on "EC2 Instance-terminate Lifecycle Action" from its queue
  it cordons and drains the node, evicting each pod with the pod's own grace (podTerminationGracePeriod -1), then
  completes the lifecycle action (pkg/monitor/sqsevent/asg-lifecycle-event.go; docs/maintenance.md).
- The kubelet: an evicted pod gets SIGTERM, then up to terminationGracePeriodSeconds, then SIGKILL (Kubernetes,
  "Pod Lifecycle", termination of pods).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from moto.events.models import EventPattern

from components.capacity_block import DRAIN_ACTION, OPEN_ACTION
from dlinfra.model.fleet.checks import BLOCK_CUT
from tests import reference

STACK = "prod-us-west-2"
POOL = "train-h100"
SCHEDULE = "aws:autoscaling/schedule:Schedule"
RULE = "aws:cloudwatch/eventRule:EventRule"
GROUP = "aws:autoscaling/group:Group"
WARNING_LEAD = datetime.timedelta(minutes=40)  # EC2 sends the warning 40 minutes before the end
# Latencies the simulation assumes (none is documented as a bound): EventBridge -> SQS -> the handler, and
# EventBridge -> Lambda -> UpdateAutoScalingGroup -> the group's termination.
HANDLER_LATENCY = datetime.timedelta(seconds=60)
CLOSER_LATENCY = datetime.timedelta(seconds=60)
TERMINATION_START = datetime.timedelta(seconds=30)  # desired 0 -> the instance enters Terminating:Wait


@dataclasses.dataclass(frozen=True)
class Planned:
    """What the plan declares for the pool's group and its window."""

    group_name: str
    declared_max: int
    hook_heartbeat: datetime.timedelta
    hook_default: str
    actions: Mapping[str, tuple[datetime.datetime, int, int, int]]  # name -> (time, min, max, desired)
    warning_rules: Sequence[EventPattern]  # rules routing EC2's expiration warning somewhere that closes the group
    lifecycle_rules: Sequence[EventPattern]  # rules routing the group's terminate lifecycle action to the handler


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


@functools.cache
def planned() -> Planned:
    result = reference.runs()[STACK]
    group = reference.named(result, f"pool-{POOL}-asg")
    name = group.inputs["name"]
    (hook,) = [
        h
        for h in group.inputs.get("initialLifecycleHooks") or ()
        if h["lifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    ]
    actions = {
        s.inputs["scheduledActionName"]: (
            _time(s.inputs["startTime"]),
            int(s.inputs["minSize"]),
            int(s.inputs["maxSize"]),
            int(s.inputs["desiredCapacity"]),
        )
        for s in reference.of_type(result, SCHEDULE)
        if s.inputs["autoscalingGroupName"] == name
    }
    rules = {r.name: EventPattern.load(r.inputs["eventPattern"]) for r in reference.of_type(result, RULE)}
    return Planned(
        group_name=name,
        declared_max=int(group.inputs["maxSize"]),
        hook_heartbeat=datetime.timedelta(seconds=int(hook["heartbeatTimeout"])),
        hook_default=hook["defaultResult"],
        actions=actions,
        warning_rules=[p for n, p in rules.items() if n == f"block-{POOL}-warning"],
        lifecycle_rules=[p for n, p in rules.items() if n == "platform-nth-asg-lifecycle"],
    )


def block() -> tuple[str, datetime.datetime, datetime.datetime]:
    cr = reference.fleet().environments["prod"].node_pools[POOL].capacity_reservations["us-west-2"]
    assert cr.start is not None and cr.end is not None
    return cr.id, cr.start, cr.end


def warning_event(reservation: str, end: datetime.datetime) -> dict[str, Any]:
    """EC2's warning as the EC2 guide shows it ("Monitor Capacity Blocks using EventBridge")."""
    return {
        "version": "0",
        "id": "00000000-0000-0000-0000-000000000001",
        "detail-type": "Capacity Block Expiration Warning",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": (end - WARNING_LEAD).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": "us-west-2",
        "resources": [f"arn:aws:ec2:us-west-2:123456789012:capacity-reservation/{reservation}"],
        "detail": {"capacity-reservation-id": reservation, "end-date": end.strftime("%Y-%m-%dT%H:%M:%SZ")},
    }


def lifecycle_event(group: str) -> dict[str, Any]:
    """Auto Scaling's terminate lifecycle action event ("Amazon EC2 Auto Scaling event reference")."""
    return {
        "version": "0",
        "id": "00000000-0000-0000-0000-000000000002",
        "detail-type": "EC2 Instance-terminate Lifecycle Action",
        "source": "aws.autoscaling",
        "account": "123456789012",
        "time": "2027-01-18T10:40:00Z",
        "region": "us-west-2",
        "resources": [],
        "detail": {
            "LifecycleActionToken": "token",
            "AutoScalingGroupName": group,
            "LifecycleHookName": "drain-before-terminate",
            "EC2InstanceId": "i-0123456789abcdef0",
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
        },
    }


@dataclasses.dataclass(frozen=True)
class Outcome:
    sigterm: datetime.datetime | None  # when the job's pod got SIGTERM (None: never signalled)
    pod_end: datetime.datetime  # when the pod was gone
    checkpointed: bool  # it finished its checkpoint and exited by itself
    killed_by: str  # "" (exited), "kubelet" (grace ran out), "ec2-cut" (EC2 terminated the instance)
    signalled_by: str  # "scheduled-drain", "expiration-warning" or ""


def run_block_end(
    plan: Planned, *, grace: datetime.timedelta, checkpoint: datetime.timedelta, end: datetime.datetime,
    reservation: str,
) -> Outcome:  # fmt: skip
    """One running pod of a job on the block's node, from before the drain to EC2's cut."""
    cut = end - BLOCK_CUT
    closes: list[tuple[datetime.datetime, str]] = []
    drain = plan.actions.get(DRAIN_ACTION)
    if drain is not None and drain[2] == 0 and drain[3] == 0:
        closes.append((drain[0], "scheduled-drain"))
    event = warning_event(reservation, end)
    if any(p.matches_event(event) for p in plan.warning_rules):
        closes.append((end - WARNING_LEAD + CLOSER_LATENCY, "expiration-warning"))
    handled = any(p.matches_event(lifecycle_event(plan.group_name)) for p in plan.lifecycle_rules)
    if not closes or not handled:
        # Nothing terminates the instance through the hook (or nothing drains it): EC2's cut kills the pod.
        return Outcome(sigterm=None, pod_end=cut, checkpointed=False, killed_by="ec2-cut", signalled_by="")
    closed_at, why = min(closes)
    hook_start = closed_at + TERMINATION_START
    sigterm = hook_start + HANDLER_LATENCY
    # The pod exits when its checkpoint is done, or the kubelet kills it when its grace runs out.
    exits = sigterm + min(checkpoint, grace)
    killed_by = "" if checkpoint <= grace else "kubelet"
    # The hook's heartbeat ends the wait (default result) if the drain is slower; EC2's cut ends everything.
    instance_gone = min(exits, hook_start + plan.hook_heartbeat) if plan.hook_default == "CONTINUE" else exits
    if instance_gone < exits:
        exits, killed_by = instance_gone, "hook-timeout"
    if exits > cut:
        exits, killed_by = cut, "ec2-cut"
    return Outcome(
        sigterm=sigterm if sigterm < cut else None,
        pod_end=exits,
        checkpointed=killed_by == "",
        killed_by=killed_by,
        signalled_by=why,
    )


def without(plan: Planned, *, drain: bool = False, warning: bool = False) -> Planned:
    actions = {k: v for k, v in plan.actions.items() if not (drain and k == DRAIN_ACTION)}
    return dataclasses.replace(plan, actions=actions, warning_rules=[] if warning else plan.warning_rules)


TEN_MINUTES = datetime.timedelta(minutes=10)
CHECKPOINT = datetime.timedelta(minutes=8)  # what the job takes to write its checkpoint after SIGTERM


def test_the_job_is_signalled_at_the_scheduled_drain_and_gone_before_ec2s_cut() -> None:
    reservation, _start, end = block()
    outcome = run_block_end(planned(), grace=TEN_MINUTES, checkpoint=CHECKPOINT, end=end, reservation=reservation)
    assert outcome.signalled_by == "scheduled-drain" and outcome.checkpointed
    assert outcome.sigterm is not None and outcome.sigterm <= end - WARNING_LEAD  # before the warning, even
    margin = end - BLOCK_CUT - outcome.pod_end
    # Figures: with the pool's default 900 s grace and 300 s margin the drain is 20 min before the cut (50 before
    # the end); the pod gets SIGTERM 90 s after it and is gone 10 min 30 s before the cut.
    assert margin == datetime.timedelta(minutes=10, seconds=30), margin


def test_a_job_using_its_whole_grace_still_ends_before_the_cut() -> None:
    reservation, _start, end = block()
    outcome = run_block_end(planned(), grace=TEN_MINUTES, checkpoint=TEN_MINUTES, end=end, reservation=reservation)
    assert outcome.checkpointed and outcome.pod_end < end - BLOCK_CUT


def test_without_the_scheduled_drain_the_warning_comes_too_late_for_a_ten_minute_grace() -> None:
    """The warning is 10 minutes before EC2's cut: a job that needs 8 of them, signalled a minute or two late, dies."""
    reservation, _start, end = block()
    plan = without(planned(), drain=True)
    outcome = run_block_end(plan, grace=TEN_MINUTES, checkpoint=CHECKPOINT, end=end, reservation=reservation)
    assert outcome.signalled_by == "expiration-warning"  # the backstop fires ...
    assert not outcome.checkpointed and outcome.killed_by == "ec2-cut"  # ... too late for this job


def test_the_warning_alone_saves_a_short_checkpoint() -> None:
    reservation, _start, end = block()
    plan = without(planned(), drain=True)
    quick = datetime.timedelta(minutes=3)
    outcome = run_block_end(plan, grace=TEN_MINUTES, checkpoint=quick, end=end, reservation=reservation)
    assert outcome.signalled_by == "expiration-warning" and outcome.checkpointed


def test_with_neither_the_drain_nor_the_warning_rule_ec2_kills_the_job_unsignalled() -> None:
    reservation, _start, end = block()
    plan = without(planned(), drain=True, warning=True)
    outcome = run_block_end(plan, grace=TEN_MINUTES, checkpoint=CHECKPOINT, end=end, reservation=reservation)
    assert outcome.sigterm is None and outcome.killed_by == "ec2-cut"


def test_the_warning_rule_matches_only_this_block() -> None:
    reservation, _start, end = block()
    (rule,) = planned().warning_rules
    assert rule.matches_event(warning_event(reservation, end))
    assert not rule.matches_event(warning_event("cr-0fffffffffffffff0", end))
    other = warning_event(reservation, end) | {"detail-type": "Capacity Block Delivered"}
    assert not rule.matches_event(other)


def group_max_at(plan: Planned, moment: datetime.datetime) -> int:
    """The group's max at `moment`: the declared one, then each scheduled action that has run, in order."""
    size = plan.declared_max
    for at, _min, most, _desired in sorted(plan.actions.values()):
        if at <= moment and most >= 0:
            size = most
    return size


@pytest.mark.parametrize("nodes", [1, 16])
def test_before_the_block_starts_no_node_can_exist(nodes: int) -> None:
    """The cluster-autoscaler never grows a group beyond its max (cloudprovider/aws: MaxSize of the group), so a
    ProvisioningRequest for the block's flavor cannot be provisioned, and Kueue's check keeps the job unadmitted."""
    _reservation, start, end = block()
    plan = planned()
    assert plan.actions[OPEN_ACTION][0] == start
    assert group_max_at(plan, start - datetime.timedelta(seconds=1)) == 0
    assert group_max_at(plan, start) >= nodes  # inside the window, the pool's max
    drain_at = plan.actions[DRAIN_ACTION][0]
    assert group_max_at(plan, drain_at) == 0 and drain_at < end - BLOCK_CUT
    assert json.dumps(plan.actions[DRAIN_ACTION][1:]) == "[0, 0, 0]"


def test_a_group_declared_open_would_admit_work_before_the_block() -> None:
    """The failing case: a block pool declared at its max lets the autoscaler try to launch before the start."""
    _reservation, start, _end = block()
    opened = dataclasses.replace(planned(), declared_max=16)
    assert group_max_at(opened, start - datetime.timedelta(days=1)) == 16
