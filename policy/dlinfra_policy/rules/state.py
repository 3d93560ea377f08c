"""What holds data (STATEFUL_TYPES, which `dlinfra diff` reads too), and the rules that protect it and only it."""

from __future__ import annotations

from collections.abc import Mapping

from .cluster import EKS_CLUSTER
from .core import Context, Resource
from .storage import EBS_VOLUME, EFS_FILE_SYSTEM, FSX_FILE_SYSTEMS

# What a stateful resource holds: losing it to a replacement or deletion loses data. This is the one list:
# the `stateful-protected` rule and `dlinfra diff` (which shouts about their replacement) both read it.
STATEFUL_TYPES: Mapping[str, str] = {
    EFS_FILE_SYSTEM: "EFS file system: home directories and datasets",
    EBS_VOLUME: "EBS volume: its data",
    "aws:s3/bucket:Bucket": "S3 bucket: datasets, checkpoints and results",
    "aws:s3/bucketV2:BucketV2": "S3 bucket: datasets, checkpoints and results",
    **{t: "FSx file system: scratch and linked data" for t in FSX_FILE_SYSTEMS},
    # Deleting a key makes every ciphertext under it (EBS, EFS, S3, logs, EKS secrets) unreadable for good.
    "aws:kms/key:Key": "KMS key: everything encrypted with it",
    # A replaced cluster loses its etcd: every Kubernetes object, queue and quota lives there.
    EKS_CLUSTER: "EKS cluster: every Kubernetes object in its etcd",
    "aws:backup/vault:Vault": "Backup vault: its recovery points",
}


def stateful_protected(resource: Resource, ctx: Context) -> list[str]:
    """Stateful resources (STATEFUL_TYPES) are protected against deletion and replacement."""
    what = STATEFUL_TYPES.get(resource.type)
    if what is None or resource.protect:
        return []
    return [f"{what} would be lost on delete or replace: declare it with ResourceOptions(protect=True)"]


def protect_only_stateful(resource: Resource, ctx: Context) -> list[str]:
    """Only what holds data is protected: a protected resource can never be deleted by an apply, so protecting
    access entries, add-ons or policies (as a child inheriting its parent's `protect` does) makes removing a
    team, an admin or a site impossible to apply. Source: Pulumi docs, resource option `protect` (children
    inherit it from their parent)."""
    if not resource.protect or resource.type in STATEFUL_TYPES or resource.type in ctx.costly_to_lose:
        return []
    return [
        f"{resource.type} is protected but holds no data (not in STATEFUL_TYPES): it could never be removed; "
        "set protect=False explicitly if it inherits protect from a stateful parent, or list the type with a "
        "reason in COSTLY_TO_LOSE if losing it costs that much"
    ]
