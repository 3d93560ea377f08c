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

from dlinfra.model import stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.review import cost
from dlinfra.review.diff import render
from dlinfra.review.diff.compare import compare
from dlinfra.review.diff.plans import PlanSet, topology
from tests import reference
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

GOLDEN = Path(__file__).parent / "golden"
STACK = "prod-us-west-2"
Plans = dict[str, dict[str, Any]]


@functools.cache
def _base() -> Plans:
    return {name: r.plan("dlinfra") for name, r in reference.runs().items()}


def _fleet_data() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(REFERENCE_FLEET.read_text())
    return data


def _run(fleet_text: str, lock_text: str) -> Plans:
    """Every stack of a fleet and address plan, run offline as `preview --all` would."""
    import tempfile

    from dlinfra.offline import engine

    with tempfile.TemporaryDirectory() as tmp:
        fleet_path, lock_path = Path(tmp) / "fleet.yaml", Path(tmp) / "cidr-lock.yaml"
        fleet_path.write_text(fleet_text)
        lock_path.write_text(lock_text)
        config = {"dlinfra:fleet": str(fleet_path), "dlinfra:lock": str(lock_path)}
        roles = stackroles.roles(load_fleet(fleet_path).fleet)
        return {r.role.name: r.plan("dlinfra") for r in engine.run_all(ROOT, roles, project="dlinfra", config=config)}


@functools.cache
def _pool_team_site_run() -> tuple[Plans, str]:
    """Every stack of the fixture fleet with pool infer-l4 and team audio added and site ams1 removed."""
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
    return _run(text, REFERENCE_LOCK.read_text()), text


@functools.cache
def _person_leaves_run() -> tuple[Plans, str]:
    """The fixture fleet with alice out of team vision (prod's federated VPN) and bob out of staging's VPN users,
    each with their dev box: what a reviewer sees when people leave the lab."""
    data = _fleet_data()
    data["teams"]["vision"]["members"].remove("alice")
    del data["environments"]["prod"]["dev_boxes"]["people"]["alice"]
    data["environments"]["staging"]["client_vpn"]["users"].remove("bob")
    del data["environments"]["staging"]["dev_boxes"]["people"]["bob"]
    text = yaml.safe_dump(data, sort_keys=False)
    return _run(text, REFERENCE_LOCK.read_text()), text


RENUMBERED = ("10.2.", "10.5.")  # prod us-west-2's VPC and subnets move from 10.2.0.0/16 to 10.5.0.0/16


def _lock(allocations: dict[str, str] | None = None) -> dict[str, Any]:
    lock: dict[str, Any] = yaml.safe_load(REFERENCE_LOCK.read_text())
    if allocations is not None:
        lock["allocations"] = allocations
    return lock


def _renumbered_allocations() -> dict[str, str]:
    """Prod us-west-2's VPC and all its subnets renumbered in the address plan.

    What a reviewer sees after `dlinfra cidr --release` of the region's keys and `cidr --update` (or a hand edit
    of the lock): the lock changes, nothing in fleet.yaml does.
    """
    old, new = RENUMBERED
    out = dict(_lock()["allocations"])
    for key, cidr in out.items():
        if key == "vpc/prod/us-west-2" or key.startswith("subnet/prod/us-west-2/"):
            assert cidr.startswith(old), (key, cidr)
            out[key] = new + cidr.removeprefix(old)
    return out


@functools.cache
def _renumbered_vpc_run() -> Plans:
    lock = yaml.safe_dump(_lock(_renumbered_allocations()), sort_keys=False)
    return _run(REFERENCE_FLEET.read_text(), lock)


def _named(plans: Plans, stack: str, name: str) -> dict[str, Any]:
    (found,) = [r for r in plans[stack]["resources"] if r["name"] == name]
    return found


def _report(head: Plans, head_fleet: dict[str, Any] | None = None, head_lock: dict[str, str] | None = None) -> str:
    base_fleet = _fleet_data()
    result = compare(
        PlanSet(
            label="main",
            plans=_base(),
            lock=_lock()["allocations"],
            topology=topology(base_fleet),
            cost=cost.estimate(_base().values()).to_json(),
        ),
        PlanSet(
            label="pull request",
            plans=head,
            lock=head_lock if head_lock is not None else _lock()["allocations"],
            topology=topology(head_fleet or base_fleet),
            cost=cost.estimate(head.values()).to_json(),
        ),
    )
    return render.render_markdown(result)


def renumber_vpc() -> str:
    return _report(_renumbered_vpc_run(), head_lock=_renumbered_allocations())


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


def person_leaves() -> str:
    head, text = _person_leaves_run()
    return _report(head, yaml.safe_load(text))


SCENARIOS = {
    "person-leaves.md": person_leaves,
    "renumber-vpc.md": renumber_vpc,
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
    assert path.exists(), f"{path} is missing: run UPDATE_GOLDEN=1 pytest tests/review/diff/test_golden.py"
    assert text == path.read_text(), (
        f"{name} changed: review, then run UPDATE_GOLDEN=1 pytest tests/review/diff/test_golden.py"
    )


def test_the_reports_say_what_a_reviewer_must_see_first() -> None:
    renumber = (GOLDEN / "renumber-vpc.md").read_text()
    assert renumber.index("Stateful resources would be replaced") < renumber.index("| stack | create |")
    assert "`storage-lustre` in `prod-us-west-2` (forced by subnetIds)" in renumber
    assert "`~ network prod/us-west-2 10.2.0.0/16 → 10.5.0.0/16 (and its subnets)`" in renumber
    # Everything downstream of the VPC is listed, stateful first, across stacks: EFS mount targets, the Lustre file
    # system, Client VPN routes and rules in every region, the peering routes of the global stack.
    section = renumber[renumber.index("### `prod-us-west-2`") :]
    replaced = section[: section.index("**Delete**")]
    assert replaced.index("`storage-lustre`") < replaced.index("`network-vpc`")
    for name in ("storage-efs-us-west-2a", "client-vpn-association-us-west-2a", "network-private-us-west-2c"):
        assert f"| `{name}` |" in replaced, name
    assert "| … |" not in replaced
    assert "| `aws:ec2clientvpn/authorizationRule:AuthorizationRule` | 13 | `targetNetworkCidr` |" in renumber
    assert "`peering-us-east-1-us-west-2-route-us-east-1-vpc-us-west-2` | `destinationCidrBlock`" in renumber
    protected = (GOLDEN / "protected-deletion.md").read_text()
    assert protected.index("This apply stops here") < protected.index("| stack | create |")
    raised = (GOLDEN / "raise-pool-max.md").read_text()
    assert "| `prod-us-west-2` | 2,732.54 → 2,732.54 | 0 | 65,999.60 → 106,309.61 | +40,310.01 |" in raised
    entities = (GOLDEN / "add-pool-and-team-remove-site.md").read_text()
    assert "`- site ams1 (prod, 3 regions)`, `+ pool infer-l4 (prod, 2 regions)`" in entities


def test_a_new_team_pool_and_removed_site_read_as_quotas() -> None:
    """The reviewer sees what each team gets, flavor by flavor, not a Kueue spec cut at 80 characters."""
    report = (GOLDEN / "add-pool-and-team-remove-site.md").read_text()
    section = report[report.index("### Team GPU quotas") :].split("\n### ", 1)[0]
    assert "> - team audio is guaranteed no GPUs in environment staging" in section  # new: a warning
    assert "- team robotics is guaranteed no GPUs in environment staging" in section  # already so: listed once
    assert "| `audio` | prod | **all regions** | | **– → 8** | – → 616 |" in section
    assert "| `vision` | prod | eu-west-1 | `site-ams1` | 19 → – | 45 → – |" in section  # the site is gone
    assert "| `vision` | prod | us-west-2 | `pool-infer-l4` | – → 5 | – → 11 |" in section  # the new pool
    assert "| `vision` | prod | **all regions** | | **192 → 192** | 464 → 432 |" in section


def test_a_person_who_leaves_loses_their_box_and_its_access() -> None:
    """Issue 26: a person removed from the fleet loses their box, its key and their way to it in the same plan."""
    report = (GOLDEN / "person-leaves.md").read_text()
    assert "`- dev box alice (prod, 1 region)`" in report and "`- dev box bob (staging, 1 region)`" in report
    deleted = report[report.index("**Delete**") :]
    for name in (
        "devbox-alice-gpu-instance",  # the box, with the user data that held alice's key
        "devbox-alice-authorize-vision",  # her team's way to the box's address
        "devbox-alice-sg-ssh-from-laptops",
        "devbox-alice-home",  # the box's right to mount her home
        "devbox-bob-cpu-instance",
        "client-vpn-user-bob-cert",  # bob's VPN certificate: no laptop of his connects to staging any more
    ):
        assert f"`{name}`" in deleted, name
    head, _text = _person_leaves_run()
    assert not [r["name"] for plan in head.values() for r in plan["resources"] if r["name"].startswith("devbox-")]
