"""Rules for site VPN tunnels (IKEv2, strong proposals) and Client VPN (logs, revocation, server certificate)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from .core import Context, Resource, Violation, as_int, as_list, as_object, as_objects, is_true

VPN_CONNECTION = "aws:ec2/vpnConnection:VpnConnection"
CLIENT_VPN_ENDPOINT = "aws:ec2clientvpn/endpoint:Endpoint"
TLS_CERT_REQUEST = "tls:index/certRequest:CertRequest"
TLS_SIGNED_CERTS = ("tls:index/locallySignedCert:LocallySignedCert", "tls:index/selfSignedCert:SelfSignedCert")

# IKE and IPsec proposals a site VPN may offer (the AWS names). RFC 8247 says DH groups 22-24 (MODP with
# small subgroups) SHOULD NOT or MUST NOT be used, so "DH >= 14" here means 14-21.
STRONG_CIPHERS = frozenset({"AES256", "AES256-GCM-16"})
STRONG_INTEGRITY = frozenset({"SHA2-256", "SHA2-384", "SHA2-512"})
STRONG_DH_GROUPS = frozenset({14, 15, 16, 17, 18, 19, 20, 21})


def _algorithms(values: Iterable[Any]) -> list[str | int]:
    return [n if (n := as_int(v)) is not None else str(v) for v in values]


def vpn_strong_crypto(resource: Resource, ctx: Context) -> list[str]:
    """Site-to-site VPN tunnels are IKEv2 only and offer only strong proposals in both phases."""
    if resource.type != VPN_CONNECTION:
        return []
    out: list[str] = []
    allowed: tuple[tuple[str, frozenset[Any]], ...] = (
        ("EncryptionAlgorithms", STRONG_CIPHERS),
        ("IntegrityAlgorithms", STRONG_INTEGRITY),
        ("DhGroupNumbers", STRONG_DH_GROUPS),
    )
    for tunnel in ("tunnel1", "tunnel2"):
        versions = [str(v) for v in as_list(resource.inputs.get(f"{tunnel}IkeVersions"))]
        if versions != ["ikev2"]:
            state = versions if versions else "unset (AWS then accepts ikev1 too)"
            out.append(f'{tunnel}IkeVersions is {state}: set ["ikev2"]')
        for phase in ("Phase1", "Phase2"):
            for what, strong in allowed:
                key = f"{tunnel}{phase}{what}"
                values = _algorithms(as_list(resource.inputs.get(key)))
                if not values:
                    out.append(f"{key} is unset, so AWS offers its defaults, weak ones included: list the strong ones")
                elif weak := [v for v in values if v not in strong]:
                    out.append(f"{key} allows {weak}: offer only {', '.join(str(s) for s in sorted(strong))}")
    return out


def client_vpn_connection_logs(resource: Resource, ctx: Context) -> list[str]:
    """Client VPN endpoints log connections (who connected, from where, when)."""
    if resource.type != CLIENT_VPN_ENDPOINT:
        return []
    if is_true(as_object(resource.inputs.get("connectionLogOptions")).get("enabled")):
        return []
    return ["connectionLogOptions.enabled is not true: laptop connections go unrecorded"]


def _domain_shaped(name: Any) -> bool:
    labels = str(name).rstrip(".").split(".")
    return len(labels) >= 2 and all(
        re.fullmatch(r"[a-z0-9*]([a-z0-9-]{0,61}[a-z0-9])?", label or "") for label in labels
    )


def server_certificates_name_a_domain(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Server certificates carry a domain-shaped DNS subject alternative name.

    ACM refuses to let AWS Client VPN use an imported server certificate without a domain name, and current TLS
    clients ignore the common name. Source: AWS Client VPN administrator guide, "Mutual authentication"; ACM
    user guide, "Prerequisites for importing certificates".
    """
    by_urn = {r.urn: r for r in resources}
    out = []
    for cert in resources:
        if cert.type not in TLS_SIGNED_CERTS or "server_auth" not in as_list(cert.inputs.get("allowedUses")):
            continue
        if cert.type == TLS_SIGNED_CERTS[1]:
            names = as_list(cert.inputs.get("dnsNames"))
        else:
            requests = [by_urn[d] for d in cert.dependencies if d in by_urn and by_urn[d].type == TLS_CERT_REQUEST]
            names = [n for request in requests for n in as_list(request.inputs.get("dnsNames"))]
        if not any(_domain_shaped(n) for n in names):
            out.append(Violation(cert.urn, "server certificate has no domain-shaped DNS name: ACM will not use it"))
    return out


def client_vpn_revocable(resource: Resource, ctx: Context) -> list[str]:
    """A Client VPN endpoint that accepts client certificates can refuse one: a client connect handler checks who
    is still admitted (without it, every certificate the CA ever issued gets in until it expires). Federated
    sign-in is revocable at the identity provider. Source: AWS Client VPN administrator guide, "Connection
    authorization" and "Client certificate revocation lists"."""
    if resource.type != CLIENT_VPN_ENDPOINT:
        return []
    kinds = {str(o.get("type")) for o in as_objects(resource.inputs.get("authenticationOptions"))}
    if "certificate-authentication" not in kinds:
        return []
    if is_true(as_object(resource.inputs.get("clientConnectOptions")).get("enabled")):
        return []
    return ["certificate sign-in without a client connect handler: a removed person's certificate still gets in"]
