"""Network: subnets per AZ and tier, NAT per environment, route tables, endpoints, flow logs (mock engine)."""

from __future__ import annotations

import ipaddress
import itertools
import json
from typing import Any

import pytest

from components.network import DEFAULT_INTERFACE_ENDPOINTS, NetworkArgs
from dlinfra.model import planner
from dlinfra.model.naming import Names
from dlinfra.model.regions import known_regions
from tests.reference import REGIONAL, by_id, env_region, fleet, named, of_type, plan, runs

NAT_COUNT = {"prod": 3, "staging": 1}


def _az(subnet: Any) -> str:
    """The fleet's AZ (label) of a subnet, which AWS is given by zone id."""
    region = subnet.inputs["tags"]["region"]
    az = known_regions()[region].az_of(subnet.inputs["availabilityZoneId"])
    assert az is not None
    return az


@pytest.mark.parametrize("stack", REGIONAL)
def test_subnets_per_az_and_tier(stack: str) -> None:
    env, region = env_region(stack)
    result = runs()[stack]
    subnets = of_type(result, "aws:ec2/subnet:Subnet")
    azs = fleet().azs(region)
    assert len(subnets) == len(azs) * len(planner.SUBNET_TIERS)
    seen = {(s.inputs["tags"]["dlinfra:tier"], _az(s)) for s in subnets}
    assert seen == set(itertools.product(planner.SUBNET_TIERS, azs))
    for s in subnets:
        # Placed by zone id: an AZ name is another zone in another account (dlinfra/data/regions.yaml).
        assert "availabilityZone" not in s.inputs
        tier, az = s.inputs["tags"]["dlinfra:tier"], _az(s)
        assert s.inputs["availabilityZoneId"] == fleet().zone_id(region, az)
        assert s.name == f"network-{tier}-{az}"
        assert s.inputs["cidrBlock"] == str(plan().cidr(planner.subnet_key(env, region, tier, az)))
        assert s.inputs["mapPublicIpOnLaunch"] is False
    nets = [ipaddress.ip_network(s.inputs["cidrBlock"]) for s in subnets]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(nets, 2))


def test_no_two_subnets_overlap_anywhere() -> None:
    nets = [
        (stack, ipaddress.ip_network(s.inputs["cidrBlock"]))
        for stack in REGIONAL
        for s in of_type(runs()[stack], "aws:ec2/subnet:Subnet")
    ]
    for (sa, a), (sb, b) in itertools.combinations(nets, 2):
        assert not a.overlaps(b), f"{sa} {a} overlaps {sb} {b}"


@pytest.mark.parametrize("stack", REGIONAL)
def test_eks_and_load_balancer_subnet_tags(stack: str) -> None:
    result = runs()[stack]
    cluster_tag = f"kubernetes.io/cluster/dlinfra-{stack.split('-', 1)[0]}-"
    for s in of_type(result, "aws:ec2/subnet:Subnet"):
        tags = s.inputs["tags"]
        tier = tags["dlinfra:tier"]
        shared = [k for k in tags if k.startswith(cluster_tag)]
        assert (tags.get("kubernetes.io/role/elb") == "1") == (tier == "public")
        assert (tags.get("kubernetes.io/role/internal-elb") == "1") == (tier == "private")
        assert len(shared) == (1 if tier in ("public", "private") else 0)
        assert all(k.endswith("-eks") and tags[k] == "shared" for k in shared)


@pytest.mark.parametrize("stack", REGIONAL)
def test_nat_mode_follows_the_environment(stack: str) -> None:
    env, _ = env_region(stack)
    result = runs()[stack]
    ids = by_id(result)
    nats = of_type(result, "aws:ec2/natGateway:NatGateway")
    eips = of_type(result, "aws:ec2/eip:Eip")
    assert fleet().environments[env].nat == ("per_az" if env == "prod" else "single")
    assert len(nats) == len(eips) == NAT_COUNT[env]
    nat_subnets = {ids[n.inputs["subnetId"]].inputs["tags"]["dlinfra:tier"] for n in nats}
    assert nat_subnets == {"public"}
    assert {n.inputs["allocationId"] for n in nats} == {e.id for e in eips}
    assert all(e.inputs["domain"] == "vpc" for e in eips)
    igw = named(result, "network-igw")
    assert all(igw.urn in n.dependencies for n in nats)


@pytest.mark.parametrize("stack", REGIONAL)
def test_route_tables(stack: str) -> None:
    env, region = env_region(stack)
    result = runs()[stack]
    ids = by_id(result)
    azs = fleet().azs(region)
    tables = {r.name: r for r in of_type(result, "aws:ec2/routeTable:RouteTable")}
    assert set(tables) == {
        "network-rt-public",
        "network-rt-transit",
        *(f"network-rt-private-{az}" for az in azs),
    }
    assert all("routes" not in t.inputs for t in tables.values())  # routes are separate resources
    defaults = {
        ids[r.inputs["routeTableId"]].name: r
        for r in of_type(result, "aws:ec2/route:Route")
        if r.inputs["destinationCidrBlock"] == "0.0.0.0/0"
    }
    assert defaults["network-rt-public"].inputs["gatewayId"] == named(result, "network-igw").id
    assert "network-rt-transit" not in defaults
    nat_of_az = {_az(ids[n.inputs["subnetId"]]): n.id for n in of_type(result, "aws:ec2/natGateway:NatGateway")}
    for az in azs:
        nat = defaults[f"network-rt-private-{az}"].inputs["natGatewayId"]
        assert nat == (nat_of_az[az] if env == "prod" else next(iter(nat_of_az.values())))
    associations = of_type(result, "aws:ec2/routeTableAssociation:RouteTableAssociation")
    assert len(associations) == 3 * len(azs)
    for a in associations:
        subnet = ids[a.inputs["subnetId"]]
        table = ids[a.inputs["routeTableId"]].name
        tier, az = subnet.inputs["tags"]["dlinfra:tier"], _az(subnet)
        assert table == (f"network-rt-private-{az}" if tier == "private" else f"network-rt-{tier}")
    exported = result.outputs["route_table_ids"]
    assert exported["private"] == {az: tables[f"network-rt-private-{az}"].id for az in azs}
    assert set(exported["transit"].values()) == {tables["network-rt-transit"].id}


@pytest.mark.parametrize("stack", REGIONAL)
def test_endpoints(stack: str) -> None:
    env, region = env_region(stack)
    result = runs()[stack]
    ids = by_id(result)
    endpoints = {r.inputs["serviceName"]: r for r in of_type(result, "aws:ec2/vpcEndpoint:VpcEndpoint")}
    assert set(endpoints) == {f"com.amazonaws.{region}.{s}" for s in ("s3", *DEFAULT_INTERFACE_ENDPOINTS)}
    s3 = endpoints.pop(f"com.amazonaws.{region}.s3")
    assert s3.inputs["vpcEndpointType"] == "Gateway"
    assert {ids[t].name for t in s3.inputs["routeTableIds"]} == {
        f"network-rt-private-{az}" for az in fleet().azs(region)
    }
    (sg,) = [r for r in of_type(result, "aws:ec2/securityGroup:SecurityGroup") if r.name == "network-endpoints-sg"]
    (https,) = [
        r
        for r in of_type(result, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        if r.inputs["securityGroupId"] == sg.id
    ]
    assert (https.inputs["fromPort"], https.inputs["toPort"], https.inputs["ipProtocol"]) == (443, 443, "tcp")
    assert https.inputs["cidrIpv4"] == str(plan().vpc(env, region))
    for endpoint in endpoints.values():
        assert endpoint.inputs["vpcEndpointType"] == "Interface"
        assert endpoint.inputs["privateDnsEnabled"] is True
        assert endpoint.inputs["securityGroupIds"] == [sg.id]
        tiers = {ids[s].inputs["tags"]["dlinfra:tier"] for s in endpoint.inputs["subnetIds"]}
        assert tiers == {"private"} and len(endpoint.inputs["subnetIds"]) == len(fleet().azs(region))


@pytest.mark.parametrize("stack", REGIONAL)
def test_flow_logs_encrypted_with_a_rotated_key(stack: str) -> None:
    result = runs()[stack]
    (flow_log,) = of_type(result, "aws:ec2/flowLog:FlowLog")
    (vpc,) = of_type(result, "aws:ec2/vpc:Vpc")
    group = named(result, "network-flow-logs")
    key = named(result, "network-log-key")
    role = named(result, "network-flow-logs-role")
    assert flow_log.inputs["vpcId"] == vpc.id and flow_log.inputs["trafficType"] == "ALL"
    assert flow_log.inputs["logDestinationType"] == "cloud-watch-logs"
    assert flow_log.inputs["logDestination"] == group.outputs["arn"]
    assert flow_log.inputs["iamRoleArn"] == role.outputs["arn"]
    assert key.inputs["enableKeyRotation"] is True
    assert group.inputs["kmsKeyId"] == key.outputs["arn"]
    assert group.inputs["retentionInDays"] == 365
    trust = json.loads(role.inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "vpc-flow-logs.amazonaws.com"}
    policy: dict[str, Any] = json.loads(named(result, "network-flow-logs-policy").inputs["policy"])
    assert group.outputs["arn"] in policy["Statement"][0]["Resource"]
    key_policy = json.loads(key.inputs["policy"])
    logs = next(s for s in key_policy["Statement"] if s["Sid"] == "CloudWatchLogsEncrypts")
    assert logs["Principal"] == {"Service": f"logs.{env_region(stack)[1]}.amazonaws.com"}


def _args(**overrides: Any) -> NetworkArgs:
    fields: dict[str, Any] = {
        "names": Names("dlinfra", "prod", "us-west-2"),
        "vpc_cidr": "10.2.0.0/16",
        "subnets": {
            "private": {"us-west-2a": "10.2.0.0/18"},
            "public": {"us-west-2a": "10.2.192.0/24"},
            "transit": {"us-west-2a": "10.2.195.0/28"},
        },
        "zone_ids": {"us-west-2a": "usw2-az2"},
    }
    return NetworkArgs(**(fields | overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"names": Names("dlinfra", "prod", None)}, r"^names: a Network belongs to a regional stack"),
        ({"vpc_cidr": "10.2.0.1/16"}, r"^vpc_cidr: '10.2.0.1/16' is not an IPv4 CIDR"),
        (
            {"subnets": {"private": {"us-west-2a": "10.2.0.0/18"}}},
            r"^subnets: need tiers private, public, transit",
        ),
        (
            {
                "subnets": {
                    "private": {"us-west-2a": "10.9.0.0/18"},
                    "public": {"us-west-2a": "10.2.192.0/24"},
                    "transit": {"us-west-2a": "10.2.195.0/28"},
                }
            },
            r"^subnets.private.us-west-2a: 10.9.0.0/18 is outside vpc_cidr",
        ),
        ({"zone_ids": {}}, r"^zone_ids: no zone id for us-west-2a"),
        ({"nat": "double"}, r"^nat: must be 'per_az' or 'single'"),
        ({"interface_endpoints": ("sts", "sts")}, r"^interface_endpoints: need a sequence of distinct names"),
        ({"flow_log_retention_days": 10}, r"^flow_log_retention_days: 10 is not a CloudWatch Logs retention"),
    ],
)
def test_args_are_checked(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _args(**overrides)
