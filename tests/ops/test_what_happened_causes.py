"""`what-happened` names who disrupted a pod and whether it waited for the pod's grace, from each source's events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dlinfra.ops.what_happened import Event
from dlinfra.ops.what_happened_causes import cause, disruptions

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
POD = "pod/training/llm-worker-0"
NODE = "node/ip-10-20-1-17.us-west-2.compute.internal"


def _at(seconds: float, source: str, subject: str, what: str, detail: str = "") -> Event:
    return Event(T0 + timedelta(seconds=seconds), source, subject, what, detail)


NTH = "[aws-node-termination-handler]"


@pytest.mark.parametrize(
    ("event", "source"),
    [
        (_at(0, "kubernetes", NODE, "ScheduledEvent", f"AWS Health scheduled change event received {NTH}"),
         "maintenance (AWS Health scheduled change)"),
        (_at(0, "kubernetes", NODE, "SpotInterruption", f"Spot Interruption notice {NTH}"), "spot interruption"),
        (_at(0, "kubernetes", NODE, "RebalanceRecommendation", NTH), "rebalance recommendation"),
        (_at(0, "kubernetes", NODE, "ASGLifecycle", NTH),
         "Auto Scaling termination (scale-in, health replacement or pool roll)"),
        # logFormatVersion 1: one reason for every queue event, the kind in the message.
        (_at(0, "kubernetes", NODE, "SQSTermination", f"Spot Interruption notice for instance i-1 {NTH}"),
         "spot interruption"),
        (_at(0, "kubernetes", POD, "ScaleDown", "deleting pod for node scale down [cluster-autoscaler]"),
         "cluster-autoscaler scale-down"),
        (_at(0, "kubernetes", "workload/job-train-1a2b3", "Preempted", "Preempted to accommodate a workload"),
         "Kueue preemption"),
        (_at(0, "kubernetes", "workload/job-train-1a2b3", "Evicted (Warning)", "Exceeded the PodsReady timeout"),
         "Kueue waitForPodsReady eviction"),
        (_at(0, "termination-queue", "instance/i-1", "spot interruption warning", "action terminate"),
         "spot interruption"),
        (_at(0, "autoscaling", "group/g", "Terminating EC2 instance: i-1",
             "At 2026-03-02T10:00:00Z an instance was taken out of service in response to an instance refresh."),
         "pool roll (instance refresh)"),
        (_at(0, "termination-queue", "instance/i-1", "Capacity Block Reservation Expiration Warning"),
         "Capacity Block end"),
        (_at(0, "autoscaling", "group/g", "Terminating EC2 instance: i-1",
             "At 2027-01-18T10:24:31Z a user request update of AutoScalingGroup constraints to min: 0, max: 0, "
             "desired: 0 changing the desired capacity from 16 to 0."),
         "pool set to 0 (a Capacity Block's keeper at its drain time, or by hand)"),
        (_at(0, "kubernetes", POD, "Killing", "Stopping container trainer [kubelet]"), None),
    ],
)  # fmt: skip
def test_each_source_is_named(event: Event, source: str | None) -> None:
    assert cause(event) == source


def test_a_block_pools_drain_is_named_behind_the_lifecycle_event() -> None:
    """The keeper sets the group to 0; Auto Scaling terminates the node through its hook; the handler drains it.
    The handler's event is the latest cause, but the reason is the group's closing."""
    events = [
        _at(0, "autoscaling", "group/g", "Terminating EC2 instance: i-1",
            "At 2027-01-18T10:24:31Z a user request update of AutoScalingGroup constraints to min: 0, max: 0, "
            "desired: 0 changing the desired capacity from 16 to 0."),
        _at(60, "kubernetes", NODE, "ASGLifecycle", NTH),
        _at(62, "kubernetes", POD, "Killing", "Stopping container trainer [kubelet]"),
        _at(542, "kubernetes", POD, "container ended", "trainer: Completed, exit code 0"),
    ]  # fmt: skip
    (found,) = disruptions(events, {POD: 1800})
    assert found.source == (
        "pool set to 0 (a Capacity Block's keeper at its drain time, or by hand), through Auto Scaling termination"
    )
    assert found.waited.startswith("waited: it exited on its own 480s after SIGTERM")
    # Without the group's activity it is only the mechanism that is known.
    (bare,) = disruptions(events[1:], {POD: 1800})
    assert bare.source == "Auto Scaling termination (scale-in, health replacement or pool roll)"


def test_maintenance_waited_for_the_checkpoint() -> None:
    events = [
        _at(0, "kubernetes", NODE, "ScheduledEvent", f"AWS Health scheduled change event received {NTH}"),
        _at(2, "kubernetes", POD, "Killing", "Stopping container trainer [kubelet]"),
        _at(592, "kubernetes", POD, "container ended", "trainer: Completed, exit code 0"),
    ]
    (found,) = disruptions(events, {POD: 600})
    assert found.source == "maintenance (AWS Health scheduled change)"
    assert found.waited.startswith("waited: it exited on its own 590s after SIGTERM")


def test_spot_cut_the_grace_short() -> None:
    events = [
        _at(0, "termination-queue", "instance/i-1", "spot interruption warning", "action terminate"),
        _at(1, "kubernetes", POD, "Killing", "Stopping container trainer [kubelet]"),
        _at(120, "ec2", "instance/i-1", "state terminated", "Server.SpotInstanceTermination"),
    ]
    (found,) = disruptions(events, {POD: 600})
    assert found.source == "spot interruption"
    assert found.waited == "did NOT wait: ended 119s after SIGTERM, 481s short of its 600s grace"


def test_killed_at_the_end_of_its_grace_was_waited_for() -> None:
    events = [
        _at(0, "kubernetes", POD, "ScaleDown", "deleting pod for node scale down [cluster-autoscaler]"),
        _at(1, "kubernetes", POD, "Killing", "Stopping container trainer [kubelet]"),
        _at(601, "kubernetes", POD, "container ended", "trainer: Error, exit code 137"),
    ]
    (found,) = disruptions(events, {POD: 600})
    assert found.source == "cluster-autoscaler scale-down" and found.waited.startswith("waited: ended 600s")


def test_a_kill_without_a_recorded_cause_says_so() -> None:
    (found,) = disruptions([_at(0, "kubernetes", POD, "Killing", "Stopping container trainer [kubelet]")], {})
    assert found.source.startswith("unknown") and "end is not recorded" in found.waited
