"""PlatformAws: the AWS side of a region's Kubernetes platform, declared by the regional stack.

The cluster-autoscaler and the node termination handler call AWS APIs: each gets an IAM role only its service
account in this cluster can assume (EKS Pod Identity), and the termination handler gets its SQS queue and the
EventBridge rules that feed it. Each team's pods get a role for the region's data buckets: their own prefix of
each, and all of the datasets to read (`team_data_policy`). These are AWS resources, applied where the AWS API is
reachable; the Helm releases that use them are in the in-cluster stack (components/platform.py), which reads the
queue URL through StackReference.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from components.charts import autoscaler, pinned, termination_handler
from components.iam import pod_identity_trust
from dlinfra.model import run_job
from dlinfra.model.naming import Names

# Every pod in a team's namespace acts as the team toward S3: the namespace is the team's boundary already (its
# members `edit` it and may run any of its service accounts), so the default account carries the identity.
TEAM_DATA_SERVICE_ACCOUNT = "default"
DATASETS_BUCKET = "datasets"  # components/storage.py BUCKETS: every team reads all of it
# What a team may do with objects under its own prefix, and with the datasets (S3 user guide, "Actions, resources,
# and condition keys for Amazon S3": object actions take an object ARN, ListBucket the bucket's, with s3:prefix).
OBJECT_READ = ("s3:GetObject", "s3:GetObjectVersion")
OBJECT_WRITE = ("s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts")


def team_data_policy(
    bucket_arns: pulumi.Input[Mapping[str, str]], key_arn: pulumi.Input[str], prefix: str, region: str | None
) -> pulumi.Output[dict[str, object]]:
    """A team's S3 access: read and write under its prefix of every data bucket, read all of the datasets.

    The buckets are SSE-KMS with the storage key (bucket keys on), so the role may use the key through S3 in this
    region only (KMS developer guide, "kms:ViaService"; S3 user guide, "Using server-side encryption with AWS KMS
    keys": uploads need kms:GenerateDataKey, downloads kms:Decrypt).
    """

    def document(arns: Mapping[str, str], key: str) -> dict[str, object]:
        buckets = [arns[purpose] for purpose in sorted(arns)]
        return {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "ListOwnPrefix",
                    "Effect": "Allow",
                    "Action": "s3:ListBucket",
                    "Resource": buckets,
                    "Condition": {"StringLike": {"s3:prefix": [prefix, f"{prefix}*"]}},
                },
                {"Sid": "ListDatasets", "Effect": "Allow", "Action": "s3:ListBucket",
                 "Resource": arns[DATASETS_BUCKET]},
                {"Sid": "OwnPrefix", "Effect": "Allow", "Action": [*OBJECT_READ, *OBJECT_WRITE],
                 "Resource": [f"{arn}/{prefix}*" for arn in buckets]},
                {"Sid": "ReadDatasets", "Effect": "Allow", "Action": list(OBJECT_READ),
                 "Resource": f"{arns[DATASETS_BUCKET]}/*"},
                {"Sid": "BucketKey", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
                 "Resource": key, "Condition": {"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}}},
            ],
        }  # fmt: skip

    return pulumi.Output.all(bucket_arns, key_arn).apply(lambda parts: document(parts[0], parts[1]))


def run_upload_policy(
    bucket_arns: pulumi.Input[Mapping[str, str]], key_arn: pulumi.Input[str], prefix: str, region: str | None
) -> pulumi.Output[dict[str, object]]:
    """What the role a team's people use may do for `dlinfra run`: put code under the team's runs/ prefix of the
    results bucket (dlinfra.model.run_job.CODE_KEY), encrypted with the storage key through S3 in this region (S3
    user guide, "Using server-side encryption with AWS KMS keys": an upload needs kms:GenerateDataKey)."""

    def document(arns: Mapping[str, str], key: str) -> dict[str, object]:
        return {
            "Version": "2012-10-17",
            "Statement": [
                {"Sid": "UploadRunCode", "Effect": "Allow", "Action": "s3:PutObject",
                 "Resource": f"{arns[run_job.CODE_BUCKET]}/{prefix}{run_job.RUNS_PREFIX}*"},
                {"Sid": "BucketKey", "Effect": "Allow", "Action": "kms:GenerateDataKey", "Resource": key,
                 "Condition": {"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}}},
            ],
        }  # fmt: skip

    return pulumi.Output.all(bucket_arns, key_arn).apply(lambda parts: document(parts[0], parts[1]))


# Where IAM Identity Center keeps the roles of its permission sets: IAM refuses any change to them ("Cannot perform the
# operation on the protected role": AWS re:Post, "identity-center-aws-reserved-sso"); a permission set attaches a
# customer managed policy by its name and path instead (IAM Identity Center user guide, "Customer managed policies").
IDENTITY_CENTER_ROLE_PATH = ":role/aws-reserved/"


def run_policy_attachable(role_arn: str, account: str) -> bool:
    """Whether this stack may attach the upload policy to `role_arn`: not a role IAM Identity Center manages, and in
    this stack's account (a role is attached to policies of its own account only; the RolePolicyAttachment names the
    role by name, which in another account would be some other role or none)."""
    return IDENTITY_CENTER_ROLE_PATH not in role_arn and role_arn.split(":")[4] == account


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
    # Team -> its namespace: the pods there act as the team toward S3 (empty: no team data roles).
    team_namespaces: Mapping[str, str] = field(default_factory=dict)
    team_prefixes: Mapping[str, str] = field(default_factory=dict)  # team -> its key prefix in each data bucket
    bucket_arns: pulumi.Input[Mapping[str, str]] | None = None  # purpose -> ARN (Storage.bucket_arns)
    storage_key_arn: pulumi.Input[str] | None = None  # the buckets' SSE-KMS key (Storage.kms_key_arn)
    # Team -> the IAM role its people use (teams.<team>.role_arn, made outside dlinfra). Each team with one gets a
    # customer managed policy to upload `dlinfra run` code under its prefix (run_upload_policy), attached to the role
    # where IAM lets this stack attach it (run_policy_attachable). Empty: no such policy.
    team_role_arns: Mapping[str, str] = field(default_factory=dict)
    account: str  # the AWS account this stack applies to (environments.<env>.account, else the caller's)

    def __post_init__(self) -> None:
        if self.names.region is None:
            raise ValueError("names: PlatformAws belongs to a regional stack (names.region is None)")
        if set(self.team_prefixes) != set(self.team_namespaces):
            raise ValueError("team_prefixes: give exactly one prefix for each team of team_namespaces")
        if self.team_namespaces and (self.bucket_arns is None or self.storage_key_arn is None):
            raise ValueError("bucket_arns and storage_key_arn: team data roles need the buckets and their key")
        if set(self.team_role_arns) - set(self.team_namespaces):
            raise ValueError("team_role_arns: only teams of team_namespaces")
        for team, prefix in self.team_prefixes.items():
            if not prefix.endswith("/") or prefix.startswith("/") or "*" in prefix:
                raise ValueError(f"team_prefixes.{team}: {prefix!r} is not a key prefix ending in '/'")


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
        self.team_data_role_arns: dict[str, pulumi.Output[str]] = {}
        for team, namespace in sorted(args.team_namespaces.items()):
            assert args.bucket_arns is not None and args.storage_key_arn is not None  # __post_init__
            role = self._pod_role(
                f"team-{team}-data",
                namespace,
                TEAM_DATA_SERVICE_ACCOUNT,
                team_data_policy(args.bucket_arns, args.storage_key_arn, args.team_prefixes[team], args.names.region),
            )
            self.team_data_role_arns[team] = role.arn
        self.team_run_policy_arns: dict[str, pulumi.Output[str]] = {}
        for team, people_role in sorted(args.team_role_arns.items()):
            assert args.bucket_arns is not None and args.storage_key_arn is not None  # __post_init__
            # Named for this stack and team: every region's stack declares its own, and an Identity Center permission
            # set finds each by name in the account.
            policy_name = args.names.physical("runs", team, max_len=128)
            policy = aws.iam.Policy(
                f"{name}-team-{team}-runs",
                name=policy_name,
                description=f"dlinfra run: upload team {team}'s code to its runs/ prefix in {args.names.region}",
                policy=pulumi.Output.json_dumps(
                    run_upload_policy(
                        args.bucket_arns, args.storage_key_arn, args.team_prefixes[team], args.names.region
                    )
                ),
                tags=args.names.tags("platform", policy_name),
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.team_run_policy_arns[team] = policy.arn
            if run_policy_attachable(people_role, args.account):
                aws.iam.RolePolicyAttachment(
                    f"{name}-team-{team}-runs-attachment",
                    role=people_role.rpartition("/")[2],  # the role's name: an ARN's last part, after any path
                    policy_arn=policy.arn,
                    opts=pulumi.ResourceOptions(parent=policy),
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
                "team_data_role_arns": self.team_data_role_arns,
                "team_run_policy_arns": self.team_run_policy_arns,
            }
        )

    def _pod_role(
        self, key: str, namespace: str, service_account: str, policy: pulumi.Input[dict[str, object]]
    ) -> aws.iam.Role:
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
