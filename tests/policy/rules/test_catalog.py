"""The catalogue: every rule has cases in its area's tests, names are unique, rules ignore types they do not judge."""

from __future__ import annotations

from policy.dlinfra_policy.rules.catalog import RULES
from policy.dlinfra_policy.rules.core import ResourceRule
from tests.policy.rules import (
    test_ci,
    test_cluster,
    test_compute,
    test_conventions,
    test_iam,
    test_network,
    test_platform,
    test_state,
    test_storage,
    test_vpn,
)
from tests.policy.rules._resources import CTX, TAGS, VPC, res

AREAS = (
    test_ci,
    test_cluster,
    test_compute,
    test_conventions,
    test_iam,
    test_network,
    test_platform,
    test_state,
    test_storage,
    test_vpn,
)


def test_every_rule_has_cases() -> None:
    assert sorted(name for area in AREAS for name in area.CASES) == sorted(r.name for r in RULES)
    assert len({r.name for r in RULES}) == len(RULES)


def test_rules_ignore_other_types() -> None:
    vpc = res(VPC)(cidrBlock="10.2.0.0/16", tags=TAGS)
    assert [m for r in RULES if isinstance(r, ResourceRule) for m in r.check(vpc, CTX)] == []
