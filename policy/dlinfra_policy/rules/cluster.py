"""Rules for EKS clusters: secrets encryption, and a Kubernetes version inside the support its policy pays for."""

from __future__ import annotations

import datetime
from typing import Any

from .core import Context, Resource, as_list, as_object, has_key

EKS_CLUSTER = "aws:eks/cluster:Cluster"


def eks_secrets_encrypted(resource: Resource, ctx: Context) -> list[str]:
    """EKS clusters envelope-encrypt Kubernetes secrets with a KMS key."""
    if resource.type != EKS_CLUSTER:
        return []
    config = as_object(resource.inputs.get("encryptionConfig"))
    if "secrets" not in [str(r) for r in as_list(config.get("resources"))]:
        return ['encryptionConfig does not cover "secrets": set encryptionConfig.resources=["secrets"]']
    if not has_key(as_object(config.get("provider")), "keyArn"):
        return ["encryptionConfig.provider.keyArn is not set: name the KMS key that encrypts secrets"]
    return []


def _eks_lifecycle(resource: Resource, ctx: Context) -> tuple[str, Any] | None:
    """(upgradePolicy.supportType, eks.Lifecycle of the version under it) of an EKS cluster; None for other types.

    The Lifecycle is None when the support type is not set: there is no support end to measure against then.
    """
    from dlinfra.model import eks  # the support dates are data of the planning core

    if resource.type != EKS_CLUSTER:
        return None
    support = str(as_object(resource.inputs.get("upgradePolicy")).get("supportType") or "")
    if support not in ("STANDARD", "EXTENDED"):
        return support, None
    policy: eks.UpgradePolicy = "standard" if support == "STANDARD" else "extended"
    return support, eks.lifecycle(str(resource.inputs.get("version")), policy, ctx.today or eks.today())


def eks_version_supported(resource: Resource, ctx: Context) -> list[str]:
    """EKS clusters name their upgrade policy and run a version still inside the support that policy pays for.

    Past its end, EKS upgrades the cluster itself and the stack would try to downgrade it. Source: Amazon EKS user
    guide, "Understand the Kubernetes version lifecycle on EKS" (dates in dlinfra/data/eks.yaml).
    """
    found = _eks_lifecycle(resource, ctx)
    if found is None:
        return []
    _, state = found
    if state is None:
        return ["upgradePolicy.supportType is not set: EKS would pick it, and with it when the cluster is upgraded"]
    return [state.message] if state.level == "error" else []


def eks_version_support_ending(resource: Resource, ctx: Context) -> list[str]:
    """Advisory: an EKS cluster's version is within eks.WARN_DAYS of the end of the support its policy pays for.

    The warning `dlinfra validate` and `preview` print, raised in a real preview too, while there is time to move:
    the mandatory eks-version-supported takes over on the day after the end. Same source and dates.
    """
    found = _eks_lifecycle(resource, ctx)
    state = found[1] if found is not None else None
    return [state.message] if state is not None and state.level == "warning" else []


SSM_ACTIVATION = "aws:ssm/activation:Activation"
ACTIVATION_MAX_DAYS = 30  # the same limit dlinfra.model.sites applies when `site add` writes an expiry


def _activation_expiry(resource: Resource) -> datetime.date | None:
    """The day an SSM activation's expirationDate falls on (UTC); None when unset (AWS: 24 hours from creation)."""
    if resource.type != SSM_ACTIVATION:
        return None
    value = resource.inputs.get("expirationDate")
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(datetime.UTC).date()
    except ValueError:
        return None


def ssm_activation_expiry_in_range(resource: Resource, ctx: Context) -> list[str]:
    """An SSM activation (hybrid nodes' registration) expires at most 30 days from now, as AWS requires when it is
    created or replaced. Source: AWS Systems Manager API reference, CreateActivation, ExpirationDate ("You can
    specify a date up to 30 days in advance")."""
    from dlinfra.model import eks

    expiry = _activation_expiry(resource)
    today = ctx.today or eks.today()
    if expiry is None or expiry <= today + datetime.timedelta(days=ACTIVATION_MAX_DAYS):
        return []
    return [
        f"expirationDate {expiry} is more than {ACTIVATION_MAX_DAYS} days after {today}: CreateActivation refuses it; "
        "set sites.<site>.activation_expiry within 30 days (dlinfra site add --activation-expiry 14d)"
    ]


def ssm_activation_not_expired(resource: Resource, ctx: Context) -> list[str]:
    """Advisory: an SSM activation's expirationDate has passed. Machines already registered keep working, but no new
    one can register, and any change that replaces the activation (its expirationDate, registration limit, role,
    name and tags force a new one: terraform-provider-aws ssm/activation.go, ForceNew) is refused by CreateActivation
    for a date in the past. Same source."""
    from dlinfra.model import eks

    expiry = _activation_expiry(resource)
    today = ctx.today or eks.today()
    if expiry is None or expiry >= today:
        return []
    return [
        f"expirationDate {expiry} has passed: remove sites.<site>.activation_expiry (a new activation then gets AWS's "
        "24 hours) or give a date within 30 days, before a change replaces the activation"
    ]
