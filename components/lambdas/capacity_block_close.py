"""Closes a node pool's Auto Scaling group when EC2 warns that its Capacity Block is about to end.

The backstop of a block's end (components/capacity_block.py): the group is already closed by a scheduled action
well before the end (the drain). If that action did not run, or the fleet's end is wrong, EC2's "Capacity Block
Expiration Warning" comes 40 minutes before the end, 10 minutes before EC2 starts terminating the block's instances
(EC2 guide, "Monitor Capacity Blocks using EventBridge"). Setting the group to 0 makes Auto Scaling terminate every
instance through the pool's termination lifecycle hook, which the node termination handler answers once it has
drained the node: each pod gets SIGTERM and its own grace (docs/maintenance.md).

It runs with the Lambda runtime's boto3; its environment names the one group and reservation it serves.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol

# What EC2 calls the warning: the EC2 guide's page shows "Capacity Block Expiration Warning" and its Chinese and
# some regional copies "Capacity Block Reservation Expiration Warning"; the rule and the handler accept both.
WARNING_DETAIL_TYPES = ("Capacity Block Expiration Warning", "Capacity Block Reservation Expiration Warning")


class AutoScaling(Protocol):
    """The Auto Scaling call the handler makes (a boto3 client, or moto's in tests)."""

    def update_auto_scaling_group(self, **kwargs: Any) -> Mapping[str, Any]: ...


def reservation_of(event: Mapping[str, Any]) -> str:
    """The capacity reservation id an EC2 Capacity Block event is about ("" when it names none)."""
    detail = event.get("detail")
    return str(detail.get("capacity-reservation-id", "")) if isinstance(detail, Mapping) else ""


def close(autoscaling: AutoScaling, group: str) -> None:
    """min = max = desired = 0: the group launches nothing more and terminates its instances through its hooks."""
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=group, MinSize=0, MaxSize=0, DesiredCapacity=0)


def respond(event: Mapping[str, Any], autoscaling: AutoScaling, *, group: str, reservation: str) -> dict[str, Any]:
    """Close `group` when `event` is the expiration warning of `reservation`; anything else is left alone."""
    kind = event.get("detail-type", event.get("detail_type"))
    about = reservation_of(event)
    if kind not in WARNING_DETAIL_TYPES or about != reservation:
        return {"closed": None, "ignored": f"{kind} about {about or 'no reservation'}"}
    close(autoscaling, group)
    return {"closed": group, "reservation": reservation}


def handler(event: Mapping[str, Any], context: object) -> dict[str, Any]:
    """Lambda entry point: EventBridge delivers the EC2 event as it is."""
    import boto3  # the Lambda runtime's; imported on a call, so tests that only read this module skip it

    return respond(
        event,
        boto3.client("autoscaling"),
        group=os.environ["GROUP_NAME"],
        reservation=os.environ["CAPACITY_RESERVATION_ID"],
    )
