"""Storage under the mock engine for every regional stack: protected, encrypted, TLS-only, one mount per AZ."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from components.storage import FsxArgs
from dlinfra.model import stackroles, team_storage
from dlinfra.model.fleet.load import load_fleet
from dlinfra.offline import engine, plan_export
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

CONFIG = {"dlinfra:fleet": str(REFERENCE_FLEET), "dlinfra:lock": str(REFERENCE_LOCK)}
PROGRAM = """
from pathlib import Path
from stacks.context import aws_provider, load_context
from stacks.storage import declare_storage
ctx = load_context(Path({root!r}))
subnets = {{az: "subnet-" + az for az in ctx.fleet.azs(ctx.role.region)}}
provider = aws_provider(ctx.role.region)
declare_storage(ctx, vpc_id="vpc-0test", private_subnet_ids=subnets, provider=provider)
"""
# Every resource type that holds data; each must be protected and retained on delete.
STATEFUL_TYPES = {
    "aws:kms/key:Key",
    "aws:efs/fileSystem:FileSystem",
    "aws:s3/bucket:Bucket",
    "aws:fsx/lustreFileSystem:LustreFileSystem",
}


RULE_IN = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"


def _regional() -> list[str]:
    fleet = load_fleet(REFERENCE_FLEET).fleet
    return [r.name for r in stackroles.roles(fleet) if r.kind == "regional"]


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[plan_export.ResourceRecord]]:
    program = tmp_path_factory.mktemp("prog") / "program.py"
    program.write_text(textwrap.dedent(PROGRAM.format(root=str(ROOT))))
    fleet = load_fleet(REFERENCE_FLEET).fleet
    out = {}
    for role in stackroles.roles(fleet):
        if role.kind == "regional":
            res = engine.run_stack(ROOT, role, project="dlinfra", config=CONFIG, stack_exports={}, program=program)
            out[role.name] = res.resources
    return out


def _of(resources: list[plan_export.ResourceRecord], type_: str) -> list[plan_export.ResourceRecord]:
    return [r for r in resources if r.type == type_]


@pytest.mark.parametrize("stack", _regional())
def test_every_stateful_resource_is_protected_and_retained(stacks: dict, stack: str) -> None:
    stateful = [r for r in stacks[stack] if r.type in STATEFUL_TYPES]
    assert len(_of(stateful, "aws:s3/bucket:Bucket")) == 4  # datasets, checkpoints, results, access logs
    for r in stateful:
        assert r.protect and r.retain_on_delete, r.name


@pytest.mark.parametrize("stack", _regional())
def test_encryption_at_rest(stacks: dict, stack: str) -> None:
    res = stacks[stack]
    (key,) = _of(res, "aws:kms/key:Key")
    assert key.inputs["enableKeyRotation"] is True
    (efs,) = _of(res, "aws:efs/fileSystem:FileSystem")
    assert efs.inputs["encrypted"] is True and efs.inputs["kmsKeyId"] == key.outputs["arn"]
    assert efs.inputs["throughputMode"] == "elastic"
    assert {"transitionToIa": "AFTER_30_DAYS"} in efs.inputs["lifecyclePolicies"]
    encs = _of(res, "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    assert len(encs) == 4
    algorithms = sorted(e.inputs["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] for e in encs)
    assert algorithms == ["AES256", "aws:kms", "aws:kms", "aws:kms"]  # the access-log bucket must be SSE-S3
    for lustre in _of(res, "aws:fsx/lustreFileSystem:LustreFileSystem"):
        assert lustre.inputs["kmsKeyId"] == key.outputs["arn"]


@pytest.mark.parametrize("stack", _regional())
def test_efs_mount_target_in_every_az(stacks: dict, stack: str) -> None:
    region = stack.split("-", 1)[1]
    azs = load_fleet(REFERENCE_FLEET).fleet.azs(region)
    mounts = _of(stacks[stack], "aws:efs/mountTarget:MountTarget")
    assert sorted(m.inputs["subnetId"] for m in mounts) == sorted(f"subnet-{az}" for az in azs)
    (sg,) = [s for s in _of(stacks[stack], "aws:ec2/securityGroup:SecurityGroup") if "efs" in s.name]
    assert "ingress" not in sg.inputs and "egress" not in sg.inputs  # rules are separate resources
    rules = [r for r in _of(stacks[stack], RULE_IN) if r.parent == sg.urn]
    assert {(r.inputs["fromPort"], r.inputs["toPort"], r.inputs["ipProtocol"]) for r in rules} == {
        (2049.0, 2049.0, "tcp")
    }
    cidrs = {r.inputs["cidrIpv4"] for r in rules}
    assert "0.0.0.0/0" not in cidrs and len(cidrs) == len(rules) == len(azs)
    paths = sorted(ap.inputs["rootDirectory"]["path"] for ap in _of(stacks[stack], "aws:efs/accessPoint:AccessPoint"))
    assert paths == ["/datasets", "/home/alice", "/home/bob", "/teams/language", "/teams/robotics", "/teams/vision"]
    (backup,) = _of(stacks[stack], "aws:efs/backupPolicy:BackupPolicy")
    assert backup.inputs["backupPolicy"]["status"] == "ENABLED"


@pytest.mark.parametrize("stack", _regional())
def test_buckets_private_tls_only_versioned_logged(stacks: dict, stack: str) -> None:
    res = stacks[stack]
    for pab in _of(res, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"):
        assert all(
            pab.inputs[k] is True
            for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
        )
    for policy in _of(res, "aws:s3/bucketPolicy:BucketPolicy"):
        statement = json.loads(policy.inputs["policy"])["Statement"][0]  # the log bucket adds log delivery
        assert statement["Effect"] == "Deny" and statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        assert len(statement["Resource"]) == 2
    assert len(_of(res, "aws:s3/bucketPolicy:BucketPolicy")) == 4
    assert all(
        v.inputs["versioningConfiguration"]["status"] == "Enabled"
        for v in _of(res, "aws:s3/bucketVersioning:BucketVersioning")
    )
    owners = _of(res, "aws:s3/bucketOwnershipControls:BucketOwnershipControls")
    assert len(owners) == 4 and all(o.inputs["rule"]["objectOwnership"] == "BucketOwnerEnforced" for o in owners)
    assert len(_of(res, "aws:s3/bucketLogging:BucketLogging")) == 3  # every data bucket logs to the log bucket
    names = sorted(b.inputs["bucket"] for b in _of(res, "aws:s3/bucket:Bucket"))
    assert all(n.endswith("-123456789012") and len(n) <= 63 for n in names)


def test_lifecycle_fits_purpose(stacks: dict) -> None:
    rules = {
        r.name.split("-")[1]: r.inputs["rules"]
        for r in _of(stacks["prod-us-west-2"], "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    }
    assert rules["checkpoints"][0]["noncurrentVersionExpiration"]["noncurrentDays"] == 90
    assert rules["checkpoints"][0]["transitions"][0]["storageClass"] == "STANDARD_IA"
    assert rules["results"][0]["transitions"][0]["storageClass"] == "GLACIER_IR"
    assert "transitions" not in rules["datasets"][0]


def test_fsx_only_where_the_fleet_asks(stacks: dict) -> None:
    for stack, res in stacks.items():
        lustre = _of(res, "aws:fsx/lustreFileSystem:LustreFileSystem")
        if stack.startswith("prod-"):
            (fs,) = lustre
            assert fs.inputs["deploymentType"] == "PERSISTENT_2" and fs.inputs["storageCapacity"] == 2400
            (dra,) = _of(res, "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
            assert dra.inputs["dataRepositoryPath"].startswith("s3://dlinfra-prod-") and dra.inputs[
                "dataRepositoryPath"
            ].endswith("datasets-123456789012")
        else:
            assert lustre == []


@pytest.mark.parametrize(("capacity", "ok"), [(1200, True), (2400, True), (4800, True), (1800, False), (3600, False)])
def test_fsx_capacity_increments(capacity: int, ok: bool) -> None:
    if ok:
        FsxArgs(storage_capacity_gib=capacity, throughput_per_tib=250)
    else:
        with pytest.raises(ValueError, match=r"fsx.storage_capacity_gib: \d+ is not 1200 or a multiple of 2400"):
            FsxArgs(storage_capacity_gib=capacity, throughput_per_tib=250)


def _key_statements(res: list[plan_export.ResourceRecord]) -> dict[str, dict[str, Any]]:
    (key,) = [k for k in _of(res, "aws:kms/key:Key") if "storage" in k.name]
    return {s["Sid"]: s for s in json.loads(key.inputs["policy"])["Statement"]}


def test_fsx_can_use_the_datasets_key_through_s3(stacks: dict) -> None:
    """FSx's S3 service-linked role may use the storage key for the datasets bucket only, through S3."""
    for stack, res in stacks.items():
        statements = _key_statements(res)
        if not _of(res, "aws:fsx/lustreFileSystem:LustreFileSystem"):
            assert "FsxDataRepositoryThroughS3" not in statements, stack
            continue
        region = stack.split("-", 1)[1]
        fsx = statements["FsxDataRepositoryThroughS3"]
        (datasets,) = [b for b in _of(res, "aws:s3/bucket:Bucket") if b.name == "storage-datasets"]
        condition = fsx["Condition"]
        assert condition["StringEquals"] == {
            "kms:CallerAccount": "123456789012",
            "kms:ViaService": f"s3.{region}.amazonaws.com",
        }
        assert condition["ArnLike"]["aws:PrincipalArn"].endswith(
            ":role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_*"
        )
        arn = datasets.outputs["arn"]
        assert condition["StringLike"]["kms:EncryptionContext:aws:s3:arn"] == [arn, f"{arn}/*"]
        assert "kms:Decrypt" in fsx["Action"] and "kms:GenerateDataKey*" in fsx["Action"]


def test_access_logs_are_delivered_to_the_log_bucket(stacks: dict) -> None:
    for stack, res in stacks.items():
        buckets = {b.name.removeprefix("storage-"): b for b in _of(res, "aws:s3/bucket:Bucket")}
        (policy,) = [p for p in _of(res, "aws:s3/bucketPolicy:BucketPolicy") if p.name == "storage-logs-policy"]
        statements = {s["Sid"]: s for s in json.loads(policy.inputs["policy"])["Statement"]}
        delivery = statements["S3ServerAccessLogs"]
        assert delivery["Principal"] == {"Service": "logging.s3.amazonaws.com"}
        assert delivery["Resource"] == buckets["logs"].outputs["arn"] + "/s3/*"
        sources = sorted(b.outputs["arn"] for name, b in buckets.items() if name != "logs")
        assert sorted(delivery["Condition"]["ArnLike"]["aws:SourceArn"]) == sources, stack
        assert delivery["Condition"]["StringEquals"] == {"aws:SourceAccount": "123456789012"}
        for logging in _of(res, "aws:s3/bucketLogging:BucketLogging"):
            assert logging.inputs["targetBucket"] == buckets["logs"].id
            assert logging.inputs["targetPrefix"].startswith("s3/")


def test_lustre_waits_for_every_rule_of_its_group(stacks: dict) -> None:
    """FSx validates 988 and 1018-1023 when it creates the file system: the rules must exist by then."""
    for stack, res in stacks.items():
        for fs in _of(res, "aws:fsx/lustreFileSystem:LustreFileSystem"):
            (group,) = [
                g for g in _of(res, "aws:ec2/securityGroup:SecurityGroup") if g.id in fs.inputs["securityGroupIds"]
            ]
            rules = [
                r for r in res if r.type.startswith("aws:vpc/securityGroup") and r.inputs["securityGroupId"] == group.id
            ]
            ports = {(r.inputs.get("fromPort"), r.inputs.get("toPort")) for r in rules}
            assert {(988.0, 988.0), (1018.0, 1023.0)} <= ports, stack
            assert {r.urn for r in rules} <= set(fs.dependencies), stack


def test_lustre_linked_to_s3_takes_no_backups(stacks: dict) -> None:
    """FSx backs up only persistent file systems not linked to S3; the datasets bucket is the durable copy."""
    for stack, res in stacks.items():
        for fs in _of(res, "aws:fsx/lustreFileSystem:LustreFileSystem"):
            links = [
                d
                for d in _of(res, "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
                if fs.urn in d.dependencies
            ]
            assert links, stack
            assert fs.inputs["automaticBackupRetentionDays"] == 0, stack
            assert "dailyAutomaticBackupStartTime" not in fs.inputs, stack


CLIENT_ACTIONS = {f"elasticfilesystem:{a}" for a in ("ClientMount", "ClientWrite", "ClientRootAccess")}


def _file_system_policy(res: list[plan_export.ResourceRecord]) -> dict[str, dict[str, Any]]:
    (efs,) = _of(res, "aws:efs/fileSystem:FileSystem")
    (policy,) = _of(res, "aws:efs/fileSystemPolicy:FileSystemPolicy")
    assert policy.inputs["fileSystemId"] == efs.id and policy.inputs["bypassPolicyLockoutSafetyCheck"] is False
    statements = json.loads(policy.inputs["policy"])["Statement"]
    assert all(s["Resource"] == efs.outputs["arn"] for s in statements)
    return {s["Sid"]: s for s in statements}


@pytest.mark.parametrize("stack", _regional())
def test_efs_policy_replaces_the_open_default(stacks: dict, stack: str) -> None:
    """EFS guide, "Default EFS file system policy": without one, any client of a mount target is root. The policy
    refuses clients without TLS, outside access points or mount targets, and root; it allows nobody anything."""
    region = stack.split("-", 1)[1]
    statements = _file_system_policy(stacks[stack])
    assert all(s["Effect"] == "Deny" and s["Principal"] == {"AWS": "*"} for s in statements.values())
    assert statements["DenyWithoutTls"]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert statements["DenyOutsideAccessPoints"]["Condition"] == {
        "StringNotLike": {
            "elasticfilesystem:AccessPointArn": f"arn:aws:elasticfilesystem:{region}:123456789012:access-point/*"
        }
    }
    assert statements["DenyOutsideMountTargets"]["Condition"] == {
        "Bool": {"elasticfilesystem:AccessedViaMountTarget": "false"}
    }
    assert statements["DenyRootAccess"]["Action"] == ["elasticfilesystem:ClientRootAccess"]
    assert "Condition" not in statements["DenyRootAccess"]
    for sid in ("DenyWithoutTls", "DenyOutsideAccessPoints", "DenyOutsideMountTargets"):
        assert set(statements[sid]["Action"]) == CLIENT_ACTIONS, sid


@pytest.mark.parametrize("stack", _regional())
def test_efs_policy_denies_no_api_action(stacks: dict, stack: str) -> None:
    """The lockout guard: AWS Backup (elasticfilesystem:Backup), the CSI controller (CreateAccessPoint) and the
    apply role (PutFileSystemPolicy) call EFS's API; a Deny naming "*" or any API action would refuse them."""
    for statement in _file_system_policy(stacks[stack]).values():
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert set(actions) <= CLIENT_ACTIONS, statement["Sid"]


@pytest.mark.parametrize("stack", _regional())
def test_no_mount_target_before_the_policy(stacks: dict, stack: str) -> None:
    (policy,) = _of(stacks[stack], "aws:efs/fileSystemPolicy:FileSystemPolicy")
    for mount in _of(stacks[stack], "aws:efs/mountTarget:MountTarget"):
        assert policy.urn in mount.dependencies, mount.name


@pytest.mark.parametrize("stack", _regional())
def test_access_points_enforce_an_identity_and_create_their_root(stacks: dict, stack: str) -> None:
    """One access point per team and per person, each enforcing its POSIX identity and creating its root
    directory owned by it (EFS guide, "Enforcing a user identity using an access point"; API reference,
    "CreationInfo": without it a missing root directory fails every mount)."""
    fleet = load_fleet(REFERENCE_FLEET).fleet
    env = stack.split("-", 1)[0]
    planned = team_storage.plan(fleet, env).access_points
    points = {
        ap.name.removeprefix("storage-efs-"): ap.inputs for ap in _of(stacks[stack], "aws:efs/accessPoint:AccessPoint")
    }
    assert set(points) == set(planned) == {"datasets", *(f"team-{t}" for t in fleet.teams), "home-alice", "home-bob"}
    for key, inputs in points.items():
        uid, gid = int(inputs["posixUser"]["uid"]), int(inputs["posixUser"]["gid"])
        creation = inputs["rootDirectory"]["creationInfo"]
        assert (int(creation["ownerUid"]), int(creation["ownerGid"])) == (uid, gid) != (0, 0), key
        assert (uid, gid, inputs["rootDirectory"]["path"]) == (planned[key].uid, planned[key].gid, planned[key].path)
    assert int(points["team-vision"]["posixUser"]["uid"]) == team_storage.posix_id("team", "vision")
    assert int(points["home-alice"]["posixUser"]["uid"]) == team_storage.posix_id("person", "alice")
    assert points["home-alice"]["rootDirectory"]["creationInfo"]["permissions"] == "0700"
    assert points["team-vision"]["rootDirectory"]["creationInfo"]["permissions"] == "0770"
    # The datasets keep the identity their files were first written with.
    assert int(points["datasets"]["posixUser"]["uid"]) == 1000
