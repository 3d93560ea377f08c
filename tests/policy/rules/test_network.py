"""The network rules: no ingress from the world, no inline security-group rules, planned VPC CIDRs, flow logs, and
security-group rules in place before FSx for Lustre is created."""

from __future__ import annotations

import pytest

from policy.dlinfra_policy.rules.allowlists import IngressException
from policy.dlinfra_policy.rules.core import Context, Resource
from policy.dlinfra_policy.rules.network import (
    FLOW_LOG,
    SECURITY_GROUP,
    SECURITY_GROUP_EGRESS_RULE,
    SECURITY_GROUP_INGRESS_RULE,
    SECURITY_GROUP_RULE,
    no_world_ingress,
    sg_rules_before_validating_resources,
    vpc_cidrs_planned,
    vpcs_disjoint,
)
from tests.policy.rules._resources import CTX, TAGS, VPC, pass_and_fail, res

WORLD_22 = {"protocol": "tcp", "fromPort": 22.0, "toPort": 22.0, "cidrBlocks": ["0.0.0.0/0"]}
LAN_22 = {"protocol": "tcp", "fromPort": 22.0, "toPort": 22.0, "cidrBlocks": ["10.200.0.0/20"]}

LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
LUSTRE_SG = res(SECURITY_GROUP, "lustre-sg", id="sg-1")(tags=TAGS)
LNET = {"securityGroupId": "sg-1", "ipProtocol": "tcp", "fromPort": 988.0, "toPort": 988.0}
LNET_IN = res(SECURITY_GROUP_INGRESS_RULE, "lustre-servers-988", dependencies=[LUSTRE_SG.urn])(
    **LNET, referencedSecurityGroupId="sg-1"
)
LNET_OUT = res(SECURITY_GROUP_EGRESS_RULE, "lustre-servers-out", dependencies=[LUSTRE_SG.urn])(
    securityGroupId="sg-1", ipProtocol="-1", referencedSecurityGroupId="sg-1"
)


def _lustre(*dependencies: Resource) -> Resource:
    return res(LUSTRE, "lustre", dependencies=[d.urn for d in dependencies])(
        deploymentType="PERSISTENT_2", securityGroupIds=["sg-1"]
    )


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
    "sg-rules-before-validating-resources": (
        [LUSTRE_SG, LNET_IN, LNET_OUT, _lustre(LUSTRE_SG, LNET_IN, LNET_OUT)],
        [LUSTRE_SG, LNET_IN, LNET_OUT, _lustre(LUSTRE_SG)],
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


def test_sg_rules_before_validating_resources_finds_groups_and_rules_by_id_or_dependency() -> None:
    # The file system names its group only by id (no dependency recorded), the rule names it only by id.
    by_id_rule = res(SECURITY_GROUP_RULE, "lustre-1018")(
        type="ingress", securityGroupId="sg-1", protocol="tcp", fromPort=1018.0, toPort=1023.0, self=True
    )
    found = sg_rules_before_validating_resources([LUSTRE_SG, by_id_rule, _lustre(LNET_IN)], CTX)
    assert [v.message for v in found] == [
        "AWS checks the rules of security group lustre-sg when it creates this resource, but it does not depend on "
        "lustre-1018: add them to depends_on, or the create can race them"
    ]
    # Rules of another group, and groups the file system does not use, are not its business.
    other = res(SECURITY_GROUP, "nodes-sg", id="sg-2")(tags=TAGS)
    other_rule = res(SECURITY_GROUP_INGRESS_RULE, "nodes-self", dependencies=[other.urn])(securityGroupId="sg-2")
    assert sg_rules_before_validating_resources([LUSTRE_SG, other, other_rule, _lustre(LUSTRE_SG)], CTX) == []
    # EFS mount targets take groups without AWS reading their rules.
    mount = res("aws:efs/mountTarget:MountTarget", dependencies=[LUSTRE_SG.urn])(securityGroups=["sg-1"])
    assert sg_rules_before_validating_resources([LUSTRE_SG, LNET_IN, mount], CTX) == []


def test_sg_rules_before_validating_resources_with_ids_unknown_as_in_a_real_preview() -> None:
    group = res(SECURITY_GROUP, "lustre-sg")(tags=TAGS)
    nodes = res(SECURITY_GROUP, "nodes-sg")(tags=TAGS)
    # Parented to the group (as components/security_groups.py does), or depending on it alone: the group's rules.
    parented = res(SECURITY_GROUP_INGRESS_RULE, "lustre-988", dependencies=[group.urn], parent=group.urn)()
    lone = res(SECURITY_GROUP_EGRESS_RULE, "lustre-out", dependencies=[group.urn])()
    # The nodes' rule admitting the servers depends on both groups, and is parented to the nodes' group.
    peer = res(
        SECURITY_GROUP_INGRESS_RULE, "nodes-from-lustre", dependencies=[nodes.urn, group.urn], parent=nodes.urn
    )()
    stack = [group, nodes, parented, lone, peer]
    assert sg_rules_before_validating_resources([*stack, _lustre(group, parented, lone)], CTX) == []
    (found,) = sg_rules_before_validating_resources([*stack, _lustre(group, lone)], CTX)
    assert "does not depend on lustre-988:" in found.message
