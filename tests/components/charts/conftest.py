"""The chart tests read the reference fleet and every region's Platform from the shared offline run."""

from __future__ import annotations

import pytest

from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet
from tests.components._platform import Stack, platform_stacks
from tests.conftest import REFERENCE_FLEET


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return load_fleet(REFERENCE_FLEET).fleet


@pytest.fixture(scope="module")
def stacks(fleet: Fleet) -> dict[str, Stack]:
    """Every region's platform, from the shared offline run of the reference fleet."""
    return platform_stacks(fleet)
