"""ClientVpn: private CA and certificates, ACM import, per-person sign-in (SAML or certificates), rules, routes.

The fixture fleet signs prod in through SAML and gives staging's people a certificate each.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest

from components.client_vpn import ClientVpnArgs
from components.lambdas import client_vpn_connect as connect
from dlinfra.model import sites
from dlinfra.model.naming import Names
from dlinfra.offline import engine, plan_export, schema
from tests.reference import REGIONAL, by_id, env_region, fleet, named, of_type, plain, plan, runs


def _remote(env: str, region: str) -> dict[str, str]:
    return {d.key: str(d.cidr) for d in sites.environment_networks(fleet(), plan(), env) if d.key != f"vpc-{region}"}


@pytest.mark.parametrize("stack", REGIONAL)
def test_endpoint(stack: str) -> None:
    env, region = env_region(stack)
    assert fleet().environments[env].client_vpn
    result = runs()[stack]
    (endpoint,) = of_type(result, "aws:ec2clientvpn/endpoint:Endpoint")
    cert = named(result, "client-vpn-server-acm")
    vpc = ipaddress.ip_network(str(plan().vpc(env, region)))
    i = endpoint.inputs
    assert i["clientCidrBlock"] == str(plan().cidr(f"client-vpn/{env}/{region}"))
    assert i["serverCertificateArn"] == cert.outputs["arn"]
    vpn = fleet().environments[env].client_vpn
    assert vpn is not None
    if vpn.saml:
        assert i["authenticationOptions"] == [
            {
                "type": "federated-authentication",
                "samlProviderArn": vpn.saml.provider_arn,
                "selfServiceSamlProviderArn": vpn.saml.self_service_provider_arn,
            }
        ]
        assert "clientConnectOptions" not in i
    else:
        assert i["authenticationOptions"] == [
            {"type": "certificate-authentication", "rootCertificateChainArn": cert.outputs["arn"]}
        ]
        handler = named(result, "client-vpn-connect")
        assert i["clientConnectOptions"] == {"enabled": True, "lambdaFunctionArn": handler.outputs["arn"]}
    assert i["splitTunnel"] is True
    assert (i["transportProtocol"], plain(i["vpnPort"])) == ("udp", 443)
    assert i["dnsServers"] == [str(vpc.network_address + 2)]
    assert i["vpcId"] == result.outputs["vpc_id"]
    assert i["selfServicePortal"] == ("enabled" if vpn.saml else "disabled")
    logs = i["connectionLogOptions"]
    assert logs["enabled"] is True
    group = named(result, "client-vpn-logs")
    assert logs["cloudwatchLogGroup"] == group.inputs["name"]
    assert logs["cloudwatchLogStream"] == named(result, "client-vpn-log-stream").inputs["name"]
    assert group.inputs["kmsKeyId"] == named(result, "network-log-key").outputs["arn"]
    (sg,) = [r for r in of_type(result, "aws:ec2/securityGroup:SecurityGroup") if r.name == "client-vpn-sg"]
    assert i["securityGroupIds"] == [sg.id]
    egress = {
        r.inputs["cidrIpv4"]
        for r in of_type(result, "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")
        if r.inputs["securityGroupId"] == sg.id
    }
    assert egress == {str(vpc), *_remote(env, region).values()}


@pytest.mark.parametrize("stack", REGIONAL)
def test_associations_rules_and_routes(stack: str) -> None:
    env, region = env_region(stack)
    result = runs()[stack]
    ids = by_id(result)
    (endpoint,) = of_type(result, "aws:ec2clientvpn/endpoint:Endpoint")
    associations = of_type(result, "aws:ec2clientvpn/networkAssociation:NetworkAssociation")
    subnets = [ids[a.inputs["subnetId"]] for a in associations]
    assert {s.inputs["tags"]["dlinfra:tier"] for s in subnets} == {"private"}
    assert {s.inputs["availabilityZoneId"] for s in subnets} == {
        fleet().zone_id(region, az) for az in fleet().azs(region)
    }
    assert all(a.inputs["clientVpnEndpointId"] == endpoint.id for a in associations)
    remote = _remote(env, region)
    destinations = {str(plan().vpc(env, region)), *remote.values()}
    # The endpoint's own rules; a dev box's rule for its /32 is its DevBox's (tests/components/test_dev_box.py).
    rules = [
        r
        for r in of_type(result, "aws:ec2clientvpn/authorizationRule:AuthorizationRule")
        if r.name.startswith("client-vpn-")
    ]
    vpn = fleet().environments[env].client_vpn
    assert vpn is not None
    if vpn.saml:
        # Per team group (and the admins' group), to every destination; never "all groups".
        groups = {t.vpn_group for t in fleet().teams.values() if t.vpn_group} | {vpn.saml.admin_group}
        pairs = {(r.inputs["accessGroupId"], r.inputs["targetNetworkCidr"]) for r in rules}
        assert pairs == {(g, d) for g in groups for d in destinations}
        assert not [r for r in rules if r.inputs.get("authorizeAllGroups")]
    else:
        # Certificates carry no group: every admitted person (the connect handler's list) reaches them.
        assert {r.inputs["targetNetworkCidr"] for r in rules} == destinations
        assert all(r.inputs["authorizeAllGroups"] is True and "accessGroupId" not in r.inputs for r in rules)
    routes: dict[str, set[str]] = {}
    for r in of_type(result, "aws:ec2clientvpn/route:Route"):
        routes.setdefault(r.inputs["destinationCidrBlock"], set()).add(r.inputs["targetVpcSubnetId"])
    assert routes == {cidr: {s.id for s in subnets} for cidr in remote.values()}


@pytest.mark.parametrize("stack", REGIONAL)
def test_certificates_and_secret_keys(stack: str, tmp_path: Path) -> None:
    result = runs()[stack]
    ca = named(result, "client-vpn-ca")
    assert ca.inputs["isCaCertificate"] is True
    assert set(ca.inputs["allowedUses"]) >= {"cert_signing"}
    env, _ = env_region(stack)
    vpn = fleet().environments[env].client_vpn
    assert vpn is not None
    people = [f"user-{u}" for u in vpn.users]
    for role, usage in (("server", "server_auth"), *((p, "client_auth") for p in people)):
        cert = named(result, f"client-vpn-{role}-cert")
        assert usage in cert.inputs["allowedUses"]
        assert cert.inputs["caCertPem"] == ca.outputs["certPem"]
        assert schema.is_secret(cert.inputs["caPrivateKeyPem"])
        key = named(result, f"client-vpn-{role}-key")
        assert (key.inputs["algorithm"], plain(key.inputs["rsaBits"])) == ("RSA", 2048)
    for user in vpn.users:
        assert named(result, f"client-vpn-user-{user}-csr").inputs["subject"]["commonName"] == user
    # ACM only lets Client VPN use a server certificate that names a domain: a DNS SAN under a private suffix,
    # while laptops keep checking the common name.
    server_csr = named(result, "client-vpn-server-csr")
    server_cn = server_csr.inputs["subject"]["commonName"]
    assert server_csr.inputs["dnsNames"] == [f"{server_cn}.clientvpn.internal"]
    assert result.outputs["client_vpn_server_name"] == server_cn
    acm = named(result, "client-vpn-server-acm")
    assert schema.is_secret(acm.inputs["privateKey"])
    assert acm.inputs["certificateChain"] == ca.outputs["certPem"]
    out = result.outputs
    assert out["client_vpn_ca_cert_pem"] == ca.outputs["certPem"]
    assert out["client_vpn_dns_name"].startswith("*.cvpn-endpoint-")
    # No key shared by every laptop: each person's own certificate and key, as one secret output.
    assert "client_vpn_client_key_pem" not in out and "client_vpn_users" in result.secret_outputs
    assert sorted(out["client_vpn_users"]) == list(vpn.users)
    assert out["client_vpn_authentication"] == ("saml" if vpn.saml else "certificate")
    text = plan_export.write_plan(result, "dlinfra", tmp_path).read_text()
    assert "PRIVATE KEY" not in text
    for credentials in out["client_vpn_users"].values():
        assert "PRIVATE KEY" in credentials["key_pem"] and credentials["key_pem"] not in text


def test_only_listed_people_are_admitted() -> None:
    """The connect handler admits exactly the fleet's users: removing a name refuses that person's next connection."""
    result = runs()["staging-us-west-2"]
    handler = named(result, "client-vpn-connect")
    assert handler.inputs["name"].startswith("AWSClientVPN-")  # Client VPN only calls functions named so
    allowed = json.loads(handler.inputs["environment"]["variables"]["ALLOWED_COMMON_NAMES"])
    assert allowed == ["alice", "bob"]
    assert connect.decide("alice", frozenset(allowed))["allow"] is True
    denied = connect.decide("carol", frozenset(allowed))
    assert denied["allow"] is False and "no longer admitted" in denied["error-msg-on-denied-connection"]
    assert denied["schema-version"] == "v3" and denied["posture-compliance-statuses"] == []


def test_handler_reads_its_list_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOWED_COMMON_NAMES", json.dumps(["alice"]))
    assert connect.handler({"common-name": "alice", "connection-id": "cvpn-connection-1"}, None)["allow"] is True
    assert connect.handler({"common-name": "mallory"}, None)["allow"] is False


def test_removing_a_person_removes_them_from_the_handler(write_fleet: Any) -> None:
    from dlinfra.model import stackroles
    from tests.conftest import ROOT

    def leaves(data: Any) -> None:  # bob leaves staging: his certificate and his dev box (the fleet needs both gone)
        data["environments"]["staging"]["client_vpn"].update(users=["alice"])
        del data["environments"]["staging"]["dev_boxes"]["people"]["bob"]

    path = write_fleet(leaves)
    config = {"dlinfra:fleet": str(path), "dlinfra:lock": str(path.parent / "cidr-lock.yaml")}
    role = stackroles.StackRole("regional", "staging", "us-west-2")
    result = engine.run_stack(ROOT, role, project="dlinfra", config=config, stack_exports={})
    handler = named(result, "client-vpn-connect")
    assert json.loads(handler.inputs["environment"]["variables"]["ALLOWED_COMMON_NAMES"]) == ["alice"]
    assert not [r for r in result.resources if r.name.startswith("client-vpn-user-bob")]


def _args(**overrides: Any) -> ClientVpnArgs:
    fields: dict[str, Any] = {
        "names": Names("dlinfra", "prod", "us-west-2"),
        "vpc_id": "vpc-1",
        "vpc_cidr": "10.2.0.0/16",
        "client_cidr": "10.4.24.0/22",
        "subnet_ids": {"us-west-2a": "subnet-1"},
        "remote_cidrs": {"vpc-us-east-1": "10.1.0.0/16"},
        "log_kms_key_arn": "arn:aws:kms:us-west-2:123456789012:key/x",
        "users": ("alice",),
    }
    return ClientVpnArgs(**(fields | overrides))


def test_resolver_is_the_vpc_base_plus_two() -> None:
    assert _args(vpc_cidr="10.3.128.0/18").resolver == "10.3.128.2"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"client_cidr": "10.4.24.0/24"},
            r"^client_cidr: 10.4.24.0/24 is a /24; Client VPN needs /12 to /22",
        ),
        ({"client_cidr": "10.2.0.0/22"}, r"^client_cidr: 10.2.0.0/22 overlaps vpc_cidr"),
        (
            {"remote_cidrs": {"lan-x": "10.4.25.0/24"}},
            r"^remote_cidrs.lan-x: .* overlaps the VPC or the client",
        ),
        ({"subnet_ids": {}}, r"^subnet_ids: the endpoint needs at least one subnet"),
        ({"session_timeout_hours": 9}, r"^session_timeout_hours: must be 8, 10, 12 or 24"),
        ({"cert_validity_days": 20}, r"^cert_validity_days: must exceed the 30-day early-renewal window"),
        ({"cert_validity_days": 4000}, r"^cert_validity_days: must be positive and shorter"),
        ({"users": ()}, r"^saml_provider_arn, users: give exactly one"),
        ({"saml_provider_arn": "arn:aws:iam::1:saml-provider/x"}, r"^saml_provider_arn, users: give exactly one"),
        ({"users": (), "saml_provider_arn": "arn:aws:iam::1:saml-provider/x"}, r"^access_groups: federated"),
        ({"access_groups": {"a": "g"}}, r"^access_groups, self_service_saml_provider_arn: only with federated"),
    ],
)
def test_args_are_checked(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _args(**overrides)
