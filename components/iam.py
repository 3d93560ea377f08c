"""IAM documents shared by components (not a component): trust policies for AWS service principals."""

from __future__ import annotations

import json

import pulumi


def service_trust(service: str, *, tag_session: bool = False) -> str:
    """A trust policy letting one AWS service assume the role; tag_session for EKS and Pod Identity."""
    actions: str | list[str] = ["sts:AssumeRole", "sts:TagSession"] if tag_session else "sts:AssumeRole"
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": actions}],
        }
    )


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
