"""Keeps a node pool's Auto Scaling group open only inside its Capacity Block's window (components/capacity_block.py).

A level-triggered keeper, not a pair of one-time actions: every minute (an EventBridge schedule) and on EC2's own
block events it computes the sizes the group should have now and sets them. Auto Scaling refuses a scheduled action
whose start time has passed (PutScheduledUpdateGroupAction) and drops a one-time action once it has run, so actions
would fail a first apply made after the block started and every later refresh; a keeper has no such state, converges
after an apply, a missed event or a manual change, and costs one UpdateAutoScalingGroup call a minute.

The sizes:
- inside [OPENS_AT, DRAINS_AT): the pool's MIN_SIZE and MAX_SIZE; the desired size stays the cluster-autoscaler's.
- anywhere else: min = max = desired = 0, so the group launches nothing and Auto Scaling terminates what runs
  through the pool's termination hook, which the node termination handler answers after draining the node (each
  pod: SIGTERM, then its own grace). DRAINS_AT is early enough for that before EC2's cut.
- "Capacity Block Delivered" for this block opens the group at once (before the next tick), unless the drain time
  has passed; "Capacity Block Expiration Warning" closes it whatever the clock says: EC2 sends it 40 minutes before
  the end, 10 before it terminates the block's instances (EC2 guide, "Monitor Capacity Blocks using EventBridge").

It runs with the Lambda runtime's boto3; its environment names the one group and block it serves.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

# What EC2 calls its block events: the EC2 guide's page shows "Capacity Block Delivered" and "Capacity Block
# Expiration Warning", its Chinese and some regional copies put "Reservation" after "Block"; both are accepted.
WARNING_DETAIL_TYPES = ("Capacity Block Expiration Warning", "Capacity Block Reservation Expiration Warning")
DELIVERED_DETAIL_TYPES = ("Capacity Block Delivered", "Capacity Block Reservation Delivered")
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
# UpdateAutoScalingGroup's errors worth another try within this call (Auto Scaling API reference: a scaling
# activity in progress, or contention on the group): the drain's budget has room for one tick, not two.
RETRIED = ("ScalingActivityInProgress", "ResourceContention")
BACKOFF_SECONDS = (2, 4, 8)  # 14 s in all, within the function's 30 s timeout


class AutoScaling(Protocol):
    """The Auto Scaling call the keeper makes (a boto3 client, or moto's in tests)."""

    def update_auto_scaling_group(self, **kwargs: Any) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class Window:
    """The block and the pool's group as the keeper's environment gives them."""

    group: str
    reservation: str
    opens_at: datetime.datetime
    drains_at: datetime.datetime
    min_size: int
    max_size: int

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> Window:
        return cls(
            group=env["GROUP_NAME"],
            reservation=env["CAPACITY_RESERVATION_ID"],
            opens_at=parse_time(env["OPENS_AT"]),
            drains_at=parse_time(env["DRAINS_AT"]),
            min_size=int(env["MIN_SIZE"]),
            max_size=int(env["MAX_SIZE"]),
        )


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, TIME_FORMAT).replace(tzinfo=datetime.UTC)


def reservation_of(event: Mapping[str, Any]) -> str:
    """The capacity reservation id an EC2 Capacity Block event is about ("" when it names none)."""
    detail = event.get("detail")
    return str(detail.get("capacity-reservation-id", "")) if isinstance(detail, Mapping) else ""


def wanted(event: Mapping[str, Any], window: Window, now: datetime.datetime) -> tuple[str, dict[str, int]] | None:
    """Why and to what sizes the group should be set now (None: the event is about another block)."""
    kind = event.get("detail-type", event.get("detail_type"))
    closed = {"MinSize": 0, "MaxSize": 0, "DesiredCapacity": 0}
    opened = {"MinSize": window.min_size, "MaxSize": window.max_size}
    if kind in WARNING_DETAIL_TYPES or kind in DELIVERED_DETAIL_TYPES:
        if reservation_of(event) != window.reservation:
            return None
        if kind in WARNING_DETAIL_TYPES:
            return "expiration-warning", closed
        return ("delivered", opened) if now < window.drains_at else ("after-drain", closed)
    # The schedule's tick (or any other invocation): the clock decides.
    if window.opens_at <= now < window.drains_at:
        return "inside-window", opened
    return ("before-window" if now < window.opens_at else "after-drain"), closed


def respond(
    event: Mapping[str, Any],
    autoscaling: AutoScaling,
    window: Window,
    now: datetime.datetime,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Set the group to what `wanted` says, trying again while Auto Scaling is busy with the group; an event about
    another block leaves it alone."""
    decision = wanted(event, window, now)
    if decision is None:
        return {"group": None, "ignored": f"{event.get('detail-type')} about {reservation_of(event) or 'nothing'}"}
    why, sizes = decision
    for pause in (*BACKOFF_SECONDS, None):
        try:
            autoscaling.update_auto_scaling_group(AutoScalingGroupName=window.group, **sizes)
            break
        except Exception as exc:  # botocore's ClientError, whose code says whether to try again
            code = getattr(exc, "response", {}).get("Error", {}).get("Code")
            if pause is None or code not in RETRIED:
                raise
            sleep(pause)
    return {"group": window.group, "why": why, **sizes}


def handler(event: Mapping[str, Any], context: object) -> dict[str, Any]:
    """Lambda entry point: EventBridge delivers EC2's event, or its schedule's tick, as it is."""
    import boto3  # the Lambda runtime's; imported on a call, so tests that only read this module skip it

    window = Window.from_environment(os.environ)
    return respond(event, boto3.client("autoscaling"), window, datetime.datetime.now(datetime.UTC))
