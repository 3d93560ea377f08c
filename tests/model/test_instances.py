"""The instance-type table: key figures, internal consistency, lookups and their errors."""

from __future__ import annotations

import pytest
import yaml

from dlinfra.model import instances
from dlinfra.model.instances import InstanceTableError, InstanceType, UnknownInstanceType
from tests.conftest import ROOT

# (name, vcpus, memory_gib, gpus, gpu_model, gpu_memory_gib, efa_interfaces, network_cards, nvswitch)
KEY_FIGURES = [
    ("p4d.24xlarge", 96, 1152, 8, "A100", 40, 4, 4, True),
    ("p4de.24xlarge", 96, 1152, 8, "A100", 80, 4, 4, True),
    ("p5.48xlarge", 192, 2048, 8, "H100", 80, 32, 32, True),
    ("p5e.48xlarge", 192, 2048, 8, "H200", 141, 32, 32, True),
    ("p5en.48xlarge", 192, 2048, 8, "H200", 141, 16, 16, True),
    ("g5.xlarge", 4, 16, 1, "A10G", 24, 0, 1, False),
    ("g5.4xlarge", 16, 64, 1, "A10G", 24, 0, 1, False),
    ("g5.8xlarge", 32, 128, 1, "A10G", 24, 1, 1, False),
    ("g5.12xlarge", 48, 192, 4, "A10G", 24, 1, 1, False),
    ("g5.48xlarge", 192, 768, 8, "A10G", 24, 1, 1, False),
    ("g6.xlarge", 4, 16, 1, "L4", 24, 0, 1, False),
    ("g6.12xlarge", 48, 192, 4, "L4", 24, 1, 1, False),
    ("g6.24xlarge", 96, 384, 4, "L4", 24, 1, 1, False),
    ("g6.48xlarge", 192, 768, 8, "L4", 24, 1, 1, False),
    ("m7i.2xlarge", 8, 32, 0, None, 0, 0, 1, False),
    ("m7i.4xlarge", 16, 64, 0, None, 0, 0, 1, False),
    ("c7i.4xlarge", 16, 32, 0, None, 0, 0, 1, False),
    ("r7i.4xlarge", 16, 128, 0, None, 0, 0, 1, False),
]

REQUIRED = (
    ["p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"]
    + [f"g5.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")]
    + [f"g6.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")]
    + [
        "m7i.2xlarge",
        "m7i.4xlarge",
        "m6i.4xlarge",
        "c7i.4xlarge",
        "m7i.8xlarge",
        "c6i.4xlarge",
        "r7i.4xlarge",
    ]
)

# Families whose 8-GPU boards sit on an NVSwitch fabric (HGX); nothing else may claim one.
NVSWITCH_FAMILIES = {"p4d", "p4de", "p5", "p5e", "p5en"}


@pytest.mark.parametrize(
    ("name", "vcpus", "memory", "gpus", "model", "gpu_mem", "efa", "cards", "nvswitch"), KEY_FIGURES
)
def test_key_figures(
    name: str,
    vcpus: int,
    memory: int,
    gpus: int,
    model: str | None,
    gpu_mem: int,
    efa: int,
    cards: int,
    nvswitch: bool,
) -> None:
    t = instances.lookup(name)
    assert (t.vcpus, t.memory_gib, t.gpus, t.gpu_model, t.gpu_memory_gib) == (
        vcpus,
        memory,
        gpus,
        model,
        gpu_mem,
    )
    assert (t.efa_interfaces, t.network_cards, t.nvswitch) == (efa, cards, nvswitch)
    assert t.architecture == "x86_64"


# (name, max_enis, ipv4_per_eni, addresses a full node holds): aws/amazon-vpc-cni-k8s vpc_ip_resource_limit.go.
ENI_FIGURES = [
    ("p5.48xlarge", 2, 50, 100),
    ("p5en.48xlarge", 4, 50, 200),
    ("p4d.24xlarge", 15, 50, 750),
    ("g5.xlarge", 4, 15, 60),
    ("g5.48xlarge", 7, 50, 350),
    ("g6.12xlarge", 8, 30, 240),
    ("m7i.4xlarge", 8, 30, 240),
]


@pytest.mark.parametrize(("name", "enis", "per_eni", "addresses"), ENI_FIGURES)
def test_eni_figures(name: str, enis: int, per_eni: int, addresses: int) -> None:
    t = instances.lookup(name)
    assert (t.max_enis, t.ipv4_per_eni, t.vpc_cni_addresses) == (enis, per_eni, addresses)


@pytest.mark.parametrize("name", REQUIRED)
def test_required_types_present(name: str) -> None:
    assert name in instances.all_types()


@pytest.mark.parametrize("t", list(instances.all_types().values()), ids=lambda t: t.name)
def test_entry_consistent(t: InstanceType) -> None:
    assert t.name == t.name.strip().lower() and "." in t.name
    if t.gpus:
        assert t.gpu_model and t.gpu_memory_gib > 0
        assert instances.is_gpu(t.name)
    else:
        assert t.gpu_model is None and t.gpu_memory_gib == 0
        assert not instances.is_gpu(t.name)
    assert 0 <= t.efa_interfaces <= t.network_cards
    assert t.nvswitch == (t.family in NVSWITCH_FAMILIES)
    assert t.max_pods is None or t.max_pods > 0
    assert t.vpc_cni_addresses == t.max_enis * t.ipv4_per_eni
    assert t.total_gpu_memory_gib == t.gpus * t.gpu_memory_gib


def test_reference_fleet_types_fit_their_pools() -> None:
    # The reference fleet's training pools use EFA; interactive pools need GPUs; CPU pools must not.
    for name in ("p5.48xlarge", "p4d.24xlarge"):
        assert instances.lookup(name).efa_supported
    for name in ("g6.12xlarge", "g5.12xlarge", "g6.xlarge"):
        assert instances.is_gpu(name)
    for name in ("m7i.4xlarge", "m6i.4xlarge", "c7i.4xlarge", "m7i.2xlarge"):
        assert not instances.is_gpu(name)


def test_offered_regions_are_regions_dlinfra_knows() -> None:
    known = set(yaml.safe_load((ROOT / "dlinfra" / "data" / "regions.yaml").read_text()))
    for t in instances.all_types().values():
        assert t.offered_in is None or (t.offered_in and set(t.offered_in) <= known), t.name
    assert not instances.offered("p5.48xlarge", "eu-west-1") and instances.offered("p4d.24xlarge", "eu-west-1")
    assert instances.offered("m7i.4xlarge", "eu-west-1")  # not established: assumed sold


def test_small_g_types_have_no_efa() -> None:
    for family in ("g5", "g6"):
        for size in ("xlarge", "2xlarge", "4xlarge"):
            assert not instances.lookup(f"{family}.{size}").efa_supported


def test_unknown_type_suggests_close_matches() -> None:
    with pytest.raises(UnknownInstanceType) as info:
        instances.lookup("p5.48xlage")
    message = str(info.value)
    assert "unknown instance type 'p5.48xlage'" in message
    assert "did you mean p5.48xlarge" in message
    assert "catalog.yaml beside the fleet" in message  # where a lab adds its own types
    assert isinstance(info.value, KeyError)


def test_unknown_type_without_close_match_lists_families() -> None:
    with pytest.raises(UnknownInstanceType, match=r"known families: .*p5.*"):
        instances.is_gpu("zz9.plural")


def test_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        instances.all_types()["x"] = instances.lookup("p5.48xlarge")  # type: ignore[index]


_GOOD_ENTRY = {
    "vcpus": 2,
    "memory_gib": 8,
    "gpus": 0,
    "gpu_model": None,
    "gpu_memory_gib": 0,
    "efa_interfaces": 0,
    "network_cards": 1,
    "nvswitch": False,
    "max_enis": 2,
    "ipv4_per_eni": 4,
    "architecture": "x86_64",
}


def _table(**changes: object) -> str:
    return yaml.safe_dump({"a.large": {**_GOOD_ENTRY, **changes}})


def test_good_entry_parses() -> None:
    assert instances.parse_table(_table(), "table.yaml")["a.large"].vcpus == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a.large: {vcpus: 2}\n", r"a\.large: .*memory_gib: Field required"),
        (_table(gpus=1), r"gpus, gpu_model and gpu_memory_gib"),
        (_table(gpu_model="L4"), r"gpus, gpu_model and gpu_memory_gib"),
        (_table(efa_interfaces=2), r"efa_interfaces \(2\) cannot exceed network_cards \(1\)"),
        (
            _table(gpus=1, gpu_model="L4", gpu_memory_gib=24, gpu_product="NVIDIA L4", nvswitch=True),
            r"nvswitch: only 8-GPU",
        ),
        (_table(gpus=1, gpu_model="L4", gpu_memory_gib=24), r"gpu_product: the NVML product name"),
        (_table(gpu_product="NVIDIA L4"), r"gpu_product: the NVML product name"),
        (_table(colour="red"), r"colour: Extra inputs are not permitted"),
        (_table(architecture="sparc"), r"architecture: Input should be 'x86_64' or 'arm64'"),
        (_table(vcpus=0), r"vcpus: Input should be greater than 0"),
        (_table(max_pods=9), r"max_pods \(9\) must be max_enis \* \(ipv4_per_eni - 1\) \+ 2 = 8"),
        (_table(max_enis=0), r"max_enis: Input should be greater than 0"),
        ("[1, 2]\n", r"expected a mapping"),
        ("a.large: 3\n", r"a\.large: expected a mapping of figures"),
        ("a: [\n", r"not valid YAML"),
        ("a.large: {vcpus: 1}\na.large: {vcpus: 2}\n", r"not valid YAML"),
    ],
)
def test_bad_table_is_rejected_with_file_and_key(text: str, expected: str) -> None:
    with pytest.raises(InstanceTableError, match=expected) as info:
        instances.parse_table(text, "table.yaml")
    assert str(info.value).startswith("table.yaml")
