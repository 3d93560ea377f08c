"""Which source disrupted a pod, and whether it waited for the pod's grace: read from a `what-happened` timeline.

Pure. The causes are the events each source records (docs/what-happened.md, "Who disrupted it"):
- the termination handler's node events, whose reason names the kind with logFormatVersion 2 (NTH v1.25.6
  pkg/observability/k8s-events.go getReasonForKindV2; v1 says SQSTermination for all and the message tells),
- the termination queue's messages (AWS Health, spot warning, rebalance, Auto Scaling lifecycle action),
- cluster-autoscaler's pod event ScaleDown, "deleting pod for node scale down" (v1.33.6 scaledown/actuation/drain.go),
- Kueue's workload and job events (Preempted; an eviction for waitForPodsReady; Stopped on the job),
- an Auto Scaling activity caused by an instance refresh (`pool roll`), or by a request that set the group to 0
  (a Capacity Block's keeper at its drain time: components/capacity_block.py),
- a Capacity Block's expiration warning.
Auto Scaling's termination is how the last two reach a node, so when the handler's lifecycle event is the latest
cause, the Auto Scaling reason recorded before it names the source.
The signal is the kubelet's Killing event on the pod (SIGTERM); its end is the container's end, or else its node's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from dlinfra.ops.what_happened import Event

LOOKBACK = timedelta(hours=2)  # a cause this long before the signal still counts (drains take up to ~1 h)
EXIT_CODE = re.compile(r"exit code (-?\d+)")

# (source, what matches: event `what` prefix, or a word of its detail) in the order they are tried.
NTH_KINDS: Mapping[str, str] = {
    "ScheduledEvent": "maintenance (AWS Health scheduled change)",
    "SpotInterruption": "spot interruption",
    "RebalanceRecommendation": "rebalance recommendation",
    "ASGLifecycle": "Auto Scaling termination (scale-in, health replacement or pool roll)",
    "StateChange": "EC2 state change (stopped or terminated)",
}
# logFormatVersion 1: one reason, the kind in the message (sqsevent/*.go Description).
NTH_V1_MESSAGES: Mapping[str, str] = {
    "AWS Health scheduled change": NTH_KINDS["ScheduledEvent"],
    "Spot Interruption notice": NTH_KINDS["SpotInterruption"],
    "Rebalance recommendation": NTH_KINDS["RebalanceRecommendation"],
    "ASG Lifecycle Termination": NTH_KINDS["ASGLifecycle"],
    "EC2 State Change": NTH_KINDS["StateChange"],
}
POOL_ROLL = "pool roll (instance refresh)"
POOL_CLOSED = "pool set to 0 (a Capacity Block's keeper at its drain time, or by hand)"
CAPACITY_BLOCK = "Capacity Block end"
# What AWS writes in an activity's cause when UpdateAutoScalingGroup set the sizes to 0 ("a user request update of
# AutoScalingGroup constraints to min: 0, max: 0, desired: 0 changing the desired capacity from N to 0").
CLOSED_CAUSE = "constraints to min: 0, max: 0, desired: 0"
QUEUE_KINDS: Mapping[str, str] = {
    "AWS Health scheduled change": NTH_KINDS["ScheduledEvent"],
    "spot interruption warning": NTH_KINDS["SpotInterruption"],
    "rebalance recommendation": NTH_KINDS["RebalanceRecommendation"],
    "EC2 Instance-terminate Lifecycle Action": NTH_KINDS["ASGLifecycle"],
}


@dataclass(frozen=True)
class Disruption:
    """One pod's disruption: who, when it was signalled and ended, its grace, and whether it was waited for."""

    pod: str  # pod/NAMESPACE/NAME
    source: str  # see NTH_KINDS and cause(); "unknown" when no recorded cause precedes the signal
    signalled: Event
    ended: Event | None
    grace: int | None  # the pod's terminationGracePeriodSeconds, when the pod could be read
    waited: str  # a sentence: waited, cut short, or not known

    def __str__(self) -> str:
        return f"{self.pod}: disrupted by {self.source}; {self.waited}"


def cause(event: Event) -> str | None:
    """The disruption source an event records, if it records one."""
    detail = event.detail
    reason = event.what.removesuffix(" (Warning)")
    if event.source == "kubernetes":
        if "[aws-node-termination-handler]" in detail:
            if reason in NTH_KINDS:
                return NTH_KINDS[reason]
            if reason == "SQSTermination":
                return next((s for m, s in NTH_V1_MESSAGES.items() if m in detail), "termination handler")
        if reason == "ScaleDown" and "cluster-autoscaler" in detail:
            return "cluster-autoscaler scale-down"
        if reason == "Preempted" or ("Preempted" in detail and reason in ("Evicted", "Stopped")):
            return "Kueue preemption"
        if reason in ("Evicted", "Stopped") and "PodsReady" in detail:
            return "Kueue waitForPodsReady eviction"
        if "Capacity Block" in detail:
            return CAPACITY_BLOCK
        return None
    if event.source == "termination-queue":
        if "Capacity Block" in event.what:
            return CAPACITY_BLOCK
        return QUEUE_KINDS.get(event.what)
    if event.source == "autoscaling" and "instance refresh" in detail:
        return POOL_ROLL
    if event.source == "autoscaling" and CLOSED_CAUSE in detail:
        return POOL_CLOSED
    if event.source == "ec2" and "Capacity Block" in detail:
        return CAPACITY_BLOCK
    return None


def _source(before: Sequence[str]) -> str:
    """The latest cause; when that is Auto Scaling's termination, the reason it was for, if one was recorded."""
    if not before:
        return "unknown (no recorded cause in the two hours before SIGTERM)"
    latest = before[-1]
    if latest == NTH_KINDS["ASGLifecycle"]:
        reasons = [c for c in before if c in (POOL_ROLL, POOL_CLOSED, CAPACITY_BLOCK)]
        if reasons:
            return f"{reasons[-1]}, through Auto Scaling termination"
    return latest


def _waited(signalled: Event, ended: Event | None, grace: int | None) -> str:
    if ended is None:
        return f"signalled at {signalled.time:%H:%M:%S}, its end is not recorded"
    took = int((ended.time - signalled.time).total_seconds())
    if grace is None:
        return f"ended {took}s after SIGTERM (its grace is unknown: the pod is gone)"
    code = EXIT_CODE.search(ended.detail)
    killed = (code is not None and code.group(1) == "137") or ended.what != "container ended"
    if took >= grace - 1:
        return f"waited: ended {took}s after SIGTERM, its full {grace}s grace"
    if not killed:
        return f"waited: it exited on its own {took}s after SIGTERM, within its {grace}s grace"
    return f"did NOT wait: ended {took}s after SIGTERM, {grace - took}s short of its {grace}s grace"


def disruptions(events: Sequence[Event], graces: Mapping[str, int]) -> list[Disruption]:
    """Each pod signalled in the timeline (kubelet Killing), with the latest recorded cause before it."""
    ordered = sorted(events, key=Event.sort_key)
    causes = [(e, c) for e in ordered if (c := cause(e)) is not None]
    out: list[Disruption] = []
    seen: set[str] = set()
    for event in ordered:
        if not (event.subject.startswith("pod/") and event.what == "Killing") or event.subject in seen:
            continue
        seen.add(event.subject)
        before = [c for e, c in causes if event.time - LOOKBACK <= e.time <= event.time]
        # A pod's own record (CA's ScaleDown, Kueue's) outranks its node's: the last recorded cause wins.
        source = _source(before)
        ended = next(
            (
                e
                for e in ordered
                if e.time >= event.time
                and (
                    (e.subject == event.subject and e.what == "container ended")
                    or (e.source == "ec2" and e.what in ("state terminated", "state stopped"))
                )
            ),
            None,
        )
        grace = graces.get(event.subject)
        out.append(Disruption(event.subject, source, event, ended, grace, _waited(event, ended, grace)))
    return out
