"""capacity-block-closes-before-cut: a pool on a Capacity Block is set to 0 by a scheduled action early enough that
its termination hook is done before EC2's cut (EC2 guide, "Work with Capacity Blocks"; Auto Scaling guide, "Use
Capacity Blocks for machine learning workloads"), and the block's expiration warning is routed ("Monitor Capacity
Blocks using EventBridge")."""

from __future__ import annotations

import json
from typing import Any

from policy.dlinfra_policy.rules.core import Resource
from tests.policy.rules._resources import ASG, LT, TAGS, messages, pass_and_fail, res

BLOCK = "cr-0a1b2c3d4e5f60718"
GROUP = "dlinfra-prod-usw2-pool-train-h100"
SCHEDULE = "aws:autoscaling/schedule:Schedule"
RULE = "aws:cloudwatch/eventRule:EventRule"
TARGET = "aws:cloudwatch/eventTarget:EventTarget"
END = "2027-01-18T11:30:00Z"


def plan(*, drain: str | None = "2027-01-18T10:40:00Z", heartbeat: int = 900, routed: bool = True) -> list[Resource]:
    template = res(LT, "pool-train-h100-lt", id="lt-1")(
        instanceMarketOptions={"marketType": "capacity-block"},
        capacityReservationSpecification={"capacityReservationTarget": {"capacityReservationId": BLOCK}},
    )
    group = res(ASG, "pool-train-h100-asg", dependencies=[template.urn])(
        name=GROUP,
        minSize=0,
        maxSize=0,
        launchTemplate={"id": "lt-1"},
        initialLifecycleHooks=[
            {"lifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING", "heartbeatTimeout": heartbeat}
        ],
    )
    out = [template, group]
    out.append(
        res(SCHEDULE, "block-open")(
            autoscalingGroupName=GROUP, startTime="2027-01-04T11:30:00Z", minSize=0, maxSize=16, desiredCapacity=-1
        )
    )
    if drain is not None:
        out.append(
            res(SCHEDULE, "block-drain")(
                autoscalingGroupName=GROUP, startTime=drain, minSize=0, maxSize=0, desiredCapacity=0
            )
        )
    pattern: dict[str, Any] = {
        "source": ["aws.ec2"],
        "detail-type": ["Capacity Block Expiration Warning"],
        "detail": {"capacity-reservation-id": [BLOCK]},
    }
    tags = TAGS | {"dlinfra:capacity-block": BLOCK, "dlinfra:capacity-block-end": END}
    out.append(res(RULE, "block-warning")(name="block-end", eventPattern=json.dumps(pattern), tags=tags))
    if routed:
        out.append(res(TARGET, "block-target")(rule="block-end", arn="arn:aws:lambda:us-west-2:1:function:f"))
    return out


CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "capacity-block-closes-before-cut": (plan(), plan(drain=None)),
}

test_rule_passes_good_resources, test_rule_flags_bad_resources = pass_and_fail(CASES)


def test_a_drain_too_late_for_the_hook_is_flagged() -> None:
    # Closed at 10:50 with a 15-minute hook: an instance may still be held at EC2's cut, 11:00.
    (message,) = messages("capacity-block-closes-before-cut", plan(drain="2027-01-18T10:50:00Z"))
    assert "close by 2027-01-18T10:45:00Z" in message
    assert messages("capacity-block-closes-before-cut", plan(drain="2027-01-18T10:45:00Z")) == []


def test_an_unrouted_warning_is_flagged() -> None:
    (message,) = messages("capacity-block-closes-before-cut", plan(routed=False))
    assert "Capacity Block Expiration Warning" in message
