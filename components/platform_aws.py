"""PlatformAws: the AWS side of a region's Kubernetes platform, declared by the regional stack.

The cluster-autoscaler and the node termination handler call AWS APIs: each gets an IAM role only its service
account in this cluster can assume (EKS Pod Identity), and the termination handler gets its SQS queue and the
EventBridge rules that feed it. These are AWS resources, applied where the AWS API is reachable; the Helm
releases that use them are in the in-cluster stack (components/platform.py), which reads the queue URL through
StackReference.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components.charts import autoscaler, pinned, termination_handler
from components.iam import pod_identity_trust
from dlinfra.model.naming import Names


@dataclass(frozen=True, kw_only=True)
class PoolGroup:
    """One node pool's Auto Scaling group, as the termination handler's rules and policy name it."""

    name: pulumi.Input[str]  # Auto Scaling group name (NodePool.group_name)
    arn: pulumi.Input[str]  # Auto Scaling group ARN (NodePool.group_arn)


@dataclass(frozen=True, kw_only=True)
class PlatformAwsArgs:
    names: Names  # naming and tags of this (regional) stack
    cluster_name: pulumi.Input[str]  # EKS cluster the Pod Identity associations belong to
    pools: Mapping[str, PoolGroup]  # pool name -> its group, every pool of this region

    def __post_init__(self) -> None:
        if self.names.region is None:
            raise ValueError("names: PlatformAws belongs to a regional stack (names.region is None)")


class PlatformAws(pulumi.ComponentResource):
    """Pod Identity roles for the autoscaler and the termination handler, and the handler's event queue."""

    autoscaler_role_arn: pulumi.Output[str]
    termination_handler_role_arn: pulumi.Output[str]
    termination_queue_url: pulumi.Output[str]
    termination_queue_arn: pulumi.Output[str]

    def __init__(self, name: str, args: PlatformAwsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:platform:PlatformAws", name, None, opts)
        self._name, self._args = name, args
        autoscaler_role = self._pod_role(
            "cluster-autoscaler",
            pinned.SYSTEM_NAMESPACE,
            autoscaler.AUTOSCALER_SA,
            autoscaler.autoscaler_policy(args.cluster_name),
        )
        queue = self._termination_queue()
        handler_role = self._pod_role(
            "node-termination-handler",
            pinned.SYSTEM_NAMESPACE,
            termination_handler.TERMINATION_HANDLER_SA,
            termination_handler.termination_handler_policy(
                queue.arn, [group.arn for _, group in sorted(args.pools.items())]
            ),
        )
        self.autoscaler_role_arn = autoscaler_role.arn
        self.termination_handler_role_arn = handler_role.arn
        self.termination_queue_url = queue.url
        self.termination_queue_arn = queue.arn
        self.register_outputs(
            {
                "autoscaler_role_arn": self.autoscaler_role_arn,
                "termination_handler_role_arn": self.termination_handler_role_arn,
                "termination_queue_url": self.termination_queue_url,
                "termination_queue_arn": self.termination_queue_arn,
            }
        )

    def _pod_role(self, key: str, namespace: str, service_account: str, policy: dict[str, object]) -> aws.iam.Role:
        """An IAM role only this service account of this cluster can assume, with one inline policy."""
        args, names = self._args, self._args.names
        role_name = names.physical(key, max_len=64)
        role = aws.iam.Role(
            f"{self._name}-{key}-role",
            name=role_name,
            assume_role_policy=pulumi.Output.json_dumps(
                pod_identity_trust(args.cluster_name, namespace, service_account)
            ),
            tags=names.tags("platform", role_name),
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws.iam.RolePolicy(
            f"{self._name}-{key}-policy",
            role=role.name,
            name=key,
            policy=pulumi.Output.json_dumps(policy),
            opts=pulumi.ResourceOptions(parent=role),
        )
        aws.eks.PodIdentityAssociation(
            f"{self._name}-{key}-identity",
            cluster_name=args.cluster_name,
            namespace=namespace,
            service_account=service_account,
            role_arn=role.arn,
            tags=names.tags("platform", role_name),
            opts=pulumi.ResourceOptions(parent=role),
        )
        return role

    def _termination_queue(self) -> aws.sqs.Queue:
        """The handler's SQS queue, fed by EventBridge rules for maintenance, spot and lifecycle events."""
        args, names = self._args, self._args.names
        queue_name = names.physical("nth", max_len=80)
        queue = aws.sqs.Queue(
            f"{self._name}-nth-queue",
            name=queue_name,
            sqs_managed_sse_enabled=True,
            # An interruption notice older than the two-minute spot warning is stale.
            message_retention_seconds=300,
            tags=names.tags("platform", queue_name),
            opts=pulumi.ResourceOptions(parent=self),
        )
        patterns: dict[str, pulumi.Input[str]] = {
            rule: json.dumps(pattern, sort_keys=True)
            for rule, pattern in termination_handler.TERMINATION_EVENTS.items()
        }
        asg_names = [group.name for _, group in sorted(args.pools.items())]
        if asg_names:
            patterns[termination_handler.LIFECYCLE_RULE] = pulumi.Output.json_dumps(
                termination_handler.lifecycle_pattern(asg_names)
            )
        rules = []
        for rule_key, pattern in patterns.items():
            rule_name = names.physical("nth", rule_key, max_len=64)
            rule = aws.cloudwatch.EventRule(
                f"{self._name}-nth-{rule_key}",
                name=rule_name,
                description=f"{rule_key} events for aws-node-termination-handler",
                event_pattern=pattern,
                tags=names.tags("platform", rule_name),
                opts=pulumi.ResourceOptions(parent=self),
            )
            aws.cloudwatch.EventTarget(
                f"{self._name}-nth-{rule_key}-target",
                rule=rule.name,
                target_id="nth-queue",
                arn=queue.arn,
                opts=pulumi.ResourceOptions(parent=rule),
            )
            rules.append(rule)
        aws.sqs.QueuePolicy(
            f"{self._name}-nth-queue-policy",
            queue_url=queue.url,
            policy=pulumi.Output.json_dumps(termination_handler.queue_policy(queue.arn, [r.arn for r in rules])),
            opts=pulumi.ResourceOptions(parent=queue),
        )
        return queue
