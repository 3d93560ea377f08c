"""The backstop of a block's end: EC2's expiration warning closes the pool's group (min = max = desired = 0).

The handler runs against moto's Auto Scaling in this process (no network): the group it closes is a real group of
moto's with instances, and any other event or reservation leaves it alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from components.lambdas import capacity_block_close as closer

RESERVATION = "cr-0a1b2c3d4e5f60718"
GROUP = "dlinfra-prod-usw2-pool-train-h100"


def warning(reservation: str = RESERVATION, kind: str = "Capacity Block Expiration Warning") -> dict[str, Any]:
    """The event as the EC2 guide shows it ("Monitor Capacity Blocks using EventBridge"), as EventBridge sends it."""
    return {
        "version": "0",
        "detail-type": kind,
        "source": "aws.ec2",
        "account": "123456789012",
        "region": "us-west-2",
        "resources": [f"arn:aws:ec2:us-west-2:123456789012:capacity-reservation/{reservation}"],
        "detail": {"capacity-reservation-id": reservation, "end-date": "2027-01-18T11:30:00Z"},
    }


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
        client.create_auto_scaling_group(
            AutoScalingGroupName=GROUP,
            LaunchTemplate={"LaunchTemplateName": "train-h100"},
            MinSize=2,
            MaxSize=16,
            DesiredCapacity=4,
            AvailabilityZones=["us-west-2a"],
        )
        yield client


def sizes(client: Any) -> tuple[int, int, int]:
    (group,) = client.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"]
    return group["MinSize"], group["MaxSize"], group["DesiredCapacity"]


@pytest.mark.parametrize("kind", closer.WARNING_DETAIL_TYPES)
def test_the_warning_closes_the_group(autoscaling: Any, kind: str) -> None:
    answer = closer.respond(warning(kind=kind), autoscaling, group=GROUP, reservation=RESERVATION)
    assert answer == {"closed": GROUP, "reservation": RESERVATION}
    assert sizes(autoscaling) == (0, 0, 0)


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(warning("cr-0fffffffffffffff0"), id="another-block"),
        pytest.param(warning(kind="Capacity Block Delivered"), id="delivered"),
        pytest.param({"detail-type": "Capacity Block Expiration Warning"}, id="no-detail"),
    ],
)
def test_anything_else_leaves_the_group_alone(autoscaling: Any, event: dict[str, Any]) -> None:
    answer = closer.respond(event, autoscaling, group=GROUP, reservation=RESERVATION)
    assert answer["closed"] is None
    assert sizes(autoscaling) == (2, 16, 4)


def test_the_handler_reads_its_group_from_the_environment(autoscaling: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GROUP_NAME", GROUP)
    monkeypatch.setenv("CAPACITY_RESERVATION_ID", RESERVATION)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert closer.handler(warning(), None)["closed"] == GROUP
    assert sizes(autoscaling) == (0, 0, 0)
