"""A Capacity Block's window in the fleet: required, checked against what EC2 sells, and warned of near its end."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlinfra.errors import FleetError
from dlinfra.model.fleet.checks import block_warnings
from dlinfra.model.fleet.load import load_fleet, parse_yaml, validate_data
from tests.conftest import REFERENCE_FLEET

BLOCK = "environments.prod.node_pools.train-h100.capacity_reservations.us-west-2"
UTC = datetime.UTC


def _block(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        block = data["environments"]["prod"]["node_pools"]["train-h100"]["capacity_reservations"]["us-west-2"]
        for key, value in fields.items():
            if value is None:
                block.pop(key, None)
            else:
                block[key] = value

    return change


def test_the_reference_block_has_its_window_in_utc() -> None:
    block = load_fleet(REFERENCE_FLEET).fleet.environments["prod"].node_pools["train-h100"].capacity_reservations
    cr = block["us-west-2"]
    assert cr.start == datetime.datetime(2027, 1, 4, 11, 30, tzinfo=UTC)
    assert cr.end == datetime.datetime(2027, 1, 18, 11, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(_block(start=None), "a capacity_block needs its window in UTC", id="no-start"),
        pytest.param(_block(end=None, start=None), "a capacity_block needs its window", id="no-window"),
        pytest.param(_block(end="2027-01-04T11:30:00Z"), "is not after start", id="empty"),
        pytest.param(_block(end="2027-01-18T12:00:00Z"), "every Capacity Block ends at 11:30 UTC", id="not-11-30"),
        pytest.param(_block(end="2027-01-18T11:30:00"), "timezone", id="naive"),
        pytest.param(_block(end="2027-08-02T11:30:00Z"), "at most 182 days", id="too-long"),
        pytest.param(_block(type="reservation"), "only a capacity_block has a window", id="window-on-a-reservation"),
    ],
)
def test_bad_window(write_fleet: Callable[..., Path], change: Any, message: str) -> None:
    path = write_fleet(change)
    with pytest.raises(FleetError) as info:
        load_fleet(path)
    text = str(info.value)
    assert str(path) in text and BLOCK in text and message in text


def test_an_offset_is_the_same_instant_in_utc(write_fleet: Callable[..., Path]) -> None:
    # 06:30-05:00 is 11:30 UTC: the plan spells it one way whatever the file wrote.
    path = write_fleet(_block(end="2027-01-18T06:30:00-05:00"))
    cr = load_fleet(path).fleet.environments["prod"].node_pools["train-h100"].capacity_reservations["us-west-2"]
    assert cr.end == datetime.datetime(2027, 1, 18, 11, 30, tzinfo=UTC) and cr.end.tzinfo == UTC


def _warnings(now: datetime.datetime, days: int = 14) -> list[tuple[str, str]]:
    fleet = load_fleet(REFERENCE_FLEET).fleet
    return block_warnings(fleet, now, datetime.timedelta(days=days))


def test_no_warning_far_from_the_end() -> None:
    assert _warnings(datetime.datetime(2026, 11, 22, tzinfo=UTC)) == []


def test_a_block_ending_within_the_horizon_is_warned_of() -> None:
    (warning,) = _warnings(datetime.datetime(2027, 1, 10, tzinfo=UTC))
    key, message = warning
    assert key == f"{BLOCK}.end"
    assert "ends 2027-01-18 11:30 UTC" in message and "go in 8 d 11 h" in message
    assert _warnings(datetime.datetime(2027, 1, 10, tzinfo=UTC), days=3) == []


def test_an_ended_block_says_the_pool_can_never_launch() -> None:
    # From EC2's cut on, nothing runs in the block any more.
    (warning,) = _warnings(datetime.datetime(2027, 1, 18, 11, 0, tzinfo=UTC))
    assert "can never launch in us-west-2 again" in warning[1]
    assert "its Kueue flavor closed: jobs run on other flavors or overflow" in warning[1]


def test_an_edited_copy_of_a_parsed_fleet_keeps_the_windows_instant() -> None:
    """ruamel's TimeStamp loses its offset when deep-copied (its `_yaml` keeps it): the model restores it."""
    data = copy.deepcopy(parse_yaml(REFERENCE_FLEET))
    fleet = validate_data(data, REFERENCE_FLEET)
    cr = fleet.environments["prod"].node_pools["train-h100"].capacity_reservations["us-west-2"]
    assert cr.start == datetime.datetime(2027, 1, 4, 11, 30, tzinfo=UTC)
