"""The node termination handler: its queue, the rules that feed it, its values and least privilege."""

from __future__ import annotations

import json

import pytest

from dlinfra.model.fleet.pools import DRAIN_MARGIN_SECONDS
from dlinfra.model.fleet.schema import Fleet
from tests.components._platform import Stack, asg_name, regional_stacks


@pytest.mark.parametrize("stack_name", regional_stacks())
def test_termination_handler_queue_rules_and_values(stacks: dict[str, Stack], fleet: Fleet, stack_name: str) -> None:
    stack = stacks[stack_name]
    env, region = stack.role.environment, stack.role.region
    (queue,) = stack.of_type("aws:sqs/queue:Queue")
    assert queue.inputs["sqsManagedSseEnabled"] is True
    queue_arn, queue_url = queue.outputs["arn"], queue.outputs["url"]
    rules = {
        r.name.removeprefix("platform-nth-"): r
        for r in stack.of_type("aws:cloudwatch/eventRule:EventRule")
        if r.name.startswith("platform-nth-")
    }
    patterns = {key: json.loads(rule.inputs["eventPattern"]) for key, rule in rules.items()}
    assert patterns["scheduled-change"] == {
        "source": ["aws.health"],
        "detail-type": ["AWS Health Event"],
        "detail": {
            "service": ["EC2"],
            "eventTypeCategory": ["scheduledChange"],
            "$or": [{"statusCode": ["upcoming", "open"]}, {"statusCode": [{"exists": False}]}],
        },
    }  # which events it routes: tests/components/test_maintenance.py
    assert patterns["spot-interruption"]["detail-type"] == ["EC2 Spot Instance Interruption Warning"]
    assert patterns["rebalance"]["detail-type"] == ["EC2 Instance Rebalance Recommendation"]
    assert patterns["state-change"]["detail-type"] == ["EC2 Instance State-change Notification"]
    assert patterns["asg-lifecycle"] == {
        "source": ["aws.autoscaling"],
        "detail-type": ["EC2 Instance-terminate Lifecycle Action"],
        # In pool-name order, so reordering the fleet's pools changes no pattern.
        "detail": {"AutoScalingGroupName": [asg_name(stack, p) for p in sorted(fleet.pools_in(env, region))]},
    }
    targets = [t for t in stack.of_type("aws:cloudwatch/eventTarget:EventTarget") if t.name.startswith("platform-nth-")]
    assert sorted(t.inputs["rule"] for t in targets) == sorted(r.inputs["name"] for r in rules.values())
    assert {t.inputs["arn"] for t in targets} == {queue_arn}
    (queue_policy,) = stack.of_type("aws:sqs/queuePolicy:QueuePolicy")
    assert queue_policy.inputs["queueUrl"] == queue_url
    allow, deny = json.loads(queue_policy.inputs["policy"])["Statement"]
    assert allow["Principal"] == {"Service": "events.amazonaws.com"} and allow["Action"] == "sqs:SendMessage"
    assert allow["Resource"] == queue_arn
    assert sorted(allow["Condition"]["ArnEquals"]["aws:SourceArn"]) == sorted(r.outputs["arn"] for r in rules.values())
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    values = stack.release("aws-node-termination-handler")["values"]
    assert values["enableSqsTerminationDraining"] is True and values["queueURL"] == queue_url
    assert values["cordonOnly"] is False and values["taintNode"] is True  # cordon, taint and drain
    assert values["awsRegion"] == region
    # The disruption contract: each pod drains with its own grace, and the drain waits for the longest grace any
    # pool of the region allows (train-h100's 1800 s where it runs) plus the margin, never the chart's 120 s.
    largest = max(p.checkpoint_grace for p in fleet.pools_in(env, region).values())
    assert values["podTerminationGracePeriod"] == -1
    assert values["nodeTerminationGracePeriod"] == largest + DRAIN_MARGIN_SECONDS
    assert values["logFormatVersion"] == 2  # events name their source (what-happened)
    assert values.get("heartbeatInterval", -1) == -1  # the hook's own timeout covers grace + margin
    # One drain per worker: every node the region's pools may run can drain at once (the chart's 10 would leave the
    # 11th node of a maintenance wave or a roll uncordoned until its hook ran out).
    nodes = sum(p.max_size for p in fleet.pools_in(env, region).values())
    assert values["workers"] == max(10, nodes) >= nodes


def test_termination_handler_least_privilege(stacks: dict[str, Stack], fleet: Fleet) -> None:
    stack = stacks["prod-eu-west-1"]
    (queue,) = stack.of_type("aws:sqs/queue:Queue")
    policy = json.loads(stack.by_name["platform-node-termination-handler-policy"].inputs["policy"])
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert by_sid["ConsumeQueue"]["Action"] == ["sqs:ReceiveMessage", "sqs:DeleteMessage"]
    assert by_sid["ConsumeQueue"]["Resource"] == queue.outputs["arn"]
    assert by_sid["DescribeInstances"]["Action"] == "ec2:DescribeInstances"
    lifecycle = by_sid["CompleteLifecycle"]
    assert lifecycle["Action"] == "autoscaling:CompleteLifecycleAction"
    pools = sorted(fleet.pools_in("prod", "eu-west-1"))
    assert lifecycle["Resource"] == [stack.by_name[f"pool-{p}-asg"].outputs["arn"] for p in pools]
    assert set(by_sid) == {"ConsumeQueue", "DescribeInstances", "CompleteLifecycle"}


def test_a_spot_notice_gives_two_minutes_whatever_the_grace() -> None:
    """EC2 takes a spot instance 2 minutes after its notice: the contract cannot give more, so no GPU pool is spot."""
    from components.charts import termination_handler

    assert termination_handler.SPOT_NOTICE_SECONDS == 120
    assert termination_handler.drain_timeout(1800) > termination_handler.SPOT_NOTICE_SECONDS
    assert termination_handler.largest_grace([]) == 900
