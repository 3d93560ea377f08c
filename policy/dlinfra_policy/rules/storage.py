"""Rules for what holds data: encryption at rest (EBS, EFS, FSx, S3), S3 public access and access logs, and
the EFS file system policy."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .compute import INSTANCE, LAUNCH_TEMPLATE
from .core import Context, Resource, Violation, as_list, as_object, as_objects, has_key, is_true, refers_to

EBS_VOLUME = "aws:ebs/volume:Volume"
EFS_FILE_SYSTEM = "aws:efs/fileSystem:FileSystem"
FSX_LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
FSX_FILE_SYSTEMS = (
    FSX_LUSTRE,
    "aws:fsx/openZfsFileSystem:OpenZfsFileSystem",
    "aws:fsx/ontapFileSystem:OntapFileSystem",
    "aws:fsx/windowsFileSystem:WindowsFileSystem",
)
S3_BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
S3_ENCRYPTION_CONFIGS = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)
S3_PUBLIC_ACCESS_BLOCK = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
S3_ACCOUNT_PUBLIC_ACCESS_BLOCK = "aws:s3/accountPublicAccessBlock:AccountPublicAccessBlock"
S3_ACLS = ("aws:s3/bucketAcl:BucketAcl", "aws:s3/bucketAclV2:BucketAclV2")
S3_LOGGING = ("aws:s3/bucketLogging:BucketLogging", "aws:s3/bucketLoggingV2:BucketLoggingV2")
S3_POLICY = "aws:s3/bucketPolicy:BucketPolicy"

S3_SSE_ALGORITHMS = frozenset({"aws:kms", "aws:kms:dsse", "AES256"})
S3_PUBLIC_ACLS = frozenset({"public-read", "public-read-write", "authenticated-read"})
S3_BLOCK_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")


def ebs_encrypted(resource: Resource, ctx: Context) -> list[str]:
    """EBS volumes, launch template block devices and instance volumes are encrypted."""
    inputs = resource.inputs
    if resource.type == EBS_VOLUME:
        return [] if is_true(inputs.get("encrypted")) else ["EBS volume is not encrypted: set encrypted=true"]
    out: list[str] = []
    if resource.type == LAUNCH_TEMPLATE:
        ebs_devices = 0
        for i, mapping in enumerate(as_objects(inputs.get("blockDeviceMappings"))):
            ebs = mapping.get("ebs")
            if not isinstance(ebs, Mapping):
                continue  # instance store or a suppressed device: nothing at rest on EBS
            ebs_devices += 1
            if not is_true(ebs.get("encrypted")):
                device = mapping.get("deviceName") or "?"
                out.append(f'blockDeviceMappings[{i}] ({device}) is not encrypted: set ebs.encrypted="true"')
        if ebs_devices == 0:
            out.append(
                "declares no EBS block device, so the root volume is only as encrypted as the AMI's snapshot: "
                'map the root device with ebs.encrypted="true"'
            )
    elif resource.type == INSTANCE:
        root = as_object(inputs.get("rootBlockDevice"))
        if not is_true(root.get("encrypted")):
            out.append("rootBlockDevice is not encrypted: set rootBlockDevice.encrypted=true")
        for i, device in enumerate(as_objects(inputs.get("ebsBlockDevices"))):
            if not is_true(device.get("encrypted")):
                out.append(f"ebsBlockDevices[{i}] ({device.get('deviceName') or '?'}) is not encrypted")
    return out


def efs_encrypted(resource: Resource, ctx: Context) -> list[str]:
    """EFS file systems are encrypted at rest (encryption cannot be turned on after creation)."""
    if resource.type != EFS_FILE_SYSTEM or is_true(resource.inputs.get("encrypted")):
        return []
    return ["EFS file system is not encrypted at rest: set encrypted=true (it forces a replacement later)"]


def fsx_encrypted(resource: Resource, ctx: Context) -> list[str]:
    """FSx file systems use a customer-managed KMS key wherever the service takes one."""
    if resource.type not in FSX_FILE_SYSTEMS:
        return []
    if resource.type == FSX_LUSTRE:
        deployment = str(resource.inputs.get("deploymentType") or "SCRATCH_1")
        if deployment.startswith("SCRATCH"):
            return []  # scratch file systems are always encrypted with FSx's own key and take no other
    if has_key(resource.inputs, "kmsKeyId"):
        return []
    return ["FSx file system has no kmsKeyId: encrypt it with a customer-managed KMS key"]


def _sse_problems(rules: Any) -> list[str]:
    """What is wrong with the `rule` list of an S3 server-side encryption configuration."""
    algorithms = [
        as_object(rule.get("applyServerSideEncryptionByDefault")).get("sseAlgorithm") for rule in as_objects(rules)
    ]
    if not algorithms:
        return ["server-side encryption configuration has no rule: add applyServerSideEncryptionByDefault"]
    bad = [a for a in algorithms if a not in S3_SSE_ALGORITHMS]
    if bad:
        return [f"sseAlgorithm {bad[0]!r} is not one of {', '.join(sorted(S3_SSE_ALGORITHMS))}"]
    return []


def s3_encrypted(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every S3 bucket has a server-side encryption configuration with a real algorithm."""
    configs = [r for r in resources if r.type in S3_ENCRYPTION_CONFIGS]
    # pulumi-aws names the rule list `rules` (Terraform: `rule`); accept either spelling.
    out = [Violation(c.urn, msg) for c in configs for msg in _sse_problems(c.inputs.get("rules", c.inputs.get("rule")))]
    for bucket in (r for r in resources if r.type in S3_BUCKETS):
        inline = as_objects(bucket.inputs.get("serverSideEncryptionConfiguration")) + as_objects(
            bucket.inputs.get("serverSideEncryptionConfigurations")
        )
        if inline:
            out += [
                Violation(bucket.urn, msg) for c in inline for msg in _sse_problems(c.get("rule") or c.get("rules"))
            ]
        elif not any(refers_to(c, bucket, "bucket") for c in configs):
            out.append(
                Violation(
                    bucket.urn,
                    "S3 bucket has no server-side encryption configuration: declare a "
                    "BucketServerSideEncryptionConfiguration for it",
                )
            )
    return out


def s3_no_public_access(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every S3 bucket has a public access block with all four settings true, and no public ACL."""
    blocks = [r for r in resources if r.type in (S3_PUBLIC_ACCESS_BLOCK, S3_ACCOUNT_PUBLIC_ACCESS_BLOCK)]
    out: list[Violation] = []
    complete: list[Resource] = []
    for block in blocks:
        off = [flag for flag in S3_BLOCK_FLAGS if not is_true(block.inputs.get(flag))]
        if off:
            out.append(Violation(block.urn, f"public access block leaves {', '.join(off)} off: set all four to true"))
        else:
            complete.append(block)
    account_wide = any(b.type == S3_ACCOUNT_PUBLIC_ACCESS_BLOCK for b in complete)
    for bucket in (r for r in resources if r.type in S3_BUCKETS):
        if str(bucket.inputs.get("acl") or "") in S3_PUBLIC_ACLS:
            out.append(Violation(bucket.urn, f"S3 bucket has the public ACL {bucket.inputs.get('acl')!r}"))
        if account_wide or any(refers_to(b, bucket, "bucket") for b in complete if b.type == S3_PUBLIC_ACCESS_BLOCK):
            continue
        out.append(
            Violation(bucket.urn, "S3 bucket has no public access block with all four settings true: declare one")
        )
    for acl in (r for r in resources if r.type in S3_ACLS):
        if str(acl.inputs.get("acl") or "") in S3_PUBLIC_ACLS:
            out.append(Violation(acl.urn, f"bucket ACL {acl.inputs.get('acl')!r} makes the bucket public"))
    return out


def s3_access_logs_delivered(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """A bucket that receives server access logs admits the S3 logging service, scoped to the source account,
    and is not SSE-KMS encrypted (log delivery cannot use a customer key). Without the policy statement the logs
    are silently never delivered. Source: S3 user guide, "Enabling Amazon S3 server access logging" (permissions
    for log delivery, with aws:SourceArn and aws:SourceAccount; SSE-S3 for the destination bucket).
    """
    buckets = [r for r in resources if r.type in S3_BUCKETS]
    policies = [r for r in resources if r.type == S3_POLICY]
    configs = [r for r in resources if r.type in S3_ENCRYPTION_CONFIGS]
    out = []

    def names(child: Resource, key: str, bucket: Resource) -> bool:
        # By value only: a logging configuration also depends on its source bucket.
        return child.inputs.get(key) in {bucket.id, bucket.inputs.get("bucket")} - {None, ""}

    for logging in (r for r in resources if r.type in S3_LOGGING):
        target = next((b for b in buckets if names(logging, "targetBucket", b)), None)
        if target is None:
            continue  # a bucket of another stack or account: not ours to check here
        statements = [
            s
            for p in policies
            if names(p, "bucket", target)
            for s in as_objects(_json_or_object(p.inputs.get("policy")).get("Statement"))
        ]
        admitted = [
            s
            for s in statements
            if s.get("Effect") == "Allow"
            and "logging.s3.amazonaws.com" in as_list(as_object(s.get("Principal")).get("Service"))
            and any("aws:SourceAccount" in as_object(block) for block in as_object(s.get("Condition")).values())
        ]
        if not admitted:
            out.append(
                Violation(
                    logging.urn,
                    "the log bucket's policy does not admit logging.s3.amazonaws.com with aws:SourceAccount: "
                    "no access log will be delivered",
                )
            )
        for config in configs:
            rules = as_objects(config.inputs.get("rules", config.inputs.get("rule")))
            algorithms = {as_object(r.get("applyServerSideEncryptionByDefault")).get("sseAlgorithm") for r in rules}
            if names(config, "bucket", target) and algorithms & {"aws:kms", "aws:kms:dsse"}:
                out.append(Violation(logging.urn, "the log bucket uses SSE-KMS: server access logs need SSE-S3"))
    return out


def _json_or_object(value: Any) -> Mapping[str, Any]:
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return as_object(value)


EFS_FILE_SYSTEM_POLICY = "aws:efs/fileSystemPolicy:FileSystemPolicy"
EFS_CLIENT_ACTIONS = (
    "elasticfilesystem:ClientMount",
    "elasticfilesystem:ClientWrite",
    "elasticfilesystem:ClientRootAccess",
)
# Condition keys EFS sets only for NFS clients (EFS guide, "EFS condition keys for clients"); an API call never has
# them, so a Deny of API actions conditioned on them, or negating them, refuses every API call.
EFS_CLIENT_KEYS = ("elasticfilesystem:AccessPointArn", "elasticfilesystem:AccessedViaMountTarget")
_NEGATED = ("StringNotEquals", "StringNotLike", "ArnNotEquals", "ArnNotLike")


def _covers(actions: Any, action: str) -> bool:
    return any(fnmatch.fnmatchcase(action, str(a)) for a in as_list(actions))


def _everyone(principal: Any) -> bool:
    return principal == "*" or "*" in as_list(as_object(principal).get("AWS"))


def _conditions(statement: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(operator, key, value) of every condition of a statement."""
    return [
        (str(op), str(key), value)
        for op, keys in as_object(statement.get("Condition")).items()
        for key, value in as_object(keys).items()
    ]


def _efs_policy_problems(doc: Mapping[str, Any]) -> list[str]:
    statements = as_objects(doc.get("Statement"))
    denies = [s for s in statements if s.get("Effect") == "Deny" and _everyone(s.get("Principal"))]
    out = []
    for s in statements:
        if (
            s.get("Effect") == "Allow"
            and _everyone(s.get("Principal"))
            and _covers(s.get("Action"), EFS_CLIENT_ACTIONS[0])
        ):
            out.append(
                f"statement {s.get('Sid') or '?'} allows ClientMount to every principal: anonymous clients (no IAM) "
                "mount too; allow named roles, or grant mounts in identity policies"
            )
    if not any(
        _covers(s.get("Action"), EFS_CLIENT_ACTIONS[0])
        and ("Bool", "aws:SecureTransport", "false") in [(o, k, str(v).lower()) for o, k, v in _conditions(s)]
        for s in denies
    ):
        out.append(
            'does not deny clients without TLS: add a Deny of the client actions on Bool aws:SecureTransport "false"'
        )
    if not any(
        all(_covers(s.get("Action"), a) for a in EFS_CLIENT_ACTIONS)
        and any(
            k == EFS_CLIENT_KEYS[0] and (o in _NEGATED or (o == "Null" and str(v).lower() == "true"))
            for o, k, v in _conditions(s)
        )
        for s in denies
    ):
        out.append(
            "does not deny mounts outside access points: add a Deny of the client actions (root access included) "
            "on StringNotLike elasticfilesystem:AccessPointArn"
        )
    for s in (s for s in statements if s.get("Effect") == "Deny"):
        broad = [a for a in as_list(s.get("Action")) if not str(a).startswith("elasticfilesystem:Client")]
        # An API call has none of the client keys: a negated or Null test on them matches it; all must match.
        api_call_matches = all(
            k in EFS_CLIENT_KEYS and (o in _NEGATED or (o == "Null" and str(v).lower() == "true"))
            for o, k, v in _conditions(s)
        )
        if broad and api_call_matches:
            out.append(
                f"statement {s.get('Sid') or '?'} denies {', '.join(map(str, broad))} under a condition API calls "
                "always meet: it locks out AWS Backup (elasticfilesystem:Backup), the EFS CSI controller and "
                "PutFileSystemPolicy; deny only the client actions"
            )
    return out


def efs_file_system_policy(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every EFS file system has a file system policy that denies clients without TLS and outside access points,
    allows no anonymous client, and denies no API action under NFS-only conditions.

    Sources: EFS user guide, "Using IAM to control file system data access" ("Default EFS file system policy":
    without a policy any anonymous client of a mount target gets full, root access; the condition keys EFS sets for
    NFS clients) and "Enforcing a user identity using an access point"; AWS managed policy
    AWSBackupServiceLinkedRolePolicyForBackup (AWS Backup calls elasticfilesystem:Backup, an API action, which a
    Deny conditioned on NFS-only keys refuses).
    """
    policies = [r for r in resources if r.type == EFS_FILE_SYSTEM_POLICY]
    out = []
    for fs in (r for r in resources if r.type == EFS_FILE_SYSTEM):
        mine = [p for p in policies if refers_to(p, fs, "fileSystemId")]
        if not mine:
            out.append(
                Violation(
                    fs.urn,
                    "EFS file system has no file system policy: EFS's default admits any client of a mount target, "
                    "anonymous and as root; declare an aws.efs.FileSystemPolicy",
                )
            )
        for policy in mine:
            out += [
                Violation(policy.urn, f"EFS file system policy {m}")
                for m in _efs_policy_problems(_json_or_object(policy.inputs.get("policy")))
            ]
    return out
