"""Names and tags: one pattern, one precedence order, AWS length limits respected."""

from __future__ import annotations

import pytest

from dlinfra.model.naming import Names, region_code


@pytest.mark.parametrize(
    ("region", "code"),
    [
        ("us-west-2", "usw2"),
        ("us-east-1", "use1"),
        ("eu-west-1", "euw1"),
        ("ap-northeast-1", "apne1"),
        ("ap-southeast-2", "apse2"),
        ("eu-central-1", "euc1"),
        ("ca-central-1", "cac1"),
        ("sa-east-1", "sae1"),
    ],
)
def test_region_codes(region: str, code: str) -> None:
    assert region_code(region) == code


def test_physical_names_follow_one_pattern() -> None:
    names = Names("dlinfra", "prod", "us-west-2")
    assert names.physical("eks") == "dlinfra-prod-usw2-eks"
    assert names.physical("pool", "train-h100") == "dlinfra-prod-usw2-pool-train-h100"
    assert Names("dlinfra", "prod", None).physical("mesh") == "dlinfra-prod-global-mesh"


def test_long_names_are_shortened_uniquely() -> None:
    names = Names("dlinfra", "prod", "ap-northeast-1")
    a = names.physical("role", "a" * 80, max_len=64)
    b = names.physical("role", "a" * 79 + "b", max_len=64)
    assert len(a) <= 64 and len(b) <= 64 and a != b


def test_tag_precedence() -> None:
    names = Names("dlinfra", "prod", "us-west-2", {"cost-centre": "ml", "team": "infra"})
    tags = names.tags("network", "dlinfra-prod-usw2-vpc", {"team": "vision", "component": "spoofed"})
    assert tags == {
        "cost-centre": "ml",
        "team": "vision",  # resource extras beat fleet tags
        "component": "network",  # standard keys beat both
        "project": "dlinfra",
        "environment": "prod",
        "region": "us-west-2",
        "managed-by": "pulumi-dlinfra",
        "Name": "dlinfra-prod-usw2-vpc",
    }
