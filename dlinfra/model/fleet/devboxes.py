"""Dev boxes in the fleet: per environment, who gets an interactive machine, of which type, where, and how long it
may sit idle before it stops itself. Each field is checked on its own here; whether the person, region, zone and type
exist in the environment is checked against the whole fleet (dlinfra.model.dev_boxes.check_fleet).

SSH public keys are read the way OpenSSH writes them (`<type> <base64 blob> [comment]`, sshd(8) "AUTHORIZED_KEYS FILE
FORMAT"); the blob is decoded and its own type string must match the first field (RFC 4253 section 6.6, RFC 5656
section 3.1 for ECDSA, RFC 8709 for Ed25519). RSA keys need a modulus of 3072 bits or more: NIST SP 800-57 Part 1
Rev. 5 (Table 2) gives 2048-bit RSA 112 bits of security, acceptable only until 2030, and 3072 bits 128.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator

from dlinfra.model.fleet.base import Strict

# How long a box may sit idle before it stops itself, in minutes. The floor leaves the on-box check (every five
# minutes) room to see a session come; the ceiling keeps the CloudWatch backstop within what an alarm can evaluate:
# its period times its evaluation periods may not exceed one day (CloudWatch API reference, PutMetricAlarm:
# "EvaluationPeriods ... multiplied by Period cannot be more than 86,400 seconds"), and the backstop waits the idle
# time plus BACKSTOP_EXTRA_MINUTES.
MIN_IDLE_MINUTES = 15
MAX_IDLE_MINUTES = 1380
DEFAULT_IDLE_MINUTES = 60
MIN_RSA_BITS = 3072
_ECDSA_CURVES = {f"ecdsa-sha2-{curve}": curve for curve in ("nistp256", "nistp384", "nistp521")}
KEY_TYPES = ("ssh-ed25519", "ssh-rsa", *_ECDSA_CURVES)
_ED25519_KEY_BYTES = 32


def _fields(blob: bytes) -> list[bytes]:
    """The SSH wire-format strings of a key blob (each a 4-byte big-endian length, then the bytes)."""
    out, at = [], 0
    while at < len(blob):
        if at + 4 > len(blob):
            raise ValueError("the key's data is cut short")
        size = int.from_bytes(blob[at : at + 4], "big")
        at += 4
        if at + size > len(blob):
            raise ValueError("the key's data is cut short")
        out.append(blob[at : at + size])
        at += size
    return out


def ssh_public_key(v: str) -> str:
    """An OpenSSH public key line of an accepted type and strength, returned as `<type> <blob>` (the comment dropped:
    it says nothing sshd checks, and a changed comment must not change the box)."""
    parts = v.strip().split()
    if len(parts) < 2:
        raise ValueError("not an OpenSSH public key: expected '<type> <base64> [comment]' (the line of id_*.pub)")
    kind, data = parts[0], parts[1]
    if kind not in KEY_TYPES:
        raise ValueError(f"key type {kind!r} is not accepted; use one of {', '.join(KEY_TYPES)} (ed25519 preferred)")
    try:
        blob = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the key's base64 part does not decode: copy the whole line of the .pub file") from None
    fields = _fields(blob)
    inner = fields[0].decode(errors="replace") if fields else "nothing"
    if inner != kind:
        raise ValueError(f"the key's data says {inner}, not {kind}")
    if kind == "ssh-ed25519" and (len(fields) != 2 or len(fields[1]) != _ED25519_KEY_BYTES):
        raise ValueError("not an Ed25519 public key: it must hold one 32-byte key")
    if kind in _ECDSA_CURVES and (len(fields) != 3 or fields[1].decode(errors="replace") != _ECDSA_CURVES[kind]):
        raise ValueError(f"not a {kind} public key: its curve must be {_ECDSA_CURVES[kind]}")
    if kind == "ssh-rsa":
        if len(fields) != 3:
            raise ValueError("not an RSA public key: it must hold an exponent and a modulus")
        bits = int.from_bytes(fields[2], "big").bit_length()
        if bits < MIN_RSA_BITS:
            raise ValueError(
                f"an RSA key of {bits} bits is too weak: {MIN_RSA_BITS} or more (ssh-keygen -t rsa -b 4096), or ed25519"
            )
    return f"{kind} {data}"


SshPublicKey = Annotated[str, AfterValidator(ssh_public_key)]


class DevBox(Strict):
    """One person's interactive machine in one region of the environment."""

    region: str  # one of the environment's regions
    instance_type: str  # from the instance catalog, sold in the region; a GPU type gives a GPU box (GPU image)
    ssh_key: SshPublicKey  # the person's OpenSSH public key: the only key the box accepts
    zone: str | None = None  # AZ name (us-west-2b); default: the region's first AZ. Move it where the type is offered
    idle_minutes: int | None = Field(None, ge=MIN_IDLE_MINUTES, le=MAX_IDLE_MINUTES)  # default: the section's
    root_volume_gib: int = Field(100, ge=30, le=16384)  # encrypted gp3 root; the home is on EFS, not here


class DevBoxes(Strict):
    """An environment's dev boxes, keyed by person (a laptop-VPN user, or a member of a team with a VPN group)."""

    idle_minutes: int = Field(DEFAULT_IDLE_MINUTES, ge=MIN_IDLE_MINUTES, le=MAX_IDLE_MINUTES)
    people: Mapping[str, DevBox] = Field(default_factory=dict)

    @field_validator("people")
    @classmethod
    def _sorted(cls, v: Mapping[str, DevBox]) -> Mapping[str, DevBox]:
        # Names need no check of their own: each must be a VPN user or team member (dev_boxes.check_fleet).
        return dict(sorted(v.items()))  # order in the file changes nothing declared
