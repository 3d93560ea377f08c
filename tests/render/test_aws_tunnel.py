"""The AWS side's tunnel options: AWS names mapped to strongSwan proposals, strong choices, values AWS accepts."""

from __future__ import annotations

from typing import Any

import pytest

from dlinfra.render import aws_tunnel
from tests.render.vpn_views import view


@pytest.mark.parametrize(
    ("encryption", "expected"),
    [
        ("AES128", "aes128-sha256-modp2048"),
        ("AES256", "aes256-sha256-modp2048"),
        ("AES128-GCM-16", "aes128gcm16-prfsha256-modp2048"),
        ("AES256-GCM-16", "aes256gcm16-prfsha256-modp2048"),
    ],
)
def test_phase1_encryption_names(encryption: str, expected: str) -> None:
    assert aws_tunnel.ike_proposals_from_aws((encryption,), ("SHA2-256",), (14,)) == (expected,)


@pytest.mark.parametrize(
    ("encryption", "expected"),
    [
        ("AES128", "aes128-sha256-modp2048"),
        ("AES256", "aes256-sha256-modp2048"),
        ("AES128-GCM-16", "aes128gcm16-modp2048"),
        ("AES256-GCM-16", "aes256gcm16-modp2048"),
    ],
)
def test_phase2_encryption_names(encryption: str, expected: str) -> None:
    assert aws_tunnel.esp_proposals_from_aws((encryption,), ("SHA2-256",), (14,)) == (expected,)


@pytest.mark.parametrize(
    ("integrity", "keyword"),
    [("SHA1", "sha1"), ("SHA2-256", "sha256"), ("SHA2-384", "sha384"), ("SHA2-512", "sha512")],
)
def test_integrity_names(integrity: str, keyword: str) -> None:
    assert aws_tunnel.ike_proposals_from_aws(("AES256",), (integrity,), (20,)) == (f"aes256-{keyword}-ecp384",)
    assert aws_tunnel.ike_proposals_from_aws(("AES256-GCM-16",), (integrity,), (20,)) == (
        f"aes256gcm16-prf{keyword}-ecp384",
    )
    assert aws_tunnel.esp_proposals_from_aws(("AES256",), (integrity,), (20,)) == (f"aes256-{keyword}-ecp384",)


@pytest.mark.parametrize(
    ("group", "keyword"),
    [
        (2, "modp1024"),
        (14, "modp2048"),
        (15, "modp3072"),
        (16, "modp4096"),
        (17, "modp6144"),
        (18, "modp8192"),
        (19, "ecp256"),
        (20, "ecp384"),
        (21, "ecp521"),
        (22, "modp1024s160"),
        (23, "modp2048s224"),
        (24, "modp2048s256"),
    ],
)
def test_dh_group_numbers(group: int, keyword: str) -> None:
    assert aws_tunnel.ike_proposals_from_aws(("AES256",), ("SHA2-256",), (group,)) == (f"aes256-sha256-{keyword}",)
    assert aws_tunnel.esp_proposals_from_aws(("AES256",), ("SHA2-256",), (group,)) == (f"aes256-sha256-{keyword}",)


def test_group_5_exists_only_in_phase2() -> None:
    assert aws_tunnel.esp_proposals_from_aws(("AES256",), ("SHA2-256",), (5,)) == ("aes256-sha256-modp1536",)
    with pytest.raises(ValueError, match="phase1 DH groups"):
        aws_tunnel.ike_proposals_from_aws(("AES256",), ("SHA2-256",), (5,))


def test_mixed_ciphers_split_into_one_proposal_per_kind_in_preference_order() -> None:
    assert aws_tunnel.ike_proposals_from_aws(("AES256-GCM-16", "AES128", "AES128-GCM-16"), ("SHA2-384",), (20, 19)) == (
        "aes256gcm16-aes128gcm16-prfsha384-ecp384-ecp256",
        "aes128-sha384-ecp384-ecp256",
    )
    assert aws_tunnel.esp_proposals_from_aws(("AES256", "AES256-GCM-16"), ("SHA2-256",), (21,)) == (
        "aes256-sha256-ecp521",
        "aes256gcm16-ecp521",
    )


def test_gcm_only_phase2_needs_no_integrity() -> None:
    assert aws_tunnel.esp_proposals_from_aws(("AES256-GCM-16",), (), (20,)) == ("aes256gcm16-ecp384",)


@pytest.mark.parametrize(
    ("call", "args", "message"),
    [
        (aws_tunnel.ike_proposals_from_aws, (("AES512",), ("SHA2-256",), (20,)), "phase1 encryption"),
        (aws_tunnel.ike_proposals_from_aws, (("aes256",), ("SHA2-256",), (20,)), "phase1 encryption"),
        (aws_tunnel.ike_proposals_from_aws, ((), ("SHA2-256",), (20,)), "phase1 encryption"),
        (aws_tunnel.ike_proposals_from_aws, (("AES256",), ("MD5",), (20,)), "phase1 integrity"),
        (aws_tunnel.ike_proposals_from_aws, (("AES256-GCM-16",), (), (20,)), "phase1 integrity"),
        (aws_tunnel.ike_proposals_from_aws, (("AES256",), ("SHA2-256",), (1,)), "phase1 DH groups"),
        (aws_tunnel.ike_proposals_from_aws, (("AES256",), ("SHA2-256",), ()), "phase1 DH groups"),
        (aws_tunnel.ike_proposals_from_aws, (("AES256", "AES256"), ("SHA2-256",), (20,)), "duplicate"),
        (aws_tunnel.esp_proposals_from_aws, (("AES256",), (), (20,)), "phase2 integrity"),
        (aws_tunnel.esp_proposals_from_aws, (("AES256",), ("SHA2-256",), (25,)), "phase2 DH groups"),
    ],
)
def test_unknown_aws_names_are_rejected(call: Any, args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(*args)


def test_defaults_are_the_mapping_of_the_aws_constants() -> None:
    ike = aws_tunnel.ike_proposals_from_aws(
        aws_tunnel.AWS_PHASE1_ENCRYPTION, aws_tunnel.AWS_PHASE1_INTEGRITY, aws_tunnel.AWS_PHASE1_DH
    )
    esp = aws_tunnel.esp_proposals_from_aws(
        aws_tunnel.AWS_PHASE2_ENCRYPTION, aws_tunnel.AWS_PHASE2_INTEGRITY, aws_tunnel.AWS_PHASE2_DH
    )
    assert ike == aws_tunnel.DEFAULT_IKE_PROPOSALS
    assert esp == aws_tunnel.DEFAULT_ESP_PROPOSALS
    assert view().ike_proposals == aws_tunnel.DEFAULT_IKE_PROPOSALS
    assert view().esp_proposals == aws_tunnel.DEFAULT_ESP_PROPOSALS


def test_aws_side_choices_are_strong() -> None:
    assert aws_tunnel.AWS_IKE_VERSIONS == ("ikev2",)
    for groups in (aws_tunnel.AWS_PHASE1_DH, aws_tunnel.AWS_PHASE2_DH):
        assert groups and all(g >= 14 and g not in (22, 23, 24) for g in groups)
    for integrity in (aws_tunnel.AWS_PHASE1_INTEGRITY, aws_tunnel.AWS_PHASE2_INTEGRITY):
        assert integrity and "SHA1" not in integrity
    for encryption in (aws_tunnel.AWS_PHASE1_ENCRYPTION, aws_tunnel.AWS_PHASE2_ENCRYPTION):
        assert encryption and all(e.startswith("AES256") for e in encryption)


def test_aws_timer_constants_are_values_aws_accepts() -> None:
    assert 900 <= aws_tunnel.AWS_PHASE1_LIFETIME_SECONDS <= 28800
    assert 900 <= aws_tunnel.AWS_PHASE2_LIFETIME_SECONDS <= 3600
    assert aws_tunnel.AWS_PHASE2_LIFETIME_SECONDS < aws_tunnel.AWS_PHASE1_LIFETIME_SECONDS
    assert 60 <= aws_tunnel.AWS_REKEY_MARGIN_TIME_SECONDS <= aws_tunnel.AWS_PHASE2_LIFETIME_SECONDS // 2
    assert 0 <= aws_tunnel.AWS_REKEY_FUZZ_PERCENTAGE <= 100
    assert 64 <= aws_tunnel.AWS_REPLAY_WINDOW_SIZE <= 2048
    assert aws_tunnel.AWS_DPD_TIMEOUT_SECONDS >= 30
    assert aws_tunnel.AWS_DPD_TIMEOUT_ACTION in ("clear", "none", "restart")
    assert aws_tunnel.AWS_STARTUP_ACTION in ("add", "start")
