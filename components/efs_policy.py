"""The EFS file system policy and the EFS CSI node's mount policy: AWS documents, no resources.

Without a file system policy EFS applies its default one, which "grants full access to any anonymous client that
can connect to the file system using a mount target" (EFS guide, "Using IAM to control file system data access",
section "Default EFS file system policy"). Any pod could then mount the file system's root over NFS as root and
read every team's files. The policy below replaces it, and only denies:

- every NFS client action over a connection without TLS (condition key aws:SecureTransport);
- every NFS client action that does not come through one of this account's access points in this region
  (elasticfilesystem:AccessPointArn), so each mount gets the enforced identity and root directory of an access
  point (EFS guide, "Enforcing a user identity using an access point" and "Enforcing a root directory with an
  access point");
- every NFS client action that does not come through a mount target (elasticfilesystem:AccessedViaMountTarget);
- root access (elasticfilesystem:ClientRootAccess) for everyone.

It allows nothing: once a policy is in effect the default grant is gone, so a client needs an Allow in an IAM
identity policy, which an anonymous client (a mount without the `iam` option: kubelet's inline `nfs` volumes)
cannot have (same guide: "An allow permission on an action in either an IAM identity policy or a file system
resource policy allows access"). Those are the only condition keys EFS evaluates for NFS clients (same guide, "EFS
condition keys for clients"), so nothing here relies on a key EFS would ignore.

Lockout (the classic defect of such policies): every Deny names only the three NFS client actions, never "*".
API calls are left to IAM: AWS Backup's elasticfilesystem:Backup and Restore (AWSBackupServiceLinkedRolePolicy...),
the EFS CSI controller's CreateAccessPoint / DescribeAccessPoints / DeleteAccessPoint (AmazonEFSCSIDriverPolicy),
Pulumi's own PutFileSystemPolicy (so the policy lockout safety check of PutFileSystemPolicy never trips; its
bypass flag stays false). The CSI node mounts with `iam` and TLS through access points and mount targets, and
never as root, so none of the Denies matches its mounts. The CSI controller mounts only to delete a volume's
directory, which dlinfra does not turn on (delete-access-point-root-dir; reclaimPolicy Retain). A deny-only
policy admits no public access, so EFS's block-public-access check accepts it (EFS guide, "Blocking public
access").
"""

from __future__ import annotations

import pulumi

CLIENT_MOUNT = "elasticfilesystem:ClientMount"
CLIENT_WRITE = "elasticfilesystem:ClientWrite"
CLIENT_ROOT = "elasticfilesystem:ClientRootAccess"
CLIENT_ACTIONS = (CLIENT_MOUNT, CLIENT_WRITE, CLIENT_ROOT)
SECURE_TRANSPORT = "aws:SecureTransport"
ACCESS_POINT_ARN = "elasticfilesystem:AccessPointArn"
VIA_MOUNT_TARGET = "elasticfilesystem:AccessedViaMountTarget"


def access_point_pattern(
    partition: pulumi.Input[str], region: pulumi.Input[str], account_id: pulumi.Input[str]
) -> pulumi.Output[str]:
    """Every access point of the account in the region (ARN format: EFS API reference, "AccessPointDescription")."""
    return pulumi.Output.concat("arn:", partition, ":elasticfilesystem:", region, ":", account_id, ":access-point/*")


def file_system_policy(file_system_arn: pulumi.Input[str], access_points: pulumi.Input[str]) -> dict[str, object]:
    """The deny-only file system policy; `access_points` is `access_point_pattern(...)`."""

    def deny(sid: str, actions: tuple[str, ...], condition: dict[str, object] | None) -> dict[str, object]:
        statement: dict[str, object] = {
            "Sid": sid,
            "Effect": "Deny",
            # Everyone, anonymous clients included; spelled as EFS's own examples do ("Resource-based policy
            # examples for Amazon EFS"; IAM user guide, "AWS JSON policy elements: Principal": the same as "*").
            "Principal": {"AWS": "*"},
            "Action": list(actions),
            "Resource": file_system_arn,
        }
        if condition is not None:
            statement["Condition"] = condition
        return statement

    return {
        "Version": "2012-10-17",
        "Statement": [
            deny("DenyWithoutTls", CLIENT_ACTIONS, {"Bool": {SECURE_TRANSPORT: "false"}}),
            # A negated operator also matches when the key is absent: a mount without an access point.
            deny("DenyOutsideAccessPoints", CLIENT_ACTIONS, {"StringNotLike": {ACCESS_POINT_ARN: access_points}}),
            deny("DenyOutsideMountTargets", CLIENT_ACTIONS, {"Bool": {VIA_MOUNT_TARGET: "false"}}),
            deny("DenyRootAccess", (CLIENT_ROOT,), None),
        ],
    }


def node_mount_policy(
    file_system_arn: pulumi.Input[str],
    access_points: pulumi.Input[str],
    read_only_access_points: list[pulumi.Input[str]],
) -> dict[str, object]:
    """What the EFS CSI node (efs-csi-node-sa) may do with the `iam` mount option: mount and write through access
    points of this file system over a mount target, and only read through the read-only ones (the datasets).

    The node mounts for every pod on it, so this cannot tell teams apart; which access point a pod gets is decided
    by Kubernetes (a static volume reserved for one team's claim, and no inline volumes: components/team_volumes.py).
    Access points are matched by pattern because the dynamic storage class creates its own at run time.
    """
    statements: list[dict[str, object]] = [
        {
            "Sid": "MountThroughAccessPoints",
            "Effect": "Allow",
            "Action": [CLIENT_MOUNT, CLIENT_WRITE],
            "Resource": file_system_arn,
            "Condition": {
                "Bool": {VIA_MOUNT_TARGET: "true"},
                "StringLike": {ACCESS_POINT_ARN: access_points},
            },
        }
    ]
    if read_only_access_points:
        statements.append(
            {
                "Sid": "ReadOnlyAccessPoints",
                "Effect": "Deny",
                "Action": [CLIENT_WRITE],
                "Resource": file_system_arn,
                "Condition": {"StringEquals": {ACCESS_POINT_ARN: read_only_access_points}},
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}
