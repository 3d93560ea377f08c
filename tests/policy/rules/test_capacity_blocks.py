"""capacity-block-closes-before-cut: a pool on a Capacity Block is declared closed, and a keeper invoked every minute
and by the block's expiration warning drains it early enough that its termination hook is done before EC2's cut
(EC2 guide, "Work with Capacity Blocks" and "Monitor Capacity Blocks using EventBridge"; Auto Scaling guide, "Use
Capacity Blocks for machine learning workloads")."""

from __future__ import annotations

import json
from typing import Any

from policy.dlinfra_policy.rules.core import Resource
from tests.policy.rules._resources import ASG, LT, TAGS, messages, pass_and_fail, res

BLOCK = "cr-0a1b2c3d4e5f60718"
GROUP = "dlinfra-prod-usw2-pool-train-h100"
HOOK = "aws:autoscaling/lifecycleHook:LifecycleHook"
FUNCTION = "aws:lambda/function:Function"
RULE = "aws:cloudwatch/eventRule:EventRule"
TARGET = "aws:cloudwatch/eventTarget:EventTarget"
RULE_NAME = "ok"


def plan(
    *,
    drain: str = "2027-01-18T10:44:00Z",
    heartbeat: int = 900,
    warning: bool = True,
    tick: str | None = "rate(1 minute)",
    keeper: bool = True,
    declared_max: int = 0,
) -> list[Resource]:
    template = res(LT, "pool-train-h100-lt", id="lt-1")(
        instanceMarketOptions={"marketType": "capacity-block"},
        capacityReservationSpecification={"capacityReservationTarget": {"capacityReservationId": BLOCK}},
    )
    group = res(ASG, "pool-train-h100-asg", dependencies=[template.urn])(
        name=GROUP,
        minSize=0,
        maxSize=declared_max,
        launchTemplate={"id": "lt-1"},
        initialLifecycleHooks=[
            {"name": "drain", "lifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING", "heartbeatTimeout": 900}
        ],
    )
    hook = res(HOOK, "pool-train-h100-drain-hook", dependencies=[group.urn])(
        name="drain",
        autoscalingGroupName=GROUP,
        lifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
        heartbeatTimeout=heartbeat,
    )
    out = [template, group, hook]
    if not keeper:
        return out
    function = res(FUNCTION, "block-train-h100-keeper")(
        name="keeper",
        environment={
            "variables": {
                "GROUP_NAME": GROUP,
                "CAPACITY_RESERVATION_ID": BLOCK,
                "OPENS_AT": "2027-01-04T11:30:00Z",
                "DRAINS_AT": drain,
                "ENDS_AT": "2027-01-18T11:30:00Z",
                "MIN_SIZE": "0",
                "MAX_SIZE": "16",
            }
        },
    )
    out.append(function)
    pattern: dict[str, Any] = {
        "source": ["aws.ec2"],
        "detail-type": ["Capacity Block Delivered", "Capacity Block Expiration Warning"][: 2 if warning else 1],
        "detail": {"capacity-reservation-id": [BLOCK]},
    }
    rules = [res(RULE, "block-events")(name="events", eventPattern=json.dumps(pattern), tags=TAGS)]
    if tick is not None:
        rules.append(res(RULE, "block-tick")(name="tick", scheduleExpression=tick, tags=TAGS))
    for rule in rules:
        out.append(rule)
        out.append(
            res(TARGET, f"{rule.name}-target", dependencies=[function.urn])(rule=rule.inputs["name"], arn="arn:f")
        )
    return out


CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "capacity-block-closes-before-cut": (plan(), plan(keeper=False)),
}

test_rule_passes_good_resources, test_rule_flags_bad_resources = pass_and_fail(CASES)


def test_a_drain_too_late_for_the_hook_is_flagged() -> None:
    # A 15-minute hook and a keeper that may act a minute late: drained at 10:45, an instance may still be held at
    # EC2's cut, 11:00.
    (message,) = messages("capacity-block-closes-before-cut", plan(drain="2027-01-18T10:45:00Z"))
    assert "drain by 2027-01-18T10:44:00Z" in message
    # The rule reads the hook resource that replaces the 900 s initial hook: a 30-minute hold needs 10:29.
    (message,) = messages("capacity-block-closes-before-cut", plan(heartbeat=1800))
    assert "drain by 2027-01-18T10:29:00Z" in message


def test_a_keeper_without_the_warning_is_flagged() -> None:
    (message,) = messages("capacity-block-closes-before-cut", plan(warning=False))
    assert "Capacity Block Expiration Warning" in message


def test_a_keeper_that_does_not_tick_every_minute_is_flagged() -> None:
    for tick in (None, "rate(5 minutes)"):
        (message,) = messages("capacity-block-closes-before-cut", plan(tick=tick))
        assert "every minute" in message


def test_a_group_the_keeper_opened_passes() -> None:
    """Inside the window the group's outputs, which a stack rule sees, carry the keeper's max: no violation."""
    assert messages("capacity-block-closes-before-cut", plan(declared_max=16)) == []
