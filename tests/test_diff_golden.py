"""Golden `dlinfra diff` reports for the changes a reviewer meets most, read as a reviewer would.

Each scenario's base is the reference fixture's plans. Plan-level edits stand in for a fleet edit where the
effect is one input (a renumbered subnet, a raised pool maximum, a protected bucket dropped); adding a pool and
a team, and removing a site, run the edited fleet offline. Reviewed, then UPDATE_GOLDEN=1 pytest rewrites them.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlinfra import cost, diff, stackroles
from dlinfra.fleet import load_fleet
from tests.components import _reference as reference
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

GOLDEN = Path(__file__).parent / "golden" / "diff"
STACK = "prod-us-west-2"
Plans = dict[str, dict[str, Any]]


@functools.cache
def _base() -> Plans:
    return {name: r.plan("dlinfra") for name, r in reference.runs().items()}


def _fleet_data() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(REFERENCE_FLEET.read_text())
    return data


@functools.cache
def _pool_team_site_run() -> tuple[Plans, str]:
    """Every stack of the fixture fleet with pool infer-l4 and team audio added and site ams1 removed."""
    import tempfile

    from dlinfra.offline import engine

    data = _fleet_data()
    data["environments"]["prod"]["node_pools"]["infer-l4"] = {
        "kind": "gpu",
        "instance_types": ["g6.12xlarge"],
        "regions": ["us-west-2", "us-east-1"],
        "min_size": 0,
        "max_size": 4,
        "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
    }
    data["teams"]["audio"] = {"gpu_quota": 8}
    del data["sites"]["ams1"]
    text = yaml.safe_dump(data, sort_keys=False)
    with tempfile.TemporaryDirectory() as tmp:
        fleet_path = Path(tmp) / "fleet.yaml"
        fleet_path.write_text(text)
        config = {"dlinfra:fleet": str(fleet_path), "dlinfra:lock": str(REFERENCE_LOCK)}
        roles = stackroles.roles(load_fleet(fleet_path).fleet)
        return {
            r.role.name: r.plan("dlinfra") for r in engine.run_all(ROOT, roles, project="dlinfra", config=config)
        }, text


def _named(plans: Plans, stack: str, name: str) -> dict[str, Any]:
    (found,) = [r for r in plans[stack]["resources"] if r["name"] == name]
    return found


def _report(head: Plans, head_fleet: dict[str, Any] | None = None) -> str:
    base_fleet = _fleet_data()
    result = diff.compare(
        diff.PlanSet(
            label="main",
            plans=_base(),
            topology=diff.topology(base_fleet),
            cost=cost.estimate(_base().values()).to_json(),
        ),
        diff.PlanSet(
            label="pull request",
            plans=head,
            topology=diff.topology(head_fleet or base_fleet),
            cost=cost.estimate(head.values()).to_json(),
        ),
    )
    return diff.render_markdown(result)


def renumber_vpc_subnet() -> str:
    head = copy.deepcopy(_base())
    _named(head, STACK, "network-private-us-west-2a")["inputs"]["cidrBlock"] = "10.2.0.0/19"
    return _report(head)


def add_pool_and_team_remove_site() -> str:
    head, text = _pool_team_site_run()
    return _report(head, yaml.safe_load(text))


def raise_pool_max() -> str:
    head = copy.deepcopy(_base())
    _named(head, STACK, "pool-interactive-asg")["inputs"]["maxSize"] = 24.0
    return _report(head)


def protected_deletion() -> str:
    head = copy.deepcopy(_base())
    head[STACK]["resources"] = [r for r in head[STACK]["resources"] if r["name"] != "storage-checkpoints"]
    return _report(head)


SCENARIOS = {
    "renumber-vpc-subnet.md": renumber_vpc_subnet,
    "add-pool-and-team-remove-site.md": add_pool_and_team_remove_site,
    "raise-pool-max.md": raise_pool_max,
    "protected-deletion.md": protected_deletion,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_report(name: str) -> None:
    text = SCENARIOS[name]()
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run UPDATE_GOLDEN=1 pytest tests/test_diff_golden.py"
    assert text == path.read_text(), (
        f"{name} changed: review, then run UPDATE_GOLDEN=1 pytest tests/test_diff_golden.py"
    )


def test_the_reports_say_what_a_reviewer_must_see_first() -> None:
    renumber = (GOLDEN / "renumber-vpc-subnet.md").read_text()
    assert renumber.index("Stateful resources would be replaced") < renumber.index("| stack | create |")
    assert "`storage-lustre` in `prod-us-west-2` (forced by subnetIds)" in renumber
    protected = (GOLDEN / "protected-deletion.md").read_text()
    assert protected.index("This apply stops here") < protected.index("| stack | create |")
    raised = (GOLDEN / "raise-pool-max.md").read_text()
    assert "| `prod-us-west-2` | 2,732.54 → 2,732.54 | 0 | 65,412.10 → 105,722.11 | +40,310.01 |" in raised
    entities = (GOLDEN / "add-pool-and-team-remove-site.md").read_text()
    assert "`- site ams1 (prod, 3 regions)`, `+ pool infer-l4 (prod, 2 regions)`" in entities
