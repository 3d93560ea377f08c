"""The storage rules: encryption at rest of EBS, EFS, FSx and S3; S3 public access and access-log delivery."""

from __future__ import annotations

import json

import pytest

from policy.dlinfra_policy.rules.compute import INSTANCE
from policy.dlinfra_policy.rules.core import Resource
from policy.dlinfra_policy.rules.storage import (
    EFS_FILE_SYSTEM_POLICY,
    FSX_LUSTRE,
    S3_ACCOUNT_PUBLIC_ACCESS_BLOCK,
    S3_BLOCK_FLAGS,
    S3_POLICY,
    S3_PUBLIC_ACCESS_BLOCK,
    ebs_encrypted,
    efs_file_system_policy,
    s3_encrypted,
    s3_no_public_access,
)
from tests.policy.rules._resources import CTX, LT, pass_and_fail, res

BUCKET = res("aws:s3/bucket:Bucket", "data", id="dlinfra-data")(bucket="dlinfra-data")
SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
KMS_RULE = [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}}]
PAB_ALL = dict.fromkeys(S3_BLOCK_FLAGS, True)
ENCRYPTED_ROOT = [{"deviceName": "/dev/xvda", "ebs": {"encrypted": "true", "volumeType": "gp3"}}]

LOG_BUCKET = res("aws:s3/bucket:Bucket", "logs", id="dlinfra-logs")(bucket="dlinfra-logs")
TLS_ONLY = {"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "s3:*"}]}
LOG_POLICY = {
    "Statement": [
        *TLS_ONLY["Statement"],
        {
            "Effect": "Allow",
            "Principal": {"Service": "logging.s3.amazonaws.com"},
            "Action": "s3:PutObject",
            "Condition": {"StringEquals": {"aws:SourceAccount": "111122223333"}},
        },
    ]
}


EFS = res("aws:efs/fileSystem:FileSystem", "efs", id="fs-1")(encrypted=True)
CLIENT = ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite", "elasticfilesystem:ClientRootAccess"]
NO_TLS = {"Effect": "Deny", "Principal": "*", "Action": CLIENT, "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
OUTSIDE_APS = {
    "Effect": "Deny",
    "Principal": "*",
    "Action": CLIENT,
    "Condition": {
        "StringNotLike": {"elasticfilesystem:AccessPointArn": "arn:aws:elasticfilesystem:*:1:access-point/*"}
    },
}
ANYONE_MOUNTS = {  # the console's "prevent root access" example: every principal, anonymous included, may mount
    "Effect": "Allow",
    "Principal": {"AWS": "*"},
    "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"],
    "Condition": {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}},
}


def efs_policy(*statements: dict[str, object]) -> Resource:
    return res(EFS_FILE_SYSTEM_POLICY, "efs-policy", dependencies=[EFS.urn])(
        fileSystemId="fs-1", policy=json.dumps({"Version": "2012-10-17", "Statement": list(statements)})
    )


# rule -> (resources that pass, resources that fail).
CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "ebs-encrypted": (
        [res(LT)(blockDeviceMappings=ENCRYPTED_ROOT), res("aws:ebs/volume:Volume")(encrypted=True)],
        [res(LT)(blockDeviceMappings=[{"deviceName": "/dev/xvda", "ebs": {"encrypted": "false"}}])],
    ),
    "efs-encrypted": (
        [res("aws:efs/fileSystem:FileSystem")(encrypted=True)],
        [res("aws:efs/fileSystem:FileSystem")(encrypted=False)],
    ),
    "s3-encrypted": (
        [BUCKET, res(SSE, dependencies=[BUCKET.urn])(bucket="dlinfra-data", rules=KMS_RULE)],
        [BUCKET],
    ),
    "fsx-encrypted": (
        [res(FSX_LUSTRE)(deploymentType="PERSISTENT_2", kmsKeyId="arn:aws:kms:k"), res(FSX_LUSTRE)()],
        [res(FSX_LUSTRE)(deploymentType="PERSISTENT_2")],
    ),
    "s3-no-public-access": (
        [BUCKET, res(S3_PUBLIC_ACCESS_BLOCK, dependencies=[BUCKET.urn])(bucket="dlinfra-data", **PAB_ALL)],
        [BUCKET, res(S3_PUBLIC_ACCESS_BLOCK)(bucket="dlinfra-data", **PAB_ALL | {"blockPublicPolicy": False})],
    ),
    "s3-access-logs-delivered": (
        [
            LOG_BUCKET,
            BUCKET,
            res("aws:s3/bucketLogging:BucketLogging")(bucket="dlinfra-data", targetBucket="dlinfra-logs"),
            res(S3_POLICY, dependencies=[LOG_BUCKET.urn])(bucket="dlinfra-logs", policy=json.dumps(LOG_POLICY)),
            res(SSE, dependencies=[LOG_BUCKET.urn])(
                bucket="dlinfra-logs", rules=[{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}]
            ),
        ],
        [
            LOG_BUCKET,
            res("aws:s3/bucketLogging:BucketLogging")(bucket="dlinfra-data", targetBucket="dlinfra-logs"),
            res(S3_POLICY, dependencies=[LOG_BUCKET.urn])(bucket="dlinfra-logs", policy=json.dumps(TLS_ONLY)),
            res(SSE, dependencies=[LOG_BUCKET.urn])(bucket="dlinfra-logs", rules=KMS_RULE),
        ],
    ),
    "efs-file-system-policy": (
        [EFS, efs_policy(NO_TLS, OUTSIDE_APS)],
        [EFS, efs_policy(NO_TLS)],
    ),
}


test_rule_passes_good_resources, test_rule_flags_bad_resources = pass_and_fail(CASES)


def test_ebs_launch_template_without_block_devices_is_flagged() -> None:
    assert "no EBS block device" in ebs_encrypted(res(LT)(imageId="ami-1"), CTX)[0]


def test_ebs_instance_root_volume() -> None:
    bad = res(INSTANCE)(rootBlockDevice={"encrypted": False}, ebsBlockDevices=[{"encrypted": True}])
    assert ebs_encrypted(bad, CTX) == ["rootBlockDevice is not encrypted: set rootBlockDevice.encrypted=true"]


def test_s3_bucket_matched_by_name_without_dependency() -> None:
    sse = res(SSE)(bucket="dlinfra-data", rules=KMS_RULE)
    assert s3_encrypted([BUCKET, sse], CTX) == []


def test_s3_weak_algorithm() -> None:
    sse = res(SSE)(bucket="dlinfra-data", rules=[{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "none"}}])
    assert "sseAlgorithm 'none'" in s3_encrypted([BUCKET, sse], CTX)[0].message


def test_s3_public_acl_and_account_block() -> None:
    account = res(S3_ACCOUNT_PUBLIC_ACCESS_BLOCK)(**PAB_ALL)
    public = res("aws:s3/bucket:Bucket", "web")(bucket="web", acl="public-read")
    found = s3_no_public_access([account, public], CTX)
    assert [v.message for v in found] == ["S3 bucket has the public ACL 'public-read'"]


def test_an_efs_file_system_without_a_policy_is_flagged() -> None:
    (found,) = efs_file_system_policy([EFS], CTX)
    assert found.urn == EFS.urn and "admits any client of a mount target" in found.message


@pytest.mark.parametrize(
    ("statements", "expected"),
    [
        ((OUTSIDE_APS,), "does not deny clients without TLS"),
        ((NO_TLS,), "does not deny mounts outside access points"),
        ((NO_TLS, OUTSIDE_APS, ANYONE_MOUNTS), "allows ClientMount to every principal"),
        # The lockout: API calls have no access point, so this Deny refuses AWS Backup and the CSI controller.
        ((NO_TLS, {**OUTSIDE_APS, "Action": "*"}), "locks out AWS Backup"),
        ((NO_TLS, OUTSIDE_APS, {"Effect": "Deny", "Principal": "*", "Action": "elasticfilesystem:*"}), "locks out"),
    ],
)
def test_efs_policy_problems(statements: tuple[dict[str, object], ...], expected: str) -> None:
    found = [v.message for v in efs_file_system_policy([EFS, efs_policy(*statements)], CTX)]
    assert any(expected in m for m in found), found


def test_a_tls_deny_of_every_action_locks_out_nobody() -> None:
    """AWS's own "enforce in-transit encryption" example denies "*" without TLS: API calls use TLS."""
    assert efs_file_system_policy([EFS, efs_policy({**NO_TLS, "Action": "*"}, OUTSIDE_APS)], CTX) == []


def test_the_declared_policy_passes() -> None:
    from components.efs_policy import file_system_policy

    doc = file_system_policy(
        "arn:aws:elasticfilesystem:us-west-2:1:file-system/fs-1", "arn:aws:elasticfilesystem:us-west-2:1:access-point/*"
    )
    policy = res(EFS_FILE_SYSTEM_POLICY, dependencies=[EFS.urn])(fileSystemId="fs-1", policy=json.dumps(doc))
    assert efs_file_system_policy([EFS, policy], CTX) == []


def test_the_rule_passes_the_declared_stack_and_catches_the_policy_removed() -> None:
    from pathlib import Path

    from dlinfra.checks.plans import Plan
    from tests import reference as ref

    stack = "prod-us-west-2"
    data = ref.runs()[stack].plan(ref.fleet().project)
    resources = Plan(Path(f"{stack}.json"), stack, data).rule_resources()
    assert efs_file_system_policy(resources, CTX) == []
    without = [r for r in resources if r.type != EFS_FILE_SYSTEM_POLICY]
    (found,) = efs_file_system_policy(without, CTX)
    assert "no file system policy" in found.message
