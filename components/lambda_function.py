"""One of our Lambda functions with what each needs around it: its own encrypted log group, a role only Lambda may
assume, and an inline policy that lets it write its logs and traces plus the statements it is for.

A helper that declares no component of its own: the resources are children of the component that calls it (the
Client VPN's connect handler and sweep, a Capacity Block's keeper), under logical names the caller gives, so moving
a function here changes no URN. The code is one file of components/lambdas/, run by the runtime's own boto3.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws

from components.iam import service_trust

RUNTIME = "python3.12"


def declare(
    key: str,
    *,
    parent: pulumi.Resource,
    resource_name: str,
    function_name: str,
    role_name: str,
    description: str,
    source: Path,
    policy_name: str,
    tags: Mapping[str, str],
    log_kms_key_arn: pulumi.Input[str],
    log_retention_days: int,
    timeout: int,
    statements: Sequence[Mapping[str, Any]] = (),
    environment: Mapping[str, pulumi.Input[str]] | None = None,
    reserved_concurrency: int | None = None,
) -> aws.lambda_.Function:
    """The function `function_name` running `source`, its log group `{key}-logs`, role `{key}-role` and policy
    `{key}-policy`; `resource_name` is the function's logical name and `statements` what it may do besides logging.
    Reserved concurrency only where a caller bounds its cost: reserving fails when it would leave the account fewer
    than 100 unreserved executions (Lambda developer guide, "Configuring reserved concurrency for a function")."""
    child = pulumi.ResourceOptions(parent=parent)
    logs = aws.cloudwatch.LogGroup(
        f"{key}-logs",
        name=f"/aws/lambda/{function_name}",
        retention_in_days=log_retention_days,
        kms_key_id=log_kms_key_arn,
        tags=dict(tags),
        opts=child,
    )
    role = aws.iam.Role(
        f"{key}-role",
        name=role_name,
        assume_role_policy=service_trust("lambda.amazonaws.com"),
        tags=dict(tags),
        opts=child,
    )
    policy = aws.iam.RolePolicy(
        f"{key}-policy",
        role=role.id,
        name=policy_name,
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
                    *statements,
                ],
            }
        ),
        opts=pulumi.ResourceOptions(parent=role),
    )
    return aws.lambda_.Function(
        resource_name,
        name=function_name,
        description=description,
        runtime=RUNTIME,
        handler=f"{source.stem}.handler",
        code=pulumi.AssetArchive({source.name: pulumi.FileAsset(str(source))}),
        role=role.arn,
        timeout=timeout,
        memory_size=128,
        environment=aws.lambda_.FunctionEnvironmentArgs(variables=dict(environment)) if environment else None,
        reserved_concurrent_executions=reserved_concurrency,
        tracing_config=aws.lambda_.FunctionTracingConfigArgs(mode="Active"),
        logging_config=aws.lambda_.FunctionLoggingConfigArgs(log_format="Text", log_group=logs.name),
        tags=dict(tags),
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[policy]),
    )
