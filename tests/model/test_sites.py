"""How far ahead a site's SSM activation may expire (dlinfra.model.sites): AWS's 30 days, from the creating call."""

from __future__ import annotations

import datetime

import pytest

from dlinfra.model import sites

NOW = datetime.datetime(2026, 11, 29, 12, 0, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("ahead", "problem"),
    [
        pytest.param(datetime.timedelta(seconds=1), None, id="a-second-ahead"),
        pytest.param(datetime.timedelta(days=30), None, id="thirty-days"),
        pytest.param(datetime.timedelta(days=30, seconds=1), "more than 30 days ahead", id="past-thirty-days"),
        pytest.param(datetime.timedelta(0), "has passed", id="now"),
        pytest.param(datetime.timedelta(days=-1), "has passed", id="yesterday"),
    ],
)
def test_activation_expiry_within_aws_limit(ahead: datetime.timedelta, problem: str | None) -> None:
    found = sites.activation_expiry_problem(NOW + ahead, NOW)
    assert found is None if problem is None else (found is not None and problem in found)


def test_a_refused_expiry_names_the_latest_accepted() -> None:
    found = sites.activation_expiry_problem(NOW + datetime.timedelta(days=45), NOW)
    assert found is not None and "give 2026-12-29T12:00:00Z or earlier" in found
