"""SiteVpn: customer gateway, IKEv2 tunnels with strong proposals, secret AWS-valid PSKs, TGW routes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from components.site_vpn import PSK_LENGTH, SiteVpnArgs
from dlinfra.model import sites
from dlinfra.model.naming import Names
from dlinfra.offline import plan_export, schema
from dlinfra.render import aws_tunnel
from tests.reference import by_id, fleet, named, of_type, plain, plan, runs

# AWS: 8-64 characters of letters, digits, '.' and '_', not starting with '0'.
AWS_PSK = re.compile(r"[A-Za-z1-9._][A-Za-z0-9._]{7,63}")
WEAK_ALGORITHMS = {"SHA1", "AES128", "AES128-GCM-16"}
WEAK_DH_GROUPS = {2, 5, 14, 15, 16, 17, 18, 22, 23, 24}  # MODP and the small-subgroup groups


def _home(site: str) -> plan_export.StackResult:
    return runs()[sites.stack_of(fleet(), site)]


def _unwrap(value: Any) -> Any:
    return value.get("value") if schema.is_secret(value) else value


@pytest.mark.parametrize("site", ["sjc1", "ams1"])
def test_customer_gateway(site: str) -> None:
    spec = fleet().sites[site]
    cgw = named(_home(site), f"site-{site}-cgw")
    assert cgw.inputs["ipAddress"] == str(spec.public_ip)
    assert cgw.inputs["bgpAsn"] == str(spec.asn)
    assert cgw.inputs["type"] == "ipsec.1"


@pytest.mark.parametrize("site", ["sjc1", "ams1"])
@pytest.mark.parametrize("tunnel", [1, 2])
def test_tunnels_are_ikev2_with_strong_proposals_and_planned_inside_cidrs(site: str, tunnel: int) -> None:
    result = _home(site)
    vpn = named(result, f"site-{site}-vpn")

    def t(field: str) -> Any:
        return plain(vpn.inputs[f"tunnel{tunnel}{field}"])

    assert vpn.inputs["transitGatewayId"] == result.outputs["transit_gateway_id"]
    assert vpn.inputs["customerGatewayId"] == named(result, f"site-{site}-cgw").id
    assert vpn.inputs["staticRoutesOnly"] is (fleet().sites[site].routing == "static")
    assert t("InsideCidr") == str(sites.tunnel_cidrs(plan(), site)[tunnel - 1])
    assert t("IkeVersions") == ["ikev2"]
    assert t("Phase1EncryptionAlgorithms") == list(aws_tunnel.AWS_PHASE1_ENCRYPTION)
    assert t("Phase1IntegrityAlgorithms") == list(aws_tunnel.AWS_PHASE1_INTEGRITY)
    assert t("Phase1DhGroupNumbers") == list(aws_tunnel.AWS_PHASE1_DH)
    assert t("Phase2EncryptionAlgorithms") == list(aws_tunnel.AWS_PHASE2_ENCRYPTION)
    assert t("Phase2IntegrityAlgorithms") == list(aws_tunnel.AWS_PHASE2_INTEGRITY)
    assert t("Phase2DhGroupNumbers") == list(aws_tunnel.AWS_PHASE2_DH)
    algorithms = {*t("Phase1EncryptionAlgorithms"), *t("Phase1IntegrityAlgorithms")}
    algorithms |= {*t("Phase2EncryptionAlgorithms"), *t("Phase2IntegrityAlgorithms")}
    assert not algorithms & WEAK_ALGORITHMS
    assert not {*t("Phase1DhGroupNumbers"), *t("Phase2DhGroupNumbers")} & WEAK_DH_GROUPS
    assert t("Phase1LifetimeSeconds") == aws_tunnel.AWS_PHASE1_LIFETIME_SECONDS
    assert t("Phase2LifetimeSeconds") == aws_tunnel.AWS_PHASE2_LIFETIME_SECONDS
    assert t("DpdTimeoutAction") == aws_tunnel.AWS_DPD_TIMEOUT_ACTION
    assert t("StartupAction") == aws_tunnel.AWS_STARTUP_ACTION
    assert t("LogOptions")["cloudwatchLogOptions"]["logEnabled"] is True
    assert schema.is_secret(vpn.inputs[f"tunnel{tunnel}PresharedKey"])


@pytest.mark.parametrize("site", ["sjc1", "ams1"])
def test_preshared_keys_are_secret_and_valid_for_aws(site: str, tmp_path: Path) -> None:
    result = _home(site)
    vpn = named(result, f"site-{site}-vpn")
    exported = result.outputs["site_vpns"][site]["tunnels"]
    keys = [t["preshared_key"] for t in exported]
    assert keys == [_unwrap(vpn.inputs["tunnel1PresharedKey"]), _unwrap(vpn.inputs["tunnel2PresharedKey"])]
    assert keys[0] != keys[1]
    for key in keys:
        assert len(key) == PSK_LENGTH and AWS_PSK.fullmatch(key) and not key.startswith("0")
    # The random passwords are configured so that every possible result obeys the AWS rule.
    for n in (1, 2):
        head = named(result, f"site-{site}-psk-{n}-head").inputs
        body = named(result, f"site-{site}-psk-{n}-body").inputs
        assert plain(head["length"]) == 1 and head["numeric"] is False and head["special"] is False
        assert plain(body["length"]) == PSK_LENGTH - 1 <= 63
        assert body["special"] is True and body["overrideSpecial"] == "._"
    assert "site_vpns" in result.secret_outputs
    text = plan_export.write_plan(result, "dlinfra", tmp_path).read_text()
    assert all(key not in text for key in keys)
    assert json.loads(text)["outputs"]["site_vpns"] == plan_export.MASK


def test_static_site_gets_tgw_routes_and_bgp_site_propagates() -> None:
    for site, spec in fleet().sites.items():
        result = _home(site)
        vpn = named(result, f"site-{site}-vpn")
        attachment = vpn.outputs["transitGatewayAttachmentId"]
        table = result.outputs["transit_route_table_id"]
        association = named(result, f"site-{site}-association")
        assert association.inputs == {
            "transitGatewayAttachmentId": attachment,
            "transitGatewayRouteTableId": table,
        }
        static = {
            r.inputs["destinationCidrBlock"]: r
            for r in of_type(result, "aws:ec2transitgateway/route:Route")
            if r.inputs["transitGatewayAttachmentId"] == attachment
        }
        propagations = [
            r
            for r in of_type(result, "aws:ec2transitgateway/routeTablePropagation:RouteTablePropagation")
            if r.inputs["transitGatewayAttachmentId"] == attachment
        ]
        if spec.routing == "static":
            assert set(static) == {str(sites.site_lan(plan(), site)), str(sites.site_pods(plan(), site))}
            assert all(r.inputs["transitGatewayRouteTableId"] == table for r in static.values())
            assert not propagations
        else:
            assert not static
            assert [p.inputs["transitGatewayRouteTableId"] for p in propagations] == [table]


@pytest.mark.parametrize("site", ["sjc1", "ams1"])
def test_site_export_has_what_rendering_needs(site: str) -> None:
    spec = fleet().sites[site]
    result = _home(site)
    conn = plain(result.outputs["site_vpns"][site])
    vpn = named(result, f"site-{site}-vpn")
    ids = by_id(result)
    assert ids[conn["customer_gateway_id"]].name == f"site-{site}-cgw"
    assert conn["vpn_connection_id"] == vpn.id
    assert (conn["site"], conn["public_ip"], conn["routing"], conn["asn"]) == (
        site,
        str(spec.public_ip),
        spec.routing,
        spec.asn,
    )
    assert conn["transit_asn"] == fleet().environments[spec.environment].regions[spec.region].transit_asn
    assert conn["lan"] == str(sites.site_lan(plan(), site))
    assert conn["pod_cidrs"] == [str(sites.site_pods(plan(), site))]
    assert conn["remote_cidrs"] == [str(c) for c in sites.site_remote_cidrs(fleet(), plan(), site)]
    for n, t in enumerate(conn["tunnels"], start=1):
        assert t["number"] == n
        assert t["outside_address"] == vpn.outputs[f"tunnel{n}Address"]
        assert t["inside_cidr"] == str(sites.tunnel_cidrs(plan(), site)[n - 1])
        assert t["cgw_inside_address"] == vpn.outputs[f"tunnel{n}CgwInsideAddress"]
        assert t["vgw_inside_address"] == vpn.outputs[f"tunnel{n}VgwInsideAddress"]


def _args(**overrides: Any) -> SiteVpnArgs:
    fields: dict[str, Any] = {
        "names": Names("dlinfra", "prod", "us-west-2"),
        "site": "sjc1",
        "public_ip": "64.62.140.17",
        "asn": 65101,
        "routing": "bgp",
        "transit_gateway_id": "tgw-1",
        "transit_route_table_id": "tgw-rtb-1",
        "transit_asn": 64512,
        "lan_cidr": "10.200.0.0/20",
        "pod_cidr": "10.3.64.0/18",
        "tunnel_inside_cidrs": ("169.254.6.8/30", "169.254.6.12/30"),
        "remote_cidrs": ["10.2.0.0/16"],
        "log_kms_key_arn": "arn:aws:kms:us-west-2:123456789012:key/x",
    }
    return SiteVpnArgs(**(fields | overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"public_ip": "10.1.2.3"}, r"^public_ip: 10.1.2.3 is not a public address"),
        ({"public_ip": "1.2.3"}, r"^public_ip: '1.2.3' is not an IPv4 address"),
        ({"asn": 64512}, r"^asn: 64512 is the transit gateway's own ASN"),
        ({"asn": 0}, r"^asn: 0 is out of range"),
        ({"routing": "ospf"}, r"^routing: must be 'static' or 'bgp'"),
        ({"pod_cidr": "10.200.8.0/21"}, r"^pod_cidr: 10.200.8.0/21 overlaps lan_cidr"),
        ({"remote_cidrs": ["10.200.0.0/16"]}, r"^remote_cidrs: 10.200.0.0/16 overlaps the site's own"),
        (
            {"tunnel_inside_cidrs": ("169.254.6.8/30", "169.254.6.8/30")},
            r"^tunnel_inside_cidrs: need two different",
        ),
        (
            {"tunnel_inside_cidrs": ("169.254.6.8/29", "169.254.6.16/30")},
            r"^tunnel_inside_cidrs\[1\]: .* /30",
        ),
        (
            {"tunnel_inside_cidrs": ("169.254.6.8/30", "169.254.2.0/30")},
            r"^tunnel_inside_cidrs\[2\]: .* reserved",
        ),
        ({"log_retention_days": 2}, r"^log_retention_days: 2 is not"),
    ],
)
def test_args_are_checked(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _args(**overrides)
