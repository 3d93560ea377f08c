"""Reachability of the reference fleet's plans: every derived intent holds, and each breaks where it should.

Each mutation removes (or adds) one resource a flow depends on and expects the intent to fail at the named
hop with the named reason: proof that the intent is carried by that rule or route and nothing else.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import pytest

from dlinfra.checks.reach import check, evaluation, from_plans, intents, sites
from dlinfra.model import planner
from dlinfra.model.fleet.load import load_fleet
from tests import reference
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK

Plans = list[dict[str, Any]]


@functools.cache
def _plans() -> tuple[dict[str, Any], ...]:
    project = reference.fleet().project
    return tuple(result.plan(project) for result in reference.runs().values())


def plans() -> Plans:
    return copy.deepcopy(list(_plans()))


def evaluate(mutated: Plans, prefix: str) -> evaluation.ReachResult:
    loaded = load_fleet(REFERENCE_FLEET)
    address_plan = planner.plan(loaded, planner.load_lock(REFERENCE_LOCK))
    topo = from_plans.build(mutated, sites.site_sides(loaded.fleet, address_plan, mutated))
    chosen = [i for i in intents.derive(loaded.fleet, topo) if i.id.startswith(prefix)]
    assert chosen, f"no intent starts with {prefix!r}"  # a check of nothing would pass
    return evaluation.run(topo, chosen)


def stack(all_plans: Plans, name: str) -> dict[str, Any]:
    (found,) = [p for p in all_plans if p["stack"] == name]
    return found


def without(stack_name: str, resource: str) -> Callable[[Plans], None]:
    def edit(all_plans: Plans) -> None:
        plan = stack(all_plans, stack_name)
        before = len(plan["resources"])
        plan["resources"] = [r for r in plan["resources"] if r["name"] != resource]
        assert len(plan["resources"]) == before - 1, f"{resource} is not in {stack_name}"

    return edit


def test_every_derived_intent_holds_on_the_reference_fleet() -> None:
    result = check.analyse(REFERENCE_FLEET, REFERENCE_LOCK, plans())
    assert [f"{f.intent.id}: {f.why}" for f in result.failures] == []
    families = result.by_family()
    for family in (
        "dns",
        "pod-to-pod",
        "control-plane",
        "storage",
        "endpoints",
        "ci",
        "site",
        "site-to-site",
        "laptop",
        "multikueue",
        "deny-internet",
        "deny-environment",
    ):
        assert families[family][1] > 0, f"no flows of {family}"
    assert result.flows > 3000


MUTATIONS = [
    pytest.param(
        without("prod-us-west-2", "cluster-nodes-self"),
        "dns/prod-us-west-2/udp",
        "security group pool-cpu-sg, cluster-nodes-sg",
        "no ingress rule admits from 10.2.",
        id="dns",
    ),
    pytest.param(
        without("prod-us-west-2", "cluster-nodes-self"),
        "pod-to-pod/prod-us-west-2",
        "security group pool-",
        "no ingress rule admits from 10.2.",
        id="pod-to-pod",
    ),
    pytest.param(
        without("prod-us-west-2", "cluster-api-from-10-2-0-0-16"),
        "control-plane/prod-us-west-2/api",
        "cluster-api-sg",
        "no ingress rule admits from 10.2.",
        id="nodes-to-api",
    ),
    pytest.param(
        without("prod-us-west-2", "cluster-api-from-10-3-64-0-18"),
        "control-plane/prod-us-west-2/api",
        "cluster-api-sg",
        "no ingress rule admits from 10.3.64.20 tcp/443",
        id="hybrid-pods-to-api",
    ),
    pytest.param(
        without("prod-us-west-2", "cluster-nodes-from-cluster"),
        "control-plane/prod-us-west-2/kubelet",
        "cluster-nodes-sg",
        "tcp/10250",
        id="kubelet",
    ),
    pytest.param(
        without("prod-us-west-2", "storage-efs-from-10-2-0-0-18"),
        "storage/prod-us-west-2/efs",
        "security group storage-efs-sg",
        "no ingress rule admits from 10.2.0.",
        id="efs",
    ),
    pytest.param(
        without("prod-us-west-2", "storage-lustre-from-10-2-0-0-18-988"),
        "storage/prod-us-west-2/fsx-clients",
        "security group storage-lustre-sg",
        "tcp/988",
        id="fsx-clients",
    ),
    pytest.param(
        without("prod-us-west-2", "storage-lustre-to-10-2-0-0-18-1018"),
        "storage/prod-us-west-2/fsx-servers",
        "security group storage-lustre-sg",
        "no egress rule admits to 10.2.0.",
        id="fsx-servers-out",
    ),
    pytest.param(
        without("prod-us-west-2", "cluster-nodes-from-lustre-988"),
        "storage/prod-us-west-2/fsx-servers",
        "cluster-nodes-sg",
        "tcp/988",
        id="fsx-servers-in",
    ),
    pytest.param(
        without("prod-us-west-2", "network-endpoints-sg-https"),
        "endpoints/prod-us-west-2",
        "security group network-endpoints-sg",
        "tcp/443",
        id="endpoints",
    ),
    pytest.param(
        without("prod-us-west-2", "cluster-api-from-10-2-0-0-16"),
        "ci/prod-us-west-2",
        "cluster-api-sg",
        "no ingress rule admits from 10.2.",
        id="ci-runner-to-api",
    ),
    pytest.param(
        without("prod-us-east-1", "cluster-api-from-10-2-0-0-16"),
        "multikueue/prod-us-west-2/us-east-1",
        "cluster-api-sg",
        "no ingress rule admits from 10.2.",
        id="multikueue-manager-to-worker-api",
    ),
    pytest.param(
        without("prod-us-west-2", "transit-route-us-west-2a-lan-sjc1"),
        "site/prod-us-west-2->sjc1",
        "internet gateway",
        "10.200.0.10 is not an internet address",
        id="vpc-route-to-site",
    ),
    pytest.param(
        without("prod-global", "peering-eu-west-1-us-west-2-route-eu-west-1-lan-sjc1"),
        "site/sjc1->prod-eu-west-1",
        "reply path: transit gateway route table transit-rt (prod-eu-west-1)",
        "no route for 10.200.0.20",
        id="peering-route",
    ),
    pytest.param(
        without("prod-us-west-2", "site-sjc1-association"),
        "site/sjc1->prod-us-west-2",
        "transit gateway transit-tgw (prod-us-west-2)",
        "site-sjc1-vpn is associated with no route table",
        id="vpn-association",
    ),
    pytest.param(
        without("prod-us-west-2", "cluster-nodes-from-10-200-0-0-20"),
        "site/sjc1->prod-us-west-2",
        "cluster-nodes-sg",
        "no ingress rule admits from 10.200.0.20",
        id="site-lan-to-nodes",
    ),
    pytest.param(
        without("prod-us-west-2", "client-vpn-authorize-vision-vpc"),
        "laptop/laptop of team vision on prod-us-west-2 VPN->prod-us-west-2/pods",
        "client VPN client-vpn-endpoint",
        "does not admit group 4a7b3c2d-2222-4e5f-9a8b-team-vision",
        id="vpn-authorization",
    ),
    pytest.param(
        without("prod-us-west-2", "cluster-nodes-from-laptops"),
        "laptop/laptop of team vision on prod-us-west-2 VPN->prod-us-west-2/pods",
        "cluster-nodes-sg",
        "tcp/6006",
        id="laptops-to-pods",
    ),
    pytest.param(
        without("prod-us-west-2", "cluster-nodes-from-10-0-0-0-16"),
        "laptop/laptop of team vision on prod-eu-west-1 VPN->prod-us-west-2/pods",
        "cluster-nodes-sg",
        "no ingress rule admits from 10.0.",
        id="other-region-to-pods",
    ),
]


@pytest.mark.parametrize(("edit", "intent", "hop", "reason"), MUTATIONS)
def test_removing_what_a_flow_depends_on_fails_it_at_that_hop(
    edit: Callable[[Plans], None], intent: str, hop: str, reason: str
) -> None:
    assert_mutation_fails(edit, intent, hop, reason)


def assert_mutation_fails(edit: Callable[[Plans], None], intent: str, hop: str, reason: str) -> None:
    """The intent holds on the reference plans, and after `edit` fails first at `hop` for `reason`."""
    mutated = plans()
    assert not evaluate(mutated, intent).failures, "holds before the mutation"
    edit(mutated)
    result = evaluate(mutated, intent)
    assert result.failures, f"{intent} still holds"
    first = result.failures[0]
    assert hop in first.verdict.denied_at, first.why
    assert reason in first.verdict.reason, first.why


def test_the_ci_runner_needs_https_egress() -> None:
    # Two rules admit it (HTTPS to the VPC, HTTPS anywhere for GitHub): either alone carries the flow.
    mutated = plans()
    without("prod-us-west-2", "ci-apply-sg-to-vpc")(mutated)
    assert not evaluate(mutated, "ci/prod-us-west-2").failures
    without("prod-us-west-2", "ci-apply-sg-to-internet")(mutated)
    failure = evaluate(mutated, "ci/prod-us-west-2").failures[0]
    assert failure.verdict.denied_at == "security group ci-apply-sg"
    assert failure.verdict.reason.startswith("no egress rule admits to 10.2.")


def test_hybrid_pods_are_unreachable_without_the_sites_bgp_peering() -> None:
    mutated = plans()
    k8s = stack(mutated, "prod-us-west-2-k8s")
    k8s["resources"] = [r for r in k8s["resources"] if r["inputs"].get("kind") != "CiliumBGPClusterConfig"]
    result = evaluate(mutated, "site/prod-us-west-2->sjc1")
    assert result.failures
    assert result.failures[0].verdict.denied_at == "site sjc1 gateway"
    assert "no route to hybrid pod 10.3.64.10 inside the site" in result.failures[0].verdict.reason


def test_a_route_into_another_sites_tunnel_is_refused_as_transit() -> None:
    mutated = plans()
    regional = stack(mutated, "prod-us-west-2")
    vpn = next(r for r in regional["resources"] if r["name"] == "site-sjc1-vpn")
    table = next(r for r in regional["resources"] if r["name"] == "transit-rt")
    regional["resources"].append(
        {
            **copy.deepcopy(vpn),
            "type": from_plans.TGW_ROUTE,
            "name": "mistake",
            "urn": "urn:x::mistake",
            "outputs": {},
            "inputs": {
                "transitGatewayRouteTableId": table["id"],
                "destinationCidrBlock": "10.4.0.0/22",
                "transitGatewayAttachmentId": vpn["outputs"]["transitGatewayAttachmentId"],
            },
        }
    )
    result = evaluate(mutated, "site/prod-us-west-2->ams1")
    assert result.failures
    assert result.failures[0].verdict.denied_at == "VPN site-sjc1-vpn"
    assert "routed into site sjc1's tunnel, which does not own it" in result.failures[0].verdict.reason


def test_the_internet_reaching_a_node_breaks_a_must_deny_intent() -> None:
    mutated = plans()
    regional = stack(mutated, "prod-us-west-2")
    for r in regional["resources"]:
        if r["name"] == "network-private-us-west-2a":
            r["inputs"]["mapPublicIpOnLaunch"] = True
            r["inputs"]["cidrBlock"] = r["inputs"]["cidrBlock"]
        if r["name"] == "network-rt-private-us-west-2a":
            igw = next(x for x in regional["resources"] if x["name"] == "network-igw")
            r["inputs"]["routes"] = [{"cidrBlock": "0.0.0.0/0", "gatewayId": igw["id"]}]
        if r["name"] == "cluster-nodes-self":
            r["inputs"].pop("referencedSecurityGroupId")
            r["inputs"]["cidrIpv4"] = "0.0.0.0/0"
    regional["resources"] = [
        r for r in regional["resources"] if r["name"] != "network-route-private-us-west-2a-default"
    ]
    result = evaluate(mutated, "deny-internet/prod-us-west-2/pool")
    assert result.failures
    assert result.failures[0].why.startswith("reaches it, but must stay closed")


def test_environments_are_isolated_both_ways() -> None:
    result = evaluate(plans(), "deny-environment/")
    assert {i.id for i in result.intents} == {
        "deny-environment/prod->staging",
        "deny-environment/staging->prod",
        "deny-environment/prod->staging/udp",
        "deny-environment/staging->prod/udp",
    }
    assert result.flows > 1000 and not result.failures


def test_a_path_between_environments_breaks_the_isolation_intent() -> None:
    # Peer staging's transit gateway with prod's, route both ways and admit staging on prod's nodes: every
    # hop a leak needs. The must-deny intent then fails, naming the path it found.
    mutated = plans()
    staging, prod = stack(mutated, "staging-us-west-2"), stack(mutated, "prod-us-west-2")

    def named(plan: dict[str, Any], name: str) -> dict[str, Any]:
        (found,) = [r for r in plan["resources"] if r["name"] == name]
        return found

    def add(plan: dict[str, Any], type_: str, name: str, inputs: dict[str, Any], id_: str = "") -> None:
        urn = f"urn:pulumi:{plan['stack']}::dlinfra::{type_}::{name}"
        plan["resources"].append(
            {
                "type": type_,
                "name": name,
                "id": id_ or name,
                "custom": True,
                "urn": urn,
                "inputs": inputs,
                "outputs": {},
            }
        )

    s_tgw, p_tgw = named(staging, "transit-tgw")["id"], named(prod, "transit-tgw")["id"]
    s_rt, p_rt = named(staging, "transit-rt")["id"], named(prod, "transit-rt")["id"]
    s_cidr, p_cidr = (
        named(staging, "network-vpc")["inputs"]["cidrBlock"],
        named(prod, "network-vpc")["inputs"]["cidrBlock"],
    )
    add(
        staging,
        from_plans.TGW_PEERING,
        "leak",
        {"transitGatewayId": s_tgw, "peerTransitGatewayId": p_tgw},
        "tgw-attach-leak",
    )
    add(
        staging,
        "aws:ec2transitgateway/peeringAttachmentAccepter:PeeringAttachmentAccepter",
        "leak-accept",
        {"transitGatewayAttachmentId": "tgw-attach-leak"},
    )
    for plan, table, cidr in ((staging, s_rt, p_cidr), (prod, p_rt, s_cidr)):
        add(
            plan,
            from_plans.TGW_ASSOC,
            f"leak-assoc-{table}",
            {"transitGatewayRouteTableId": table, "transitGatewayAttachmentId": "tgw-attach-leak"},
        )
        add(
            plan,
            from_plans.TGW_ROUTE,
            f"leak-route-{table}",
            {
                "transitGatewayRouteTableId": table,
                "destinationCidrBlock": cidr,
                "transitGatewayAttachmentId": "tgw-attach-leak",
            },
        )
    for plan, tgw, cidr in ((staging, s_tgw, p_cidr), (prod, p_tgw, s_cidr)):
        for r in [r for r in plan["resources"] if r["type"] == from_plans.ROUTE_TABLE and "private" in r["name"]]:
            add(
                plan,
                from_plans.ROUTE,
                f"leak-{r['name']}",
                {"routeTableId": r["id"], "destinationCidrBlock": cidr, "transitGatewayId": tgw},
            )
    nodes = named(prod, "cluster-nodes-sg")["id"]
    add(prod, from_plans.SG_INGRESS, "leak-ingress", {"securityGroupId": nodes, "ipProtocol": "-1", "cidrIpv4": s_cidr})
    result = evaluate(mutated, "deny-environment/staging->prod")
    assert result.failures
    leak = next(f for f in result.failures if f.destination.label.startswith("pool"))
    assert leak.why.startswith("reaches it, but must stay closed")
    assert "peering attachment leak" in leak.why


def test_subnets_placed_by_zone_id_keep_the_fleets_az_names() -> None:
    """Subnets reach AWS by zone id; reachability names them by the fleet's AZ, as the fleet file does."""
    loaded = load_fleet(REFERENCE_FLEET)
    address_plan = planner.plan(loaded, planner.load_lock(REFERENCE_LOCK))
    all_plans = plans()
    topo = from_plans.build(all_plans, sites.site_sides(loaded.fleet, address_plan, all_plans))
    regional = [p for p in all_plans if p["role"]["kind"] == "regional"]
    subnets = [r for p in regional for r in p["resources"] if r["type"] == "aws:ec2/subnet:Subnet"]
    assert subnets and all("availabilityZoneId" in s["inputs"] for s in subnets)
    for s in subnets:
        region = s["inputs"]["tags"]["region"]
        assert topo.subnets[s["id"]].az in loaded.fleet.azs(region)
