"""The reachability model on small hand-written plans: one rule of routing or filtering per test."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import pytest

from dlinfra.checks.reach import from_plans
from dlinfra.checks.reach.engine import AtSite, Endpoint, InVpc, OnClientVpn, OnInternet, evaluate
from dlinfra.checks.reach.topology import SiteSide, Topology

N = ipaddress.IPv4Network
A = ipaddress.IPv4Address


def res(
    type_: str, name: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "type": type_,
        "name": name,
        "id": id_,
        "custom": True,
        "inputs": inputs,
        "outputs": outputs or {},
        "urn": f"urn:pulumi:test::p::{type_}::{name}",
    }


def plan(stack: str, resources: list[dict[str, Any]], env: str = "prod", region: str = "r1") -> dict[str, Any]:
    return {"stack": stack, "role": {"environment": env, "region": region}, "resources": resources}


def vpc(prefix: str, cidr: str, *, tgw: str | None = None) -> list[dict[str, Any]]:
    """A VPC with two private subnets sharing one route table, and a transit subnet when a TGW is given."""
    base = N(cidr)
    a, b, t = list(base.subnets(new_prefix=base.prefixlen + 2))[:3]
    out = [
        res(from_plans.VPC, f"{prefix}-vpc", f"vpc-{prefix}", {"cidrBlock": cidr}),
        res(from_plans.SUBNET, f"{prefix}-a", f"subnet-{prefix}-a", {"vpcId": f"vpc-{prefix}", "cidrBlock": str(a)}),
        res(from_plans.SUBNET, f"{prefix}-b", f"subnet-{prefix}-b", {"vpcId": f"vpc-{prefix}", "cidrBlock": str(b)}),
        res(from_plans.ROUTE_TABLE, f"{prefix}-rt", f"rtb-{prefix}", {"vpcId": f"vpc-{prefix}"}),
        res(
            from_plans.RT_ASSOC,
            f"{prefix}-rta-a",
            "x",
            {"subnetId": f"subnet-{prefix}-a", "routeTableId": f"rtb-{prefix}"},
        ),
        res(
            from_plans.RT_ASSOC,
            f"{prefix}-rta-b",
            "x",
            {"subnetId": f"subnet-{prefix}-b", "routeTableId": f"rtb-{prefix}"},
        ),
    ]
    if tgw:
        out += [
            res(
                from_plans.SUBNET, f"{prefix}-t", f"subnet-{prefix}-t", {"vpcId": f"vpc-{prefix}", "cidrBlock": str(t)}
            ),
            res(
                from_plans.TGW_VPC,
                f"{prefix}-att",
                f"att-{prefix}",
                {"vpcId": f"vpc-{prefix}", "transitGatewayId": tgw, "subnetIds": [f"subnet-{prefix}-t"]},
            ),
        ]
    return out


def sg(name: str, vpc_id: str, *rules: dict[str, Any]) -> list[dict[str, Any]]:
    out = [res(from_plans.SG, name, f"sg-{name}", {"vpcId": vpc_id})]
    for i, rule in enumerate(rules):
        kind = from_plans.SG_INGRESS if rule.pop("direction", "ingress") == "ingress" else from_plans.SG_EGRESS
        out.append(res(kind, f"{name}-{i}", f"r-{name}-{i}", {"securityGroupId": f"sg-{name}", **rule}))
    return out


ALL_OUT = {"direction": "egress", "ipProtocol": "-1", "cidrIpv4": "0.0.0.0/0"}


def at(topo: Topology, subnet: str, host: int, *groups: str) -> Endpoint:
    s = topo.subnets[subnet]
    return Endpoint(f"{subnet}#{host}", s.cidr.network_address + host, InVpc(s.vpc_id, subnet, tuple(groups)))


def route(table: str, cidr: str, **target: str) -> dict[str, Any]:
    return res(
        from_plans.ROUTE,
        f"route-{table}-{cidr}",
        f"r-{table}-{cidr}",
        {"routeTableId": table, "destinationCidrBlock": cidr, **target},
    )


# --- security groups ------------------------------------------------------------------------------------
@pytest.fixture
def one_vpc() -> Iterator[list[dict[str, Any]]]:
    yield (
        vpc("a", "10.1.0.0/16")
        + sg(
            "web",
            "vpc-a",
            {"ipProtocol": "tcp", "fromPort": 443, "toPort": 443, "referencedSecurityGroupId": "sg-client"},
        )
        + sg("client", "vpc-a", dict(ALL_OUT))
        + sg("other", "vpc-a", dict(ALL_OUT))
    )


def test_a_group_reference_admits_members_of_that_group_only(one_vpc: list[dict[str, Any]]) -> None:
    topo = from_plans.build([plan("s", one_vpc)])
    server = at(topo, "subnet-a-b", 10, "sg-web")
    assert evaluate(topo, at(topo, "subnet-a-a", 10, "sg-client"), server, "tcp", 443).allowed
    denied = evaluate(topo, at(topo, "subnet-a-a", 11, "sg-other"), server, "tcp", 443)
    assert not denied.allowed
    assert denied.denied_at == "security group web"
    assert denied.reason == "no ingress rule admits from 10.1.0.11 tcp/443"
    wrong_port = evaluate(topo, at(topo, "subnet-a-a", 10, "sg-client"), server, "tcp", 80)
    assert not wrong_port.allowed and "tcp/80" in wrong_port.reason


def test_egress_is_checked_and_replies_need_no_rule(one_vpc: list[dict[str, Any]]) -> None:
    topo = from_plans.build([plan("s", one_vpc)])
    # web has no egress rule at all: it cannot open a connection, but its replies flow (stateful).
    out = evaluate(topo, at(topo, "subnet-a-b", 10, "sg-web"), at(topo, "subnet-a-a", 10, "sg-client"), "tcp", 443)
    assert not out.allowed and out.denied_at == "security group web" and "no egress rule" in out.reason
    assert evaluate(
        topo, at(topo, "subnet-a-a", 10, "sg-client"), at(topo, "subnet-a-b", 10, "sg-web"), "tcp", 443
    ).allowed


def test_network_acls_are_stateless_and_first_match_wins(one_vpc: list[dict[str, Any]]) -> None:
    acl = res(
        from_plans.NACL,
        "acl-b",
        "acl-b",
        {
            "vpcId": "vpc-a",
            "subnetIds": ["subnet-a-b"],
            "ingress": [
                {
                    "ruleNo": 100,
                    "action": "allow",
                    "protocol": "tcp",
                    "cidrBlock": "10.1.0.0/16",
                    "fromPort": 443,
                    "toPort": 443,
                }
            ],
            "egress": [
                {
                    "ruleNo": 90,
                    "action": "deny",
                    "protocol": "-1",
                    "cidrBlock": "10.1.0.0/18",
                    "fromPort": 0,
                    "toPort": 0,
                },
                {
                    "ruleNo": 100,
                    "action": "allow",
                    "protocol": "-1",
                    "cidrBlock": "0.0.0.0/0",
                    "fromPort": 0,
                    "toPort": 0,
                },
            ],
        },
    )
    topo = from_plans.build([plan("s", [*one_vpc, acl])])
    verdict = evaluate(topo, at(topo, "subnet-a-a", 10, "sg-client"), at(topo, "subnet-a-b", 10, "sg-web"), "tcp", 443)
    assert not verdict.allowed
    assert verdict.denied_at == "reply path: network ACL acl-b"
    assert verdict.reason.startswith("rule 90 denies 10.1.0.10")


# --- VPC routing ---------------------------------------------------------------------------------------------
def two_vpcs_one_tgw(*extra: dict[str, Any]) -> Topology:
    resources = (
        vpc("a", "10.1.0.0/16", tgw="tgw-1")
        + vpc("b", "10.2.0.0/16", tgw="tgw-1")
        + [
            res(
                from_plans.TGW,
                "tgw",
                "tgw-1",
                {"defaultRouteTableAssociation": "disable", "defaultRouteTablePropagation": "disable"},
            ),
            res(from_plans.TGW_RT, "tgw-rt", "tgw-rtb-1", {"transitGatewayId": "tgw-1"}),
            *(
                res(
                    from_plans.TGW_ASSOC,
                    f"assoc-{v}",
                    "x",
                    {"transitGatewayRouteTableId": "tgw-rtb-1", "transitGatewayAttachmentId": f"att-{v}"},
                )
                for v in "ab"
            ),
            *(
                res(
                    from_plans.TGW_PROP,
                    f"prop-{v}",
                    "x",
                    {"transitGatewayRouteTableId": "tgw-rtb-1", "transitGatewayAttachmentId": f"att-{v}"},
                )
                for v in "ab"
            ),
            route("rtb-a", "10.0.0.0/8", transitGatewayId="tgw-1"),
            route("rtb-b", "10.0.0.0/8", transitGatewayId="tgw-1"),
            *sg("open", "vpc-a", dict(ALL_OUT), {"ipProtocol": "-1", "cidrIpv4": "10.0.0.0/8"}),
            *sg("open2", "vpc-b", dict(ALL_OUT), {"ipProtocol": "-1", "cidrIpv4": "10.0.0.0/8"}),
            *extra,
        ]
    )
    return from_plans.build([plan("s", resources)])


def test_vpcs_reach_each_other_through_propagated_transit_routes() -> None:
    topo = two_vpcs_one_tgw()
    verdict = evaluate(topo, at(topo, "subnet-a-a", 10, "sg-open"), at(topo, "subnet-b-a", 10, "sg-open2"), "tcp", 22)
    assert verdict.allowed, verdict.reason
    assert any("propagated route -> vpc attachment b-att" in hop for hop in verdict.hops)


def test_longest_prefix_wins_and_a_blackhole_stops_the_flow() -> None:
    topo = two_vpcs_one_tgw(route("rtb-a", "10.2.0.0/18", gatewayId=""))
    into_blackhole = evaluate(
        topo, at(topo, "subnet-a-a", 10, "sg-open"), at(topo, "subnet-b-a", 10, "sg-open2"), "tcp", 22
    )
    assert not into_blackhole.allowed
    assert into_blackhole.denied_at == "route table a-rt"
    assert "10.2.0.0/18 has no target (blackhole)" in into_blackhole.reason
    # 10.2.64.0/18 is outside the more specific route: the /8 to the transit gateway still carries it.
    assert evaluate(
        topo, at(topo, "subnet-a-a", 10, "sg-open"), at(topo, "subnet-b-b", 10, "sg-open2"), "tcp", 22
    ).allowed


def test_a_transit_blackhole_route_beats_the_propagated_one() -> None:
    hole = res(
        from_plans.TGW_ROUTE,
        "hole",
        "x",
        {"transitGatewayRouteTableId": "tgw-rtb-1", "destinationCidrBlock": "10.2.0.0/16", "blackhole": True},
    )
    topo = two_vpcs_one_tgw(hole)
    verdict = evaluate(topo, at(topo, "subnet-a-a", 10, "sg-open"), at(topo, "subnet-b-a", 10, "sg-open2"), "tcp", 22)
    assert not verdict.allowed and verdict.reason == "10.2.0.10 matches a blackhole route"


def test_an_unassociated_attachment_routes_nothing() -> None:
    topo = two_vpcs_one_tgw()
    topo.tgw_route_tables["tgw-rtb-1"].associations.discard("att-b")
    verdict = evaluate(topo, at(topo, "subnet-a-a", 10, "sg-open"), at(topo, "subnet-b-a", 10, "sg-open2"), "tcp", 22)
    assert not verdict.allowed
    assert verdict.denied_at.startswith("reply path: transit gateway tgw")
    assert verdict.reason == "attachment b-att is associated with no route table"


def test_peering_carries_only_static_routes() -> None:
    resources = (
        vpc("a", "10.1.0.0/16", tgw="tgw-1")
        + vpc("b", "10.2.0.0/16", tgw="tgw-2")
        + [
            res(from_plans.TGW, "tgw-one", "tgw-1", {}),
            res(from_plans.TGW, "tgw-two", "tgw-2", {}),
            res(from_plans.TGW_RT, "rt-one", "rt-1", {"transitGatewayId": "tgw-1"}),
            res(from_plans.TGW_RT, "rt-two", "rt-2", {"transitGatewayId": "tgw-2"}),
            res(
                from_plans.TGW_PEERING, "peer", "att-p", {"transitGatewayId": "tgw-1", "peerTransitGatewayId": "tgw-2"}
            ),
            res(
                "aws:ec2transitgateway/peeringAttachmentAccepter:PeeringAttachmentAccepter",
                "accept",
                "x",
                {"transitGatewayAttachmentId": "att-p"},
            ),
            *(
                res(
                    from_plans.TGW_ASSOC,
                    f"assoc-{a}-{t}",
                    "x",
                    {"transitGatewayRouteTableId": t, "transitGatewayAttachmentId": a},
                )
                for a, t in (("att-a", "rt-1"), ("att-p", "rt-1"), ("att-b", "rt-2"), ("att-p", "rt-2"))
            ),
            # Each side propagates its own VPC and the peering attachment: peering propagates nothing.
            *(
                res(
                    from_plans.TGW_PROP,
                    f"prop-{a}-{t}",
                    "x",
                    {"transitGatewayRouteTableId": t, "transitGatewayAttachmentId": a},
                )
                for a, t in (("att-a", "rt-1"), ("att-p", "rt-1"), ("att-b", "rt-2"), ("att-p", "rt-2"))
            ),
            res(
                from_plans.TGW_ROUTE,
                "one-to-b",
                "x",
                {
                    "transitGatewayRouteTableId": "rt-1",
                    "destinationCidrBlock": "10.2.0.0/16",
                    "transitGatewayAttachmentId": "att-p",
                },
            ),
            route("rtb-a", "10.0.0.0/8", transitGatewayId="tgw-1"),
            route("rtb-b", "10.0.0.0/8", transitGatewayId="tgw-2"),
            *sg("open", "vpc-a", dict(ALL_OUT), {"ipProtocol": "-1", "cidrIpv4": "10.0.0.0/8"}),
            *sg("open2", "vpc-b", dict(ALL_OUT), {"ipProtocol": "-1", "cidrIpv4": "10.0.0.0/8"}),
        ]
    )
    topo = from_plans.build([plan("s", resources)])
    src, dst = at(topo, "subnet-a-a", 10, "sg-open"), at(topo, "subnet-b-a", 10, "sg-open2")
    verdict = evaluate(topo, src, dst, "tcp", 22)
    # There: a static route on side one; back: side two has no route to 10.1/16 (nothing propagates over peering).
    assert not verdict.allowed
    assert verdict.denied_at == "reply path: transit gateway route table rt-two (s)"
    assert verdict.reason == "no route for 10.1.0.10"
    resources.append(
        res(
            from_plans.TGW_ROUTE,
            "two-to-a",
            "x",
            {
                "transitGatewayRouteTableId": "rt-2",
                "destinationCidrBlock": "10.1.0.0/16",
                "transitGatewayAttachmentId": "att-p",
            },
        )
    )
    topo = from_plans.build([plan("s", resources)])
    assert evaluate(topo, src, dst, "tcp", 22).allowed


# --- sites over VPN ------------------------------------------------------------------------------------------
SITE = SiteSide(
    name="lab",
    environment="prod",
    region="r1",
    lan=N("10.9.0.0/20"),
    pods=N("10.8.0.0/18"),
    announce=(N("10.9.0.0/20"), N("10.8.0.0/18")),
    local_selectors=(N("10.9.0.0/20"), N("10.8.0.0/18")),
    remote_selectors=(N("10.1.0.0/16"),),
    pod_routes=(),
)


def site_plan(static: bool, *extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *vpc("a", "10.1.0.0/16", tgw="tgw-1"),
        res(from_plans.TGW, "tgw", "tgw-1", {}),
        res(from_plans.TGW_RT, "tgw-rt", "rt-1", {"transitGatewayId": "tgw-1"}),
        res(
            from_plans.VPN,
            "site-lab-vpn",
            "vpn-1",
            {"transitGatewayId": "tgw-1", "staticRoutesOnly": static, "tags": {"dlinfra:site": "lab"}},
            {"transitGatewayAttachmentId": "att-vpn"},
        ),
        *(
            res(
                from_plans.TGW_ASSOC,
                f"assoc-{a}",
                "x",
                {"transitGatewayRouteTableId": "rt-1", "transitGatewayAttachmentId": a},
            )
            for a in ("att-a", "att-vpn")
        ),
        *(
            res(
                from_plans.TGW_PROP,
                f"prop-{a}",
                "x",
                {"transitGatewayRouteTableId": "rt-1", "transitGatewayAttachmentId": a},
            )
            for a in ("att-a", "att-vpn")
        ),
        route("rtb-a", "10.8.0.0/13", transitGatewayId="tgw-1"),
        *sg("nodes", "vpc-a", dict(ALL_OUT), {"ipProtocol": "-1", "cidrIpv4": "10.8.0.0/13"}),
        *extra,
    ]


def test_bgp_vpn_attachments_propagate_what_the_site_announces() -> None:
    topo = from_plans.build([plan("s", site_plan(static=False))], [SITE])
    node = at(topo, "subnet-a-a", 10, "sg-nodes")
    lan = Endpoint("lab host", A("10.9.0.10"), AtSite("lab", "lan"))
    verdict = evaluate(topo, node, lan, "tcp", 22)
    assert verdict.allowed, verdict.reason
    assert verdict.tunnels == {"lab"}
    assert evaluate(topo, lan, node, "tcp", 22).allowed


def test_static_vpn_attachments_route_only_their_static_routes() -> None:
    topo = from_plans.build([plan("s", site_plan(static=True))], [SITE])
    node, lan = at(topo, "subnet-a-a", 10, "sg-nodes"), Endpoint("lab host", A("10.9.0.10"), AtSite("lab", "lan"))
    verdict = evaluate(topo, node, lan, "tcp", 22)
    assert not verdict.allowed and verdict.denied_at == "transit gateway route table tgw-rt (s)"
    with_route = site_plan(
        True, res(from_plans.VPN_ROUTE, "r", "x", {"vpnConnectionId": "vpn-1", "destinationCidrBlock": "10.9.0.0/20"})
    )
    topo = from_plans.build([plan("s", with_route)], [SITE])
    assert evaluate(topo, node, lan, "tcp", 22).allowed


def test_hybrid_pods_need_a_route_inside_the_site() -> None:
    pod = Endpoint("hybrid pod", A("10.8.0.10"), AtSite("lab", "pods"))
    topo = from_plans.build([plan("s", site_plan(static=False))], [SITE])
    verdict = evaluate(topo, at(topo, "subnet-a-a", 10, "sg-nodes"), pod, "tcp", 8080)
    assert not verdict.allowed and verdict.denied_at == "site lab gateway"
    assert "no route to hybrid pod 10.8.0.10 inside the site" in verdict.reason
    routed = SiteSide(**{**SITE.__dict__, "pod_routes": ((N("10.8.0.0/18"), "Cilium BGP"),)})
    topo = from_plans.build([plan("s", site_plan(static=False))], [routed])
    assert evaluate(topo, at(topo, "subnet-a-a", 10, "sg-nodes"), pod, "tcp", 8080).allowed


def test_a_site_gateway_carries_only_its_ipsec_selectors() -> None:
    narrow = SiteSide(**{**SITE.__dict__, "remote_selectors": (N("10.1.128.0/17"),)})
    topo = from_plans.build([plan("s", site_plan(static=False))], [narrow])
    lan = Endpoint("lab host", A("10.9.0.10"), AtSite("lab", "lan"))
    verdict = evaluate(topo, lan, at(topo, "subnet-a-a", 10, "sg-nodes"), "tcp", 22)
    assert not verdict.allowed and verdict.reason == "no IPsec policy carries 10.9.0.10 -> 10.1.0.10"


# --- Client VPN and the internet ------------------------------------------------------------------------
def client_vpn_plan(*rules: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *vpc("a", "10.1.0.0/16"),
        res(
            from_plans.CVPN,
            "cvpn",
            "cvpn-1",
            {
                "clientCidrBlock": "10.50.0.0/22",
                "securityGroupIds": ["sg-laptops"],
                "authenticationOptions": [{"type": "federated-authentication"}],
            },
        ),
        res(from_plans.CVPN_ASSOC, "assoc", "x", {"clientVpnEndpointId": "cvpn-1", "subnetId": "subnet-a-a"}),
        *(
            res(from_plans.CVPN_AUTH, f"auth-{i}", "x", {"clientVpnEndpointId": "cvpn-1", **r})
            for i, r in enumerate(rules)
        ),
        *sg("laptops", "vpc-a", dict(ALL_OUT)),
        *sg(
            "pods",
            "vpc-a",
            {"ipProtocol": "tcp", "fromPort": 0, "toPort": 65535, "referencedSecurityGroupId": "sg-laptops"},
        ),
    ]


def test_client_vpn_needs_the_most_specific_authorization_for_the_group() -> None:
    rules = (
        {"targetNetworkCidr": "10.1.0.0/16", "accessGroupId": "g-vision"},
        {"targetNetworkCidr": "10.1.64.0/18", "accessGroupId": "g-admins"},
    )
    topo = from_plans.build([plan("s", client_vpn_plan(*rules))])
    vision = Endpoint("laptop", A("10.50.0.10"), OnClientVpn("cvpn-1", "g-vision"))
    assert evaluate(topo, vision, at(topo, "subnet-a-a", 10, "sg-pods"), "tcp", 6006).allowed
    # 10.1.64.0/18 has a more specific rule for admins only: vision is refused there.
    verdict = evaluate(topo, vision, at(topo, "subnet-a-b", 10, "sg-pods"), "tcp", 6006)
    assert not verdict.allowed and verdict.denied_at == "client VPN cvpn"
    assert "does not admit group g-vision" in verdict.reason
    stranger = Endpoint("laptop", A("10.50.0.11"), OnClientVpn("cvpn-1", "g-other"))
    assert not evaluate(topo, stranger, at(topo, "subnet-a-a", 10, "sg-pods"), "tcp", 6006).allowed


def test_the_internet_reaches_nothing_without_a_public_address() -> None:
    resources = [
        *vpc("a", "10.1.0.0/16"),
        res(from_plans.IGW, "igw", "igw-1", {"vpcId": "vpc-a"}),
        *sg("wide", "vpc-a", {"ipProtocol": "-1", "cidrIpv4": "0.0.0.0/0"}),
    ]
    topo = from_plans.build([plan("s", resources)])
    internet = Endpoint("internet", A("198.51.100.7"), OnInternet())
    verdict = evaluate(topo, internet, at(topo, "subnet-a-a", 10, "sg-wide"), "tcp", 22)
    assert not verdict.allowed and "has no public address" in verdict.reason
