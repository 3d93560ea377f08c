"""Quotas and capacity (dlinfra.checks.limits) on small hand-made plans: each limit under, near and over its quota,
counted per scope; then on the reference plans."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from dlinfra.checks import report, runner
from dlinfra.checks.limits import check as limits
from dlinfra.checks.limits import compute
from dlinfra.checks.limits.scope import Config
from dlinfra.cli import main as cli
from dlinfra.model import quotas as quota_data
from tests import reference
from tests.checks.reach.test_reference import plans as reference_plans
from tests.conftest import REFERENCE_FLEET, ROOT

Plan = dict[str, Any]
Builder = Callable[[int], list[Plan]]


class Stack:
    """A hand-made plan: resources get a URN, an id and inputs as the plan export writes them."""

    def __init__(self, stack: str, *, kind: str = "regional", environment: str = "prod", region: str | None = None):
        region = region if region is not None or kind == "global" else stack.split("-", 1)[1]
        self.plan: Plan = {
            "stack": stack,
            "role": {"kind": kind, "environment": environment, "region": region},
            "resources": [],
        }

    def add(self, type_: str, name: str, id_: str | None = None, /, **inputs: Any) -> str:
        rid = id_ or f"{name}-id"
        self.plan["resources"].append(
            {
                "urn": f"urn:pulumi:{self.plan['stack']}::dlinfra::{type_}::{name}",
                "type": type_,
                "name": name,
                "custom": True,
                "id": rid,
                "inputs": inputs,
            }
        )
        return rid


VPC = "aws:ec2/vpc:Vpc"
EIP = "aws:ec2/eip:Eip"
TGW = "aws:ec2transitgateway/transitGateway:TransitGateway"
CVPN = "aws:ec2clientvpn/endpoint:Endpoint"
SG = "aws:ec2/securityGroup:SecurityGroup"
ASG = "aws:autoscaling/group:Group"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
SUBNET = "aws:ec2/subnet:Subnet"
CLUSTER = "aws:eks/cluster:Cluster"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"


def _verdicts(plans: Sequence[Plan], quota: str, config: Config | None = None) -> list[limits.Verdict]:
    return [v for v in limits.analyse(plans, config or Config()).verdicts if v.quota.key == quota]


def _one(plans: Sequence[Plan], quota: str, config: Config | None = None) -> limits.Verdict:
    (verdict,) = _verdicts(plans, quota, config)
    return verdict


def per_region(type_: str) -> Builder:
    """n resources of a type in us-west-2, split over two environments of the shared account."""

    def build(n: int) -> list[Plan]:
        prod, staging = Stack("prod-us-west-2"), Stack("staging-us-west-2", environment="staging")
        for i in range(n):
            (prod if i % 2 else staging).add(type_, f"thing-{i}")
        return [prod.plan, staging.plan]

    return build


def routes(n: int) -> list[Plan]:
    s = Stack("prod-us-west-2")
    table = s.add("aws:ec2/routeTable:RouteTable", "rt")
    for i in range(n - 1):  # plus the local route
        s.add("aws:ec2/route:Route", f"r{i}", routeTableId=table, destinationCidrBlock=f"10.{i // 256}.{i % 256}.0/24")
    s.add("aws:ec2/route:Route", "r6", routeTableId=table, destinationIpv6CidrBlock="::/0")  # counted apart
    return [s.plan]


def rules(direction: str) -> Builder:
    def build(n: int) -> list[Plan]:
        s = Stack("prod-us-west-2")
        group = s.add(SG, "sg")
        kind = "Ingress" if direction == "ingress" else "Egress"
        for i in range(n):
            s.add(
                f"aws:vpc/securityGroup{kind}Rule:SecurityGroup{kind}Rule",
                f"rule{i}",
                securityGroupId=group,
                cidrIpv4=f"10.0.{i}.0/24",
            )
        return [s.plan]

    return build


def groups_per_interface(n: int) -> list[Plan]:
    s = Stack("prod-us-west-2")
    s.add(LT, "lt", vpcSecurityGroupIds=[f"sg-{i}" for i in range(n)])
    return [s.plan]


def peering(n: int) -> list[Plan]:
    """A hub transit gateway peered with n others (the hub's count is the one judged)."""
    hub = Stack("prod-us-west-2")
    hub.add(TGW, "tgw", "tgw-hub")
    glob = Stack("prod-global", kind="global")
    for i in range(n):
        glob.add(
            "aws:ec2transitgateway/peeringAttachment:PeeringAttachment",
            f"p{i}",
            transitGatewayId=f"tgw-{i}",
            peerTransitGatewayId="tgw-hub",
            peerRegion="us-west-2",
        )
    return [hub.plan, glob.plan]


def endpoints(n: int) -> list[Plan]:
    s = Stack("prod-us-west-2")
    vpc = s.add(VPC, "vpc")
    for i in range(n):
        s.add("aws:ec2/vpcEndpoint:VpcEndpoint", f"e{i}", vpcId=vpc, vpcEndpointType="Interface", serviceName=f"s{i}")
    s.add("aws:ec2/vpcEndpoint:VpcEndpoint", "s3", vpcId=vpc, vpcEndpointType="Gateway", serviceName="s3")
    return [s.plan]


def authorization_rules(n: int) -> list[Plan]:
    s = Stack("prod-us-west-2")
    endpoint = s.add(CVPN, "cvpn")
    for i in range(n):
        s.add(
            "aws:ec2clientvpn/authorizationRule:AuthorizationRule",
            f"a{i}",
            clientVpnEndpointId=endpoint,
            targetNetworkCidr=f"10.{i}.0.0/16",
            accessGroupId="g",
        )
    return [s.plan]


def client_vpn_routes(n: int) -> list[Plan]:
    s = Stack("prod-us-west-2")
    endpoint = s.add(CVPN, "cvpn")
    s.add(
        "aws:ec2clientvpn/networkAssociation:NetworkAssociation",
        "assoc",
        clientVpnEndpointId=endpoint,
        subnetId="subnet-a",
    )
    for i in range(n - 1):  # plus the VPC route the association adds
        s.add(
            "aws:ec2clientvpn/route:Route",
            f"r{i}",
            clientVpnEndpointId=endpoint,
            targetVpcSubnetId="subnet-a",
            destinationCidrBlock=f"10.{i}.0.0/16",
        )
    s.add("aws:ec2clientvpn/route:Route", "other", clientVpnEndpointId=endpoint, targetVpcSubnetId="subnet-b")
    return [s.plan]


def cluster(**inputs: Any) -> Builder:
    def build(n: int) -> list[Plan]:
        s = Stack("prod-us-west-2")
        made = {k: v(n) for k, v in inputs.items()}
        s.add(CLUSTER, "eks", **made)
        return [s.plan]

    return build


def nodes(n: int) -> list[Plan]:
    s = Stack("prod-us-west-2")
    s.add(CLUSTER, "eks")
    s.add(ASG, "pool-asg", maxSize=float(n - 10))
    s.add("aws:ssm/activation:Activation", "site", registrationLimit=10.0)
    return [s.plan]


def pods(n: int) -> list[Plan]:
    """n nodes of m7i.4xlarge (234 pods each) and no site machines."""
    s = Stack("prod-us-west-2")
    s.add(CLUSTER, "eks")
    template = s.add(LT, "lt", instanceType="m7i.4xlarge")
    s.add(ASG, "pool-asg", maxSize=float(n), launchTemplate={"id": template, "version": "1"})
    return [s.plan]


def subnet(n: int) -> list[Plan]:
    """n m7i.4xlarge nodes (240 addresses each) in one /20 (4091 usable), with one endpoint interface."""
    s = Stack("prod-us-west-2")
    sub = s.add(SUBNET, "private-a", cidrBlock="10.0.0.0/20")
    template = s.add(LT, "lt", instanceType="m7i.4xlarge")
    s.add(ASG, "pool-asg", maxSize=float(n), launchTemplate={"id": template, "version": "1"}, vpcZoneIdentifiers=[sub])
    s.add("aws:ec2/vpcEndpoint:VpcEndpoint", "sts", vpcEndpointType="Interface", subnetIds=[sub, "subnet-b"])
    s.add("aws:ec2/routeTableAssociation:RouteTableAssociation", "rta", subnetId=sub)  # no interface
    return [s.plan]


def role_policies(n: int) -> list[Plan]:
    """n managed policies attached to one team role, spread over two stacks of the account (IAM is global), and one
    on another role that must not count with them."""
    stacks = [Stack("prod-us-west-2"), Stack("prod-us-east-1")]
    for i in range(n):
        stacks[i % 2].add(ATTACHMENT, f"runs-{i}", role="team-vision", policyArn=f"policy/p{i}")
    stacks[0].add(ATTACHMENT, "other", role="team-language", policyArn="policy/other")
    return [s.plan for s in stacks]


def _cidrs(n: int) -> dict[str, Any]:
    return {"cidrs": [f"10.{i}.0.0/16" for i in range(n)]}


# (quota, builder, n under, n near, n over): near is >= 80% of the default, over is above it.
CASES = [
    ("vpcs-per-region", per_region(VPC), 2, 3, 5),  # plus the default VPC
    ("elastic-ips-per-region", per_region(EIP), 3, 4, 6),
    ("transit-gateways-per-region", per_region(TGW), 2, 5, 6),
    ("client-vpn-endpoints-per-region", per_region(CVPN), 1, 4, 7),
    ("routes-per-route-table", routes, 12, 400, 501),
    ("inbound-rules-per-security-group", rules("ingress"), 10, 48, 61),
    ("outbound-rules-per-security-group", rules("egress"), 10, 50, 70),
    ("security-groups-per-interface", groups_per_interface, 2, 4, 6),
    ("tgw-peering-attachments", peering, 9, 40, 51),
    ("tgw-pending-peering-attachments", peering, 7, 9, 11),
    ("interface-endpoints-per-vpc", endpoints, 8, 45, 51),
    ("client-vpn-authorization-rules", authorization_rules, 28, 160, 201),
    ("client-vpn-routes-per-association", client_vpn_routes, 7, 80, 101),
    ("eks-control-plane-security-groups", cluster(vpcConfig=lambda n: {"securityGroupIds": list(range(n))}), 1, 4, 5),
    ("eks-remote-node-networks", cluster(remoteNetworkConfig=lambda n: {"remoteNodeNetworks": _cidrs(n)}), 2, 12, 16),
    ("eks-remote-pod-networks", cluster(remoteNetworkConfig=lambda n: {"remotePodNetworks": [_cidrs(n)]}), 2, 13, 16),
    ("nodes-per-cluster", nodes, 84, 4000, 5001),
    ("pods-per-cluster", pods, 100, 520, 650),
    ("subnet-addresses", subnet, 1, 14, 18),
    ("iam-managed-policies-per-role", role_policies, 4, 8, 11),
]


def _expected(quota: str, n: int) -> int:
    """The count a builder's n makes (what the hand-made plan holds)."""
    if quota == "pods-per-cluster":
        return n * 234
    if quota == "subnet-addresses":
        return n * 240 + 1
    if quota == "vpcs-per-region":
        return n + 1  # the default VPC, which the fleet does not say was deleted
    return n


@pytest.mark.parametrize(("quota", "build", "under", "near", "over"), CASES, ids=[c[0] for c in CASES])
def test_each_limit_under_near_and_over(quota: str, build: Builder, under: int, near: int, over: int) -> None:
    for n, state in ((under, "ok"), (near, "near"), (over, "over")):
        verdict = max(_verdicts(build(n), quota), key=lambda v: v.usage.used)  # a hub's spokes count too
        assert verdict.usage.used == _expected(quota, n), (n, verdict.usage.how)
        assert verdict.state == state, (n, verdict.usage.used, verdict.limit)
        assert verdict.blocking == (state == "over" and not verdict.quota.adjustable)


def test_a_count_over_a_quota_aws_will_not_raise_blocks_and_one_it_will_only_warns() -> None:
    findings = runner.limit_findings(limits.analyse(nodes(5001) + routes(501), Config()), runner.SourceIndex(ROOT))
    by_rule = {f.rule: f for f in findings}
    blocked, warned = by_rule["limit-nodes-per-cluster"], by_rule["limit-routes-per-route-table"]
    assert blocked.blocking and blocked.level == "mandatory" and blocked.tool == "limits"
    assert "5001 of 5000 (100%) exceeds Nodes per cluster in cluster eks" in blocked.message
    assert "default 5000; not adjustable: change the plan" in blocked.message
    assert blocked.guideline == "https://kubernetes.io/docs/setup/best-practices/cluster-large/"
    assert not warned.blocking and warned.level == "advisory"
    assert "AWS default 500; adjustable: request an increase (Service Quotas vpc/L-93826ACB" in warned.message
    assert "--quota-code L-93826ACB --desired-value 627" in warned.message
    assert runner.CheckRun(stacks=[], rules=[], findings=findings).exit_code == 1
    assert runner.CheckRun(stacks=[], rules=[], findings=[warned]).exit_code == 0


def test_quotas_per_region_are_counted_per_account() -> None:
    plans = per_region(VPC)(6)  # 3 in prod, 3 in staging
    gone = Config(default_vpc_deleted=True)
    (shared,) = _verdicts(plans, "vpcs-per-region", gone)
    assert shared.usage.used == 6 and shared.state == "over" and "the shared account" in shared.usage.scope
    assert shared.usage.how.endswith("prod-us-west-2 3, staging-us-west-2 3")
    apart = _verdicts(plans, "vpcs-per-region", Config(accounts={"prod": "111111111111"}, default_vpc_deleted=True))
    assert sorted((v.usage.scope, v.usage.used, v.state) for v in apart) == [
        ("us-west-2 (111111111111)", 3, "ok"),
        ("us-west-2 (the shared account)", 3, "ok"),
    ]
    other_region = [*per_region(VPC)(3), Stack("prod-eu-west-1").plan]
    other_region[-1]["resources"] = per_region(VPC)(3)[0]["resources"]
    assert sorted(v.usage.used for v in _verdicts(other_region, "vpcs-per-region", gone)) == [1, 3]


def test_the_default_vpc_counts_in_each_account_and_region_until_the_fleet_says_it_was_deleted() -> None:
    # AWS creates a default VPC in every region of a new account (Amazon VPC user guide, "Default VPCs").
    plans = per_region(VPC)(4)
    (kept,) = _verdicts(plans, "vpcs-per-region")
    assert (kept.usage.used, kept.state) == (5, "near") and kept.usage.how.endswith("; the default VPC 1")
    apart = _verdicts(plans, "vpcs-per-region", Config(accounts={"prod": "111111111111"}))
    assert sorted(v.usage.used for v in apart) == [3, 3]  # each account has its own
    (deleted,) = _verdicts(plans, "vpcs-per-region", Config(default_vpc_deleted=True))
    assert deleted.usage.used == 4


def test_raised_quotas_from_the_fleet_are_the_limit() -> None:
    plans = per_region(EIP)(6)
    assert _one(plans, "elastic-ips-per-region").state == "over"
    raised = _one(plans, "elastic-ips-per-region", Config(raised={"L-0263D0A3": 10}))
    assert (raised.limit, raised.raised, raised.state) == (10, True, "ok")
    here = Config(raised={"L-0263D0A3": 10}, raised_in={"us-west-2": {"L-0263D0A3": 7}})
    near = _one(plans, "elastic-ips-per-region", here)
    assert (near.limit, near.state) == (7, "near")
    assert "raised to 7 in the fleet (AWS default 5)" in near.message()


def test_security_group_rules_count_each_cidr_and_references_in_both_ip_versions() -> None:
    s = Stack("prod-us-west-2")
    group = s.add(SG, "sg", ingress=[{"cidrBlocks": ["10.0.0.0/8", "10.1.0.0/16"], "securityGroups": ["sg-x"]}])
    s.add("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "v6", securityGroupId=group, cidrIpv6="::/0")
    s.add(
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
        "ref",
        securityGroupId=group,
        referencedSecurityGroupId="sg-y",
    )
    s.add(
        "aws:ec2/securityGroupRule:SecurityGroupRule",
        "old",
        securityGroupId=group,
        type="ingress",
        cidrBlocks=["192.168.0.0/16"],
        self=True,
    )
    s.add(
        "aws:ec2/securityGroupRule:SecurityGroupRule",
        "out",
        securityGroupId=group,
        type="egress",
        cidrBlocks=["0.0.0.0/0"],
    )
    inbound = _one([s.plan], "inbound-rules-per-security-group")
    # IPv4: 2 CIDRs + sg-x, sg-y, 1 CIDR + self = 6; IPv6: ::/0 + sg-x, sg-y, self = 4.
    assert (inbound.usage.used, inbound.usage.how) == (6, "6 IPv4 and 4 IPv6 inbound rules")
    assert _one([s.plan], "outbound-rules-per-security-group").usage.used == 1


def test_the_cluster_security_group_counts_on_the_control_plane_interfaces() -> None:
    s = Stack("prod-us-west-2")
    s.add(CLUSTER, "eks", vpcConfig={"securityGroupIds": ["sg-1", "sg-2", "sg-3", "sg-4"]})
    s.add(SG, "sg", ingress=[{"securityGroups": ["a", "b", "c", "d", "e", "f"]}])  # references, not interfaces
    verdict = _one([s.plan], "security-groups-per-interface")
    assert (verdict.usage.used, verdict.state) == (5, "near")
    assert "the cluster security group EKS creates" in verdict.usage.how
    lt = Stack("prod-us-west-2")
    interfaces = [{"securityGroups": ["a", "b"]}, {"securityGroups": ["a", "b", "c", "d", "e", "f"]}]
    lt.add(LT, "lt", networkInterfaces=interfaces)
    assert _one([lt.plan], "security-groups-per-interface").state == "over"


def test_peering_counts_on_both_transit_gateways() -> None:
    west, east = Stack("prod-us-west-2"), Stack("prod-us-east-1")
    west.add(TGW, "tgw", "tgw-w", tags={"Name": "tgw-west"})
    east.add(TGW, "tgw", "tgw-e")
    glob = Stack("prod-global", kind="global")
    glob.add(
        "aws:ec2transitgateway/peeringAttachment:PeeringAttachment",
        "p",
        transitGatewayId="tgw-e",
        peerTransitGatewayId="tgw-w",
        peerRegion="us-west-2",
    )
    verdicts = _verdicts([west.plan, east.plan, glob.plan], "tgw-peering-attachments")
    counted = {(v.usage.stack, v.usage.scope): v.usage.used for v in verdicts}
    assert counted == {("prod-us-west-2", "transit gateway tgw-west"): 1, ("prod-us-east-1", "transit gateway tgw"): 1}


def test_pod_addresses_follow_the_instance_type_and_prefix_delegation() -> None:
    assert compute.node_addresses("p5.48xlarge", prefix_delegation=False) == 100
    assert compute.node_addresses("g5.12xlarge", prefix_delegation=False) == 750
    # 234 pods: 15 prefixes and one spare, on 8 interfaces' primary addresses.
    assert compute.node_addresses("m7i.4xlarge", prefix_delegation=True) == 16 * 16 + 8
    plans = subnet(14)
    mixed = plans[0]["resources"]
    group = next(r for r in mixed if r["type"] == ASG)
    group["inputs"].pop("launchTemplate")
    group["inputs"]["mixedInstancesPolicy"] = {
        "launchTemplate": {
            "launchTemplateSpecification": {"launchTemplateId": "lt-id"},
            "overrides": [{"instanceType": "m7i.2xlarge"}, {"instanceType": "g5.12xlarge"}],
        }
    }
    # The pool may launch its largest type anywhere: 750 per node.
    assert _one(plans, "subnet-addresses").usage.used == 14 * 750 + 1
    delegated = subnet(14)
    delegated[0]["resources"].append(
        {
            "urn": "u",
            "type": "aws:eks/addon:Addon",
            "name": "cni",
            "custom": True,
            "id": "cni",
            "inputs": {"addonName": "vpc-cni", "configurationValues": '{"env": {"ENABLE_PREFIX_DELEGATION": "true"}}'},
        }
    )
    assert _one(delegated, "subnet-addresses").usage.used == 14 * 264 + 1


def test_subnet_nodes_spread_evenly_over_the_pool_subnets() -> None:
    s = Stack("prod-us-west-2")
    a = s.add(SUBNET, "a", cidrBlock="10.0.0.0/20")
    b = s.add(SUBNET, "b", cidrBlock="10.0.16.0/20")
    template = s.add(LT, "lt", instanceType="p5.48xlarge")
    s.add(ASG, "spread", maxSize=5.0, launchTemplate={"id": template}, vpcZoneIdentifiers=[a, b])
    s.add(ASG, "one-zone", maxSize=4.0, launchTemplate={"id": template}, vpcZoneIdentifiers=[a])
    used = {v.usage.scope: v.usage.used for v in _verdicts([s.plan], "subnet-addresses")}
    assert used == {"subnet a (10.0.0.0/20)": 3 * 100 + 4 * 100, "subnet b (10.0.16.0/20)": 3 * 100}
    verdict = next(v for v in _verdicts([s.plan], "subnet-addresses") if v.usage.scope.startswith("subnet a"))
    assert verdict.limit == 4096 - 5 and "capacity 4091" in verdict.message()


def test_a_type_the_table_lacks_is_named_in_a_note() -> None:
    s = Stack("prod-us-west-2")
    template = s.add(LT, "lt", instanceType="z9.huge")
    s.add(ASG, "pool-asg", maxSize=2.0, launchTemplate={"id": template}, vpcZoneIdentifiers=["subnet-a"])
    result = limits.analyse([s.plan], Config())
    assert any("z9.huge" in note and "instance_types.yaml" in note for note in result.notes)


def test_report_json_and_sarif_carry_the_limits() -> None:
    result = limits.analyse(nodes(5001) + per_region(EIP)(4), Config())
    summary = limits.summary_json(result)
    rows = {r["key"]: r for r in summary["quotas"]}
    assert rows["nodes-per-cluster"]["over"] == 1 and rows["nodes-per-cluster"]["peak"]["used"] == 5001
    assert rows["elastic-ips-per-region"]["near"] == 1 and rows["elastic-ips-per-region"]["code"] == "L-0263D0A3"
    assert rows["subnet-addresses"]["peak"] is None
    findings = runner.limit_findings(result, runner.SourceIndex(ROOT))
    run = runner.CheckRun(stacks=["prod-us-west-2"], rules=[], findings=findings, limits=summary)
    assert report.to_json(run)["limits"]["reported"][0]["blocking"] is True
    (limits_run,) = [r for r in report.to_sarif(run)["runs"] if r["tool"]["driver"]["name"] == "dlinfra-limits"]
    assert {r["ruleId"]: r["level"] for r in limits_run["results"]} == {
        "limit-nodes-per-cluster": "error",
        "limit-elastic-ips-per-region": "warning",
    }


def _lines(out: str) -> Iterator[str]:
    return (line.strip() for line in out.splitlines())


def test_print_limits_shows_every_quota_with_default_adjustability_and_code(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    report.print_limits(
        limits.summary_json(limits.analyse(nodes(5001), Config())), Console(highlight=False, soft_wrap=True)
    )
    lines = list(_lines(capsys.readouterr().out))
    assert any(
        line.startswith("FAIL (1)") and "nodes-per-cluster" in line and "not adjustable, no code" in line
        for line in lines
    )
    assert any(
        line.startswith("-") and "vpcs-per-region" in line and "default 5, adjustable, vpc/L-F678F1CE" in line
        for line in lines
    )


def test_reference_plans_reach_no_blocking_limit_and_report_the_shared_elastic_ips() -> None:
    result = limits.analyse(reference_plans(), Config.of(reference.fleet()))
    assert not any(v.blocking for v in result.verdicts) and not result.notes
    assert {v.quota.key for v in result.verdicts} == set(quota_data.table().quotas)  # every quota is counted
    (eips,) = result.reported  # prod's three NAT gateways and staging's one share us-west-2 of one account
    assert (eips.quota.key, eips.usage.used, eips.limit, eips.state) == ("elastic-ips-per-region", 4, 5, "near")
    peak = {k: max(v.usage.used for v in result.verdicts if v.quota.key == k) for k in quota_data.table().quotas}
    assert peak["nodes-per-cluster"] == 16 + 12 + 40 + 16  # train-h100, interactive, cpu, sjc1's machines
    # prod-us-west-2's endpoint: 28 VPC and remote rules for its 4 groups, and alice's dev box's own /32 rule.
    assert peak["interface-endpoints-per-vpc"] == 8 and peak["client-vpn-authorization-rules"] == 28 + 1
    # us-east-1's 16 p5.48xlarge (us-west-2's run on a Capacity Block, which On-Demand quotas do not count).
    assert peak["ec2-on-demand-p-vcpus"] == 16 * 192
    assert peak["vpcs-per-region"] == 3  # prod's and staging's in us-west-2, and the default VPC
    assert peak["lambda-concurrent-executions"] == 10 + 100  # the Client VPN handler's reservation; 100 unreserved
    # eu-west-1a: cpu 14 x m7i.4xlarge (240), interactive 4 x g5.12xlarge (750), train-a100 8 x p4d (750), 13 ENIs.
    assert peak["subnet-addresses"] == 14 * 240 + 4 * 750 + 8 * 750 + 13


def test_check_all_reports_quotas_on_the_reference_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "plans"
    folder.mkdir()
    for plan in reference_plans():
        (folder / f"{plan['stack']}.json").write_text(json.dumps({**plan, "provenance": reference.provenance()}))
    argv = ["check", "--all", "--no-checkov", "--fleet", str(REFERENCE_FLEET), "--plans", str(folder)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "Quotas and capacity, every pool at its maximum size" in out
    assert "ADVISORY  limit-elastic-ips-per-region  -  us-west-2 (the shared account)" in out
    assert cli.main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [f["rule"] for f in data["findings"] if f["tool"] == "limits"] == ["limit-elastic-ips-per-region"]
    assert len(data["limits"]["quotas"]) == len(quota_data.table().quotas)


def test_dev_boxes_count_against_the_on_demand_vcpu_quotas() -> None:
    result = limits.analyse(reference_plans(), Config.of(reference.fleet()))
    in_usw2 = [v for v in result.verdicts if v.usage.region == "us-west-2"]
    g_vt = next(v for v in in_usw2 if v.quota.key == "ec2-on-demand-g-vt-vcpus")
    assert "prod-us-west-2 devbox-alice-gpu-instance 4" in g_vt.usage.how  # a g6.xlarge: 4 vCPUs, stopped or not
    standard = next(v for v in in_usw2 if v.quota.key == "ec2-on-demand-standard-vcpus")
    assert "staging-us-west-2 devbox-bob-cpu-instance 8" in standard.usage.how  # an m7i.2xlarge
