"""Laptop side of the AWS Client VPN: a self-contained .ovpn profile (certificates and key inline)."""

from __future__ import annotations

import functools
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

import jinja2

FORMAT_VERSION: Final = 1
_PEM: Final = re.compile(r"-----BEGIN ([A-Z ]+)-----\n[A-Za-z0-9+/=\n]+-----END \1-----\n?")
_DNS_NAME: Final = re.compile(r"^\*\.((?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63})$")
_LABEL: Final = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_X509_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$")


def _pem(what: str, value: str, *labels: str) -> str:
    text = value if value.endswith("\n") else value + "\n"
    match = _PEM.fullmatch(text)
    if not match or match.group(1) not in labels:
        # Never echo the value: it may be a private key.
        raise ValueError(f"ClientVpnProfile.{what}: expected one PEM block ({' or '.join(labels)}); value not shown")
    return text


@dataclass(frozen=True, kw_only=True)
class ClientVpnProfile:
    """What a laptop needs to join one Client VPN endpoint."""

    name: str  # what the profile is for, e.g. "dlinfra prod-us-west-2"; a comment only
    endpoint_dns_name: str  # the endpoint's DNS name as AWS reports it: "*.cvpn-endpoint-....amazonaws.com"
    server_name: str  # CN of the endpoint's server certificate (verify-x509-name)
    ca_cert_pem: str  # the endpoint's private CA certificate
    client_cert_pem: str | None = None  # this person's client certificate; None with federated (SAML) sign-in
    client_key_pem: str | None = field(default=None, repr=False)  # its private key (secret)
    port: int = 443  # the endpoint's vpn_port
    protocol: Literal["udp", "tcp"] = "udp"  # the endpoint's transport_protocol

    def __post_init__(self) -> None:
        if "\n" in self.name or len(self.name) > 200:
            raise ValueError("ClientVpnProfile.name: one line of at most 200 characters")
        if not _DNS_NAME.fullmatch(self.endpoint_dns_name):
            raise ValueError(
                f"ClientVpnProfile.endpoint_dns_name: {self.endpoint_dns_name!r} is not a Client VPN "
                "DNS name (*.cvpn-endpoint-<id>.prod.clientvpn.<region>.amazonaws.com)"
            )
        if not _X509_NAME.fullmatch(self.server_name):
            raise ValueError(f"ClientVpnProfile.server_name: {self.server_name!r} is not a certificate CN")
        _pem("ca_cert_pem", self.ca_cert_pem, "CERTIFICATE")
        if (self.client_cert_pem is None) != (self.client_key_pem is None):
            raise ValueError("ClientVpnProfile.client_cert_pem, client_key_pem: give both (certificate) or neither")
        if self.client_cert_pem is not None and self.client_key_pem is not None:
            _pem("client_cert_pem", self.client_cert_pem, "CERTIFICATE")
            _pem("client_key_pem", self.client_key_pem, "RSA PRIVATE KEY", "PRIVATE KEY", "EC PRIVATE KEY")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"ClientVpnProfile.port: {self.port} is not a port")
        if self.protocol not in ("udp", "tcp"):
            raise ValueError(f"ClientVpnProfile.protocol: must be udp or tcp, got {self.protocol!r}")

    @property
    def federated(self) -> bool:
        """SAML sign-in: the AWS-provided client opens the identity provider; no certificate on the laptop."""
        return self.client_cert_pem is None

    @property
    def host(self) -> str:
        """The endpoint's name without the wildcard label."""
        return self.endpoint_dns_name.removeprefix("*.")


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # a config file, not HTML; inputs are validated instead
        keep_trailing_newline=True,
    )


def render_ovpn(profile: ClientVpnProfile, *, prefix: str | None = None) -> str:
    """The .ovpn text; prefix is the random label put before the endpoint name (fixed only in tests)."""
    label = prefix if prefix is not None else secrets.token_hex(6)
    if not _LABEL.fullmatch(label):
        raise ValueError(f"prefix: {label!r} is not a DNS label")
    return (
        _environment()
        .get_template("client.ovpn.j2")
        .render(
            format_version=FORMAT_VERSION,
            name=profile.name,
            protocol=profile.protocol,
            prefix=label,
            host=profile.host,
            port=profile.port,
            server_name=profile.server_name,
            ca_cert_pem=_pem("ca_cert_pem", profile.ca_cert_pem, "CERTIFICATE"),
            federated=profile.federated,
            client_cert_pem=profile.client_cert_pem,
            client_key_pem=profile.client_key_pem,
        )
    )
