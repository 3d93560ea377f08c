"""Rules for IAM roles: a role a service may assume for any account is scoped to ours (confused deputy)."""

from __future__ import annotations

import json

from .core import Context, Resource, as_list, as_object, as_objects

IAM_ROLE = "aws:iam/role:Role"
# Services that act for any account: a role they may assume names the account and source it is for.
# Sources: IAM user guide, "The confused deputy problem"; EKS guide "Prepare credentials for hybrid nodes" (SSM);
# CodeBuild guide "Allow CodeBuild to interact with other AWS services" (service role trust).
CONFUSED_DEPUTY_SERVICES = frozenset({"ssm.amazonaws.com", "codebuild.amazonaws.com"})


def service_trust_scoped(resource: Resource, ctx: Context) -> list[str]:
    """Roles that SSM or CodeBuild may assume limit it to this account and source (aws:SourceAccount, SourceArn)."""
    if resource.type != IAM_ROLE:
        return []
    document = resource.inputs.get("assumeRolePolicy")
    try:
        policy = json.loads(document) if isinstance(document, str) else as_object(document)
    except json.JSONDecodeError:
        return ["assumeRolePolicy is not JSON"]
    out = []
    for statement in as_objects(policy.get("Statement")):
        services = set(as_list(as_object(statement.get("Principal")).get("Service")))
        for service in sorted(services & CONFUSED_DEPUTY_SERVICES):
            keys = {key for block in as_object(statement.get("Condition")).values() for key in as_object(block)}
            missing = [k for k in ("aws:SourceAccount", "aws:SourceArn") if k not in keys]
            if missing:
                out.append(f"trusts {service} without {' and '.join(missing)} conditions (confused deputy)")
    return out


# Where IAM Identity Center keeps its permission sets' roles, and how it names them (IAM Identity Center user guide,
# "Referencing permission sets in resource policies, Amazon EKS, and AWS KMS": role/aws-reserved/sso.amazonaws.com/...
# /AWSReservedSSO_<permission set>_<suffix>). IAM refuses to change them ("Cannot perform the operation on the
# protected role": AWS re:Post knowledge center, identity-center-aws-reserved-sso), so an apply would fail midway;
# a permission set carries the policy instead.
IDENTITY_CENTER_ROLE_PREFIX = "AWSReservedSSO_"
IDENTITY_CENTER_ROLE_PATH = "role/aws-reserved/"
# Resources that put or attach a policy on a role, and the inputs that name the role (by name or ARN).
ROLE_POLICY_INPUTS = {
    "aws:iam/rolePolicy:RolePolicy": ("role",),
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": ("role",),
    "aws:iam/policyAttachment:PolicyAttachment": ("roles",),
    "aws:iam/rolePoliciesExclusive:RolePoliciesExclusive": ("roleName",),
    "aws:iam/rolePolicyAttachmentsExclusive:RolePolicyAttachmentsExclusive": ("roleName",),
}


def no_policy_on_identity_center_role(resource: Resource, ctx: Context) -> list[str]:
    """No policy is put on, or attached to, a role IAM Identity Center manages."""
    out = []
    for key in ROLE_POLICY_INPUTS.get(resource.type, ()):
        for role in as_list(resource.inputs.get(key)):
            name = str(role).rpartition("/")[2]
            if isinstance(role, str) and (
                name.startswith(IDENTITY_CENTER_ROLE_PREFIX) or IDENTITY_CENTER_ROLE_PATH in role
            ):
                out.append(
                    f"{key} {role} is an IAM Identity Center role, which IAM refuses to change: add the policy to its "
                    "permission set (customer managed policy) instead"
                )
    return out
