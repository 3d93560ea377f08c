"""Laptop VPN profile: golden .ovpn, input checks, and the key never echoed in errors."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest

from dlinfra.render.openvpn import FORMAT_VERSION, ClientVpnProfile, render_ovpn

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
DNS_NAME = "*.cvpn-endpoint-0123456789abcdef0.prod.clientvpn.us-west-2.amazonaws.com"


def _pem(label: str, text: str) -> str:
    """A PEM-shaped block around fake content (these are not keys or certificates)."""
    return f"-----BEGIN {label}-----\n{base64.b64encode(text.encode()).decode()}\n-----END {label}-----\n"


CA = _pem("CERTIFICATE", "golden fake CA certificate")
CERT = _pem("CERTIFICATE", "golden fake client certificate")
KEY = _pem("PRIVATE KEY", "golden fake client key")


def profile(**overrides: Any) -> ClientVpnProfile:
    fields: dict[str, Any] = {
        "name": "dlinfra prod-us-west-2",
        "endpoint_dns_name": DNS_NAME,
        "server_name": "dlinfra-prod-usw2-client-vpn-server",
        "ca_cert_pem": CA,
        "client_cert_pem": CERT,
        "client_key_pem": KEY,
    }
    return ClientVpnProfile(**(fields | overrides))


def test_profile_matches_golden() -> None:
    rendered = render_ovpn(profile(), prefix="a1b2c3d4e5f6")
    path = GOLDEN / "client.ovpn"
    if UPDATE:
        path.write_text(rendered)
    assert path.exists(), f"{path} is missing: run UPDATE_GOLDEN=1 pytest tests/render"
    assert rendered == path.read_text(), "client.ovpn changed: review, then UPDATE_GOLDEN=1 pytest tests/render"


def test_profile_essentials() -> None:
    lines = render_ovpn(profile(), prefix="x0").splitlines()
    assert f"format {FORMAT_VERSION}" in lines[0]
    assert "remote x0.cvpn-endpoint-0123456789abcdef0.prod.clientvpn.us-west-2.amazonaws.com 443" in lines
    for line in ("client", "proto udp", "remote-cert-tls server", "nobind"):
        assert line in lines
    assert "verify-x509-name dlinfra-prod-usw2-client-vpn-server name" in lines


def test_prefix_is_random_by_default() -> None:
    profiles = [render_ovpn(profile()).splitlines() for _ in range(3)]
    remotes = {next(line for line in lines if line.startswith("remote ")) for lines in profiles}
    assert len(remotes) == 3


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"endpoint_dns_name": "cvpn-endpoint-1.example.com"}, r"endpoint_dns_name: .* is not a Client VPN"),
        ({"server_name": "server name\nremote evil 1"}, r"server_name: .* is not a certificate CN"),
        ({"ca_cert_pem": "not a pem"}, r"ca_cert_pem: expected one PEM block \(CERTIFICATE\)"),
        ({"client_cert_pem": KEY}, r"client_cert_pem: expected one PEM block \(CERTIFICATE\)"),
        ({"port": 0}, r"port: 0 is not a port"),
        ({"protocol": "sctp"}, r"protocol: must be udp or tcp"),
    ],
)
def test_bad_input(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        profile(**overrides)


def test_a_bad_key_is_never_echoed() -> None:
    secret = "sup3r-secret-key-material"
    with pytest.raises(ValueError) as info:
        profile(client_key_pem=secret)
    assert secret not in str(info.value) and "value not shown" in str(info.value)
    assert secret not in repr(profile())  # the key field is left out of repr


def test_bad_prefix() -> None:
    with pytest.raises(ValueError, match=r"prefix: 'a b' is not a DNS label"):
        render_ovpn(profile(), prefix="a b")


def test_federated_profile_has_no_key_and_signs_in_through_the_idp() -> None:
    rendered = render_ovpn(profile(client_cert_pem=None, client_key_pem=None), prefix="a1b2c3d4e5f6")
    path = GOLDEN / "client-saml.ovpn"
    if UPDATE:
        path.write_text(rendered)
    assert rendered == path.read_text(), "client-saml.ovpn changed: review, then UPDATE_GOLDEN=1 pytest tests/render"
    lines = rendered.splitlines()
    assert {"auth-user-pass", "auth-federate"} <= set(lines)
    assert "<key>" not in lines and "<cert>" not in lines and "PRIVATE KEY" not in rendered


def test_certificate_and_key_come_together() -> None:
    with pytest.raises(ValueError, match="give both"):
        profile(client_key_pem=None)
