"""`dlinfra cost`: the price table, the estimate of the reference fleet against a hand calculation, the CLI."""

from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from dlinfra.cli import main as cli
from dlinfra.model import stackroles
from dlinfra.review import cost, dev_box_cost
from tests import reference as _reference
from tests.conftest import REFERENCE_FLEET

ON = datetime.date(2026, 11, 22)  # the suite's pinned date: Kubernetes 1.33 is past standard support


@pytest.fixture(scope="module")
def plans() -> dict[str, dict[str, Any]]:
    """Plan exports of every reference stack, from the shared offline run (not a preview per test)."""
    project = _reference.fleet().project
    return {name: result.plan(project) for name, result in _reference.runs().items()}


@pytest.fixture(scope="module")
def report(plans: dict[str, dict[str, Any]]) -> cost.Report:
    return cost.estimate(plans.values(), on=ON)


@pytest.fixture(scope="module")
def plan_dir(plans: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("plans")
    for name, plan in plans.items():
        made_from = {**plan, "provenance": _reference.provenance()}  # as `dlinfra preview` writes them
        (folder / f"{name}.json").write_text(json.dumps(made_from, sort_keys=True))
    return folder


def _stack(report: cost.Report, name: str) -> cost.StackCost:
    (match,) = [s for s in report.stacks if s.stack == name]
    return match


def _item(stack: cost.StackCost, label: str) -> cost.LineItem:
    (match,) = [i for i in stack.items if i.label == label]
    return match


def test_price_table_loads_with_source_date_and_honest_marks() -> None:
    table = cost.load_prices()
    assert table.read_on == datetime.date(2026, 11, 23)
    assert table.hours_per_month == 730
    for price in table.prices.values():
        assert price.source.startswith("https://aws.amazon.com/"), price
        assert price.usd > 0 and price.unit
        if price.copied_from:
            assert price.copied_from != price.region and (price.key, price.copied_from) in table.prices
        if price.unverified:
            assert price.note, f"{price.key} ({price.region}) is unverified without saying why"


def test_every_aws_type_in_the_reference_plans_is_classified(plans: dict[str, dict[str, Any]]) -> None:
    emitted = {r["type"] for plan in plans.values() for r in plan["resources"] if r["type"].startswith("aws:")}
    known = cost.FREE | set(cost.NOT_COUNTED) | cost.PRICED
    assert emitted - known == set()
    # Each priced type the fleet uses is in the table for each region the fleet runs in.
    regions = {p["role"]["region"] for p in plans.values() if p["role"]["region"]}
    table = cost.load_prices()
    # Every type a pool runs on in a region (the ones sold there) is priced there.
    fleet = _reference.fleet()
    for env_name, env in fleet.environments.items():
        for region in env.regions:
            for name in fleet.pools_in(env_name, region):
                types = fleet.pool_types(env_name, region, name)
                assert types and all((f"ec2/{t}", region) in table.prices for t in types), (name, region)
    needed = {
        "nat_gateway",
        "nat_gateway_gb",
        "tgw_attachment",
        "tgw_gb",
        "vpn_connection",
        "eks_standard",
        "eks_extended",
        "client_vpn_association",
        "client_vpn_connection",
        "efs_standard",
        "s3_standard",
        "interface_endpoint",
        "public_ipv4",
    }
    assert {(k, r) for k in needed for r in regions} - set(table.prices) == set()


def test_unpriced_type_and_region_are_one_error_listing_them(plans: dict[str, dict[str, Any]]) -> None:
    plan = copy.deepcopy(plans["prod-us-west-2"])
    plan["resources"].append({"type": "aws:rds/instance:Instance", "name": "db", "inputs": {}, "outputs": {}})
    plan["role"]["region"] = "ap-south-1"
    with pytest.raises(cost.CostError) as caught:
        cost.estimate([plan], on=ON)
    message = str(caught.value)
    assert "aws:rds/instance:Instance (db)" in message
    assert "nat_gateway in ap-south-1" in message and "ec2/m7i.4xlarge in ap-south-1" in message


def test_prod_us_west_2_matches_a_hand_calculation(report: cost.Report) -> None:
    stack = _stack(report, "prod-us-west-2")
    # Prices (dlinfra/data/prices.yaml, us-west-2) and 730 h a month; the fleet's prod pools and network:
    cpu_min = 2 * 730 * 0.8064  # cpu pool: min 2 x m7i.4xlarge (first override; spot share priced on demand)
    cpu_max = 40 * 730 * 0.8064  # max 40
    interactive_max = 12 * 730 * 4.6016  # interactive: 0..12 x g6.12xlarge
    fixed = (
        730 * 0.60  # EKS 1.33, upgrade policy EXTENDED, past standard support on 2026-07-29: extended rate
        + 3 * 730 * 0.045  # 3 NAT gateways (one per AZ); data processed assumed 0 GB
        + 3 * 730 * 0.005  # their 3 EIPs (public IPv4)
        + 2 * 730 * 0.05  # TGW attachments: the VPC and the sjc1 VPN
        + 1 * 730 * 0.05  # Site-to-Site VPN connection to sjc1
        + 3 * 730 * 0.10  # Client VPN: 3 subnet associations; connection-hours assumed 0
        + 8 * 3 * 730 * 0.01  # 8 interface endpoints x 3 subnets
        + 2400 * 0.21  # FSx for Lustre PERSISTENT_2, 2400 GiB at 250 MB/s/TiB
    )  # = 1555.20; train-h100 runs on a capacity block (billed up front, not here); EFS and S3 assumed 0 GB
    box_max = 730 * 0.8048  # alice's dev box: a g6.xlarge, stopped all month (0 h) up to running every hour
    assert fixed == pytest.approx(1555.20)
    assert stack.usd_min == pytest.approx(round(cpu_min, 2) + fixed, abs=0.01)  # 2,732.54
    expected_max = round(cpu_max, 2) + round(interactive_max, 2) + round(box_max, 2) + fixed
    assert stack.usd_max == pytest.approx(expected_max, abs=0.01)
    assert stack.usd_min == pytest.approx(2732.54) and stack.usd_max == pytest.approx(65999.60)
    block = _item(stack, "pool train-h100 (p5.48xlarge)")
    assert block.usd_max == 0 and "capacity block" in block.note and block.price_key == ""
    assert "first of 3 overrides" in _item(stack, "pool cpu (m7i.4xlarge)").note
    assert "spot share" in _item(stack, "pool cpu (m7i.4xlarge)").note


def test_prod_eu_west_1_matches_a_hand_calculation(report: cost.Report) -> None:
    stack = _stack(report, "prod-eu-west-1")
    # eu-west-1 prices, from AWS Price List data (prices.yaml notes): dearer than us-east-1 for EC2 and NAT.
    cpu = (2 * 730 * 0.8988, 40 * 730 * 0.8988)  # cpu pool: 2..40 x m7i.4xlarge
    interactive_max = 12 * 730 * 6.33167  # g6 is not sold in eu-west-1: the pool runs its g5.12xlarge there
    a100_max = 8 * 730 * 23.71569  # train-a100: 0..8 x p4d.24xlarge
    fixed = (
        730 * 0.60  # EKS, extended support
        + 3 * 730 * 0.048  # 3 NAT gateways
        + 3 * 730 * 0.005  # their EIPs
        + 2 * 730 * 0.05  # TGW attachments: the VPC and the ams1 VPN
        + 730 * 0.05  # Site-to-Site VPN to ams1
        + 3 * 730 * 0.10  # Client VPN associations
        + 8 * 3 * 730 * 0.011  # interface endpoints
        + 2400 * 0.21  # FSx for Lustre
    )
    assert fixed == pytest.approx(1579.29)
    assert stack.usd_min == pytest.approx(round(cpu[0], 2) + fixed, abs=0.01)  # 2,891.54
    expected_max = round(cpu[1], 2) + round(interactive_max, 2) + round(a100_max, 2) + fixed
    assert stack.usd_max == pytest.approx(expected_max, abs=0.02)  # 221,789.31
    assert _item(stack, "pool interactive (g5.12xlarge)").usd_each == 6.33167


def test_global_stack_prices_peering_attachments_per_region(report: cost.Report) -> None:
    stack = _stack(report, "prod-global")
    labels = {i.label: i.usd_min for i in stack.items}
    # 3 peerings, one attachment each, in the requester's region: 2 from eu-west-1, 1 from us-east-1.
    assert labels == {
        "TGW peering attachments (eu-west-1)": pytest.approx(2 * 730 * 0.05),
        "TGW peering attachments (us-east-1)": pytest.approx(1 * 730 * 0.05),
    }


def test_min_never_above_max(report: cost.Report) -> None:
    assert report.usd_min <= report.usd_max
    for stack in report.stacks:
        assert stack.usd_min <= stack.usd_max, stack.stack
        for item in stack.items:
            assert item.usd_min <= item.usd_max, (stack.stack, item.label)


def test_raising_a_pool_max_raises_the_max_cost(plans: dict[str, dict[str, Any]], report: cost.Report) -> None:
    plan = copy.deepcopy(plans["prod-us-west-2"])
    (asg,) = [r for r in plan["resources"] if r["name"] == "pool-cpu-asg"]
    asg["inputs"]["maxSize"] = 50
    raised = _stack(cost.estimate([plan], on=ON), "prod-us-west-2")
    before = _stack(report, "prod-us-west-2")
    assert raised.usd_max == pytest.approx(before.usd_max + 10 * 730 * 0.8064, abs=0.01)
    assert raised.usd_min == before.usd_min


def test_assumptions_are_priced_and_printed(plans: dict[str, dict[str, Any]]) -> None:
    assumed = cost.parse_assumptions(["nat_gb=1000", "s3_gb=500"])
    stack = _stack(cost.estimate([plans["prod-us-west-2"]], assumptions=assumed, on=ON), "prod-us-west-2")
    assert _item(stack, "NAT data processed").usd_min == pytest.approx(1000 * 0.045)
    assert _item(stack, "S3 storage").usd_min == pytest.approx(500 * 0.023)
    with pytest.raises(cost.CostError, match="nat_gb"):
        cost.parse_assumptions(["nat=1"])
    with pytest.raises(cost.CostError, match="not a number"):
        cost.parse_assumptions(["nat_gb=lots"])


def test_json_round_trips(report: cost.Report) -> None:
    data = report.to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["price_date"] == "2026-11-23" and data["hours_per_month"] == 730
    assert data["assumptions"]["nat_gb"] == 0
    assert sum(s["usd_max"] for s in data["stacks"]) == pytest.approx(data["usd_max"])


def test_cli_table_and_json(capsys: pytest.CaptureFixture[str], plan_dir: Path, report: cost.Report) -> None:
    code = cli.main(["cost", "--fleet", str(REFERENCE_FLEET), "--plans", str(plan_dir)])
    out = capsys.readouterr().out
    assert code == 0
    assert "prod-us-west-2" in out and "2,732.54" in out and "65,999.60" in out
    assert "Dev boxes by environment" in out and "587.50" in out  # prod: alice's g6.xlarge, a month at most
    assert "read 2026-11-23" in out and "nat_gb=0" in out and "Not counted:" in out and "EBS volumes" in out
    code = cli.main(["cost", "--json", "--fleet", str(REFERENCE_FLEET), "--plans", str(plan_dir)])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data == json.loads(json.dumps(report.to_json()))
    names = [s["stack"] for s in data["stacks"]]
    assert names == [r.name for r in stackroles.roles(_reference.fleet())]


def test_cli_missing_plans_exit_2_with_one_message(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "prod-us-west-2.json").write_text("{}")
    code = cli.main(["cost", "--fleet", str(REFERENCE_FLEET), "--plans", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert "no plan export" in captured.err and "dlinfra preview --all" in captured.err


def test_cli_bad_assumption_exit_2(capsys: pytest.CaptureFixture[str], plan_dir: Path) -> None:
    code = cli.main(["cost", "--fleet", str(REFERENCE_FLEET), "--plans", str(plan_dir), "--assume", "x=1"])
    assert code == 2 and "--assume" in capsys.readouterr().err


def test_a_shared_pool_is_priced_per_share(report: cost.Report) -> None:
    """staging's interactive pool time-slices each g6.xlarge's one L4 four ways: a share is a quarter of the node."""
    item = _item(_stack(report, "staging-us-west-2"), "pool interactive (g6.xlarge)")
    assert item.note == f"per share and hour: nvidia.com/gpu.shared ${item.usd_each / 4:.3f}"


def test_dev_boxes_cost_per_hour_and_a_month_at_most_by_environment(report: cost.Report) -> None:
    alice = _item(_stack(report, "prod-us-west-2"), "dev box alice (g6.xlarge)")
    bob = _item(_stack(report, "staging-us-west-2"), "dev box bob (m7i.2xlarge)")
    assert (alice.usd_each, alice.unit, alice.usd_min, alice.usd_max) == (0.8048, "instance-hour", 0.0, 587.5)
    assert (bob.usd_each, bob.usd_min, bob.usd_max) == (0.4032, 0.0, round(730 * 0.4032, 2))
    assert "stopped" in alice.note
    boxes = dev_box_cost.by_environment(report.stacks)
    assert boxes == {
        "prod": dev_box_cost.EnvironmentBoxes(1, 0.8048, 587.5),
        "staging": dev_box_cost.EnvironmentBoxes(1, 0.4032, 294.34),
    }
    assert any("CloudWatch alarms" in line for line in report.not_counted)
