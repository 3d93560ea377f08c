"""The catalogue: every rule has cases in its area's tests, names are unique, rules ignore types they do not judge."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from policy.dlinfra_policy.rules.catalog import RULES
from policy.dlinfra_policy.rules.core import ResourceRule
from tests.policy.rules._resources import CTX, TAGS, VPC, res

# Every area's test module: the ones beside this file that hold CASES.
AREAS = [
    module
    for info in pkgutil.iter_modules([str(Path(__file__).parent)])
    if info.name.startswith("test_")
    and hasattr(module := importlib.import_module(f"tests.policy.rules.{info.name}"), "CASES")
]


def test_every_rule_has_cases() -> None:
    assert sorted(name for area in AREAS for name in area.CASES) == sorted(r.name for r in RULES)
    assert len({r.name for r in RULES}) == len(RULES)


def test_rules_ignore_other_types() -> None:
    vpc = res(VPC)(cidrBlock="10.2.0.0/16", tags=TAGS)
    assert [m for r in RULES if isinstance(r, ResourceRule) for m in r.check(vpc, CTX)] == []
