"""aws-node-termination-handler in queue mode: its values, the events that feed its queue, its IAM and queue policy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pulumi

from components.charts.nodes import CLOUD_NODE_AFFINITY
from dlinfra.model.fleet.pools import DEFAULT_CHECKPOINT_GRACE, DRAIN_MARGIN_SECONDS

TERMINATION_HANDLER_SA = "aws-node-termination-handler"

# What the termination handler listens to, by rule. Patterns follow the AWS event shapes NTH's queue processor reads.
TERMINATION_EVENTS: Mapping[str, dict[str, Any]] = {
    # AWS Health scheduled changes for EC2: every AWS_EC2_*_SCHEDULED type (retirement, stop, reboot, network and
    # power maintenance), by category rather than by a list of type codes that AWS extends. Health sends the event
    # when it announces the change ("upcoming", about two weeks ahead for MAINTENANCE_SCHEDULED types) and again
    # on each update; the handler cordons, taints and drains on every one it gets (docs/maintenance.md). A
    # "closed" update means the work is done or cancelled: draining then would empty a node back in service. The
    # second branch keeps events without a statusCode (NTH's own example has none) rather than miss a maintenance.
    # Sources: AWS Health user guide, "Reference: AWS Health events Amazon EventBridge schema"; NTH v1.25.6
    # pkg/monitor/sqsevent/scheduled-change-event.go (service EC2, eventTypeCategory scheduledChange).
    "scheduled-change": {
        "source": ["aws.health"],
        "detail-type": ["AWS Health Event"],
        "detail": {
            "service": ["EC2"],
            "eventTypeCategory": ["scheduledChange"],
            "$or": [{"statusCode": ["upcoming", "open"]}, {"statusCode": [{"exists": False}]}],
        },
    },
    "spot-interruption": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "state-change": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Instance State-change Notification"],
        # The states NTH drains on; running/pending notifications would only be noise in the queue.
        "detail": {"state": ["stopping", "stopped", "shutting-down", "terminated"]},
    },
}
# EC2 reclaims a spot instance two minutes after its interruption notice (EC2 guide "Spot Instance interruption
# notices"): no drain can give a pod more, whatever its grace. The handler drains at once on the notice (NTH v1.25.6
# pkg/monitor/sqsevent/spot-itn-event.go: StartTime is the event's time, so TimeUntilDrain is already past), so a
# pod gets SIGTERM at once and its grace until EC2 takes the instance. GPU pools never run on spot
# (dlinfra.model.fleet.pools.NodePool), so a GPU job's grace is cut this way only on a CPU spot pool.
SPOT_NOTICE_SECONDS = 120
LIFECYCLE_RULE = "asg-lifecycle"  # added per stack: it is filtered to this cluster's Auto Scaling groups


DEFAULT_WORKERS = 10  # the chart's `workers` (aws-node-termination-handler chart 0.27.6 values.yaml)


def handler_workers(nodes: int) -> int:
    """Drains the handler runs at once: one per node the region's pools may run, never below the chart's 10."""
    return max(DEFAULT_WORKERS, nodes)


def largest_grace(graces: Iterable[int]) -> int:
    """The longest checkpoint grace among a region's pools (the default when it has none)."""
    return max(graces, default=DEFAULT_CHECKPOINT_GRACE)


def drain_timeout(checkpoint_grace: int) -> int:
    """The handler's drain timeout (nodeTerminationGracePeriod) for a region whose largest pool grace is this."""
    return checkpoint_grace + DRAIN_MARGIN_SECONDS


def termination_handler_values(
    queue_url: pulumi.Input[str],
    region: str,
    checkpoint_grace: int = DEFAULT_CHECKPOINT_GRACE,
    nodes: int = DEFAULT_WORKERS,
) -> dict[str, Any]:
    """aws-node-termination-handler in queue-processor mode: cordon, taint and drain before the node goes.

    `checkpoint_grace`: the largest checkpoint_grace among the region's pools; the drain waits that long and more.
    Every event the queue brings (AWS Health maintenance, spot interruption, rebalance recommendation, state
    change, Auto Scaling termination = scale-in and `pool roll`) goes down the same path: taint, cordon, then
    evict every pod with its own grace, waiting for all of them, then (for a lifecycle action) complete the hook.
    """
    return {
        "enableSqsTerminationDraining": True,
        "queueURL": queue_url,
        "awsRegion": region,
        "serviceAccount": {"create": True, "name": TERMINATION_HANDLER_SA},
        # Drain, not only cordon; and taint nodes with scheduled maintenance so nothing new starts there.
        "cordonOnly": False,
        "taintNode": True,
        "deleteLocalData": True,
        "ignoreDaemonSets": True,
        "podTerminationGracePeriod": -1,  # each pod's own grace period: training jobs checkpoint on SIGTERM
        # The drain's timeout: NTH v1.25.6 pkg/node/node.go getDrainHelper sets drain.Helper Timeout from it, and
        # a drain that times out is an error (no CompleteLifecycleAction: the hook then runs out). Its other use,
        # scheduling the drain this long before the event (interruptioneventstore TimeUntilDrain), does nothing in
        # queue mode: every queue event starts now or at the event's time. The chart's default, 120 s, would give
        # up on a checkpointing pod long before its grace; the largest pool grace plus the margin never does.
        "nodeTerminationGracePeriod": drain_timeout(checkpoint_grace),
        # Kubernetes events whose reason names the source (ScheduledEvent, SpotInterruption,
        # RebalanceRecommendation, StateChange, ASGLifecycle) instead of v1's one "SQSTermination" for all queue
        # events (NTH v1.25.6 pkg/observability/k8s-events.go getReasonForKindV2): `dlinfra what-happened` reads them.
        "logFormatVersion": 2,
        # One drain per worker at a time: the handler takes a queue event only when a worker is free
        # (cmd/node-termination-handler.go, v1.25.6), and with the grace above a drain holds its worker up to
        # grace + margin. With the chart's 10 (values.yaml `workers`), a maintenance wave or a roll touching more
        # nodes would leave the 11th uncordoned until its hook or EC2's deadline passed. `nodes`: every node the
        # region's pools may run, so each can drain at once.
        "workers": handler_workers(nodes),
        # Lifecycle heartbeats (heartbeatInterval/heartbeatUntil, queue mode only since NTH v1.25.0) stay off: each
        # pool's termination hook already holds a node for its grace plus the margin (components/nodepool.py
        # termination_hook_timeout, at most 3900 s of the 7200 s AWS allows), which a single timeout covers.
        # Rebalance recommendations: in queue mode the handler drains on them like on any other event
        # (pkg/interruptionevent/draincordon/handler.go: cordon-only applies to IMDS mode without
        # enableRebalanceDraining, which the chart documents as IMDS-only). EC2 sends them for spot instances only,
        # i.e. CPU spot pools: draining at the recommendation gives pods more time than the 2-minute notice would.
        # The rules see every instance of the account and region; the handler acts only on nodes of its own
        # cluster (others are not found) and drops those messages instead of letting them pile up.
        "checkTagBeforeDraining": False,
        "deleteSqsMsgIfNodeNotFound": True,
        "emitKubernetesEvents": True,
        "replicas": 2,
        "podDisruptionBudget": {"maxUnavailable": 1},
        "affinity": CLOUD_NODE_AFFINITY,
    }


def termination_handler_policy(queue_arn: pulumi.Input[str], asg_arns: Sequence[pulumi.Input[str]]) -> dict[str, Any]:
    """Consume the queue, look instances up, and complete lifecycle hooks of this cluster's groups only."""
    statements: list[dict[str, Any]] = [
        {
            "Sid": "ConsumeQueue",
            "Effect": "Allow",
            "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage"],
            "Resource": queue_arn,
        },
        {"Sid": "DescribeInstances", "Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"},
    ]
    if asg_arns:
        statements.append(
            {
                "Sid": "CompleteLifecycle",
                "Effect": "Allow",
                "Action": "autoscaling:CompleteLifecycleAction",
                "Resource": list(asg_arns),
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}


def queue_policy(queue_arn: pulumi.Input[str], rule_arns: Sequence[pulumi.Input[str]]) -> dict[str, Any]:
    """EventBridge may send only from our rules; nothing may use the queue without TLS."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "FromEventBridgeRules",
                "Effect": "Allow",
                "Principal": {"Service": "events.amazonaws.com"},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"ArnEquals": {"aws:SourceArn": list(rule_arns)}},
            },
            {
                "Sid": "DenyInsecureTransport",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "sqs:*",
                "Resource": queue_arn,
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
        ],
    }


def lifecycle_pattern(asg_names: Sequence[pulumi.Input[str]]) -> dict[str, Any]:
    """ASG termination lifecycle actions of this cluster's groups (other clusters' hooks are theirs)."""
    return {
        "source": ["aws.autoscaling"],
        "detail-type": ["EC2 Instance-terminate Lifecycle Action"],
        "detail": {"AutoScalingGroupName": list(asg_names)},
    }
