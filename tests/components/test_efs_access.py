"""Who may mount the file system, evaluated on the declared documents (tests/components/_iam_eval.py).

The file system policy (components/efs_policy.py) and the EFS CSI node's identity policy together must admit the
driver's IAM mounts through access points and keep everyone else out: anonymous NFS clients, mounts without TLS,
mounts outside access points, root. And they must lock out nobody who calls EFS's API: AWS Backup, the CSI
controller, the role that applies the policy.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.cluster import EFS_CSI_NODE_SA
from tests import reference as ref
from tests.components._iam_eval import ANONYMOUS, Request, allowed

STACKS = ref.REGIONAL
MOUNT, WRITE, ROOT = (f"elasticfilesystem:{a}" for a in ("ClientMount", "ClientWrite", "ClientRootAccess"))


def _documents(stack: str) -> dict[str, Any]:
    run = ref.runs()[stack]
    (efs,) = ref.of_type(run, "aws:efs/fileSystem:FileSystem")
    (policy,) = ref.of_type(run, "aws:efs/fileSystemPolicy:FileSystemPolicy")
    role = ref.named(run, "cluster-efs-csi-node-role")
    (inline,) = [p for p in ref.of_type(run, "aws:iam/rolePolicy:RolePolicy") if p.parent == role.urn]
    points = {
        ap.name.removeprefix("storage-efs-"): ap.outputs["arn"]
        for ap in ref.of_type(run, "aws:efs/accessPoint:AccessPoint")
    }
    return {
        "fs": efs.outputs["arn"],
        "policy": json.loads(policy.inputs["policy"]),
        "node": json.loads(inline.inputs["policy"]),
        "role": role,
        "points": points,
    }


def _mount(doc: dict[str, Any], who: str, action: str, **context: str) -> bool:
    base = {"aws:SecureTransport": "true", "elasticfilesystem:AccessedViaMountTarget": "true"}
    request = Request(who, action, doc["fs"], {**base, **context})
    return allowed(request, doc["policy"], [doc["node"]])


@pytest.mark.parametrize("stack", STACKS)
def test_the_csi_node_mounts_and_writes_through_team_and_home_access_points(stack: str) -> None:
    doc = _documents(stack)
    node = doc["role"].outputs["arn"]
    for key in ("team-vision", "home-alice"):
        through = {"elasticfilesystem:AccessPointArn": doc["points"][key]}
        assert _mount(doc, node, MOUNT, **through) and _mount(doc, node, WRITE, **through), key
        assert not _mount(doc, node, ROOT, **through), key


@pytest.mark.parametrize("stack", STACKS)
def test_the_datasets_are_read_only_down_to_efs(stack: str) -> None:
    doc = _documents(stack)
    node = doc["role"].outputs["arn"]
    through = {"elasticfilesystem:AccessPointArn": doc["points"]["datasets"]}
    assert _mount(doc, node, MOUNT, **through)
    assert not _mount(doc, node, WRITE, **through)


@pytest.mark.parametrize("stack", STACKS)
def test_no_mount_without_tls_an_access_point_a_mount_target_or_iam(stack: str) -> None:
    doc = _documents(stack)
    node = doc["role"].outputs["arn"]
    through = {"elasticfilesystem:AccessPointArn": doc["points"]["team-vision"]}
    assert not _mount(doc, node, MOUNT, **through, **{"aws:SecureTransport": "false"})
    assert not _mount(doc, node, MOUNT)  # the file system's root, no access point
    assert not _mount(doc, node, MOUNT, **through, **{"elasticfilesystem:AccessedViaMountTarget": "false"})
    # An inline nfs volume: kubelet mounts anonymously, without TLS or an access point; even with both it has no
    # identity to be allowed by.
    assert not _mount(doc, ANONYMOUS, MOUNT, **{"aws:SecureTransport": "false"})
    assert not _mount(doc, ANONYMOUS, MOUNT, **through)
    assert not _mount(doc, ANONYMOUS, ROOT, **through)


@pytest.mark.parametrize("stack", STACKS)
def test_the_file_system_policy_locks_out_no_api_caller(stack: str) -> None:
    """AWS Backup (elasticfilesystem:Backup, Restore), the CSI controller (CreateAccessPoint, DeleteAccessPoint,
    DescribeAccessPoints) and the apply role (PutFileSystemPolicy, DescribeFileSystemPolicy) call the API without
    NFS's condition keys; the policy must deny none of them whatever their identity policies allow."""
    doc = _documents(stack)
    anything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    callers = {
        "arn:aws:iam::123456789012:role/aws-service-role/backup.amazonaws.com/AWSServiceRoleForBackup": (
            "elasticfilesystem:Backup", "elasticfilesystem:Restore",
        ),
        "arn:aws:iam::123456789012:role/dlinfra-prod-usw2-eks-aws-efs-csi-driver": (
            "elasticfilesystem:CreateAccessPoint", "elasticfilesystem:DeleteAccessPoint",
            "elasticfilesystem:DescribeAccessPoints",
        ),
        "arn:aws:iam::111122223333:role/dlinfra-apply-prod": (
            "elasticfilesystem:PutFileSystemPolicy", "elasticfilesystem:DescribeFileSystemPolicy",
        ),
    }  # fmt: skip
    for principal, actions in callers.items():
        for action in actions:
            request = Request(principal, action, doc["fs"], {"aws:SecureTransport": "true"})
            assert allowed(request, doc["policy"], [anything]), (principal, action)


@pytest.mark.parametrize("stack", STACKS)
def test_only_the_csi_nodes_service_account_assumes_the_mount_role(stack: str) -> None:
    run = ref.runs()[stack]
    role = ref.named(run, "cluster-efs-csi-node-role")
    trust = json.loads(role.inputs["assumeRolePolicy"])
    (statement,) = trust["Statement"]
    assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    tags = statement["Condition"]["StringEquals"]
    assert tags["aws:RequestTag/kubernetes-namespace"] == "kube-system"
    assert tags["aws:RequestTag/kubernetes-service-account"] == EFS_CSI_NODE_SA
    association = ref.named(run, "cluster-efs-csi-node-identity")
    assert (association.inputs["namespace"], association.inputs["serviceAccount"]) == ("kube-system", EFS_CSI_NODE_SA)
    # The add-on starts its node pods after the association exists, so they get its credentials.
    addon = ref.named(run, "cluster-aws-efs-csi-driver")
    assert association.urn in addon.dependencies
