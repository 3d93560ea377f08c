"""The rules every resource follows: standard tags and an explicit provider in the stack's region."""

from __future__ import annotations

from policy.dlinfra_policy.rules.conventions import required_tags
from policy.dlinfra_policy.rules.core import Resource
from tests.policy.rules._resources import ASG, CTX, DEFAULT_PROVIDER, STACK, TAGS, VPC, messages, pass_and_fail, res

# rule -> (resources that pass, resources that fail).
CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "required-tags": (
        [res(VPC)(tags=TAGS), res("aws:ec2/route:Route")()],
        [res(VPC)(tags={"project": "dlinfra"})],
    ),
    "explicit-provider": (
        [
            res(VPC)(cidrBlock="10.2.0.0/16"),
            # Global stacks have one explicit provider per region; no region is implied by their name.
            res(VPC, stack="prod-global", provider_inputs={"region": "eu-west-1"})(cidrBlock="10.2.0.0/16"),
            res(
                "kubernetes:core/v1:Namespace",
                stack=f"{STACK}-k8s",
                provider_urn="urn:x::pulumi:providers:kubernetes::k8s",
            )(),
            res("tls:index/privateKey:PrivateKey", provider_urn="")(algorithm="RSA"),
        ],
        [
            res(VPC, provider_urn=DEFAULT_PROVIDER)(cidrBlock="10.2.0.0/16"),
            res(VPC, provider_urn="")(cidrBlock="10.2.0.0/16"),
            res(VPC, provider_inputs={"region": "eu-west-1"})(cidrBlock="10.2.0.0/16"),
            res("kubernetes:core/v1:Namespace", stack=f"{STACK}-k8s", provider_urn="")(),
        ],
    ),
}


test_rule_passes_good_resources, test_rule_flags_bad_resources = pass_and_fail(CASES)


def test_required_tags_read_autoscaling_group_tag_lists() -> None:
    group = res(ASG)(tags=[{"key": k, "value": v, "propagateAtLaunch": True} for k, v in TAGS.items()])
    assert required_tags(group, CTX) == []
    assert required_tags(res("random:index/randomPassword:RandomPassword")(length=32.0), CTX) == []


def test_explicit_provider_names_the_problem() -> None:
    wrong_region = res(VPC, provider_inputs={"region": "eu-west-1"})(cidrBlock="10.2.0.0/16")
    assert messages("explicit-provider", [wrong_region]) == [
        "provider region is 'eu-west-1', but the stack prod-us-west-2 is in us-west-2"
    ]
    default = res(VPC, provider_urn=DEFAULT_PROVIDER)(cidrBlock="10.2.0.0/16")
    assert messages("explicit-provider", [default]) == [
        "uses the default aws provider: pass the stack's explicit provider"
    ]
    each_bad = CASES["explicit-provider"][1]
    assert all(messages("explicit-provider", [r]) for r in each_bad)
