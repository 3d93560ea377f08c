"""Cluster-version lifecycle: support dates as data, warnings before the end, refusal after it."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from components.charts.autoscaler import autoscaler_image_tag
from dlinfra.cli import main as cli
from dlinfra.errors import FleetError
from dlinfra.model import eks
from dlinfra.model.fleet.load import load_fleet, version_lifecycle

D = datetime.date


@pytest.mark.parametrize(
    ("version", "policy", "on", "level", "text"),
    [
        ("1.33", "standard", D(2026, 3, 1), "ok", "standard support until 2026-07-29"),
        ("1.33", "standard", D(2026, 6, 1), "warning", "leaves standard support on 2026-07-29 (58 days)"),
        ("1.33", "standard", D(2026, 7, 30), "error", "left standard support on 2026-07-29"),
        ("1.33", "extended", D(2026, 11, 22), "ok", "extended support until 2027-07-29"),
        ("1.33", "extended", D(2027, 7, 30), "error", "left extended support on 2027-07-29"),
        ("1.32", "standard", D(2026, 3, 24), "error", "move to 1.33"),
    ],
)
def test_lifecycle(version: str, policy: eks.UpgradePolicy, on: datetime.date, level: str, text: str) -> None:
    state = eks.lifecycle(version, policy, on)
    assert state.level == level and text in state.message, state


def test_every_version_with_pinned_add_ons_has_dates_and_an_autoscaler_image() -> None:
    for version in eks.supported_versions():
        assert eks.support_end(version, "standard") < eks.support_end(version, "extended")
        assert set(eks.addon_versions(version)) == set(eks.ADDONS)
        assert autoscaler_image_tag(version).startswith(f"v{version}.")


def test_tests_run_on_a_pinned_date() -> None:
    assert eks.today() == D(2026, 11, 22)


def test_upgrade_policy_is_required(write_fleet: Callable[..., Path]) -> None:
    path = write_fleet(lambda data: data["environments"]["prod"]["kubernetes"].pop("upgrade_policy"))
    with pytest.raises(FleetError, match=r"environments.prod.kubernetes.upgrade_policy: required"):
        load_fleet(path)


def _policy(data: dict[str, Any], policy: str) -> None:
    data["environments"]["staging"]["kubernetes"]["upgrade_policy"] = policy


def test_a_fleet_past_its_support_is_refused_before_anything_runs(
    write_fleet: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_fleet(lambda data: _policy(data, "standard"))
    with pytest.raises(FleetError, match=r"environments\.staging\.kubernetes\.version: Kubernetes 1\.33 left standard"):
        version_lifecycle(load_fleet(path), D(2026, 11, 22))
    code = cli.main(["preview", "--stack", "staging-us-west-2", "--fleet", str(path), "--out", str(path.parent)])
    assert code == 2 and "left standard support on 2026-07-29" in capsys.readouterr().err
    assert not (path.parent / "staging-us-west-2.json").exists()


def test_a_version_near_its_end_warns(
    write_fleet: Callable[..., Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_fleet()
    monkeypatch.setenv(eks.TODAY_VARIABLE, "2027-06-01")
    assert cli.main(["validate", "--fleet", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "environments.prod.kubernetes.version" in err and "(58 days)" in err


def test_clusters_declare_the_fleets_upgrade_policy() -> None:
    from tests.reference import runs

    for name, result in runs().items():
        for cluster in (r for r in result.resources if r.type == "aws:eks/cluster:Cluster"):
            assert cluster.inputs["upgradePolicy"] == {"supportType": "EXTENDED"}, name


def test_every_offered_version_has_support_dates() -> None:
    """A version EKS offers without dates could never be checked: lifecycle() would call it past its end."""
    for version in eks.offered_versions():
        assert eks.support_end(version, "standard") < eks.support_end(version, "extended"), version
