"""The in-cluster stack's planning: the Platform's arguments from the fleet."""

from __future__ import annotations

import pytest

from dlinfra.model import planner
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.naming import Names
from stacks.in_cluster import platform_args_from_fleet
from tests.components._platform import AP_ID, FS_ID
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return load_fleet(REFERENCE_FLEET).fleet


def test_args_from_fleet_need_every_pool(fleet: Fleet) -> None:
    plan = planner.plan(load_fleet(REFERENCE_FLEET), planner.load_lock(REFERENCE_LOCK))
    with pytest.raises(ValueError, match="pools cpu, interactive, train-h100 of prod/us-west-2 were not passed"):
        platform_args_from_fleet(
            fleet, plan, names=Names("dlinfra", "prod", "us-west-2"), provider=None,  # type: ignore[arg-type]
            cluster_name="c", node_pools={}, efs_file_system_id=FS_ID, efs_access_point_ids={"datasets": AP_ID},
            termination_queue_url="q", quota_policy="guaranteed",
        )  # fmt: skip
