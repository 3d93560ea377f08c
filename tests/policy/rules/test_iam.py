"""The IAM rule: roles a service may assume for any account are scoped to ours."""

from __future__ import annotations

import json
from typing import Any

from policy.dlinfra_policy.rules.core import Resource
from tests.policy.rules._resources import pass_and_fail, res


def _trust(service: str, *, scoped: bool) -> dict[str, Any]:
    statement: dict[str, Any] = {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}
    if scoped:
        statement["Condition"] = {
            "StringEquals": {"aws:SourceAccount": "111122223333"},
            "ArnEquals": {"aws:SourceArn": "arn:aws:ssm:us-west-2:111122223333:*"},
        }
    return {"Version": "2012-10-17", "Statement": [statement]}


POLICY_ARN = "arn:aws:iam::111122223333:policy/dlinfra-prod-usw2-runs-vision"
SSO_ROLE_NAME = "AWSReservedSSO_vision_0123456789abcdef"  # as IAM Identity Center names a permission set's role

# rule -> (resources that pass, resources that fail).
CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "service-trust-scoped": (
        [
            res("aws:iam/role:Role")(assumeRolePolicy=json.dumps(_trust("ssm.amazonaws.com", scoped=True))),
            res("aws:iam/role:Role")(assumeRolePolicy=json.dumps(_trust("ec2.amazonaws.com", scoped=False))),
        ],
        [
            res("aws:iam/role:Role")(assumeRolePolicy=json.dumps(_trust("ssm.amazonaws.com", scoped=False))),
            res("aws:iam/role:Role")(assumeRolePolicy=json.dumps(_trust("codebuild.amazonaws.com", scoped=False))),
        ],
    ),
    "no-policy-on-identity-center-role": (
        [
            res("aws:iam/rolePolicyAttachment:RolePolicyAttachment")(role="team-vision", policyArn=POLICY_ARN),
            res("aws:iam/rolePolicy:RolePolicy")(role="team-vision", policy="{}"),
            res("aws:iam/policyAttachment:PolicyAttachment")(roles=["team-vision"], policyArn=POLICY_ARN),
        ],
        [
            res("aws:iam/rolePolicyAttachment:RolePolicyAttachment")(role=SSO_ROLE_NAME, policyArn=POLICY_ARN),
            res("aws:iam/rolePolicy:RolePolicy")(role=SSO_ROLE_NAME, policy="{}"),
            res("aws:iam/policyAttachment:PolicyAttachment")(
                roles=["team-vision", SSO_ROLE_NAME], policyArn=POLICY_ARN
            ),
            res("aws:iam/rolePoliciesExclusive:RolePoliciesExclusive")(roleName=SSO_ROLE_NAME, policyNames=["x"]),
            res("aws:iam/rolePolicyAttachmentsExclusive:RolePolicyAttachmentsExclusive")(
                roleName=SSO_ROLE_NAME, policyArns=[POLICY_ARN]
            ),
        ],
    ),
}


test_rule_passes_good_resources, test_rule_flags_bad_resources = pass_and_fail(CASES)
