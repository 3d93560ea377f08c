"""The stacks `site add` and `site remove` tell you to apply are exactly the stacks whose plans change.

Each case previews every stack of a fixture fleet offline, runs the real command on it, previews again, and
compares the plans stack by stack: the `pulumi up` lines printed must name the changed stacks (and new ones),
no others, in apply order.
"""

from __future__ import annotations

import datetime
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from dlinfra.cli import main as cli
from dlinfra.model import stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.offline import engine
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

NYC1 = ["nyc1", "--region", "us-east-1", "--public-ip", "8.8.4.4", "--asn", "65103"]


def _copy(to: Path) -> Path:
    to.mkdir(parents=True, exist_ok=True)
    shutil.copy(REFERENCE_FLEET, to / "fleet.yaml")
    shutil.copy(REFERENCE_LOCK, to / "cidr-lock.yaml")
    return to / "fleet.yaml"


def _preview(fleet_path: Path) -> dict[str, dict[str, Any]]:
    """Stack name -> its plan export, every stack of the fleet, as `dlinfra preview --all` makes them."""
    fleet = load_fleet(fleet_path).fleet
    config = {"dlinfra:fleet": str(fleet_path), "dlinfra:lock": str(fleet_path.parent / "cidr-lock.yaml")}
    results = engine.run_all(ROOT, stackroles.roles(fleet), project=fleet.project, config=config)
    plans = {r.role.name: r.plan(fleet.project) for r in results}
    for plan in plans.values():
        plan.pop("provenance", None)  # where and when, not what
    return plans


@pytest.fixture(scope="module")
def before(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The fixture fleet's plans, from a copy of it (the same paths' shape as the cases')."""
    return _preview(_copy(tmp_path_factory.mktemp("before")))


def _run(capsys: pytest.CaptureFixture[str], fleet_path: Path, *argv: str) -> str:
    capsys.readouterr()
    code = cli.main([*argv, "--fleet", str(fleet_path), "--lock", str(fleet_path.parent / "cidr-lock.yaml")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def _printed_stacks(out: str) -> list[str]:
    return re.findall(r"pulumi up --stack (\S+)", out)


def _changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [name for name, plan in after.items() if before.get(name) != plan]


EXPIRY = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=20)).replace(microsecond=0)
GPU_SITE = ["--nfs", "10.60.0.5:/tank:/data", "--activation-expiry", EXPIRY.isoformat()]
STAGING = ["nyc1", "--region", "us-west-2", "--environment", "staging", "--public-ip", "8.8.4.4", "--asn", "65103"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(
            ["site", "add", *NYC1, "--gpu-nodes", "4", "--lan", "10.60.0.0/20", *GPU_SITE],
            # Its GPUs move every team's share in every prod region: all three in-cluster stacks.
            [
                "prod-us-west-2",
                "prod-us-east-1",
                "prod-eu-west-1",
                "prod-us-east-1-k8s",
                "prod-eu-west-1-k8s",
                "prod-us-west-2-k8s",
                "prod-global",
            ],
            id="gpu-site",
        ),
        pytest.param(
            ["site", "add", *NYC1],
            # No GPUs: only its own region's in-cluster stack (BGP peers for its nodes' pods).
            ["prod-us-west-2", "prod-us-east-1", "prod-eu-west-1", "prod-us-east-1-k8s", "prod-global"],
            id="site-without-gpus",
        ),
        pytest.param(
            ["site", "add", *STAGING, "--gpu-nodes", "2"],
            # One region, so no global stack; prod is untouched.
            ["staging-us-west-2", "staging-us-west-2-k8s"],
            id="site-in-a-one-region-environment",
        ),
        pytest.param(
            ["site", "remove", "ams1"],
            [
                "prod-us-west-2",
                "prod-us-east-1",
                "prod-eu-west-1",
                "prod-us-east-1-k8s",
                "prod-eu-west-1-k8s",
                "prod-us-west-2-k8s",
                "prod-global",
            ],
            id="remove",
        ),
    ],
)
def test_the_stacks_to_apply_are_the_stacks_whose_plans_change(
    before: dict[str, dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    expected: list[str],
) -> None:
    fleet_path = _copy(tmp_path / "repo")
    out = _run(capsys, fleet_path, *argv)
    after = _preview(fleet_path)
    changed = _changed(before, after)
    assert _printed_stacks(out) == changed
    # The expected list pins the case down, so a fixture change that makes it vacuous shows here.
    assert changed == expected
    order = [role.name for role in stackroles.roles(load_fleet(fleet_path).fleet)]
    assert changed == sorted(changed, key=order.index)  # apply order: regional, in-cluster, global
    if "--activation-expiry" in argv:
        (activation,) = [
            r for r in after["prod-us-east-1"]["resources"] if r["type"] == "aws:ssm/activation:Activation"
        ]
        assert activation["inputs"]["expirationDate"] == EXPIRY.isoformat().replace("+00:00", "Z")
