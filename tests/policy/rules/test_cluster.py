"""The cluster rules: EKS secrets encryption and Kubernetes version support."""

from __future__ import annotations

import dataclasses
import datetime

import pytest

from policy.dlinfra_policy.rules.cluster import EKS_CLUSTER
from policy.dlinfra_policy.rules.core import Resource
from tests.policy.rules._resources import CTX, messages, pass_and_fail, res

ACTIVATION = "aws:ssm/activation:Activation"

# rule -> (resources that pass, resources that fail).
CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "eks-secrets-encrypted": (
        [res(EKS_CLUSTER)(encryptionConfig={"resources": ["secrets"], "provider": {"keyArn": "arn:k"}})],
        [res(EKS_CLUSTER)(name="c")],
    ),
    "eks-version-supported": (
        [res(EKS_CLUSTER)(version="1.33", upgradePolicy={"supportType": "EXTENDED"})],
        [
            res(EKS_CLUSTER)(version="1.33", upgradePolicy={"supportType": "STANDARD"}),  # ended 2026-07-29
            res(EKS_CLUSTER)(version="1.33"),
        ],
    ),
    "eks-version-support-ending": (
        [
            res(EKS_CLUSTER)(version="1.33", upgradePolicy={"supportType": "EXTENDED"}),  # to 2027-07-29
            res(EKS_CLUSTER)(version="1.33", upgradePolicy={"supportType": "STANDARD"}),  # past: mandatory's
        ],
        [res(EKS_CLUSTER)(version="1.34", upgradePolicy={"supportType": "STANDARD"})],  # ends 2026-12-02
    ),
    # CTX.today is 2026-11-22: 30 days ahead is 2026-12-22.
    "ssm-activation-expiry-in-range": (
        [
            res(ACTIVATION)(iamRole="r", registrationLimit=4),  # unset: AWS's 24 hours
            res(ACTIVATION)(iamRole="r", registrationLimit=4, expirationDate="2026-12-22T00:00:00Z"),
        ],
        [res(ACTIVATION)(iamRole="r", registrationLimit=4, expirationDate="2026-12-23T00:00:00Z")],
    ),
    "ssm-activation-not-expired": (
        [res(ACTIVATION)(iamRole="r", registrationLimit=4, expirationDate="2026-11-22T12:00:00Z")],
        [res(ACTIVATION)(iamRole="r", registrationLimit=4, expirationDate="2026-11-21T23:59:00Z")],
    ),
}


test_rule_passes_good_resources, test_rule_flags_bad_resources = pass_and_fail(CASES)


@pytest.mark.parametrize(
    ("today", "advisory", "mandatory"),
    [
        (datetime.date(2026, 9, 2), [], []),  # 91 days before standard support ends
        (datetime.date(2026, 9, 3), ["(90 days)"], []),
        (datetime.date(2026, 12, 2), ["(0 days)"], []),  # the last day of standard support
        (datetime.date(2026, 12, 3), [], ["left standard support on 2026-12-02"]),
    ],
)
def test_eks_version_warns_then_refuses(today: datetime.date, advisory: list[str], mandatory: list[str]) -> None:
    """The advisory warns through the last day of support; from the next day the mandatory rule refuses."""
    cluster = res(EKS_CLUSTER)(version="1.34", upgradePolicy={"supportType": "STANDARD"})
    ctx = dataclasses.replace(CTX, today=today)
    for rule, expected in (("eks-version-support-ending", advisory), ("eks-version-supported", mandatory)):
        found = messages(rule, [cluster], ctx)
        assert len(found) == len(expected) and all(e in m for e, m in zip(expected, found, strict=True)), (rule, found)
