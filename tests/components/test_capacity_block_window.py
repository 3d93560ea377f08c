"""The keeper of a block pool's group: open inside the window, closed outside it, closed by EC2's warning whatever the
clock says, opened by EC2's Delivered event, deaf to other blocks' events.

The handler runs against moto's Auto Scaling in this process (no network): the group it sizes is a real group of
moto's (created open, as after someone opened it by hand, or closed, as Pulumi declares it).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from components.lambdas import capacity_block_window as keeper

RESERVATION = "cr-0a1b2c3d4e5f60718"
GROUP = "dlinfra-prod-usw2-pool-train-h100"
OPENS = datetime.datetime(2027, 1, 4, 11, 30, tzinfo=datetime.UTC)
DRAINS = datetime.datetime(2027, 1, 18, 10, 24, tzinfo=datetime.UTC)
WINDOW = keeper.Window(GROUP, RESERVATION, OPENS, DRAINS, min_size=2, max_size=16)
TICK = {"version": "0", "detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}
MINUTE = datetime.timedelta(minutes=1)


def event(kind: str, reservation: str = RESERVATION) -> dict[str, Any]:
    """An EC2 block event as the EC2 guide shows it ("Monitor Capacity Blocks using EventBridge")."""
    return {
        "version": "0",
        "detail-type": kind,
        "source": "aws.ec2",
        "account": "123456789012",
        "region": "us-west-2",
        "resources": [f"arn:aws:ec2:us-west-2:123456789012:capacity-reservation/{reservation}"],
        "detail": {"capacity-reservation-id": reservation, "end-date": "2027-01-18T11:30:00Z"},
    }


def make_group(client: Any, low: int, high: int, desired: int) -> None:
    client.update_auto_scaling_group(AutoScalingGroupName=GROUP, MinSize=low, MaxSize=high, DesiredCapacity=desired)


@pytest.fixture
def autoscaling() -> Iterator[Any]:
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-west-2")
        image = ec2.describe_images()["Images"][0]["ImageId"]
        ec2.create_launch_template(
            LaunchTemplateName="train-h100", LaunchTemplateData={"ImageId": image, "InstanceType": "t3.micro"}
        )
        client = boto3.client("autoscaling", region_name="us-west-2")
        client.create_auto_scaling_group(  # as Pulumi declares a block pool: closed
            AutoScalingGroupName=GROUP,
            LaunchTemplate={"LaunchTemplateName": "train-h100"},
            MinSize=0,
            MaxSize=0,
            DesiredCapacity=0,
            AvailabilityZones=["us-west-2a"],
        )
        yield client


def sizes(client: Any) -> tuple[int, int, int]:
    (group,) = client.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"]
    return group["MinSize"], group["MaxSize"], group["DesiredCapacity"]


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        pytest.param(OPENS - MINUTE, (0, 0, 0), id="before"),
        # Inside, the desired size stays the autoscaler's (4 here).
        pytest.param(OPENS, (2, 16, 4), id="at-start"),
        pytest.param(DRAINS - MINUTE, (2, 16, 4), id="last-minute"),
        pytest.param(DRAINS, (0, 0, 0), id="at-drain"),
        pytest.param(DRAINS + datetime.timedelta(days=30), (0, 0, 0), id="long-after"),
    ],
)
def test_each_tick_sets_the_group_from_the_clock(
    autoscaling: Any, now: datetime.datetime, expected: tuple[int, int, int]
) -> None:
    make_group(autoscaling, 0, 16, 4)  # whatever it was: opened by hand, or left by the last tick
    keeper.respond(TICK, autoscaling, WINDOW, now)
    assert sizes(autoscaling) == expected


def test_the_keeper_converges_from_any_state(autoscaling: Any) -> None:
    """An apply after the block started (the case one-time scheduled actions fail) just needs the next tick."""
    inside = OPENS + datetime.timedelta(days=3)
    assert keeper.respond(TICK, autoscaling, WINDOW, inside)["why"] == "inside-window"
    assert sizes(autoscaling) == (2, 16, 2)
    keeper.respond(TICK, autoscaling, WINDOW, inside + MINUTE)  # idempotent
    assert sizes(autoscaling) == (2, 16, 2)


@pytest.mark.parametrize("kind", keeper.WARNING_DETAIL_TYPES)
def test_the_warning_closes_the_group_whatever_the_clock_says(autoscaling: Any, kind: str) -> None:
    make_group(autoscaling, 2, 16, 4)
    answer = keeper.respond(event(kind), autoscaling, WINDOW, OPENS + datetime.timedelta(days=1))
    assert answer["why"] == "expiration-warning"
    assert sizes(autoscaling) == (0, 0, 0)


@pytest.mark.parametrize("kind", keeper.DELIVERED_DETAIL_TYPES)
def test_delivery_opens_the_group_before_the_next_tick(autoscaling: Any, kind: str) -> None:
    assert keeper.respond(event(kind), autoscaling, WINDOW, OPENS - datetime.timedelta(seconds=5))["why"] == "delivered"
    assert sizes(autoscaling) == (2, 16, 2)
    # ... but never after the drain time
    assert keeper.respond(event(kind), autoscaling, WINDOW, DRAINS)["why"] == "after-drain"
    assert sizes(autoscaling) == (0, 0, 0)


@pytest.mark.parametrize("kind", [*keeper.WARNING_DETAIL_TYPES, *keeper.DELIVERED_DETAIL_TYPES])
def test_another_blocks_events_leave_the_group_alone(autoscaling: Any, kind: str) -> None:
    make_group(autoscaling, 2, 16, 4)
    answer = keeper.respond(event(kind, "cr-0fffffffffffffff0"), autoscaling, WINDOW, OPENS + MINUTE)
    assert answer["group"] is None
    assert sizes(autoscaling) == (2, 16, 4)


def test_the_handler_reads_its_window_from_the_environment(autoscaling: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "GROUP_NAME": GROUP,
        "CAPACITY_RESERVATION_ID": RESERVATION,
        "OPENS_AT": "2027-01-04T11:30:00Z",
        "DRAINS_AT": "2027-01-18T10:24:00Z",
        "MIN_SIZE": "2",
        "MAX_SIZE": "16",
        "AWS_DEFAULT_REGION": "us-west-2",
    }.items():
        monkeypatch.setenv(key, value)
    assert keeper.Window.from_environment(os.environ) == WINDOW
    make_group(autoscaling, 2, 16, 4)
    assert keeper.handler(event(keeper.WARNING_DETAIL_TYPES[0]), None)["why"] == "expiration-warning"
    assert sizes(autoscaling) == (0, 0, 0)


class _Busy:
    """A client whose group is busy for the first `busy` calls (botocore's ClientError shape)."""

    def __init__(self, busy: int, code: str = "ScalingActivityInProgress") -> None:
        self.busy, self.code, self.calls = busy, code, 0

    def update_auto_scaling_group(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.busy:
            error = RuntimeError(self.code)
            error.response = {"Error": {"Code": self.code}}  # type: ignore[attr-defined]
            raise error
        return {}


def test_a_busy_group_is_tried_again_within_the_call() -> None:
    """A scaling activity in progress at the drain time must not cost a whole tick of the drain's budget."""
    pauses: list[float] = []
    client = _Busy(busy=3)
    answer = keeper.respond(TICK, client, WINDOW, DRAINS, sleep=pauses.append)
    assert answer["why"] == "after-drain" and client.calls == 4 and sum(pauses) == 14
    with pytest.raises(RuntimeError):
        keeper.respond(TICK, _Busy(busy=4), WINDOW, DRAINS, sleep=pauses.append)  # then the next tick
    with pytest.raises(RuntimeError):
        keeper.respond(TICK, _Busy(busy=1, code="ValidationError"), WINDOW, DRAINS, sleep=pauses.append)
