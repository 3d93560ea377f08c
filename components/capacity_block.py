"""CapacityBlockWindow: a node pool's Auto Scaling group admits instances only inside its Capacity Block's window,
and is drained early enough that every job checkpoints before EC2's cut.

EC2 terminates a block's instances 30 minutes before its end, and the Auto Scaling guide says to scale the group to
zero before that, with scheduled scaling at the reservation's times and lifecycle hooks for a graceful shutdown
("Use Capacity Blocks for machine learning workloads", operational guidelines). So: the pool's group is declared
closed (components/nodepool.py), a one-time scheduled action opens it at the block's start, and another closes it
(min = max = desired = 0) at end - 30 min - the pool's checkpoint grace - DRAIN_MARGIN_SECONDS. Auto Scaling then
terminates each instance through the group's termination hook, which the node termination handler answers after
draining the node (each pod: SIGTERM, then its own terminationGracePeriodSeconds). EC2's expiration warning, 40
minutes before the end ("Monitor Capacity Blocks using EventBridge"), closes the group too, as a backstop.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws

from components.iam import service_trust
from components.lambdas.capacity_block_close import WARNING_DETAIL_TYPES
from dlinfra.model.fleet.checks import BLOCK_CUT
from dlinfra.model.naming import Names

CLOSER = Path(__file__).parent / "lambdas" / "capacity_block_close.py"
# Time to evict, detach and answer the termination hook, on top of the pods' grace (the disruption contract).
DRAIN_MARGIN_SECONDS = 300
# The scheduled actions' names on the group (unique per group: PutScheduledUpdateGroupAction ScheduledActionName).
OPEN_ACTION = "capacity-block-open"
DRAIN_ACTION = "capacity-block-drain"
# The tag on the warning rule that says which block's end it guards (rule `capacity-block-closes-before-cut`).
BLOCK_END_TAG = "dlinfra:capacity-block-end"
BLOCK_TAG = "dlinfra:capacity-block"


def drain_at(end: datetime.datetime, checkpoint_grace: int) -> datetime.datetime:
    """When the pool's group closes: early enough that a pod given its whole grace, and the node its margin, are
    gone before EC2 starts terminating the block's instances."""
    return end - BLOCK_CUT - datetime.timedelta(seconds=checkpoint_grace + DRAIN_MARGIN_SECONDS)


def utc_text(moment: datetime.datetime) -> str:
    """The form scheduled actions take: YYYY-MM-DDThh:mm:ssZ, in UTC (PutScheduledUpdateGroupAction StartTime)."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def warning_pattern(reservation_id: str) -> dict[str, object]:
    """The EventBridge pattern of EC2's expiration warning for one Capacity Block (source aws.ec2, the reservation
    in detail.capacity-reservation-id: "Monitor Capacity Blocks using EventBridge")."""
    return {
        "source": ["aws.ec2"],
        "detail-type": list(WARNING_DETAIL_TYPES),
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
    group_arn: pulumi.Input[str]  # the same group's ARN: all the closer may update
    min_size: int  # the pool's min_size: what the group holds inside the window
    max_size: int  # the pool's max_size: what the group may grow to inside the window
    checkpoint_grace: int  # seconds: the longest grace a pod of the pool gets (fleet checkpoint_grace, default 900)
    log_kms_key_arn: pulumi.Input[str]  # KMS key of the closer's log group (Network.log_key_arn)
    log_retention_days: int = 365  # days the closer's logs are kept

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
    """Scheduled open and drain of a pool's group, and the expiration warning routed to a function that closes it."""

    drain_time: str  # when the group closes, YYYY-MM-DDThh:mm:ssZ
    rule_arn: pulumi.Output[str]
    function_arn: pulumi.Output[str]

    def __init__(self, name: str, args: CapacityBlockWindowArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:compute:CapacityBlockWindow", name, None, opts)
        names = args.names
        child = pulumi.ResourceOptions(parent=self)
        component = f"pool-{args.pool}"
        self.drain_time = utc_text(drain_at(args.end, args.checkpoint_grace))

        # One-time actions (a start time, no recurrence: Auto Scaling guide, "Scheduled scaling"). Auto Scaling
        # refuses an action scheduled in the past (PutScheduledUpdateGroupAction), so `validate` warns of a block
        # that has ended: remove it from the fleet.
        aws.autoscaling.Schedule(
            f"{name}-open",
            scheduled_action_name=OPEN_ACTION,
            autoscaling_group_name=args.group_name,
            start_time=utc_text(args.start),
            min_size=args.min_size,
            max_size=args.max_size,
            desired_capacity=-1,  # -1: unchanged; the cluster-autoscaler owns the desired size inside the window
            opts=child,
        )
        aws.autoscaling.Schedule(
            f"{name}-drain",
            scheduled_action_name=DRAIN_ACTION,
            autoscaling_group_name=args.group_name,
            start_time=self.drain_time,
            min_size=0,
            max_size=0,
            desired_capacity=0,
            opts=child,
        )

        function_name = names.physical("capacity-block", args.pool, max_len=64)
        tags = names.tags(component, function_name)
        logs = aws.cloudwatch.LogGroup(
            f"{name}-logs",
            name=f"/aws/lambda/{function_name}",
            retention_in_days=args.log_retention_days,
            kms_key_id=args.log_kms_key_arn,
            tags=tags,
            opts=child,
        )
        role = aws.iam.Role(
            f"{name}-role",
            name=function_name,
            assume_role_policy=service_trust("lambda.amazonaws.com"),
            tags=tags,
            opts=child,
        )
        policy = aws.iam.RolePolicy(
            f"{name}-policy",
            role=role.id,
            name="close-pool-at-block-end",
            policy=pulumi.Output.json_dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Sid": "Logs",
                            "Effect": "Allow",
                            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                            "Resource": pulumi.Output.concat(logs.arn, ":*"),
                        },
                        {
                            "Sid": "Traces",  # X-Ray takes no resource-level scoping
                            "Effect": "Allow",
                            "Action": ["xray:PutTraceSegments", "xray:PutTelemetryRecords"],
                            "Resource": "*",
                        },
                        {
                            # UpdateAutoScalingGroup takes the autoScalingGroup resource type (Service
                            # Authorization Reference, Amazon EC2 Auto Scaling): this pool's group, no other.
                            "Sid": "ClosePool",
                            "Effect": "Allow",
                            "Action": "autoscaling:UpdateAutoScalingGroup",
                            "Resource": args.group_arn,
                        },
                    ],
                }
            ),
            opts=pulumi.ResourceOptions(parent=role),
        )
        function = aws.lambda_.Function(
            f"{name}-closer",
            name=function_name,
            description=f"Closes pool {args.pool}'s group when Capacity Block {args.reservation_id} is about to end",
            runtime="python3.12",
            handler=f"{CLOSER.stem}.handler",
            code=pulumi.AssetArchive({CLOSER.name: pulumi.FileAsset(str(CLOSER))}),
            role=role.arn,
            timeout=30,  # one UpdateAutoScalingGroup call
            memory_size=128,
            # Neither name is secret; a customer key would add a key-policy dependency and protect nothing.
            environment=aws.lambda_.FunctionEnvironmentArgs(
                variables={"GROUP_NAME": args.group_name, "CAPACITY_RESERVATION_ID": args.reservation_id}
            ),
            tracing_config=aws.lambda_.FunctionTracingConfigArgs(mode="Active"),
            logging_config=aws.lambda_.FunctionLoggingConfigArgs(log_format="Text", log_group=logs.name),
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy]),
        )
        rule_name = names.physical("capacity-block-end", args.pool, max_len=64)
        rule = aws.cloudwatch.EventRule(
            f"{name}-warning",
            name=rule_name,
            description=f"EC2 warns that Capacity Block {args.reservation_id} ends in 40 minutes",
            event_pattern=json.dumps(warning_pattern(args.reservation_id), sort_keys=True),
            tags=names.tags(
                component,
                rule_name,
                extra={BLOCK_TAG: args.reservation_id, BLOCK_END_TAG: utc_text(args.end)},
            ),
            opts=child,
        )
        permission = aws.lambda_.Permission(
            f"{name}-invoke",
            action="lambda:InvokeFunction",
            function=function.name,
            principal="events.amazonaws.com",
            source_arn=rule.arn,
            opts=pulumi.ResourceOptions(parent=function),
        )
        aws.cloudwatch.EventTarget(
            f"{name}-target",
            rule=rule.name,
            arn=function.arn,
            # The warning leaves 10 minutes: retry for at most 5 of them (EventBridge retries for 24 hours and
            # 185 times by default, "Event retry policy").
            retry_policy=aws.cloudwatch.EventTargetRetryPolicyArgs(
                maximum_event_age_in_seconds=300, maximum_retry_attempts=10
            ),
            opts=pulumi.ResourceOptions(parent=rule, depends_on=[permission]),
        )

        self.rule_arn = rule.arn
        self.function_arn = function.arn
        self.register_outputs(
            {"drain_time": self.drain_time, "rule_arn": self.rule_arn, "function_arn": self.function_arn}
        )
