"""TransitHub (per region) and TransitPeering (the mesh of `<env>-global`) under the mock engine."""

from __future__ import annotations

import itertools
from typing import Any, cast

import pytest

from components.transit import TransitHubArgs
from components.transit_peering import PeerSide, TransitPeeringArgs
from dlinfra.model import sites
from dlinfra.model.naming import Names
from tests.reference import REGIONAL, by_id, env_region, fleet, named, of_type, plain, plan, runs


@pytest.mark.parametrize("stack", REGIONAL)
def test_transit_gateway_with_its_own_route_table(stack: str) -> None:
    env, region = env_region(stack)
    result = runs()[stack]
    (tgw,) = of_type(result, "aws:ec2transitgateway/transitGateway:TransitGateway")
    assert plain(tgw.inputs["amazonSideAsn"]) == fleet().environments[env].regions[region].transit_asn
    assert tgw.inputs["defaultRouteTableAssociation"] == "disable"
    assert tgw.inputs["defaultRouteTablePropagation"] == "disable"
    assert tgw.inputs["autoAcceptSharedAttachments"] == "disable"
    (table,) = of_type(result, "aws:ec2transitgateway/routeTable:RouteTable")
    assert table.inputs["transitGatewayId"] == tgw.id
    (attachment,) = of_type(result, "aws:ec2transitgateway/vpcAttachment:VpcAttachment")
    ids = by_id(result)
    assert {ids[s].inputs["tags"]["dlinfra:tier"] for s in attachment.inputs["subnetIds"]} == {"transit"}
    assert len(attachment.inputs["subnetIds"]) == len(fleet().azs(region))
    assert attachment.inputs["transitGatewayDefaultRouteTableAssociation"] is False
    assert attachment.inputs["transitGatewayDefaultRouteTablePropagation"] is False
    association = named(result, "transit-vpc-association")
    propagation = named(result, "transit-vpc-propagation")
    for r in (association, propagation):
        assert r.inputs["transitGatewayAttachmentId"] == attachment.id
        assert r.inputs["transitGatewayRouteTableId"] == table.id
    assert result.outputs["transit_gateway_id"] == tgw.id
    assert result.outputs["transit_route_table_id"] == table.id
    assert plain(result.outputs["transit_asn"]) == plain(tgw.inputs["amazonSideAsn"])


@pytest.mark.parametrize("stack", REGIONAL)
def test_private_route_tables_reach_everything_else_through_the_tgw(stack: str) -> None:
    env, region = env_region(stack)
    result = runs()[stack]
    ids = by_id(result)
    (tgw,) = of_type(result, "aws:ec2transitgateway/transitGateway:TransitGateway")
    (attachment,) = of_type(result, "aws:ec2transitgateway/vpcAttachment:VpcAttachment")
    wanted = {str(d.cidr) for d in sites.environment_networks(fleet(), plan(), env) if d.key != f"vpc-{region}"}
    via_tgw: dict[str, set[str]] = {}
    for route in of_type(result, "aws:ec2/route:Route"):
        if "transitGatewayId" in route.inputs:
            assert route.inputs["transitGatewayId"] == tgw.id
            assert attachment.urn in route.dependencies
            via_tgw.setdefault(ids[route.inputs["routeTableId"]].name, set()).add(route.inputs["destinationCidrBlock"])
    expected = {f"network-rt-private-{az}": wanted for az in fleet().azs(region)} if wanted else {}
    assert via_tgw == expected


def _hub(**overrides: Any) -> TransitHubArgs:
    fields: dict[str, Any] = {
        "names": Names("dlinfra", "prod", "us-west-2"),
        "vpc_id": "vpc-1",
        "vpc_cidr": "10.2.0.0/16",
        "transit_subnet_ids": {"us-west-2a": "subnet-1"},
        "private_route_table_ids": {"us-west-2a": "rtb-1"},
        "amazon_side_asn": 64512,
        "remote_cidrs": {"vpc-us-east-1": "10.1.0.0/16"},
    }
    return TransitHubArgs(**(fields | overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"amazon_side_asn": 65535}, r"^amazon_side_asn: 65535 is not a private ASN"),
        (
            {"remote_cidrs": {"lan-x": "10.2.1.0/24"}},
            r"^remote_cidrs.lan-x: 10.2.1.0/24 overlaps the VPC's own",
        ),
        (
            {"remote_cidrs": {"a": "10.1.0.0/16", "b": "10.1.2.0/24"}},
            r"^remote_cidrs.b: 10.1.2.0/24 overlaps remote_cidrs.a",
        ),
        ({"transit_subnet_ids": {}}, r"^transit_subnet_ids: at least one"),
    ],
)
def test_hub_args_are_checked(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _hub(**overrides)


# --- the mesh in <env>-global ---------------------------------------------------------------------
def test_peering_mesh_is_complete() -> None:
    result = runs()["prod-global"]
    regions = sorted(fleet().environments["prod"].regions)
    providers = {p.name: p for p in of_type(result, "pulumi:providers:aws")}
    assert {name: p.inputs["region"] for name, p in providers.items()} == {f"aws-{r}": r for r in regions}
    provider_region = {f"{p.urn}::{p.id}": p.inputs["region"] for p in providers.values()}
    attachments = of_type(result, "aws:ec2transitgateway/peeringAttachment:PeeringAttachment")
    accepters = {
        a.inputs["transitGatewayAttachmentId"]: a
        for a in of_type(result, "aws:ec2transitgateway/peeringAttachmentAccepter:PeeringAttachmentAccepter")
    }
    n = len(regions)
    assert len(attachments) == len(accepters) == n * (n - 1) // 2
    pairs = set()
    for attachment in attachments:
        first, second = provider_region[attachment.provider or ""], attachment.inputs["peerRegion"]
        assert first < second  # the lexicographically first region requests
        assert attachment.name == f"peering-{first}-{second}-attachment"
        assert attachment.inputs["transitGatewayId"] == runs()[f"prod-{first}"].outputs["transit_gateway_id"]
        assert attachment.inputs["peerTransitGatewayId"] == runs()[f"prod-{second}"].outputs["transit_gateway_id"]
        assert provider_region[accepters[attachment.id].provider or ""] == second
        pairs.add((first, second))
    assert pairs == set(itertools.combinations(regions, 2))
    assert set(result.outputs["peering_attachment_ids"]) == {f"{a}/{b}" for a, b in pairs}


def _pair_regions(result: Any) -> dict[str, tuple[str, str]]:
    """Peering attachment id -> (requester region, accepter region)."""
    provider_region = {f"{p.urn}::{p.id}": p.inputs["region"] for p in of_type(result, "pulumi:providers:aws")}
    return {
        a.id: (provider_region[a.provider or ""], a.inputs["peerRegion"])
        for a in of_type(result, "aws:ec2transitgateway/peeringAttachment:PeeringAttachment")
    }


def test_peering_attachments_are_associated_on_both_sides() -> None:
    result = runs()["prod-global"]
    regions = fleet().environments["prod"].regions
    table_region = {runs()[f"prod-{r}"].outputs["transit_route_table_id"]: r for r in regions}
    associated: dict[str, set[str]] = {}
    for a in of_type(result, "aws:ec2transitgateway/routeTableAssociation:RouteTableAssociation"):
        associated.setdefault(a.inputs["transitGatewayAttachmentId"], set()).add(
            table_region[a.inputs["transitGatewayRouteTableId"]]
        )
    assert associated == {attachment: set(pair) for attachment, pair in _pair_regions(result).items()}


def test_every_region_routes_to_every_other_region_and_remote_site_through_peering() -> None:
    result = runs()["prod-global"]
    regions = list(fleet().environments["prod"].regions)
    table_region = {runs()[f"prod-{r}"].outputs["transit_route_table_id"]: r for r in regions}
    attachment_of = {frozenset(pair): a for a, pair in _pair_regions(result).items()}
    routes: dict[str, dict[str, str]] = {r: {} for r in regions}
    for route in of_type(result, "aws:ec2transitgateway/route:Route"):
        region = table_region[route.inputs["transitGatewayRouteTableId"]]
        routes[region][route.inputs["destinationCidrBlock"]] = route.inputs["transitGatewayAttachmentId"]
    networks = sites.environment_networks(fleet(), plan(), "prod")
    for region in regions:
        expected = {str(d.cidr): attachment_of[frozenset((region, d.region))] for d in networks if d.region != region}
        assert routes[region] == expected, region


def _side(region: str, cidrs: dict[str, str]) -> PeerSide:
    return PeerSide(
        region=region,
        provider=cast(Any, object()),  # never used: validation fails first
        transit_gateway_id="tgw-1",
        route_table_id="tgw-rtb-1",
        cidrs=cidrs,
    )


@pytest.mark.parametrize(
    ("requester", "accepter", "message"),
    [
        (
            ("us-west-2", {"vpc": "10.2.0.0/16"}),
            ("us-west-2", {"vpc": "10.1.0.0/16"}),
            r"^accepter.region: both",
        ),
        (("us-east-1", {}), ("us-west-2", {"vpc": "10.1.0.0/16"}), r"^requester.cidrs: at least"),
        (
            ("us-east-1", {"vpc": "10.1.0.0/16"}),
            ("us-west-2", {"lan-x": "10.1.4.0/24"}),
            r"^accepter.cidrs.lan-x: 10.1.4.0/24 overlaps requester.cidrs.vpc",
        ),
    ],
)
def test_peering_args_are_checked(
    requester: tuple[str, dict[str, str]], accepter: tuple[str, dict[str, str]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        TransitPeeringArgs(names=Names("dlinfra", "prod", None), requester=_side(*requester), accepter=_side(*accepter))
