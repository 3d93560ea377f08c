"""A Capacity Block ending under a running job, simulated on the planned configuration (issue 22, item 4).

Everything the scenario relies on is read from the offline plan of the reference fleet (tests/reference.py runs()):
the pool's group and its termination lifecycle hook, the block's keeper (its environment, the rules that invoke it,
and its own decision function, components/lambdas/capacity_block_window.py `wanted`), and the termination handler's
lifecycle rule (matched with moto's EventBridge matcher). Only the block's times come from the fleet. Simulated
time, no sleeping. Where it stands in for a controller it copies documented behaviour:

- EC2: the block's instances exist only inside its window; EC2 sends "Capacity Block Expiration Warning" 40
  minutes before the end and terminates whatever still runs 30 minutes before it (EC2 guide, "Monitor Capacity
  Blocks using EventBridge"; "Work with Capacity Blocks").
- EventBridge: a rule with rate(1 minute) invokes its target once a minute, at a phase of its own ("Creating a
  rule that runs on a schedule"), so the keeper may act up to a minute after the drain time.
- Auto Scaling: UpdateAutoScalingGroup sets min, max and desired at once; a group whose desired drops terminates
  instances, each held in Terminating:Wait by the
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
from collections.abc import Sequence
from typing import Any

import pytest
from moto.events.models import EventPattern

from components.lambdas import capacity_block_window as keeper
from dlinfra.model.fleet.checks import BLOCK_CUT
from tests import reference

STACK = "prod-us-west-2"
POOL = "train-h100"
FUNCTION = "aws:lambda/function:Function"
TARGET = "aws:cloudwatch/eventTarget:EventTarget"
HOOK = "aws:autoscaling/lifecycleHook:LifecycleHook"
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
    """What the plan declares for the pool's group and its keeper."""

    group_name: str
    declared_max: int
    hook_heartbeat: datetime.timedelta
    hook_default: str
    window: keeper.Window | None  # the keeper's window, from its environment (None: no keeper)
    tick: datetime.timedelta | None  # how often a schedule invokes the keeper (None: never)
    event_rules: Sequence[EventPattern]  # rules routing EC2's block events to the keeper
    lifecycle_rules: Sequence[EventPattern]  # rules routing the group's terminate lifecycle action to the handler


def _period(expression: str) -> datetime.timedelta | None:
    number, unit = expression.removeprefix("rate(").removesuffix(")").split()
    return datetime.timedelta(minutes=int(number)) if unit.startswith("minute") else None


@functools.cache
def planned() -> Planned:
    result = reference.runs()[STACK]
    group = reference.named(result, f"pool-{POOL}-asg")
    name = group.inputs["name"]
    # The hook AWS holds: the LifecycleHook resource of the same name replaces the initial one (PutLifecycleHook).
    (hook,) = [h for h in reference.of_type(result, HOOK) if h.inputs["autoscalingGroupName"] == name]
    (function,) = [
        f
        for f in reference.of_type(result, FUNCTION)
        if (f.inputs.get("environment") or {}).get("variables", {}).get("GROUP_NAME") == name
    ]
    rules = {r.inputs["name"]: r for r in reference.of_type(result, RULE)}
    invoking = [rules[t.inputs["rule"]] for t in reference.of_type(result, TARGET) if function.urn in t.dependencies]
    ticks = [p for r in invoking if (p := _period(r.inputs.get("scheduleExpression") or "rate(0 hours)")) is not None]
    return Planned(
        group_name=name,
        declared_max=int(group.inputs["maxSize"]),
        hook_heartbeat=datetime.timedelta(seconds=int(hook.inputs["heartbeatTimeout"])),
        hook_default=hook.inputs["defaultResult"],
        window=keeper.Window.from_environment(function.inputs["environment"]["variables"]),
        tick=min(ticks, default=None),
        event_rules=[EventPattern.load(r.inputs["eventPattern"]) for r in invoking if r.inputs.get("eventPattern")],
        lifecycle_rules=[
            EventPattern.load(r.inputs["eventPattern"])
            for r in reference.of_type(result, RULE)
            if r.name == "platform-nth-asg-lifecycle"
        ],
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
    signalled_by: str  # "keeper-drain", "expiration-warning" or ""


TICK_EVENT = {"version": "0", "detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}


def ticks(plan: Planned, start: datetime.datetime, stop: datetime.datetime) -> list[datetime.datetime]:
    """The keeper's schedule between two moments, at the worst phase for a drain: one second short of a whole tick
    after the drain time (none without a schedule)."""
    if plan.tick is None or plan.window is None:
        return []
    phase = (plan.window.drains_at - start) % plan.tick + plan.tick - datetime.timedelta(seconds=1)
    out, moment = [], start + phase
    while moment < stop:
        out.append(moment)
        moment += plan.tick
    return out


def group_sizes(plan: Planned, moment: datetime.datetime, events: Sequence[tuple[datetime.datetime, dict]] = ()) -> int:
    """The group's max at `moment`: the declared one, then what the keeper last set, at each tick and each EC2
    event a rule routes to it (the keeper's own decision function)."""
    size = plan.declared_max
    if plan.window is None:
        return size
    calls = [(t, TICK_EVENT) for t in ticks(plan, moment - datetime.timedelta(days=30), moment + datetime.timedelta(0))]
    calls += [(t, e) for t, e in events if t <= moment and any(p.matches_event(e) for p in plan.event_rules)]
    for at, event in sorted(calls, key=lambda c: c[0]):
        decision = keeper.wanted(event, plan.window, at)
        if decision is not None:
            size = decision[1]["MaxSize"]
    return size


def run_block_end(
    plan: Planned, *, grace: datetime.timedelta, checkpoint: datetime.timedelta, end: datetime.datetime,
    reservation: str,
) -> Outcome:  # fmt: skip
    """One running pod of a job on the block's node, from six hours before the end to EC2's cut."""
    cut = end - BLOCK_CUT
    closes: list[tuple[datetime.datetime, str]] = []
    if plan.window is not None:
        for moment in ticks(plan, end - datetime.timedelta(hours=6), cut):
            decision = keeper.wanted(TICK_EVENT, plan.window, moment)
            if decision is not None and decision[1]["MaxSize"] == 0:
                closes.append((moment + CLOSER_LATENCY, "keeper-drain"))
                break
        event = warning_event(reservation, end)
        if any(p.matches_event(event) for p in plan.event_rules):
            decision = keeper.wanted(event, plan.window, end - WARNING_LEAD)
            if decision is not None and decision[1]["MaxSize"] == 0:
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


def without(plan: Planned, *, tick: bool = False, warning: bool = False) -> Planned:
    return dataclasses.replace(plan, tick=None if tick else plan.tick, event_rules=[] if warning else plan.event_rules)


GRACE = datetime.timedelta(minutes=30)  # the reference pool's checkpoint_grace (1800 s)
CHECKPOINT = datetime.timedelta(minutes=8)  # what the job takes to write its checkpoint after SIGTERM


def test_the_job_is_signalled_at_the_keepers_drain_and_gone_before_ec2s_cut() -> None:
    reservation, _start, end = block()
    outcome = run_block_end(planned(), grace=GRACE, checkpoint=CHECKPOINT, end=end, reservation=reservation)
    assert outcome.signalled_by == "keeper-drain" and outcome.checkpointed
    assert outcome.sigterm is not None and outcome.sigterm <= end - WARNING_LEAD  # before the warning, even
    margin = end - BLOCK_CUT - outcome.pod_end
    # Figures: with the pool's 1800 s grace, the 300 s margin and one tick the drain time is 36 min before the cut;
    # at the worst phase the keeper acts 59 s later, the pod gets SIGTERM 2 min 30 s after that, and with an
    # 8-minute checkpoint it is gone 24 min 31 s before the cut.
    assert margin == datetime.timedelta(minutes=24, seconds=31), margin


def test_a_job_using_its_whole_grace_still_ends_before_the_cut() -> None:
    reservation, _start, end = block()
    outcome = run_block_end(planned(), grace=GRACE, checkpoint=GRACE, end=end, reservation=reservation)
    assert outcome.checkpointed and outcome.pod_end < end - BLOCK_CUT


def test_without_the_keepers_schedule_the_warning_comes_too_late_for_an_eight_minute_checkpoint() -> None:
    """The warning is 10 minutes before EC2's cut: a job that needs 8 of them, signalled a minute or two late, dies."""
    reservation, _start, end = block()
    plan = without(planned(), tick=True)
    outcome = run_block_end(plan, grace=GRACE, checkpoint=CHECKPOINT, end=end, reservation=reservation)
    assert outcome.signalled_by == "expiration-warning"  # the backstop fires ...
    assert not outcome.checkpointed and outcome.killed_by == "ec2-cut"  # ... too late for this job


def test_the_warning_alone_saves_a_short_checkpoint() -> None:
    reservation, _start, end = block()
    plan = without(planned(), tick=True)
    quick = datetime.timedelta(minutes=3)
    outcome = run_block_end(plan, grace=GRACE, checkpoint=quick, end=end, reservation=reservation)
    assert outcome.signalled_by == "expiration-warning" and outcome.checkpointed


def test_with_neither_the_schedule_nor_the_warning_rule_ec2_kills_the_job_unsignalled() -> None:
    reservation, _start, end = block()
    plan = without(planned(), tick=True, warning=True)
    outcome = run_block_end(plan, grace=GRACE, checkpoint=CHECKPOINT, end=end, reservation=reservation)
    assert outcome.sigterm is None and outcome.killed_by == "ec2-cut"


def test_the_event_rule_matches_only_this_blocks_events() -> None:
    reservation, _start, end = block()
    (rule,) = planned().event_rules
    assert rule.matches_event(warning_event(reservation, end))
    assert rule.matches_event(warning_event(reservation, end) | {"detail-type": "Capacity Block Delivered"})
    assert not rule.matches_event(warning_event("cr-0fffffffffffffff0", end))
    other = warning_event(reservation, end) | {"detail-type": "EC2 Capacity Reservation Expired"}
    assert not rule.matches_event(other)


@pytest.mark.parametrize("nodes", [1, 16])
def test_no_node_can_exist_outside_the_window(nodes: int) -> None:
    """The cluster-autoscaler never grows a group beyond its max (cloudprovider/aws: MaxSize of the group), so a
    ProvisioningRequest for the block's flavor cannot be provisioned, and Kueue's check keeps the job unadmitted."""
    _reservation, start, end = block()
    plan = planned()
    assert plan.window is not None and plan.window.opens_at == start
    assert group_sizes(plan, start - datetime.timedelta(seconds=1)) == 0
    assert group_sizes(plan, start + datetime.timedelta(minutes=1)) >= nodes  # within a tick of the start
    assert group_sizes(plan, plan.window.drains_at + datetime.timedelta(minutes=1)) == 0
    assert plan.window.drains_at < end - BLOCK_CUT


def test_delivery_opens_the_group_before_the_first_tick() -> None:
    reservation, start, end = block()
    plan = without(planned(), tick=True)
    delivered = warning_event(reservation, end) | {"detail-type": "Capacity Block Delivered"}
    assert group_sizes(plan, start + datetime.timedelta(seconds=5), [(start, delivered)]) == 16


def test_an_apply_after_the_block_started_opens_the_group_within_a_tick() -> None:
    """The case one-time scheduled actions got wrong: created after their start time, they are refused."""
    _reservation, start, _end = block()
    plan = planned()
    assert plan.tick == datetime.timedelta(minutes=1)
    late = start + datetime.timedelta(days=3, seconds=17)
    assert group_sizes(plan, late + plan.tick) == 16


def test_a_group_declared_open_would_admit_work_before_the_block() -> None:
    """The failing case: a block pool declared at its max, with no keeper, lets the autoscaler try to launch before
    the start."""
    _reservation, start, _end = block()
    opened = dataclasses.replace(planned(), declared_max=16, window=None)
    assert group_sizes(opened, start - datetime.timedelta(days=1)) == 16
