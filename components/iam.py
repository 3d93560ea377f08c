"""IAM and KMS pieces shared by components (not a component): trust policies and customer-managed keys."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws


def service_trust(service: str, *, tag_session: bool = False) -> str:
    """A trust policy letting one AWS service assume the role; tag_session for EKS and Pod Identity."""
    actions: str | list[str] = ["sts:AssumeRole", "sts:TagSession"] if tag_session else "sts:AssumeRole"
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": actions}],
        }
    )


def scoped_service_trust(
    service: str, account_id: pulumi.Input[str], source_arn: pulumi.Input[str]
) -> dict[str, object]:
    """A trust policy letting one AWS service assume the role only on behalf of this account and source ARN
    (pattern), against the confused-deputy problem (IAM user guide, "The confused deputy problem")."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": service},
                "Action": "sts:AssumeRole",
                "Condition": {
                    "StringEquals": {"aws:SourceAccount": account_id},
                    "ArnLike": {"aws:SourceArn": source_arn},
                },
            }
        ],
    }


def pod_identity_trust(cluster_name: pulumi.Input[str], namespace: str, service_account: str) -> dict[str, Any]:
    """Trust policy for EKS Pod Identity, limited by session tags to one service account of one cluster."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "pods.eks.amazonaws.com"},
                "Action": ["sts:AssumeRole", "sts:TagSession"],
                "Condition": {
                    "StringEquals": {
                        "aws:RequestTag/eks-cluster-name": cluster_name,
                        "aws:RequestTag/kubernetes-namespace": namespace,
                        "aws:RequestTag/kubernetes-service-account": service_account,
                    }
                },
            }
        ],
    }


def account_key_policy(
    account_id: pulumi.Input[str], partition: pulumi.Input[str], *statements: dict[str, object]
) -> dict[str, object]:
    """A KMS key policy: the account administers the key (so IAM policies grant its use), plus statements."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "AccountAdministersKey",
                "Effect": "Allow",
                "Principal": {"AWS": pulumi.Output.concat("arn:", partition, ":iam::", account_id, ":root")},
                "Action": "kms:*",
                "Resource": "*",
            },
            *statements,
        ],
    }


def protected_key(
    name: str,
    *,
    description: str,
    tags: dict[str, str],
    parent: pulumi.Resource,
    statements: tuple[dict[str, object], ...] = (),
) -> aws.kms.Key:
    """A rotated customer-managed key the account administers, protected and retained like the data it guards.

    `statements` are added to the key policy (services that use the key directly, such as CloudWatch Logs).
    """
    invoke = pulumi.InvokeOutputOptions(parent=parent)
    account_id = aws.get_caller_identity_output(opts=invoke).account_id
    partition = aws.get_partition_output(opts=invoke).partition
    return aws.kms.Key(
        name,
        description=description,
        enable_key_rotation=True,
        deletion_window_in_days=30,
        policy=pulumi.Output.json_dumps(account_key_policy(account_id, partition, *statements)),
        tags=tags,
        # Deleting or replacing a key makes everything encrypted with it unreadable.
        opts=pulumi.ResourceOptions(parent=parent, protect=True, retain_on_delete=True),
    )
