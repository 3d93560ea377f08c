"""The lab's own catalog beside the fleet: validated like the packaged tables, merged over them for every command,
and only the stacks that use a changed entry run again."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlinfra.cli import main as cli
from dlinfra.errors import FleetError
from dlinfra.model import catalog, instances
from dlinfra.model.fleet.load import load_fleet
from dlinfra.review import cost

G6E = {
    "vcpus": 4, "memory_gib": 32, "gpus": 1, "gpu_model": "L40S", "gpu_memory_gib": 48,
    "gpu_product": "NVIDIA L40S", "efa_interfaces": 0, "network_cards": 1, "nvswitch": False, "max_pods": 58,
    "max_enis": 4, "ipv4_per_eni": 15, "architecture": "x86_64", "offered_in": ["us-east-1", "us-west-2"],
}  # fmt: skip
PRICE = {"unit": "instance-hour", "source": "https://aws.amazon.com/ec2/pricing/on-demand/", "regions": {}}


@pytest.fixture(autouse=True)
def _packaged_tables_after() -> Iterator[None]:
    yield
    catalog.install(catalog.EMPTY)  # the next test starts from the packaged tables


def _use_g6e(data: dict[str, Any]) -> None:
    data["environments"]["staging"]["node_pools"]["interactive"]["instance_types"] = ["g6e.xlarge"]


def _catalog(fleet: Path, **sections: Any) -> Path:
    path = fleet.parent / "catalog.yaml"
    path.write_text(yaml.safe_dump(sections, sort_keys=False))
    return path


def test_a_pool_may_use_a_type_only_the_labs_catalog_declares(write_fleet: Callable[..., Path]) -> None:
    fleet = write_fleet(_use_g6e)
    with pytest.raises(FleetError, match=r"unknown instance type 'g6e\.xlarge'.*catalog\.yaml beside the fleet"):
        load_fleet(fleet)
    _catalog(fleet, instance_types={"g6e.xlarge": G6E})
    loaded = load_fleet(fleet)
    assert loaded.fleet.environments["staging"].node_pools["interactive"].instance_types == ("g6e.xlarge",)
    assert instances.lookup("g6e.xlarge").gpu_model == "L40S"
    assert instances.lookup("p5.48xlarge").gpus == 8  # the packaged table is still there under it


def test_a_bad_entry_is_refused_naming_the_catalog_and_the_key(write_fleet: Callable[..., Path]) -> None:
    fleet = write_fleet()
    path = _catalog(fleet, instance_types={"g6e.xlarge": {**G6E, "vcpus": 0}})
    with pytest.raises(FleetError) as caught:
        load_fleet(fleet)
    assert caught.value.file == str(path) and caught.value.key == "instance_types.g6e.xlarge"
    assert "vcpus" in caught.value.detail
    bad_price = {"ec2/g6e.xlarge": {**PRICE, "regions": {"us-west-2": {"usd": "cheap"}}}}
    _catalog(fleet, prices=bad_price)
    with pytest.raises(FleetError) as caught:
        load_fleet(fleet)
    assert caught.value.key == "prices.ec2/g6e.xlarge.regions.us-west-2.usd"
    _catalog(fleet, instance_type={"g6e.xlarge": G6E})
    with pytest.raises(FleetError, match="unknown section"):
        load_fleet(fleet)


def test_cost_reads_the_labs_prices_over_the_packaged_ones(write_fleet: Callable[..., Path]) -> None:
    fleet = write_fleet(_use_g6e)
    prices = {
        "ec2/g6e.xlarge": {**PRICE, "regions": {"us-west-2": {"usd": 1.861}}},
        "ec2/g6.xlarge": {**PRICE, "regions": {"us-west-2": {"usd": 0.9}}},  # the lab's negotiated rate wins
    }
    _catalog(fleet, instance_types={"g6e.xlarge": G6E}, prices=prices)
    load_fleet(fleet)
    table = cost.load_prices()
    assert table.get("ec2/g6e.xlarge", "us-west-2").usd == 1.861  # type: ignore[union-attr]
    assert table.get("ec2/g6.xlarge", "us-west-2").usd == 0.9  # type: ignore[union-attr]
    assert table.get("ec2/g6.xlarge", "us-east-1").usd == 0.8048  # type: ignore[union-attr]


def _preview(fleet: Path, out: Path, *extra: str) -> dict[str, Any]:
    buffer = io.StringIO()
    argv = ["preview", "--all", "--json", "--jobs", "2", "--fleet", str(fleet), "--out", str(out), *extra]
    with contextlib.redirect_stdout(buffer):
        code = cli.main(argv)
    assert code == 0
    return dict(json.loads(buffer.getvalue()))


def test_only_the_stacks_whose_pools_use_a_changed_entry_run_again(
    write_fleet: Callable[..., Path], tmp_path: Path
) -> None:
    fleet = write_fleet(_use_g6e)
    _catalog(fleet, instance_types={"g6e.xlarge": G6E})
    out = tmp_path / "build" / "plans"
    _preview(fleet, out)
    # A type no pool uses, and a price: no plan can change, nothing runs.
    unused = {**G6E, "vcpus": 8, "memory_gib": 64}
    prices = {"ec2/g6e.xlarge": {**PRICE, "regions": {"us-west-2": {"usd": 1.861}}}}
    _catalog(fleet, instance_types={"g6e.xlarge": G6E, "g6e.2xlarge": unused}, prices=prices)
    assert _preview(fleet, out)["cache"]["ran"] == []
    # Figures of the type staging's pool uses (max_pods, in its nodes' user data): staging's stacks only, with
    # the plans a run without the cache makes.
    before = _plans(out)
    _catalog(fleet, instance_types={"g6e.xlarge": {**G6E, "max_enis": 3, "max_pods": 44}}, prices=prices)
    again = _preview(fleet, out)
    assert set(again["cache"]["ran"]) == {"staging-us-west-2", "staging-us-west-2-k8s"}
    after = _plans(out)
    assert after["staging-us-west-2"] != before["staging-us-west-2"]
    assert {s for s in after if after[s] != before[s]} <= {"staging-us-west-2", "staging-us-west-2-k8s"}
    _preview(fleet, tmp_path / "fresh" / "plans", "--no-cache")
    assert _plans(tmp_path / "fresh" / "plans") == after
    plan = json.loads((out / "staging-us-west-2.json").read_text())
    assert plan["provenance"]["catalog"] != "missing"


def _plans(out: Path) -> dict[str, Any]:
    plans = {}
    for path in sorted(out.glob("*.json")):
        data = json.loads(path.read_text())
        data.pop("provenance")
        plans[path.stem] = data
    return plans


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        ({"gpu_model": "B200", "gpu_product": "NVIDIA B200"}, "gpu_model", "not one the GPU health check knows"),
        ({"gpu_product": "NVIDIA L4"}, "gpu_product", "must be one of L40S's products"),
        ({"architecture": "arm64"}, "architecture", "only x86_64 types"),
        ({"offered_in": None}, "offered_in", "say where AWS sells it"),
    ],
)
def test_a_type_the_nodes_could_not_run_is_refused(
    write_fleet: Callable[..., Path], change: dict[str, Any], key: str, words: str
) -> None:
    fleet = write_fleet()
    entry = {k: v for k, v in {**G6E, **change}.items() if v is not None}
    path = _catalog(fleet, instance_types={"g6e.xlarge": entry})
    with pytest.raises(FleetError) as caught:
        load_fleet(fleet)
    assert caught.value.file == str(path) and caught.value.key == f"instance_types.g6e.xlarge.{key}"
    assert words in caught.value.detail
    _catalog(fleet, instance_types={"G6E_XLARGE": G6E})
    with pytest.raises(FleetError, match="not an EC2 instance type name"):
        load_fleet(fleet)
