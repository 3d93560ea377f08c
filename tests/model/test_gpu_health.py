"""The GPU model table and the health check's expectations: every GPU dlinfra runs has an entry, floors carry their
measurement, and what `dlinfra gpu expect` writes is what the check on the machine reads and judges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlinfra.cli import main as cli
from dlinfra.model import gpu_health, instances
from dlinfra.model.fleet.labels import label_value_problem
from tests.chef._gpu_check import gpu_check
from tests.chef.test_gpu_check import FIXTURES, recorded
from tests.conftest import REFERENCE_FLEET


def test_every_gpu_model_of_the_instance_table_is_known() -> None:
    used = {t.gpu_model for t in instances.all_types().values() if t.gpu_model}
    assert used <= set(gpu_health.table().models), used - set(gpu_health.table().models)


def test_every_gpu_type_names_a_product_of_its_model_and_its_label_is_nvidia_s() -> None:
    for spec in instances.all_types().values():
        if spec.gpu_model is None:
            continue
        assert spec.gpu_product in gpu_health.model(spec.gpu_model).products, spec.name
        labels = gpu_health.gpu_labels(spec.gpu_model, str(spec.gpu_product))
        assert labels["dlinfra.io/gpu-model"] == spec.gpu_model
        assert labels["nvidia.com/gpu.product"] == str(spec.gpu_product).replace(" ", "-")
        assert label_value_problem(labels["nvidia.com/gpu.product"]) is None, spec.name
    # As GPU feature discovery writes it (NVIDIA/k8s-device-plugin internal/lm/resource.go: spaces to '-').
    assert gpu_health.product_label("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert gpu_health.product_label("NVIDIA A100-SXM4-40GB") == "NVIDIA-A100-SXM4-40GB"
    # An environment whose admitted jobs still select the short name keeps it in NVIDIA's key.
    assert gpu_health.gpu_labels("H100", "NVIDIA H100 80GB HBM3", "short")["nvidia.com/gpu.product"] == "H100"


@pytest.mark.parametrize(
    ("gpu_model", "declared", "product", "refused"),
    [
        ("H100", None, "NVIDIA H100 80GB HBM3", None),  # one product: the model's
        ("A100", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", None),
        ("A100", None, None, "A100 comes as .*say which one the machines have"),  # 40 or 80 GB: say which
        ("H100", "NVIDIA A10G", None, "'NVIDIA A10G' is not a product of H100"),
    ],
)
def test_a_site_s_product_is_its_model_s_or_the_one_it_names(
    gpu_model: str, declared: str | None, product: str | None, refused: str | None
) -> None:
    if refused is None:
        assert gpu_health.site_product(gpu_model, declared) == product
    else:
        with pytest.raises(ValueError, match=refused):
            gpu_health.site_product(gpu_model, declared)


def test_every_floor_names_its_measurement_and_products_look_like_nvml_names() -> None:
    for name, model in gpu_health.table().models.items():
        for floor in (model.gemm_tflops, model.bandwidth_gbs):
            if floor is not None:  # NVIDIA's DCGM threshold, or 0.75 of a named measurement
                assert "DCGM" in floor.source or floor.source.startswith("0.75 x "), name
        assert all(p.strip() == p and "  " not in p for p in model.products), name
    assert set(gpu_health.table().failing_xids) >= {48, 64, 74, 79, 95}  # DBE, remap failure, NVLink, bus, ECC
    assert not set(gpu_health.table().failing_xids) & {13, 31, 43, 63, 94, 154}  # the application's, or info


def test_a_p5_expectation_carries_count_model_efa_and_floors() -> None:
    spec = gpu_health.instance_expectation("p5.48xlarge", efa=True, dcgm_level=2)
    expect = gpu_check.Expectation.from_json(spec)
    assert (expect.gpu_count, expect.products, expect.memory_health) == (8, ("NVIDIA H100 80GB HBM3",), "row_remap")
    assert expect.efa_devices == instances.lookup("p5.48xlarge").efa_interfaces == 32
    assert expect.fabric  # NVSwitch: Fabric Manager must have trained it
    assert not gpu_health.instance_expectation("g6.12xlarge", efa=False)["fabric"]
    assert expect.dcgm_level == 2 and expect.failing_xids[79] == "RESTART_BM"
    assert expect.gemm_tflops_floor == 587 and expect.bandwidth_gbs_floor == 1905
    assert gpu_health.expectation("A10G", 1)["gemm_tflops_floor"] is None  # no healthy measurement found
    # p4d's A100s are the 40 GB ones, p4de's the 80 GB ones: each refuses the other.
    assert gpu_health.instance_expectation("p4d.24xlarge", efa=False)["products"] == [
        "NVIDIA A100-SXM4-40GB",
        "A100-SXM4-40GB",
    ]
    assert gpu_health.instance_expectation("p4de.24xlarge", efa=False)["products"][0] == "NVIDIA A100-SXM4-80GB"
    assert gpu_health.instance_expectation("p5e.48xlarge", efa=False)["products"] == ["NVIDIA H200"]  # one size


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: gpu_health.instance_expectation("m7i.2xlarge", efa=False), "not a GPU instance type"),
        (lambda: gpu_health.expectation("H100", 8, dcgm_level=5), "dcgm_level"),
        (lambda: gpu_health.expectation("V100", 8), "no GPU model 'V100'"),
    ],
)
def test_bad_requests_say_what_is_wrong(call: object, message: str) -> None:
    with pytest.raises((ValueError, gpu_health.GpuTableError), match=message):
        call()  # type: ignore[operator]


def test_dlinfra_gpu_expect_feeds_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "expect.json"
    argv = ["gpu", "expect", "--fleet", str(REFERENCE_FLEET), "--env", "prod", "--region", "us-west-2"]
    assert cli.main([*argv, "--pool", "train-h100", "--dcgm-level", "1", "--out", str(out)]) == 0
    # A pool's nodes carry one expectation per instance type; the check takes the machine's own (DMI product name).
    product = tmp_path / "product_name"
    product.write_text("p5.48xlarge\n")
    expect = gpu_check.Expectation.from_json(gpu_check.select(json.loads(out.read_text()), str(product)))
    assert expect.gpu_count == 8 and expect.efa_devices == 32 and expect.dcgm_level == 1
    product.write_text("p4d.24xlarge\n")
    with pytest.raises(ValueError, match=r"no expectation for instance type 'p4d.24xlarge' \(the pool has p5.48xlarge"):
        gpu_check.select(json.loads(out.read_text()), str(product))
    with pytest.raises(ValueError, match="this machine's is unknown"):
        gpu_check.select(json.loads(out.read_text()), str(tmp_path / "no-dmi"))
    # The recorded healthy H100 node, here without EFA devices, DCGM or PyTorch, fails exactly on those.
    report = gpu_check.check(expect, recorded("h100-healthy.json"), log="", efa_root=str(tmp_path))
    assert {p["check"] for p in report["problems"]} == {"read", "efa", "dcgm", "gemm", "bandwidth"}
    assert next(p["detail"] for p in report["problems"] if p["check"] == "read").startswith("throughput: ")
    assert cli.main([*argv, "--pool", "train-h100", "--no-throughput"]) == 0
    printed = json.loads(capsys.readouterr().out)["instance_types"]["p5.48xlarge"]
    assert printed["gemm_tflops_floor"] is None and printed["bandwidth_gbs_floor"] is None
    # Without --dcgm-level the pool's own burn-in level: the default, DCGM level 2.
    assert cli.main([*argv, "--pool", "train-h100"]) == 0
    assert json.loads(capsys.readouterr().out)["instance_types"]["p5.48xlarge"]["dcgm_level"] == 2


def test_a_shared_pools_expectation_says_what_its_nodes_offer(capsys: pytest.CaptureFixture[str]) -> None:
    """staging's time-sliced interactive pool: `gpu expect` (what the hand-run check uses) and the user data agree that
    its node offers four nvidia.com/gpu.shared for its one L4, which the burn-in agent then waits for."""
    argv = ["gpu", "expect", "--fleet", str(REFERENCE_FLEET), "--env", "staging", "--region", "us-west-2"]
    assert cli.main([*argv, "--pool", "interactive"]) == 0
    printed = json.loads(capsys.readouterr().out)["instance_types"]["g6.xlarge"]
    assert printed["resources"] == {"nvidia.com/gpu.shared": 4} and "mig" not in printed
    expect = gpu_check.Expectation.from_json({**printed, "failing_xids": {}})
    assert expect.resources == {"nvidia.com/gpu.shared": 4} and expect.mig is None


def test_a_site_expectation_follows_its_declaration(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gpu", "expect", "--fleet", str(REFERENCE_FLEET), "--site", "sjc1"]) == 0
    expect = json.loads(capsys.readouterr().out)
    assert (expect["gpu_count"], expect["products"], expect["efa_devices"]) == (8, ["NVIDIA H100 80GB HBM3"], 0)


def test_an_unknown_pool_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["gpu", "expect", "--fleet", str(REFERENCE_FLEET), "--env", "prod", "--region", "us-west-2"]
    assert cli.main([*argv, "--pool", "nope"]) == 2
    assert "environments.prod.node_pools.nope: no such GPU pool" in capsys.readouterr().err
    assert FIXTURES.is_dir()


def test_a_site_of_an_unknown_gpu_model_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = REFERENCE_FLEET.read_text()
    assert "gpu_model: H100" in text
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(text.replace("gpu_model: H100", "gpu_model: V100", 1))
    (tmp_path / "cidr-lock.yaml").write_text((REFERENCE_FLEET.parent / "cidr-lock.yaml").read_text())
    assert cli.main(["gpu", "expect", "--fleet", str(fleet), "--site", "sjc1"]) == 2
    err = capsys.readouterr().err
    assert "sites.sjc1.gpu_model: 'V100' is not a GPU model dlinfra can check" in err
