"""CiRunner: a CodeBuild-hosted GitHub Actions runner in the region's private subnets, for one workflow.

The EKS endpoint is private, so the in-cluster stack (`<env>-<region>-k8s`) can only be applied, or previewed for
real, from inside the VPC. CodeBuild starts an ephemeral runner per queued workflow job whose `runs-on` names the
project (`codebuild-<project>-${{ github.run_id }}-${{ github.run_attempt }}`; AWS CodeBuild user guide, "Tutorial:
Configure a CodeBuild-hosted GitHub Actions runner") and that the webhook's filters admit. Each region has one
runner per purpose (dlinfra.model.ci): apply.yml's jobs, and preview.yml's where previews are real; separate
projects, roles and security groups. The webhook admits a job when its workflow has exactly the runner's workflow
name and one of the fleet's `ci.runner_actor_ids` started it: the only filters CodeBuild documents for queued
workflow jobs. A fork's pull request (from any branch name) never reaches a runner; a listed account's pull
request that names its workflow `apply` does. Organizations can close that too by registering the runners in a
runner group restricted to selected workflows (README, "Only trusted workflows get the in-VPC runners"). The
runner's own role is minimal: it can write its logs, attach to the VPC and use the GitHub connection, nothing else.
The workflow jobs get their AWS identity by OIDC (the fleet's apply or preview role), so what a job may change is
decided by that role's trust and its EKS access entry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components import security_groups as sg
from components.iam import scoped_service_trust
from components.network import LOG_RETENTION_DAYS
from dlinfra.model import ci, stackroles
from dlinfra.model.naming import Names

# Ubuntu 22.04 (aws-codebuild-docker-images, ubuntu/standard/7.0): every in-VPC job starts with actions/setup-python,
# which has Python builds for Ubuntu only (dlinfra/data/codebuild_images.yaml gives the sources). It also carries
# the AWS CLI v2, which the Kubernetes provider calls (`aws eks get-token`), and git.
DEFAULT_IMAGE = "aws/codebuild/standard:7.0"
_REPOSITORY = re.compile(r"https://github\.com/[A-Za-z0-9-]{1,39}/[A-Za-z0-9._-]{1,100}")


@dataclass(frozen=True, kw_only=True)
class CiRunnerArgs:
    names: Names  # naming and tags of this (regional) stack
    purpose: ci.Purpose  # apply: apply.yml's in-cluster jobs; preview: preview.yml's in-VPC jobs
    filters: Sequence[ci.WebhookFilter]  # the webhook's filter group (dlinfra.model.ci.webhook_filters)
    vpc_id: pulumi.Input[str]  # the region's VPC
    vpc_cidr: str  # the VPC block: the EKS private endpoint and interface endpoints live there
    subnet_ids: Mapping[str, pulumi.Input[str]]  # AZ -> private subnet (egress through NAT) the builds run in
    repository: str  # https://github.com/<owner>/<repo> whose workflow jobs this runner takes
    connection_arn: str  # AWS CodeConnections connection to GitHub (fleet: environments.<env>.ci.connection_arn)
    log_kms_key_arn: pulumi.Input[str]  # KMS key of the build log group (Network.log_key_arn)
    compute_type: str = "BUILD_GENERAL1_SMALL"  # 3 GB, 2 vCPUs: enough for `pulumi up` of the in-cluster stack
    image: str = DEFAULT_IMAGE  # CodeBuild curated image; one actions/setup-python has Python builds for
    timeout_minutes: int = 120  # a job's limit; Helm releases with `atomic` can take long (CodeBuild: 5..2160)
    # Jobs at once; None (the default) sets no project limit. With a limit, a build past it returns an error instead of
    # queueing (CodeBuild user guide, "Builds in AWS CodeBuild"): a GitHub job whose build was refused waits for a
    # runner until GitHub gives up, and apply.yml's single `apply` concurrency group with it. Without one, builds
    # queue against the account's concurrent builds quota for the compute type (up to five times the quota, for the
    # queue timeout, eight hours by default), so two pull requests' in-VPC previews, or a quick re-push, wait their
    # turn. A limit may not exceed that quota either (terraform-provider-aws PR 37748). `dlinfra check` judges each
    # project against the quota: its limit, or one build without one (limit-codebuild-linux-small-builds).
    concurrent_build_limit: int | None = None
    log_retention_days: int = 365  # days build logs are kept; a value CloudWatch Logs accepts

    def __post_init__(self) -> None:
        if not self.subnet_ids:
            raise ValueError("subnet_ids: the runner needs at least one private subnet")
        if not _REPOSITORY.fullmatch(self.repository):
            raise ValueError(f"repository: {self.repository!r} is not https://github.com/<owner>/<repo>")
        if not 5 <= self.timeout_minutes <= 2160:
            raise ValueError(f"timeout_minutes: {self.timeout_minutes} is outside CodeBuild's 5..2160")
        if self.concurrent_build_limit is not None and self.concurrent_build_limit < 1:
            raise ValueError(f"concurrent_build_limit: must be at least 1, got {self.concurrent_build_limit}")
        if self.log_retention_days not in LOG_RETENTION_DAYS:
            raise ValueError(f"log_retention_days: {self.log_retention_days} is not a CloudWatch Logs retention")
        problem = ci.setup_python_problem(self.image)
        if problem is not None:
            raise ValueError(f"image: {problem}")
        types = {f.type for f in self.filters if not f.exclude}
        if (
            ci.WebhookFilter("EVENT", ci.JOB_QUEUED) not in self.filters
            or not {"WORKFLOW_NAME", "ACTOR_ACCOUNT_ID"} <= types
        ):
            # Without them any workflow job that names the runner's label, from anyone, runs inside the VPC.
            raise ValueError(
                f"filters: need EVENT {ci.JOB_QUEUED}, a WORKFLOW_NAME and an ACTOR_ACCOUNT_ID filter, "
                f"got {self.filters}"
            )
        unguarded = ci.unguarded_filters(self.filters)
        if unguarded:
            # CodeBuild documents them for other events only (API reference, "WebhookFilter"): on a queued workflow
            # job they either never pass (the runner never starts) or are not evaluated (they guard nothing).
            raise ValueError(f"filters: {sorted({f.type for f in unguarded})} do not apply to workflow jobs")


class CiRunner(pulumi.ComponentResource):
    """CodeBuild project, webhook for its workflow's queued jobs, its role, security group and log group."""

    project_name: pulumi.Output[str]
    runner_label: pulumi.Output[str]  # the runs-on prefix: codebuild-<project>
    role_arn: pulumi.Output[str]
    security_group_id: pulumi.Output[str]

    def __init__(self, name: str, args: CiRunnerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:ci:CiRunner", name, None, opts)
        names = args.names
        child = pulumi.ResourceOptions(parent=self)
        component = stackroles.RUNNER_COMPONENTS[args.purpose]
        project_name = names.physical(component)
        tags = names.tags("ci", project_name)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        account_id = aws.get_caller_identity_output(opts=invoke).account_id
        partition = aws.get_partition_output(opts=invoke).partition
        region = names.region or ""
        arn = f"arn:{{partition}}:{{service}}:{region}:{{account}}:"
        project_arn = pulumi.Output.all(partition, account_id).apply(
            lambda p: arn.format(partition=p[0], service="codebuild", account=p[1]) + f"project/{project_name}"
        )

        log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs",
            name=f"/aws/codebuild/{project_name}",
            retention_in_days=args.log_retention_days,
            kms_key_id=args.log_kms_key_arn,
            tags=tags,
            opts=child,
        )
        group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            name=project_name,
            description=f"In-VPC CI runner ({args.purpose}): HTTPS out only",
            vpc_id=args.vpc_id,
            tags=tags,
            opts=child,
        )
        # GitHub, Pulumi Cloud and chart repositories through NAT; the EKS endpoint and interface endpoints in
        # the VPC. DNS goes to the VPC resolver, which security groups do not filter (Amazon VPC user guide,
        # "Security group rules": traffic to the Amazon DNS server is not affected).
        for key, cidr, what in (("internet", "0.0.0.0/0", "GitHub, Pulumi, charts"), ("vpc", args.vpc_cidr, "EKS")):
            sg.rule(
                f"{name}-sg-to-{key}", "egress", group=group, peer=sg.Peer(cidr=cidr), description=f"HTTPS to {what}",
                names=names, component="ci", protocol="tcp", ports=(443, 443),
            )  # fmt: skip

        role = aws.iam.Role(
            f"{name}-role",
            name=names.physical(component, max_len=64),
            assume_role_policy=pulumi.Output.json_dumps(
                scoped_service_trust("codebuild.amazonaws.com", account_id, project_arn)
            ),
            tags=tags,
            opts=child,
        )
        interfaces = pulumi.Output.all(partition, account_id).apply(
            lambda p: arn.format(partition=p[0], service="ec2", account=p[1]) + "network-interface/*"
        )
        subnet_arns = [
            pulumi.Output.all(partition, account_id, args.subnet_ids[az]).apply(
                lambda p: arn.format(partition=p[0], service="ec2", account=p[1]) + f"subnet/{p[2]}"
            )
            for az in sorted(args.subnet_ids)
        ]
        policy = aws.iam.RolePolicy(
            f"{name}-policy",
            role=role.id,
            name="ci-runner",
            policy=pulumi.Output.json_dumps(
                _runner_policy(
                    log_group.arn, args.log_kms_key_arn, args.connection_arn, subnet_arns, group.arn, interfaces
                )
            ),
            opts=pulumi.ResourceOptions(parent=role),
        )
        project = aws.codebuild.Project(
            f"{name}-project",
            name=project_name,
            description=f"GitHub Actions runner inside {names.prefix}'s VPC for {ci.WORKFLOWS[args.purpose]}.yml",
            service_role=role.arn,
            build_timeout=args.timeout_minutes,
            concurrent_build_limit=args.concurrent_build_limit,
            source=aws.codebuild.ProjectSourceArgs(
                type="GITHUB",
                location=args.repository,
                auth=aws.codebuild.ProjectSourceAuthArgs(type="CODECONNECTIONS", resource=args.connection_arn),
            ),
            artifacts=aws.codebuild.ProjectArtifactsArgs(type="NO_ARTIFACTS"),
            environment=aws.codebuild.ProjectEnvironmentArgs(
                type="LINUX_CONTAINER",
                compute_type=args.compute_type,
                image=args.image,
                image_pull_credentials_type="CODEBUILD",
                privileged_mode=False,  # no Docker daemon: nothing here builds images
            ),
            vpc_config=aws.codebuild.ProjectVpcConfigArgs(
                vpc_id=args.vpc_id,
                subnets=[args.subnet_ids[az] for az in sorted(args.subnet_ids)],
                security_group_ids=[group.id],
            ),
            logs_config=aws.codebuild.ProjectLogsConfigArgs(
                cloudwatch_logs=aws.codebuild.ProjectLogsConfigCloudwatchLogsArgs(
                    status="ENABLED", group_name=log_group.name
                )
            ),
            encryption_key=args.log_kms_key_arn,
            tags=tags,
            # The role must be able to reach the VPC and the connection before the first build.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy]),
        )
        aws.codebuild.Webhook(
            f"{name}-webhook",
            project_name=project.name,
            build_type="BUILD",
            # Only its own workflow's queued jobs, started by a listed account: any other job that asks for the label
            # stays queued on GitHub. The runner never builds pushes or pull requests by itself.
            filter_groups=[
                aws.codebuild.WebhookFilterGroupArgs(
                    filters=[
                        aws.codebuild.WebhookFilterGroupFilterArgs(
                            type=f.type, pattern=f.pattern, exclude_matched_pattern=f.exclude
                        )
                        for f in args.filters
                    ]
                )
            ],
            opts=pulumi.ResourceOptions(parent=project),
        )

        self.project_name = project.name
        self.runner_label = project.name.apply(lambda n: f"codebuild-{n}")
        self.role_arn = role.arn
        self.security_group_id = group.id
        self.register_outputs(
            {
                "project_name": self.project_name,
                "runner_label": self.runner_label,
                "role_arn": self.role_arn,
                "security_group_id": self.security_group_id,
            }
        )


def _runner_policy(
    log_group_arn: pulumi.Input[str],
    key_arn: pulumi.Input[str],
    connection_arn: str,
    subnet_arns: list[pulumi.Output[str]],
    group_arn: pulumi.Input[str],
    interfaces: pulumi.Input[str],
) -> dict[str, object]:
    """Logs, VPC network interfaces and the GitHub connection (AWS CodeBuild user guide, "Use CodeBuild with
    Amazon VPC" and "Allow CodeBuild to interact with other AWS services"), each on its own resources."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "Logs",
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": [log_group_arn, pulumi.Output.concat(log_group_arn, ":*")],
            },
            {
                "Sid": "BuildKey",  # the project's encryption key (logs and build output)
                "Effect": "Allow",
                "Action": ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey*", "kms:DescribeKey"],
                "Resource": key_arn,
            },
            {
                "Sid": "DescribeNetwork",
                "Effect": "Allow",
                "Action": [
                    "ec2:DescribeDhcpOptions",
                    "ec2:DescribeNetworkInterfaces",
                    "ec2:DescribeSecurityGroups",
                    "ec2:DescribeSubnets",
                    "ec2:DescribeVpcs",
                ],
                "Resource": "*",  # Describe actions support no resource-level scoping
            },
            {
                "Sid": "BuildInterfaces",  # only in the runner's subnets, with its security group
                "Effect": "Allow",
                "Action": ["ec2:CreateNetworkInterface", "ec2:DeleteNetworkInterface"],
                "Resource": [interfaces, group_arn, *subnet_arns],
            },
            {
                "Sid": "AttachInPrivateSubnets",
                "Effect": "Allow",
                "Action": "ec2:CreateNetworkInterfacePermission",
                "Resource": interfaces,
                "Condition": {
                    "StringEquals": {"ec2:AuthorizedService": "codebuild.amazonaws.com"},
                    "ArnEquals": {"ec2:Subnet": subnet_arns},
                },
            },
            {
                "Sid": "GitHubConnection",
                "Effect": "Allow",
                "Action": [
                    "codeconnections:GetConnection",
                    "codeconnections:GetConnectionToken",
                    "codeconnections:UseConnection",
                    "codestar-connections:GetConnection",
                    "codestar-connections:GetConnectionToken",
                    "codestar-connections:UseConnection",
                ],
                "Resource": connection_arn,
            },
        ],
    }
