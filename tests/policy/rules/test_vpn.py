"""The VPN rules: strong site VPN crypto; Client VPN connection logs, revocation and server certificate."""

from __future__ import annotations

from typing import Any

import pytest

from policy.dlinfra_policy.rules.core import Resource
from policy.dlinfra_policy.rules.vpn import (
    CLIENT_VPN_ENDPOINT,
    TLS_CERT_REQUEST,
    TLS_SIGNED_CERTS,
    VPN_CONNECTION,
    vpn_strong_crypto,
)
from tests.policy.rules._resources import CTX, pass_and_fail, res

STRONG_VPN = {
    f"tunnel{t}{key}": value
    for t in (1, 2)
    for key, value in {
        "IkeVersions": ["ikev2"],
        "Phase1EncryptionAlgorithms": ["AES256-GCM-16", "AES256"],
        "Phase2EncryptionAlgorithms": ["AES256-GCM-16"],
        "Phase1IntegrityAlgorithms": ["SHA2-384", "SHA2-256"],
        "Phase2IntegrityAlgorithms": ["SHA2-256"],
        "Phase1DhGroupNumbers": [20.0, 19.0, 14.0],
        "Phase2DhGroupNumbers": [20.0],
    }.items()
}
SIGNED = "tls:index/locallySignedCert:LocallySignedCert"


# rule -> (resources that pass, resources that fail).
CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "vpn-strong-crypto": (
        [res(VPN_CONNECTION)(**STRONG_VPN)],
        [res(VPN_CONNECTION)(**STRONG_VPN | {"tunnel2IkeVersions": ["ikev1", "ikev2"]})],
    ),
    "client-vpn-connection-logs": (
        [res(CLIENT_VPN_ENDPOINT)(connectionLogOptions={"enabled": True})],
        [res(CLIENT_VPN_ENDPOINT)(connectionLogOptions={"enabled": False})],
    ),
    "server-cert-domain-san": (
        [
            CSR_WITH_DOMAIN := res(TLS_CERT_REQUEST, "server-csr")(dnsNames=["vpn-server.clientvpn.internal"]),
            res(SIGNED, dependencies=[CSR_WITH_DOMAIN.urn])(allowedUses=["key_encipherment", "server_auth"]),
            res(SIGNED, "client")(allowedUses=["client_auth"]),  # client certificates need no domain
        ],
        [
            CSR_BARE := res(TLS_CERT_REQUEST, "server-csr")(subject={"commonName": "vpn-server"}),
            res(SIGNED, dependencies=[CSR_BARE.urn])(allowedUses=["server_auth"]),
            res(TLS_SIGNED_CERTS[1])(allowedUses=["server_auth"], dnsNames=["server"]),
        ],
    ),
    "client-vpn-revocable": (
        [
            res(CLIENT_VPN_ENDPOINT)(authenticationOptions=[{"type": "federated-authentication"}]),
            res(CLIENT_VPN_ENDPOINT)(
                authenticationOptions=[{"type": "certificate-authentication"}],
                clientConnectOptions={"enabled": True, "lambdaFunctionArn": "arn:aws:lambda:x"},
            ),
        ],
        [res(CLIENT_VPN_ENDPOINT)(authenticationOptions=[{"type": "certificate-authentication"}])],
    ),
}


test_rule_passes_good_resources, test_rule_flags_bad_resources = pass_and_fail(CASES)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"tunnel1Phase1DhGroupNumbers": [2.0, 14.0]}, "tunnel1Phase1DhGroupNumbers allows [2]"),
        ({"tunnel1Phase2DhGroupNumbers": [22.0]}, "tunnel1Phase2DhGroupNumbers allows [22]"),
        ({"tunnel2Phase1EncryptionAlgorithms": ["AES128"]}, "allows ['AES128']"),
        ({"tunnel1Phase2IntegrityAlgorithms": ["SHA1"]}, "allows ['SHA1']"),
        ({"tunnel2Phase2IntegrityAlgorithms": None}, "is unset"),
        ({"tunnel1IkeVersions": None}, "ikev1 too"),
    ],
)
def test_vpn_weak_proposals(change: dict[str, Any], expected: str) -> None:
    found = vpn_strong_crypto(res(VPN_CONNECTION)(**STRONG_VPN | change), CTX)
    assert len(found) == 1 and expected in found[0]
