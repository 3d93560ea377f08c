"""CapacityBlockWindow: a node pool's Auto Scaling group admits instances only inside its Capacity Block's window,
and is drained early enough that every job checkpoints before EC2's cut.

EC2 terminates a block's instances 30 minutes before its end, and the Auto Scaling guide says to scale the group to
zero before that, leaving lifecycle hooks time for a graceful shutdown ("Use Capacity Blocks for machine learning
workloads", operational guidelines). The pool's group is declared closed (components/nodepool.py: min = max = 0,
sizes ignored after creation), and a keeper function (components/lambdas/capacity_block_window.py) sets it every
minute to what the clock says: the pool's sizes from the block's start, 0 from `drain_at` (end - 30 min - the pool's
checkpoint grace - the drain margin - one tick). EC2's own events reach it too: "Capacity Block Delivered" opens the
group at once, "Capacity Block Expiration Warning" (40 minutes before the end) closes it whatever the clock says.

Why not two one-time scheduled actions: Auto Scaling refuses one whose start time has passed
(PutScheduledUpdateGroupAction) and forgets it once it has run, so a first apply after the block started would fail,
and so would every apply after a refresh. The keeper holds no such state.

Kueue's side: the block's flavor admits work only inside the window, opened and closed by its own keeper in the
cluster (components/block_flavors.py); and a block pool's flavor carries the provisioning check (capacity arrives
whole), while the cluster-autoscaler cannot grow a group beyond its max.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws

from components import lambda_function
from components.lambdas.capacity_block_window import DELIVERED_DETAIL_TYPES, TIME_FORMAT, WARNING_DETAIL_TYPES
from dlinfra.model.fleet.checks import BLOCK_CUT
from dlinfra.model.fleet.pools import DRAIN_MARGIN_SECONDS
from dlinfra.model.naming import Names

KEEPER = Path(__file__).parent / "lambdas" / "capacity_block_window.py"
# The keeper's schedule (EventBridge rate expression) and how late a tick may set the group: the drain time is
# brought forward by one tick, so the group is closed by `drain_at` + TICK at the latest.
TICK = datetime.timedelta(minutes=1)
TICK_SCHEDULE = "rate(1 minute)"
# Tags on the block's event rule: which block it guards and its window (rule `capacity-block-closes-before-cut`
# and `dlinfra cost` read them).
BLOCK_TAG = "dlinfra:capacity-block"
BLOCK_START_TAG = "dlinfra:capacity-block-start"
BLOCK_END_TAG = "dlinfra:capacity-block-end"


def drain_at(end: datetime.datetime, checkpoint_grace: int) -> datetime.datetime:
    """When the pool's group closes: early enough that, one tick late, a pod given its whole grace and the node its
    margin are gone before EC2 starts terminating the block's instances."""
    return end - BLOCK_CUT - datetime.timedelta(seconds=checkpoint_grace + DRAIN_MARGIN_SECONDS) - TICK


def utc_text(moment: datetime.datetime) -> str:
    """YYYY-MM-DDThh:mm:ssZ in UTC: the keeper's environment and the rule's tags."""
    return moment.astimezone(datetime.UTC).strftime(TIME_FORMAT)


def block_events_pattern(reservation_id: str) -> dict[str, object]:
    """The EventBridge pattern of EC2's Delivered and Expiration Warning events for one Capacity Block (source
    aws.ec2, the reservation in detail.capacity-reservation-id: "Monitor Capacity Blocks using EventBridge")."""
    return {
        "source": ["aws.ec2"],
        "detail-type": [*DELIVERED_DETAIL_TYPES, *WARNING_DETAIL_TYPES],
        "detail": {"capacity-reservation-id": [reservation_id]},
    }


@dataclass(frozen=True, kw_only=True)
class CapacityBlockWindowArgs:
    names: Names  # naming and tags of this (regional) stack
    pool: str  # the pool's name in the fleet (stable: part of every child's name)
    reservation_id: str  # the Capacity Block's capacity reservation id (cr-...)
    start: datetime.datetime  # the block's StartDate (aware, UTC)
    end: datetime.datetime  # the block's EndDate (aware, UTC)
    group_name: pulumi.Input[str]  # the pool's Auto Scaling group, declared closed (min = max = 0)
    group_arn: pulumi.Input[str]  # the same group's ARN: all the keeper may update
    min_size: int  # the pool's min_size: what the group holds inside the window
    max_size: int  # the pool's max_size: what the group may grow to inside the window
    checkpoint_grace: int  # seconds: the longest grace a pod of the pool gets (fleet checkpoint_grace, default 900)
    log_kms_key_arn: pulumi.Input[str]  # KMS key of the keeper's log group (Network.log_key_arn)
    log_retention_days: int = 365  # days the keeper's logs are kept

    def __post_init__(self) -> None:
        for field in ("start", "end"):
            if getattr(self, field).utcoffset() is None:
                raise ValueError(f"{self.pool}: {field}: give an aware UTC datetime")
        if self.end <= self.start:
            raise ValueError(f"{self.pool}: end: the window ends before it starts")
        if not 0 <= self.min_size <= self.max_size:
            raise ValueError(f"{self.pool}: min_size/max_size: need 0 <= min <= max")
        if self.checkpoint_grace < 0:
            raise ValueError(f"{self.pool}: checkpoint_grace: seconds, 0 or more")
        if drain_at(self.end, self.checkpoint_grace) <= self.start:
            raise ValueError(
                f"{self.pool}: the block's window ({utc_text(self.start)} to {utc_text(self.end)}) is shorter than "
                f"EC2's 30-minute cut plus the pool's {self.checkpoint_grace} s grace and {DRAIN_MARGIN_SECONDS} s "
                "drain margin: the pool would close before it opened"
            )


class CapacityBlockWindow(pulumi.ComponentResource):
    """The keeper of a pool's group, invoked every minute and by EC2's events for the block."""

    drain_time: str  # when the group closes, YYYY-MM-DDThh:mm:ssZ
    rule_arn: pulumi.Output[str]  # the rule routing EC2's block events
    function_arn: pulumi.Output[str]

    def __init__(self, name: str, args: CapacityBlockWindowArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:compute:CapacityBlockWindow", name, None, opts)
        names = args.names
        child = pulumi.ResourceOptions(parent=self)
        component = f"pool-{args.pool}"
        self.drain_time = utc_text(drain_at(args.end, args.checkpoint_grace))

        function_name = names.physical("capacity-block", args.pool, max_len=64)
        tags = names.tags(component, function_name)
        function = lambda_function.declare(
            name,
            parent=self,
            resource_name=f"{name}-keeper",
            function_name=function_name,
            role_name=function_name,
            description=f"Keeps pool {args.pool}'s group open only inside Capacity Block {args.reservation_id}",
            source=KEEPER,
            policy_name="keep-pool-in-block-window",
            tags=tags,
            log_kms_key_arn=args.log_kms_key_arn,
            log_retention_days=args.log_retention_days,
            timeout=30,  # one UpdateAutoScalingGroup call, tried again while the group is busy
            statements=[
                {
                    # UpdateAutoScalingGroup takes the autoScalingGroup resource type (Service Authorization
                    # Reference, Amazon EC2 Auto Scaling): this pool's group, no other.
                    "Sid": "SizePool",
                    "Effect": "Allow",
                    "Action": "autoscaling:UpdateAutoScalingGroup",
                    "Resource": args.group_arn,
                }
            ],
            # None of it is secret; a customer key would add a key-policy dependency and protect nothing.
            environment={
                "GROUP_NAME": args.group_name,
                "CAPACITY_RESERVATION_ID": args.reservation_id,
                "OPENS_AT": utc_text(args.start),
                "DRAINS_AT": self.drain_time,
                "ENDS_AT": utc_text(args.end),
                "MIN_SIZE": str(args.min_size),
                "MAX_SIZE": str(args.max_size),
            },
        )
        rule_name = names.physical("capacity-block", args.pool, max_len=64)
        rule = aws.cloudwatch.EventRule(
            f"{name}-events",
            name=rule_name,
            description=f"EC2's Delivered and Expiration Warning events of Capacity Block {args.reservation_id}",
            event_pattern=json.dumps(block_events_pattern(args.reservation_id), sort_keys=True),
            tags=names.tags(
                component,
                rule_name,
                extra={
                    BLOCK_TAG: args.reservation_id,
                    BLOCK_START_TAG: utc_text(args.start),
                    BLOCK_END_TAG: utc_text(args.end),
                },
            ),
            opts=child,
        )
        tick_name = names.physical("capacity-block-tick", args.pool, max_len=64)
        tick = aws.cloudwatch.EventRule(
            f"{name}-tick",
            name=tick_name,
            description=f"Every minute: pool {args.pool}'s group sized for Capacity Block {args.reservation_id}'s "
            "window",
            schedule_expression=TICK_SCHEDULE,
            tags=names.tags(component, tick_name, extra={BLOCK_TAG: args.reservation_id}),
            opts=child,
        )
        for key, source in (("events", rule), ("tick", tick)):
            permission = aws.lambda_.Permission(
                f"{name}-invoke-{key}",
                action="lambda:InvokeFunction",
                function=function.name,
                principal="events.amazonaws.com",
                source_arn=source.arn,
                opts=pulumi.ResourceOptions(parent=function),
            )
            aws.cloudwatch.EventTarget(
                f"{name}-target-{key}",
                rule=source.name,
                arn=function.arn,
                # A late call is worth nothing: the warning leaves 10 minutes, and the next tick comes in one
                # (EventBridge retries for 24 hours and 185 times by default, "Event retry policy").
                retry_policy=aws.cloudwatch.EventTargetRetryPolicyArgs(
                    maximum_event_age_in_seconds=300 if key == "events" else 60, maximum_retry_attempts=10
                ),
                opts=pulumi.ResourceOptions(parent=source, depends_on=[permission]),
            )

        self.rule_arn = rule.arn
        self.function_arn = function.arn
        self.register_outputs(
            {"drain_time": self.drain_time, "rule_arn": self.rule_arn, "function_arn": self.function_arn}
        )
