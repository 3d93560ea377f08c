"""The tunnel options dlinfra sets on the AWS side of every site VPN, and their algorithms as strongSwan proposals.

components/site_vpn.py configures AWS from these constants and the site's files are rendered from them, so the two
ends cannot drift apart.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any, Final

# What dlinfra configures on the AWS side of every tunnel (aws.ec2.VpnConnection tunnel options),
# in AWS's own names. Only strong choices: IKEv2, AES-256 (GCM preferred), SHA-2 >= 256, and the
# elliptic-curve DH groups (19-21); AWS's weak groups (2, 5, 22-24) and SHA-1 are left out.
AWS_IKE_VERSIONS: Final = ("ikev2",)
AWS_PHASE1_ENCRYPTION: Final = ("AES256-GCM-16", "AES256")
AWS_PHASE1_INTEGRITY: Final = ("SHA2-384", "SHA2-256")
AWS_PHASE1_DH: Final = (20, 19, 21)
AWS_PHASE2_ENCRYPTION: Final = ("AES256-GCM-16", "AES256")
AWS_PHASE2_INTEGRITY: Final = ("SHA2-384", "SHA2-256")
AWS_PHASE2_DH: Final = (20, 19, 21)  # AWS requires PFS in phase 2
AWS_PHASE1_LIFETIME_SECONDS: Final = 28800  # AWS default and maximum
AWS_PHASE2_LIFETIME_SECONDS: Final = 3600  # AWS default and maximum
# AWS default margin; AWS starts a rekey between margin and margin x (1 + fuzz) before expiry.
AWS_REKEY_MARGIN_TIME_SECONDS: Final = 270
AWS_REKEY_FUZZ_PERCENTAGE: Final = 100  # AWS default
AWS_REPLAY_WINDOW_SIZE: Final = 1024  # AWS default; the site renders the same window
# AWS's minimum (provider docstring: "equal or higher than 30"; AWS's pages give 30 or 40 as the default). AWS's
# pages also read it two ways: the user guide ("Tunnel options for your Site-to-Site VPN connection") has a 30 s
# timeout declare the peer dead 30 s after the first failed keep-alive, the EC2 API reference
# (ModifyVpnTunnelOptionsSpecification) has 40 s do that. dlinfra.render.failover takes the later reading.
AWS_DPD_TIMEOUT_SECONDS: Final = 30
# AWS does not publish when it sends its first keep-alive; "Site-to-Site VPN tunnel initiation options" says an
# idle tunnel may go down after "usually 10 seconds". The failover figures count 10 s of silence before it.
AWS_DPD_IDLE_SECONDS: Final = 10
# The site gateway owns (re)establishment (it initiates and retries forever); AWS re-initiating as
# well would race it into duplicate IKE_SAs, so AWS only clears and waits. Clearing also takes the tunnel
# down and removes its routes ("Site-to-Site VPN tunnel initiation options"): on a static site, that is the only
# thing that moves AWS's return traffic off a tunnel whose far end went silent ("none" would never move it).
AWS_DPD_TIMEOUT_ACTION: Final = "clear"
AWS_STARTUP_ACTION: Final = "add"

# AWS rejects these tunnel inside CIDRs (VpnTunnelOptionsSpecification.TunnelInsideCidr).
AWS_RESERVED_INSIDE_CIDRS: Final = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "169.254.0.0/30",
        "169.254.1.0/30",
        "169.254.2.0/30",
        "169.254.3.0/30",
        "169.254.4.0/30",
        "169.254.5.0/30",
        "169.254.169.252/30",
    )
)

# AWS algorithm names -> strongSwan proposal keywords.
_ENCRYPTION: Final[Mapping[str, str]] = {
    "AES128": "aes128",
    "AES256": "aes256",
    "AES128-GCM-16": "aes128gcm16",
    "AES256-GCM-16": "aes256gcm16",
}
_AEAD: Final = frozenset({"AES128-GCM-16", "AES256-GCM-16"})
_INTEGRITY: Final[Mapping[str, str]] = {
    "SHA1": "sha1",
    "SHA2-256": "sha256",
    "SHA2-384": "sha384",
    "SHA2-512": "sha512",
}
_DH_GROUPS: Final[Mapping[int, str]] = {
    2: "modp1024",
    5: "modp1536",
    14: "modp2048",
    15: "modp3072",
    16: "modp4096",
    17: "modp6144",
    18: "modp8192",
    19: "ecp256",
    20: "ecp384",
    21: "ecp521",
    22: "modp1024s160",
    23: "modp2048s224",
    24: "modp2048s256",
}
_PHASE1_DH_ALLOWED: Final = frozenset({2, *range(14, 25)})
_PHASE2_DH_ALLOWED: Final = frozenset({2, 5, *range(14, 25)})


def _check_aws_names(what: str, values: Sequence[Any], allowed: Sequence[Any], *, may_be_empty: bool = False) -> None:
    if not values and not may_be_empty:
        raise ValueError(f"{what}: at least one value is needed")
    if len(set(values)) != len(values):
        raise ValueError(f"{what}: duplicate values in {list(values)}")
    for value in values:
        if value not in allowed:
            raise ValueError(f"{what}: {value!r} is not an AWS name; AWS accepts {', '.join(map(str, allowed))}")


def _proposals(
    phase: int, encryption: Sequence[str], integrity: Sequence[str], dh_groups: Sequence[int]
) -> tuple[str, ...]:
    dh_allowed = sorted(_PHASE1_DH_ALLOWED if phase == 1 else _PHASE2_DH_ALLOWED)
    _check_aws_names(f"phase{phase} encryption", encryption, list(_ENCRYPTION))
    _check_aws_names(f"phase{phase} integrity", integrity, list(_INTEGRITY), may_be_empty=True)
    _check_aws_names(f"phase{phase} DH groups", dh_groups, dh_allowed)
    aead = [_ENCRYPTION[e] for e in encryption if e in _AEAD]
    classic = [_ENCRYPTION[e] for e in encryption if e not in _AEAD]
    dh = [_DH_GROUPS[g] for g in dh_groups]
    if not integrity and (classic or phase == 1):
        # IKE always needs a PRF, and non-AEAD ciphers need an integrity algorithm.
        raise ValueError(f"phase{phase} integrity: at least one value is needed with {list(encryption)}")
    # strongSwan cannot mix AEAD and classic ciphers in one proposal: one proposal per kind, in the
    # order the caller prefers them.
    built: list[tuple[bool, str]] = []
    if aead:
        prf = [f"prf{_INTEGRITY[i]}" for i in integrity] if phase == 1 else []
        built.append((True, "-".join([*aead, *prf, *dh])))
    if classic:
        built.append((False, "-".join([*classic, *(_INTEGRITY[i] for i in integrity), *dh])))
    aead_first = encryption[0] in _AEAD
    return tuple(text for is_aead, text in sorted(built, key=lambda b: b[0] != aead_first))


def ike_proposals_from_aws(
    encryption: Sequence[str], integrity: Sequence[str], dh_groups: Sequence[int]
) -> tuple[str, ...]:
    """strongSwan IKE proposals equivalent to AWS phase 1 options (e.g. AWS_PHASE1_*)."""
    return _proposals(1, encryption, integrity, dh_groups)


def esp_proposals_from_aws(
    encryption: Sequence[str], integrity: Sequence[str], dh_groups: Sequence[int]
) -> tuple[str, ...]:
    """strongSwan ESP proposals (with PFS groups) equivalent to AWS phase 2 options (e.g. AWS_PHASE2_*)."""
    return _proposals(2, encryption, integrity, dh_groups)


DEFAULT_IKE_PROPOSALS: Final = ike_proposals_from_aws(AWS_PHASE1_ENCRYPTION, AWS_PHASE1_INTEGRITY, AWS_PHASE1_DH)
DEFAULT_ESP_PROPOSALS: Final = esp_proposals_from_aws(AWS_PHASE2_ENCRYPTION, AWS_PHASE2_INTEGRITY, AWS_PHASE2_DH)


def check_proposals(what: str, proposals: Sequence[str], phase: int) -> None:
    """Each proposal must use only algorithms that the AWS side is configured with, combined validly."""
    if phase == 1:
        enc_names, integ_names, dh_numbers = AWS_PHASE1_ENCRYPTION, AWS_PHASE1_INTEGRITY, AWS_PHASE1_DH
    else:
        enc_names, integ_names, dh_numbers = AWS_PHASE2_ENCRYPTION, AWS_PHASE2_INTEGRITY, AWS_PHASE2_DH
    aead = {_ENCRYPTION[e] for e in enc_names if e in _AEAD}
    classic = {_ENCRYPTION[e] for e in enc_names if e not in _AEAD}
    integ = {_INTEGRITY[i] for i in integ_names}
    prf = {f"prf{i}" for i in integ} if phase == 1 else set()
    dh = {_DH_GROUPS[g] for g in dh_numbers}
    if not proposals:
        raise ValueError(f"{what}: at least one proposal is needed")
    for proposal in proposals:
        tokens = proposal.split("-")
        unknown = [t for t in tokens if t not in aead | classic | integ | prf | dh]
        if unknown:
            raise ValueError(
                f"{what}: {proposal!r} uses {', '.join(unknown)}, which the AWS side is not configured "
                f"with (allowed: {', '.join(sorted(aead | classic | integ | prf | dh))})"
            )
        has_aead, has_classic = any(t in aead for t in tokens), any(t in classic for t in tokens)
        has_integ, has_prf = any(t in integ for t in tokens), any(t in prf for t in tokens)
        if not (has_aead or has_classic):
            raise ValueError(f"{what}: {proposal!r} has no encryption algorithm")
        if has_aead and has_classic:
            # strongSwan rejects such a proposal; AEAD and CBC ciphers go in separate proposals.
            raise ValueError(f"{what}: {proposal!r} mixes GCM and CBC ciphers; split it into two proposals")
        if not any(t in dh for t in tokens):
            raise ValueError(f"{what}: {proposal!r} has no DH group (AWS requires one, also for PFS)")
        if has_aead and has_integ:
            raise ValueError(f"{what}: {proposal!r} combines GCM with an integrity algorithm")
        if has_classic and not has_integ:
            raise ValueError(f"{what}: {proposal!r} needs an integrity algorithm for its CBC cipher")
        if phase == 1 and has_aead and not has_prf:
            raise ValueError(f"{what}: {proposal!r} needs a PRF (prfsha256 or stronger) with GCM")
