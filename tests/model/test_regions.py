"""The regions table: every AZ name labels one zone id of its own region; EKS's refused zone ids are well formed."""

from __future__ import annotations

import pytest

from dlinfra.model import eks
from dlinfra.model.regions import ZONE_ID, known_regions, region_of_zone


@pytest.mark.parametrize("region", sorted(known_regions()))
def test_each_az_labels_one_zone_id_of_its_region(region: str) -> None:
    info = known_regions()[region]
    zones = list(info.zone_ids.values())
    assert len(set(zones)) == len(zones), f"{region}: two AZ names label one zone"
    assert all(az.startswith(region) for az in info.azs)
    # A zone id starts with the region's short code: us-west-2 -> usw2, ap-northeast-1 -> apne1.
    prefixes = {z.split("-az")[0] for z in zones}
    assert len(prefixes) == 1 and all(ZONE_ID.match(z) for z in zones), zones
    for az, zone in info.zone_ids.items():
        assert info.az_of(zone) == az and region_of_zone(zone) == region


@pytest.mark.parametrize("region", ["us-east-1", "us-west-1", "ca-central-1"])
def test_eks_refused_zone_ids_belong_to_their_region(region: str) -> None:
    refused = eks.unsupported_zone_ids(region)
    assert refused and all(ZONE_ID.match(z) for z in refused)
    prefix = next(iter(known_regions()[region].zone_ids.values())).split("-az")[0]
    assert all(z.startswith(f"{prefix}-az") for z in refused)


def test_the_reference_regions_avoid_the_zone_eks_refuses() -> None:
    # us-east-1 labels use1-az3 us-east-1e: a fleet may use at most four AZs there (tests/model/test_fleet.py).
    assert known_regions()["us-east-1"].az_of("use1-az3") == "us-east-1e"
    assert eks.unsupported_zone_ids("us-west-2") == frozenset()
