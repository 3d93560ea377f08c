"""The network rules: no ingress from the world, no inline security-group rules, planned VPC CIDRs, flow logs."""

from __future__ import annotations

import pytest

from policy.dlinfra_policy.rules.allowlists import IngressException
from policy.dlinfra_policy.rules.core import Context, Resource
from policy.dlinfra_policy.rules.network import (
    FLOW_LOG,
    SECURITY_GROUP,
    SECURITY_GROUP_INGRESS_RULE,
    SECURITY_GROUP_RULE,
    no_world_ingress,
    vpc_cidrs_planned,
    vpcs_disjoint,
)
from tests.policy.rules._resources import CTX, TAGS, VPC, pass_and_fail, res

WORLD_22 = {"protocol": "tcp", "fromPort": 22.0, "toPort": 22.0, "cidrBlocks": ["0.0.0.0/0"]}
LAN_22 = {"protocol": "tcp", "fromPort": 22.0, "toPort": 22.0, "cidrBlocks": ["10.200.0.0/20"]}


# rule -> (resources that pass, resources that fail).
CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "no-world-ingress": (
        [res(SECURITY_GROUP)(ingress=[LAN_22], tags=TAGS)],
        [res(SECURITY_GROUP)(ingress=[WORLD_22], tags=TAGS)],
    ),
    "vpc-cidr-planned": (
        [res(VPC)(cidrBlock="10.2.0.0/16")],
        [res(VPC)(cidrBlock="10.3.0.0/16")],
    ),
    "vpc-flow-logs": (
        [
            res(VPC, id="vpc-1")(cidrBlock="10.2.0.0/16"),
            res(FLOW_LOG)(vpcId="vpc-1", trafficType="ALL"),
        ],
        [res(VPC, id="vpc-1")(cidrBlock="10.2.0.0/16")],
    ),
    "sg-no-inline-rules": (
        [res(SECURITY_GROUP)(tags=TAGS), res(SECURITY_GROUP)(ingress=[], egress=[])],
        [res(SECURITY_GROUP)(ingress=[LAN_22]), res(SECURITY_GROUP)(egress=[LAN_22])],
    ),
}


test_rule_passes_good_resources, test_rule_flags_bad_resources = pass_and_fail(CASES)


@pytest.mark.parametrize(
    ("resource", "hits"),
    [
        (res(SECURITY_GROUP_INGRESS_RULE)(cidrIpv6="::/0", ipProtocol="tcp", fromPort=443, toPort=443), 1),
        (res(SECURITY_GROUP_INGRESS_RULE)(cidrIpv4="10.0.0.0/8", ipProtocol="-1"), 0),
        (res(SECURITY_GROUP_RULE)(type="ingress", cidrBlocks=["0.0.0.0/1", "128.0.0.0/1"], protocol="-1"), 2),
        (res(SECURITY_GROUP_RULE)(type="egress", cidrBlocks=["0.0.0.0/0"], protocol="-1"), 0),
        (res(SECURITY_GROUP)(egress=[{"cidrBlocks": ["0.0.0.0/0"], "protocol": "-1"}]), 0),
    ],
)
def test_world_ingress_variants(resource: Resource, hits: int) -> None:
    assert len(no_world_ingress(resource, CTX)) == hits


def test_world_ingress_allowlist_needs_component_protocol_and_ports() -> None:
    entry = IngressException("edge", "udp", 443, 443, "a public UDP service the design declares")
    ctx = Context(taggable=CTX.taggable, gpu_count=CTX.gpu_count, ingress_allowlist=(entry,))
    rule = {"cidrIpv4": "0.0.0.0/0", "ipProtocol": "udp", "fromPort": 443.0, "toPort": 443.0}
    assert no_world_ingress(res(SECURITY_GROUP_INGRESS_RULE)(**rule, tags=TAGS | {"component": "edge"}), ctx) == []
    assert no_world_ingress(res(SECURITY_GROUP_INGRESS_RULE)(**rule, tags=TAGS), ctx)
    assert no_world_ingress(
        res(SECURITY_GROUP_INGRESS_RULE)(**rule | {"ipProtocol": "tcp"}, tags=TAGS | {"component": "edge"}), ctx
    )


def test_vpc_overlapping_a_site_lan_and_another_vpc() -> None:
    ours = res(VPC, "a")(cidrBlock="10.200.0.0/16")
    found = [v.message for v in vpc_cidrs_planned([ours], CTX)]
    assert any("not the planned block 10.2.0.0/16" in m for m in found)
    assert any("overlaps site-lan/sjc1" in m for m in found)
    east = res(VPC, "b", stack="prod-us-east-1")(cidrBlock="10.1.0.0/16")
    clash = res(VPC, "c", stack="staging-us-west-2")(cidrBlock="10.1.128.0/17")
    across = vpcs_disjoint([east, clash], across_stacks_only=True)
    assert [v.urn for v in across] == [clash.urn]


def test_vpc_without_plan_is_a_violation_not_a_pass() -> None:
    ctx = Context(taggable=CTX.taggable, gpu_count=CTX.gpu_count, address_plan_error="lock missing")
    assert "lock missing" in vpc_cidrs_planned([res(VPC)(cidrBlock="10.2.0.0/16")], ctx)[0].message
    assert (
        "has no VPC in the address plan"
        in vpc_cidrs_planned([res(VPC, stack="x-y")(cidrBlock="10.9.0.0/16")], CTX)[0].message
    )
