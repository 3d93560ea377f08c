"""Resources as the rules see them, a context to judge them in, and what a rule says about them."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from policy.dlinfra_policy.rules.catalog import RULES
from policy.dlinfra_policy.rules.core import AddressPlan, Context, Resource, ResourceRule

STACK = "prod-us-west-2"
TAGS = {"project": "dlinfra", "environment": "prod", "region": "us-west-2", "component": "test", "managed-by": "x"}

PLAN = AddressPlan(
    vpcs={STACK: ipaddress.IPv4Network("10.2.0.0/16"), "prod-us-east-1": ipaddress.IPv4Network("10.1.0.0/16")},
    vpc_keys={STACK: "vpc/prod/us-west-2", "prod-us-east-1": "vpc/prod/us-east-1"},
    blocks={
        "vpc/prod/us-west-2": ipaddress.IPv4Network("10.2.0.0/16"),
        "vpc/prod/us-east-1": ipaddress.IPv4Network("10.1.0.0/16"),
        "site-lan/sjc1": ipaddress.IPv4Network("10.200.0.0/20"),
    },
)
CTX = Context(
    taggable=lambda t: t != "aws:ec2/route:Route",
    gpu_count=lambda t: {"p5.48xlarge": 8, "p4de.24xlarge": 8, "g6.xlarge": 1, "m7i.4xlarge": 0}.get(t),
    address_plan=PLAN,
    today=datetime.date(2026, 11, 22),
)


PROVIDER = f"urn:pulumi:{STACK}::dlinfra::pulumi:providers:aws::aws-us-west-2"
DEFAULT_PROVIDER = f"urn:pulumi:{STACK}::dlinfra::pulumi:providers:aws::default_7_12_0"

# Type tokens spelled out, so a test does not take the rules' own constants on trust.
VPC = "aws:ec2/vpc:Vpc"
ASG = "aws:autoscaling/group:Group"
LT = "aws:ec2/launchTemplate:LaunchTemplate"


def res(type_: str, name: str = "r", stack: str = STACK, **options: Any) -> Callable[..., Resource]:
    """A resource factory: res(TYPE)(inputs...) with URN, protect, dependencies, id, provider (by default the
    stack's explicit us-west-2 provider) and parent from options."""

    def make(**inputs: Any) -> Resource:
        return Resource(
            urn=f"urn:pulumi:{stack}::dlinfra::dlinfra:test:T${type_}::{name}",
            type=type_,
            name=name,
            inputs=inputs,
            protect=options.get("protect", False),
            dependencies=tuple(options.get("dependencies", ())),
            id=options.get("id", ""),
            provider_urn=options.get("provider_urn", PROVIDER),
            provider_inputs=options.get("provider_inputs", {"region": "us-west-2"}),
            parent=options.get("parent", ""),
        )

    return make


def messages(rule_name: str, resources: Sequence[Resource], ctx: Context = CTX) -> list[str]:
    """What a rule says about resources (a resource rule sees each, a stack rule all of them)."""
    rule = next(r for r in RULES if r.name == rule_name)
    if isinstance(rule, ResourceRule):
        return [m for r in resources for m in rule.check(r, ctx)]
    return [v.message for v in rule.check(resources, ctx)]


Cases = dict[str, tuple[Sequence[Resource], Sequence[Resource]]]  # rule -> (resources it passes, ones it flags)


def pass_and_fail(cases: Cases) -> tuple[Callable[[str], None], Callable[[str], None]]:
    """The two tests every area runs over its cases: each rule passes its good resources and flags its bad ones.
    An area module binds them as `test_rule_passes_good_resources, test_rule_flags_bad_resources = ...`."""

    @pytest.mark.parametrize("rule_name", sorted(cases))
    def passes(rule_name: str) -> None:
        assert messages(rule_name, cases[rule_name][0]) == []

    @pytest.mark.parametrize("rule_name", sorted(cases))
    def flags(rule_name: str) -> None:
        assert messages(rule_name, cases[rule_name][1]), f"{rule_name} let a bad resource through"

    return passes, flags
