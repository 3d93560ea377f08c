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
