"""Shared GPU pools: MIG layouts checked against each GPU's real profiles and placements, time-slicing in range, and
what a shared node offers; each bad layout refused at load with the file and key."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlinfra.errors import FleetError
from dlinfra.model import gpu_health, gpu_sharing, instances, kueue
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.pools import GpuSharing, TimeSlicing

A100_80 = ("A100", "NVIDIA A100-SXM4-80GB")
POOL = "environments.prod.node_pools.notebooks"


def test_the_table_holds_every_mig_capable_product_dlinfra_sells() -> None:
    """Every A100, H100 and H200 instance type's product has profiles; no A10G, L4 or L40S has any (MIG User Guide,
    "Supported GPUs"). Every profile's name says its compute slices, and its placements fit the 8 memory slices."""
    for spec in instances.packaged_types().values():
        if not spec.gpus:
            continue
        known = gpu_sharing.profiles(str(spec.gpu_model), str(spec.gpu_product))
        assert (known is not None) == (spec.gpu_model in {"A100", "H100", "H200"}), spec.name
        for name, profile in (known or {}).items():
            assert name.startswith(f"{profile.compute}g."), name
            # Each profile alone fills the GPU as far as NVIDIA says it can, and one more does not fit.
            assert gpu_sharing.place({name: profile.instances}, known) is not None, name
    for model in gpu_sharing.table().models:
        assert set(gpu_sharing.table().models[model]) <= set(gpu_health.model(model).products)


@pytest.mark.parametrize(
    ("layout", "problem"),
    [
        ({"1g.10gb": 7}, None),
        ({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}, None),  # mig-parted's all-balanced for A100-80GB
        ({"4g.40gb": 1, "3g.40gb": 1}, None),
        ({"3g.40gb": 4}, "holds at most 2 x 3g.40gb per GPU, not 4"),
        ({"1g.5gb": 7}, "has no MIG profile '1g.5gb'"),  # an A100-40GB profile
        ({"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}, "takes 8 compute slices; a GPU has 7"),
        # 3 + 3 + 1 = 7 compute slices, but each 3g instance takes 4 of the 8 memory slices.
        ({"3g.40gb": 2, "1g.10gb": 1}, "the compute slices add up (7 of 7) but the instances do not fit"),
        ({"1g.20gb": 3, "4g.40gb": 1}, "the compute slices add up (7 of 7) but the instances do not fit"),
    ],
)
def test_a_layout_fits_the_gpu_or_says_why(layout: dict[str, int], problem: str | None) -> None:
    found = gpu_sharing.layout_problem(layout, *A100_80)
    assert found == problem if problem is None else problem in str(found)


def test_placements_are_searched_not_just_counted() -> None:
    """3g + 2g + 2g fits only with the 3g at slice 4: a greedy first fit at 0 would refuse it."""
    known = gpu_sharing.profiles(*A100_80)
    assert known is not None
    assert gpu_sharing.place({"3g.40gb": 1, "2g.20gb": 2}, known) == (("3g.40gb", 4), ("2g.20gb", 0), ("2g.20gb", 2))
    # Every layout the search places is one whose instances each sit at a start NVIDIA allows, without overlap.
    for counts in itertools.product(*(range(p.instances + 1) for p in known.values())):
        layout = {n: c for n, c in zip(known, counts, strict=True) if c}
        placed = gpu_sharing.place(layout, known)
        if placed is None:
            continue
        used = [s for name, start in placed for s in range(start, start + known[name].memory)]
        assert len(used) == len(set(used)) and all(start in known[n].starts for n, start in placed), layout


def test_the_node_creates_the_instances_where_validation_placed_them() -> None:
    layout = {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
    # nvidia-smi mig -cgi ID:START (profile ids of `nvidia-smi mig -lgip`: 9 is 3g, 14 is 2g, 19 is 1g).
    assert gpu_sharing.create_argument(layout, *A100_80) == "14:0,19:2,19:3,9:4"
    with pytest.raises(ValueError, match="validation refuses it"):
        gpu_sharing.create_argument({"3g.40gb": 2, "1g.10gb": 1}, *A100_80)


def test_a_shared_node_offers_its_shares_and_never_a_whole_gpu() -> None:
    mig = GpuSharing(mig={"1g.10gb": 4, "3g.40gb": 1})
    assert gpu_sharing.per_node(mig, 8) == {"nvidia.com/mig-1g.10gb": 32, "nvidia.com/mig-3g.40gb": 8}
    sliced = GpuSharing(time_slicing=TimeSlicing(replicas=4))
    assert gpu_sharing.per_node(sliced, 1) == {"nvidia.com/gpu.shared": 4}
    assert gpu_sharing.shares_tag(mig) == "nvidia.com/mig-1g.10gb=4 nvidia.com/mig-3g.40gb=1"  # no commas: AWS refuses
    assert gpu_sharing.parse_shares_tag(gpu_sharing.shares_tag(mig)) == gpu_sharing.per_gpu(mig)
    # The device plugin: MIG by profile (mixed), time-slicing renamed so a whole-GPU request never gets a turn.
    assert gpu_sharing.device_plugin_config(mig)["flags"] == {"migStrategy": "mixed"}
    slicing = gpu_sharing.device_plugin_config(sliced)["sharing"]["timeSlicing"]
    assert slicing["renameByDefault"] and slicing["failRequestsGreaterThanOne"]
    assert slicing["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]


def test_the_autoscaler_template_says_no_whole_gpu_and_keeps_notebooks() -> None:
    mig = GpuSharing(mig={"1g.10gb": 4, "3g.40gb": 1})
    # The AWS provider fills in the instance type's GPUs unless a tag says otherwise.
    assert gpu_sharing.template_resources(mig, 8) == {
        "nvidia.com/gpu": 0, "nvidia.com/mig-1g.10gb": 32, "nvidia.com/mig-3g.40gb": 8,
    }  # fmt: skip
    (threshold,) = gpu_sharing.autoscaler_options().values()
    assert float(threshold) == gpu_sharing.SHARED_SCALE_DOWN_THRESHOLD > 0  # 0 keeps an empty node before 1.32
    # Any pod that asks for 1m CPU keeps its node, on every GPU instance type dlinfra knows.
    most_vcpus = max(t.vcpus for t in instances.all_types().values() if t.gpus)
    assert 0.001 / most_vcpus > gpu_sharing.SHARED_SCALE_DOWN_THRESHOLD  # 1m CPU on the largest type


def test_a_share_costs_its_part_of_the_node() -> None:
    prices = gpu_sharing.share_prices(28.0, {"nvidia.com/mig-1g.10gb": 4, "nvidia.com/mig-3g.40gb": 1}, 8)
    # 8 GPUs x (4 x 1 + 1 x 3) = 56 compute slices used: $0.50 a slice.
    assert prices == {"nvidia.com/mig-1g.10gb": 0.5, "nvidia.com/mig-3g.40gb": 1.5}
    assert gpu_sharing.share_prices(1.0, {"nvidia.com/gpu.shared": 4}, 1) == {"nvidia.com/gpu.shared": 0.25}


def _pool(sharing: dict[str, Any], instance_types: list[str] | None = None, **more: Any) -> Callable[..., None]:
    """A prod pool `notebooks` of p4de.24xlarge (A100-80GB) in us-west-2 with this gpu_sharing."""

    def change(data: dict[str, Any]) -> None:
        data["environments"]["prod"]["node_pools"]["notebooks"] = {
            "kind": "gpu",
            "instance_types": instance_types or ["p4de.24xlarge"],
            "regions": ["us-west-2"],
            "max_size": 2,
            "gpu_sharing": sharing,
            **more,
        }

    return change


BAD = [
    pytest.param(
        _pool({"mig": {"3g.40gb": 4}}), f"{POOL}.gpu_sharing.mig", "holds at most 2 x 3g.40gb per GPU, not 4",
        id="more-instances-than-the-gpu-holds",
    ),
    pytest.param(
        _pool({"mig": {"1g.5gb": 7}}), f"{POOL}.gpu_sharing.mig.1g.5gb",
        "NVIDIA A100-SXM4-80GB has no MIG profile '1g.5gb'", id="a-profile-the-model-does-not-have",
    ),
    pytest.param(
        _pool({"mig": {"3g.40gb": 2, "1g.10gb": 1}}), f"{POOL}.gpu_sharing.mig",
        "the compute slices add up (7 of 7) but the instances do not fit the GPU's 8 memory slices",
        id="placements-that-do-not-fit",
    ),
    pytest.param(
        _pool({"mig": {"1g.10gb": 7}}, ["p4de.24xlarge", "p5.48xlarge"]), f"{POOL}.instance_types",
        "a MIG pool's instance types must have one GPU product", id="two-gpu-models",
    ),
    pytest.param(
        _pool({"mig": {"1g.10gb": 7}}, ["g6.12xlarge"]), f"{POOL}.gpu_sharing.mig",
        "NVIDIA L4 (L4) has no MIG", id="a-gpu-without-mig",
    ),
    pytest.param(
        _pool({"time_slicing": {"replicas": 64}}), f"{POOL}.gpu_sharing.time_slicing.replicas",
        "64 is outside 2..16", id="too-many-replicas",
    ),
    pytest.param(
        _pool({"time_slicing": {"replicas": 1}}), f"{POOL}.gpu_sharing.time_slicing.replicas", "1 is no sharing",
        id="one-replica",
    ),
    pytest.param(
        _pool({"mig": {"1g.10gb": 7}, "time_slicing": {"replicas": 2}}), f"{POOL}.gpu_sharing",
        "give exactly one of mig", id="both",
    ),
    pytest.param(
        _pool({"mig": {"7g": 1}}), f"{POOL}.gpu_sharing.mig", "'7g' is not a MIG profile name", id="not-a-name",
    ),
    pytest.param(
        _pool({"mig": {"1g.10gb": 7}}, gpu_check={"throughput": True}), f"{POOL}",
        "on a MIG pool the burn-in checks the GPUs", id="throughput-floors-on-mig",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("change", "key", "message"), BAD)
def test_an_impossible_sharing_is_refused_naming_the_key(
    fleet_error: Callable[..., str], change: Any, key: str, message: str
) -> None:
    text = fleet_error(change)
    assert key in text and message in text, text


def test_two_shared_pools_offer_the_same_shares_or_none_in_common(write_fleet: Callable[..., Path]) -> None:
    def change(data: dict[str, Any]) -> None:
        _pool({"mig": {"1g.10gb": 7}})(data)
        other = {**data["environments"]["prod"]["node_pools"]["notebooks"], "gpu_sharing": {"mig": {"1g.10gb": 3,
                 "3g.40gb": 1}}}  # fmt: skip
        data["environments"]["prod"]["node_pools"]["notebooks-big"] = other

    path = write_fleet(change)
    with pytest.raises(FleetError, match=r"Kueue counts nvidia\.com/mig-1g\.10gb in one resource group"):
        load_fleet(path)


def test_a_mig_pools_flavor_counts_its_shares_and_its_burn_in_judges_the_layout(
    write_fleet: Callable[..., Path],
) -> None:
    fleet = load_fleet(write_fleet(_pool({"mig": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}))).fleet
    pool = fleet.environments["prod"].node_pools["notebooks"]
    assert (pool.burn_in.dcgm_level, pool.burn_in.throughput) == (0, False)  # whole-GPU tests do not judge slices
    flavor = next(f for f in kueue.flavors(fleet, "prod") if f.source_name == "notebooks")
    assert flavor.gpus == 16  # quotas are still planned in GPUs
    assert flavor.resources == {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-3g.40gb": 1}
    assert pool.gpu_sharing is not None
    expect = gpu_health.pool_expectations(["p4de.24xlarge"], efa=False, check=pool.burn_in, sharing=pool.gpu_sharing)
    mine = expect["instance_types"]["p4de.24xlarge"]
    assert mine["mig"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert mine["resources"]["nvidia.com/mig-1g.10gb"] == 16 and mine["gemm_tflops_floor"] is None
