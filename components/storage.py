"""Storage: EFS for home directories and datasets, S3 buckets for datasets, checkpoints and results, and
optional FSx for Lustre scratch linked to the datasets bucket. Every stateful resource is protected and
retained on delete: losing researchers' data is the one failure this toolkit must not allow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components import security_groups as sg
from components.efs_policy import access_point_pattern, file_system_policy
from components.iam import protected_key
from dlinfra.model.naming import Names
from dlinfra.model.team_storage import AccessPoint

BUCKETS = ("datasets", "checkpoints", "results")
NFS_PORT = 2049
LUSTRE_PORTS = ((988, 988), (1018, 1023))
FSX_DEPLOYMENT = "PERSISTENT_2"

# Stateful: never replaced or deleted by `pulumi up`; removing one from the program orphans it in AWS.
STATEFUL = pulumi.ResourceOptions(protect=True, retain_on_delete=True)


@dataclass(frozen=True, kw_only=True)
class FsxArgs:
    storage_capacity_gib: int  # PERSISTENT_2: 1200 or a multiple of 2400
    throughput_per_tib: int  # MB/s per TiB: 125, 250, 500 or 1000

    def __post_init__(self) -> None:
        if self.storage_capacity_gib != 1200 and self.storage_capacity_gib % 2400:
            raise ValueError(f"fsx.storage_capacity_gib: {self.storage_capacity_gib} is not 1200 or a multiple of 2400")
        if self.throughput_per_tib not in (125, 250, 500, 1000):
            raise ValueError(f"fsx.throughput_per_tib: {self.throughput_per_tib} is not 125, 250, 500 or 1000")


@dataclass(frozen=True, kw_only=True)
class StorageArgs:
    names: Names  # naming and tags of this stack
    account_id: pulumi.Input[str]  # bucket names carry it, since S3 names are global
    vpc_id: pulumi.Input[str]
    subnet_ids: Mapping[str, pulumi.Input[str]]  # AZ -> private (node) subnet id: one mount target per AZ
    client_cidrs: Sequence[str]  # private subnet CIDRs: nodes and pods (VPC CNI gives pods VPC addresses)
    # EFS access points by key (dlinfra.model.team_storage.plan): the datasets, one per team, one home per person.
    access_points: Mapping[str, AccessPoint]
    checkpoint_retention_days: int = 90  # noncurrent checkpoint versions kept this long
    fsx: FsxArgs | None = None  # Lustre scratch linked to the datasets bucket; None: none

    def __post_init__(self) -> None:
        if not self.subnet_ids:
            raise ValueError("subnet_ids: at least one AZ is needed for EFS mount targets")
        if not self.client_cidrs:
            raise ValueError("client_cidrs: name the node subnets that may mount the file systems")
        if self.checkpoint_retention_days < 1:
            raise ValueError(f"checkpoint_retention_days: {self.checkpoint_retention_days} must be at least 1")
        for key, point in self.access_points.items():
            if key != point.key:
                raise ValueError(f"access_points.{key}: keyed by {key!r} but its key is {point.key!r}")
            # EFS: a root directory of at most 100 characters and four levels ("Enforcing a root directory with
            # an access point"); the identity is a 32-bit POSIX id (API reference, "PosixUser").
            if len(point.path) > 100 or point.path.count("/") > 4 or not point.path.startswith("/"):
                raise ValueError(f"access_points.{key}: {point.path!r} is not an absolute path of 1-4 levels")
            if not (0 < point.uid < 2**32 and 0 < point.gid < 2**32):
                raise ValueError(f"access_points.{key}: uid/gid {point.uid}/{point.gid}: root or out of range")


class Storage(pulumi.ComponentResource):
    """KMS key, EFS with mount targets and access points, S3 buckets, and optional FSx for Lustre."""

    kms_key_arn: pulumi.Output[str]
    efs_id: pulumi.Output[str]
    efs_arn: pulumi.Output[str]
    efs_security_group_id: pulumi.Output[str]
    access_point_ids: pulumi.Output[dict[str, str]]  # key -> fsap-... (what a volume handle names)
    access_point_arns: pulumi.Output[dict[str, str]]  # key -> ARN (what IAM conditions name)
    bucket_names: pulumi.Output[dict[str, str]]
    bucket_arns: pulumi.Output[dict[str, str]]
    fsx_id: pulumi.Output[str] | None

    def __init__(self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:storage:Storage", name, None, opts)
        names = args.names
        child = pulumi.ResourceOptions(parent=self)
        stateful = STATEFUL.merge(child)
        tags = names.tags("storage")

        partition = aws.get_partition_output(opts=pulumi.InvokeOutputOptions(parent=self)).partition
        bucket_arns = {
            purpose: pulumi.Output.concat("arn:", partition, ":s3:::", _bucket_name(args, purpose))
            for purpose in ("logs", *BUCKETS)
        }
        # EFS, S3 and FSx use the key on callers' behalf, so IAM policies decide who may; FSx's data repository
        # link is the exception, below.
        key = protected_key(
            f"{name}-key",
            description=f"{names.prefix} storage: EFS, S3 and FSx",
            tags=names.tags("storage", names.physical("storage-key")),
            parent=self,
            statements=(_fsx_data_repository_statement(args, partition, bucket_arns["datasets"]),) if args.fsx else (),
        )
        aws.kms.Alias(
            f"{name}-key-alias", name=f"alias/{names.physical('storage')}", target_key_id=key.key_id, opts=child
        )

        # EFS: shared home directories and datasets.
        efs_sg_name = names.physical("efs")
        efs_sg = aws.ec2.SecurityGroup(
            f"{name}-efs-sg",
            name=efs_sg_name,
            description="NFS from nodes and pods only",
            vpc_id=args.vpc_id,
            tags=names.tags("storage", efs_sg_name),
            opts=child,
        )
        for cidr in sorted(args.client_cidrs):
            sg.rule(
                f"{name}-efs-from-{sg.cidr_key(cidr)}", "ingress", group=efs_sg, peer=sg.Peer(cidr=cidr),
                description="NFS from node and pod subnets", names=names, component="storage", protocol="tcp",
                ports=(NFS_PORT, NFS_PORT),
            )  # fmt: skip
        efs = aws.efs.FileSystem(
            f"{name}-efs",
            creation_token=names.physical("efs"),
            encrypted=True,
            kms_key_id=key.arn,
            performance_mode="generalPurpose",
            throughput_mode="elastic",
            lifecycle_policies=[
                aws.efs.FileSystemLifecyclePolicyArgs(transition_to_ia="AFTER_30_DAYS"),
                aws.efs.FileSystemLifecyclePolicyArgs(transition_to_primary_storage_class="AFTER_1_ACCESS"),
            ],
            tags=names.tags("storage", names.physical("efs")),
            opts=stateful,
        )
        # Children would inherit the file system's `protect`; mount targets and access points must stay removable.
        on_efs = pulumi.ResourceOptions(parent=efs, protect=False)
        aws.efs.BackupPolicy(
            f"{name}-efs-backup",
            file_system_id=efs.id,
            backup_policy=aws.efs.BackupPolicyBackupPolicyArgs(status="ENABLED"),
            opts=on_efs,
        )
        # Replaces EFS's default policy, which admits any anonymous client as root (components/efs_policy.py).
        region = names.region or ""
        account = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self)).account_id
        fs_policy = aws.efs.FileSystemPolicy(
            f"{name}-efs-policy",
            file_system_id=efs.id,
            policy=pulumi.Output.json_dumps(
                file_system_policy(efs.arn, access_point_pattern(partition, region, account))
            ),
            bypass_policy_lockout_safety_check=False,
            opts=on_efs,
        )
        for az, subnet_id in sorted(args.subnet_ids.items()):
            aws.efs.MountTarget(
                f"{name}-efs-{az}",
                file_system_id=efs.id,
                subnet_id=subnet_id,
                security_groups=[efs_sg.id],
                # No client can connect before the policy replaces the default, open one.
                opts=on_efs.merge(pulumi.ResourceOptions(depends_on=[fs_policy])),
            )
        points = {
            key: aws.efs.AccessPoint(
                f"{name}-efs-{key}",
                file_system_id=efs.id,
                # Every request through the access point acts as this user and group, whatever the client sends
                # (EFS guide, "Enforcing a user identity using an access point").
                posix_user=aws.efs.AccessPointPosixUserArgs(uid=point.uid, gid=point.gid),
                root_directory=aws.efs.AccessPointRootDirectoryArgs(
                    path=point.path,
                    # EFS creates the directory on the first mount, owned by the enforced identity; without it a
                    # mount through a missing directory fails (API reference, "CreationInfo").
                    creation_info=aws.efs.AccessPointRootDirectoryCreationInfoArgs(
                        owner_uid=point.uid, owner_gid=point.gid, permissions=point.permissions
                    ),
                ),
                tags=names.tags("storage", names.physical("efs", key), {"dlinfra:owner": point.owner}),
                opts=on_efs,
            )
            for key, point in sorted(args.access_points.items())
        }

        # S3: access logs first, since every data bucket logs to it.
        # Server access logs are delivered by the S3 logging service, which the log bucket's policy must admit:
        # for these source buckets of this account only (S3 user guide, "Enabling Amazon S3 server access
        # logging": bucket policy for the logging service principal, with aws:SourceAccount and aws:SourceArn).
        logs = self._bucket(
            name, "logs", args, key_arn=None, tags=tags,
            statements=(_log_delivery_statement(args, bucket_arns),),
        )  # fmt: skip
        buckets = {
            purpose: self._bucket(name, purpose, args, key_arn=key.arn, tags=tags, logs=logs) for purpose in BUCKETS
        }

        self.fsx_id = None
        self.lustre_security_group_id: pulumi.Output[str] | None = None
        if args.fsx is not None:
            self.fsx_id, self.lustre_security_group_id = self._lustre(
                name, args, args.fsx, key.arn, buckets["datasets"], tags
            )

        self.kms_key_arn = key.arn
        self.efs_id = efs.id
        self.efs_arn = efs.arn
        self.efs_security_group_id = efs_sg.id
        self.access_point_ids = pulumi.Output.all(**{k: p.id for k, p in points.items()}).apply(dict)
        self.access_point_arns = pulumi.Output.all(**{k: p.arn for k, p in points.items()}).apply(dict)
        self.bucket_names = pulumi.Output.all(**{p: b.bucket for p, b in buckets.items()}).apply(dict)
        self.bucket_arns = pulumi.Output.all(**{p: b.arn for p, b in buckets.items()}).apply(dict)
        outputs: dict[str, pulumi.Input[object]] = {
            "kms_key_arn": self.kms_key_arn,
            "efs_id": self.efs_id,
            "efs_arn": self.efs_arn,
            "efs_security_group_id": self.efs_security_group_id,
            "access_point_ids": self.access_point_ids,
            "access_point_arns": self.access_point_arns,
            "bucket_names": self.bucket_names,
            "bucket_arns": self.bucket_arns,
        }
        if self.fsx_id is not None:
            outputs["fsx_id"] = self.fsx_id
        self.register_outputs(outputs)

    def _bucket(
        self,
        name: str,
        purpose: str,
        args: StorageArgs,
        *,
        key_arn: pulumi.Input[str] | None,
        tags: Mapping[str, str],
        logs: aws.s3.Bucket | None = None,
        statements: tuple[dict[str, object], ...] = (),
    ) -> aws.s3.Bucket:
        """A private, versioned, encrypted, TLS-only bucket with lifecycle rules that fit its purpose."""
        names = args.names
        bucket = aws.s3.Bucket(
            f"{name}-{purpose}",
            bucket=_bucket_name(args, purpose),
            tags=names.tags("storage", names.physical(purpose), {"dlinfra:purpose": purpose}),
            opts=STATEFUL.merge(pulumi.ResourceOptions(parent=self)),
        )
        # Configuration of the bucket, not data: explicitly unprotected rather than inheriting the bucket's protect.
        child = pulumi.ResourceOptions(parent=bucket, protect=False)
        aws.s3.BucketPublicAccessBlock(
            f"{name}-{purpose}-public-access",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        aws.s3.BucketOwnershipControls(
            f"{name}-{purpose}-ownership",
            bucket=bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=child,
        )
        aws.s3.BucketVersioning(
            f"{name}-{purpose}-versioning",
            bucket=bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=child,
        )
        # The access-log bucket must use SSE-S3: S3 server access logging cannot deliver to SSE-KMS by default.
        sse = (
            aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                sse_algorithm="aws:kms", kms_master_key_id=key_arn
            )
            if key_arn is not None
            else aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                sse_algorithm="AES256"
            )
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-{purpose}-encryption",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=sse, bucket_key_enabled=key_arn is not None
                )
            ],
            opts=child,
        )
        aws.s3.BucketPolicy(
            f"{name}-{purpose}-policy",
            bucket=bucket.id,
            policy=pulumi.Output.json_dumps(
                {"Version": "2012-10-17", "Statement": [_tls_only_statement(bucket.arn), *statements]}
            ),
            opts=child,
        )
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-{purpose}-lifecycle",
            bucket=bucket.id,
            rules=_lifecycle_rules(purpose, args.checkpoint_retention_days),
            opts=child,
        )
        if logs is not None:
            aws.s3.BucketLogging(
                f"{name}-{purpose}-logging",
                bucket=bucket.id,
                target_bucket=logs.id,
                target_prefix=f"s3/{purpose}/",
                opts=child,
            )
        return bucket

    def _lustre(
        self,
        name: str,
        args: StorageArgs,
        fsx: FsxArgs,
        key_arn: pulumi.Input[str],
        datasets: aws.s3.Bucket,
        tags: Mapping[str, str],
    ) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
        """Lustre scratch (PERSISTENT_2, no backups) in the first AZ, linked to the datasets bucket; (id, group)."""
        names = args.names
        sg_name = names.physical("lustre")
        lustre_sg = aws.ec2.SecurityGroup(
            f"{name}-lustre-sg",
            name=sg_name,
            description="Lustre from nodes and pods, and between file servers",
            vpc_id=args.vpc_id,
            tags=names.tags("storage", sg_name),
            opts=pulumi.ResourceOptions(parent=self),
        )
        servers = sg.Peer(security_group_id=lustre_sg.id)
        rules: list[pulumi.Resource] = []
        for lo, hi in LUSTRE_PORTS:
            for cidr in sorted(args.client_cidrs):
                rules.append(sg.rule(
                    f"{name}-lustre-from-{sg.cidr_key(cidr)}-{lo}", "ingress", group=lustre_sg,
                    peer=sg.Peer(cidr=cidr), description="Lustre clients", names=names, component="storage",
                    protocol="tcp", ports=(lo, hi),
                ))  # fmt: skip
                # Servers also open connections to clients (FSx for Lustre guide, "File system access control
                # with Amazon VPC": the file system's group allows 988 and 1018-1023 out to its clients).
                rules.append(sg.rule(
                    f"{name}-lustre-to-{sg.cidr_key(cidr)}-{lo}", "egress", group=lustre_sg,
                    peer=sg.Peer(cidr=cidr), description="Lustre servers to clients", names=names,
                    component="storage", protocol="tcp", ports=(lo, hi),
                ))  # fmt: skip
            rules.append(sg.rule(
                f"{name}-lustre-servers-{lo}", "ingress", group=lustre_sg, peer=servers, description="Lustre servers",
                names=names, component="storage", protocol="tcp", ports=(lo, hi),
            ))  # fmt: skip
        rules.append(sg.rule(
            f"{name}-lustre-servers-out", "egress", group=lustre_sg, peer=servers,
            description="Lustre servers to each other", names=names, component="storage",
        ))  # fmt: skip
        first_az = sorted(args.subnet_ids)[0]
        lustre = aws.fsx.LustreFileSystem(
            f"{name}-lustre",
            deployment_type=FSX_DEPLOYMENT,
            storage_type="SSD",
            storage_capacity=fsx.storage_capacity_gib,
            per_unit_storage_throughput=fsx.throughput_per_tib,
            subnet_ids=args.subnet_ids[first_az],  # PERSISTENT_2 single-AZ: one subnet
            security_group_ids=[lustre_sg.id],
            kms_key_id=key_arn,
            data_compression_type="LZ4",
            # No FSx backups: they are not supported on a file system linked to S3 ("Working with backups":
            # automatic and user backups are for persistent file systems not linked to an S3 data repository;
            # "Using data repositories": backups aren't supported on linked file systems; FSx API, CreateBackup).
            # The provider's docstring allows the field for any PERSISTENT type and would not catch it. The
            # durable copy of /datasets is the versioned datasets bucket (auto-export below); the rest is scratch.
            automatic_backup_retention_days=0,
            # Moot without backups, but it forces a new file system when it changes (dlinfra/data/replacements.yaml).
            copy_tags_to_backups=True,
            tags=names.tags("storage", names.physical("lustre")),
            # FSx checks the group's rules when it creates the file system and refuses with InvalidNetworkSettings
            # while 988 is not yet open between its servers: the rules are separate resources that Pulumi would
            # otherwise create alongside it (FSx for Lustre guide, "Creating an FSx for Lustre file system fails";
            # aws-parallelcluster issue 6181 hit the same race). Rule `sg-rules-before-validating-resources`.
            opts=STATEFUL.merge(pulumi.ResourceOptions(parent=self, depends_on=rules)),
        )
        aws.fsx.DataRepositoryAssociation(
            f"{name}-lustre-datasets",
            file_system_id=lustre.id,
            file_system_path="/datasets",
            data_repository_path=pulumi.Output.concat("s3://", datasets.bucket),
            batch_import_meta_data_on_create=True,
            s3=aws.fsx.DataRepositoryAssociationS3Args(
                auto_import_policy=aws.fsx.DataRepositoryAssociationS3AutoImportPolicyArgs(
                    events=["NEW", "CHANGED", "DELETED"]
                ),
                auto_export_policy=aws.fsx.DataRepositoryAssociationS3AutoExportPolicyArgs(
                    events=["NEW", "CHANGED", "DELETED"]
                ),
            ),
            tags=names.tags("storage", names.physical("lustre", "datasets")),
            # The link, not the data (delete_data_in_filesystem stays false): removable, unlike the file system.
            opts=pulumi.ResourceOptions(parent=lustre, protect=False),
        )
        return lustre.id, lustre_sg.id


def _bucket_name(args: StorageArgs, purpose: str) -> pulumi.Output[str]:
    """A bucket's physical name: global in S3, so it carries the account id."""
    return pulumi.Output.concat(args.names.physical(purpose, max_len=50), "-", args.account_id)


def _tls_only_statement(bucket_arn: pulumi.Input[str]) -> dict[str, object]:
    """Deny every request that does not use TLS, for the bucket and its objects."""
    return {
        "Sid": "DenyInsecureTransport",
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:*",
        "Resource": [bucket_arn, pulumi.Output.concat(bucket_arn, "/*")],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }


def _log_delivery_statement(args: StorageArgs, bucket_arns: Mapping[str, pulumi.Output[str]]) -> dict[str, object]:
    """The S3 logging service may write access logs under s3/, for the data buckets of this account only."""
    return {
        "Sid": "S3ServerAccessLogs",
        "Effect": "Allow",
        "Principal": {"Service": "logging.s3.amazonaws.com"},
        "Action": "s3:PutObject",
        "Resource": pulumi.Output.concat(bucket_arns["logs"], "/s3/*"),
        "Condition": {
            "ArnLike": {"aws:SourceArn": [bucket_arns[p] for p in BUCKETS]},
            "StringEquals": {"aws:SourceAccount": args.account_id},
        },
    }


def _fsx_data_repository_statement(
    args: StorageArgs, partition: pulumi.Input[str], datasets_arn: pulumi.Input[str]
) -> dict[str, object]:
    """Let FSx's S3 service-linked role use the key for the datasets bucket's objects (SSE-KMS).

    The role is named after the file system (AWSServiceRoleForFSxS3Access_fs-...), which does not exist when the
    key is made, so the statement matches the role by ARN pattern, through S3 in this region and account only, for
    this bucket's objects only. Source: FSx for Lustre user guide, "Working with server-side encrypted Amazon S3
    buckets".
    """
    region = args.names.region or ""
    role_pattern = pulumi.Output.concat(
        "arn:", partition, ":iam::", args.account_id,
        ":role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_*",
    )  # fmt: skip
    return {
        "Sid": "FsxDataRepositoryThroughS3",
        "Effect": "Allow",
        "Principal": {"AWS": "*"},
        "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"],
        "Resource": "*",
        "Condition": {
            "StringEquals": {"kms:CallerAccount": args.account_id, "kms:ViaService": f"s3.{region}.amazonaws.com"},
            "ArnLike": {"aws:PrincipalArn": role_pattern},
            # With S3 Bucket Keys the context is the bucket's ARN; without, each object's.
            "StringLike": {
                "kms:EncryptionContext:aws:s3:arn": [datasets_arn, pulumi.Output.concat(datasets_arn, "/*")]
            },
        },
    }


def _lifecycle_rules(purpose: str, checkpoint_days: int) -> list[aws.s3.BucketLifecycleConfigurationRuleArgs]:
    """Lifecycle per purpose: datasets stay hot, checkpoints age out, results go cold, logs expire."""
    abort = aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(days_after_initiation=7)
    # (rule id, days before transition, storage class, days noncurrent versions are kept)
    by_purpose: dict[str, tuple[str, int | None, str | None, int]] = {
        # Datasets are read over and over: keep them in STANDARD, drop old versions after a month.
        "datasets": ("noncurrent-30d", None, None, 30),
        # Checkpoints are large and mostly superseded: IA after 30 days, old versions after the retention.
        "checkpoints": ("age-out", 30, "STANDARD_IA", checkpoint_days),
        # Results are kept for papers: Glacier Instant Retrieval after 90 days.
        "results": ("archive", 90, "GLACIER_IR", 365),
        "logs": ("expire", None, None, 30),
    }
    rule_id, days, storage_class, noncurrent_days = by_purpose[purpose]
    transitions = None
    if days is not None and storage_class is not None:
        transitions = [aws.s3.BucketLifecycleConfigurationRuleTransitionArgs(days=days, storage_class=storage_class)]
    return [
        aws.s3.BucketLifecycleConfigurationRuleArgs(
            id=rule_id,
            status="Enabled",
            filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
            abort_incomplete_multipart_upload=abort,
            transitions=transitions,
            noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                noncurrent_days=noncurrent_days
            ),
            expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(days=365) if purpose == "logs" else None,
        )
    ]
