"""The GPU health check (chef/cookbooks/dlinfra_gpu/files/gpu_check.py) and its watch on recorded GPU readings
(tests/fixtures/gpu), read through nvidia-ml-py's own error class and constants, so a call the check makes that the
bindings do not have fails here; DCGM through a dcgmi on PATH that answers with recorded output. The repair through a
fake IMDS and a fake command runner: no test runs aws or systemctl, or reaches 169.254.169.254."""

from __future__ import annotations

import io
import json
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from tests.chef._gpu_check import gpu_check

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpu"
CATALOG = {48: "RESET_GPU", 63: "RESET_GPU", 64: "RESET_GPU", 79: "RESTART_BM", 94: "RESET_GPU", 95: "RESET_GPU"}
H100 = gpu_check.Expectation(gpu_count=8, products=("NVIDIA H100 80GB HBM3",), memory_health="row_remap",
                             failing_xids=CATALOG)  # fmt: skip


class RecordedNvml:
    """The pynvml functions the check calls, answering from a recorded reading; everything else is pynvml's own."""

    def __init__(self, recording: dict[str, Any], *, init_error: int | None = None) -> None:
        self.recording, self.init_error = recording, init_error
        self.NVMLError = pynvml.NVMLError
        for name in dir(pynvml):
            if name.startswith("NVML_"):
                setattr(self, name, getattr(pynvml, name))
        self.c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t
        self.shut_down = False

    def _answer(self, index: int, key: str) -> Any:
        value = self.recording["gpus"][index][key]
        if value == "not_supported":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self.recording["driver"])

    def nvmlDeviceGetCount(self) -> int:
        return len(self.recording["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int | tuple[int, int]) -> str:
        if isinstance(handle, tuple):  # a MIG device: (its GPU, its slot)
            return str(self.recording["gpus"][handle[0]]["mig_devices"][handle[1]])
        return str(self._answer(handle, "name"))

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return 7  # A100, H100, H200 (MIG User Guide, "Supported GPUs": 7 instances)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, slot: int) -> tuple[int, int]:
        if slot >= len(self.recording["gpus"][handle].get("mig_devices", [])):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return (handle, slot)

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._answer(handle, "pci_bus_id").encode())

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        return tuple(self._answer(handle, "remapped_rows"))  # type: ignore[return-value]

    def nvmlDeviceGetFieldValues(self, handle: int, fields: list[int]) -> list[SimpleNamespace]:
        assert fields == [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        action = self.recording["gpus"][handle].get("recovery_action", 0)
        return [SimpleNamespace(nvmlReturn=pynvml.NVML_SUCCESS, value=SimpleNamespace(uiVal=action))]

    def nvmlDeviceGetGpuFabricInfo(self, handle: int, info: Any) -> int:
        state, status = self.recording["gpus"][handle].get("fabric", [pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, 0])
        info.state, info.status = state, status
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetEccMode(self, handle: int) -> list[int]:
        return list(self.recording["gpus"][handle].get("ecc_mode", [1, 1]))  # current, pending

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        return list(self.recording["gpus"][handle].get("mig_mode", [0, 0]))

    def nvmlDeviceGetRowRemapperHistogram(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(
            **dict(zip(("max", "high", "partial", "low", "none"), self._answer(handle, "row_spares"), strict=True))
        )

    def nvmlDeviceGetRetiredPages(self, handle: int, cause: int) -> list[int]:
        pages = self._answer(handle, "retired_pages")
        single = cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        return list(pages["single_bit" if single else "double_bit"])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        return int(self._answer(handle, "retired_pages")["pending"])

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        return int(self._answer(handle, "uncorrectable_ecc"))


def recorded(name: str) -> RecordedNvml:
    return RecordedNvml(json.loads((FIXTURES / name).read_text()))


def test_the_bindings_have_every_call_the_check_makes() -> None:
    for name in vars(RecordedNvml):
        if name.startswith("nvml"):
            assert callable(getattr(pynvml, name)), name


def test_a_healthy_h100_node_passes(tmp_path: Path) -> None:
    nvml = recorded("h100-healthy.json")
    report = gpu_check.check(H100, nvml, log="", efa_root=str(tmp_path))
    assert report["passed"] and report["checked"], report["problems"]
    gpus = report["reading"]["gpus"]
    assert len(gpus) == 8 and gpus[0]["retired_pages"] is None  # N/A on Hopper: not a problem there
    assert gpus[0]["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0}
    assert nvml.shut_down


def test_pending_and_failed_row_remaps_and_ecc_errors_are_refused(tmp_path: Path) -> None:
    report = gpu_check.check(H100, recorded("h100-memory-errors.json"), log="", efa_root=str(tmp_path))
    assert not report["passed"]
    found = {(p["gpu"], p["check"], p["detail"].split(":")[0]) for p in report["problems"]}
    assert found == {
        (2, "memory", "1 memory banks have no spare rows left"),
        (3, "memory", "a row remapping is pending"),
        (5, "memory", "a row remapping failed"),
        (6, "ecc", "4 uncorrectable ECC errors since the driver loaded"),
    }


def test_a_missing_gpu_is_refused(tmp_path: Path) -> None:
    report = gpu_check.check(H100, recorded("h100-seven-gpus.json"), log="", efa_root=str(tmp_path))
    assert [(p["check"], p["detail"]) for p in report["problems"]] == [("count", "7 GPUs visible, 8 expected")]


def test_the_wrong_model_is_refused(tmp_path: Path) -> None:
    h200 = gpu_check.Expectation(gpu_count=8, products=("NVIDIA H200",), memory_health="row_remap", failing_xids={})
    report = gpu_check.check(h200, recorded("h100-healthy.json"), log="", efa_root=str(tmp_path))
    assert {p["check"] for p in report["problems"]} == {"model"}
    assert len(report["problems"]) == 8


def test_an_ampere_gpu_whose_row_remapper_cannot_be_read_is_refused(tmp_path: Path) -> None:
    nvml = recorded("a10g-healthy.json")
    nvml.recording["gpus"][0]["remapped_rows"] = "not_supported"
    a10g = gpu_check.Expectation(gpu_count=1, products=("NVIDIA A10G",), memory_health="row_remap", failing_xids={})
    (problem,) = gpu_check.check(a10g, nvml, log="", efa_root=str(tmp_path))["problems"]
    assert problem["check"] == "memory" and "not readable" in problem["detail"]


def test_an_older_gpu_reports_retired_pages_and_a_pending_retirement_is_refused(tmp_path: Path) -> None:
    t4 = gpu_check.Expectation(gpu_count=1, products=("Tesla T4",), memory_health="retired_pages", failing_xids={})
    report = gpu_check.check(t4, recorded("t4-pending-retirement.json"), log="", efa_root=str(tmp_path))
    assert report["reading"]["gpus"][0]["retired_pages"] == {"single_bit": 0, "double_bit": 1, "pending": 1}
    assert {p["check"] for p in report["problems"]} == {"memory", "ecc"}


def test_a_catalogued_xid_fails_the_gpu_it_names_and_an_application_xid_does_not(tmp_path: Path) -> None:
    fell_off = (FIXTURES / "kernel-xid79.log").read_text()
    (problem,) = gpu_check.check(H100, recorded("h100-healthy.json"), log=fell_off, efa_root=str(tmp_path))["problems"]
    assert problem == {"gpu": 3, "check": "xid", "detail": "Xid 79 logged (0000:40:1c): RESTART_BM", "fault": True}
    app_error = (FIXTURES / "kernel-xid13.log").read_text()
    assert gpu_check.check(H100, recorded("h100-healthy.json"), log=app_error, efa_root=str(tmp_path))["passed"]


def test_an_unreadable_kernel_log_fails_closed_but_judges_nothing(tmp_path: Path) -> None:
    report = gpu_check.check(H100, recorded("h100-healthy.json"), log=None, efa_root=str(tmp_path))
    assert [p["check"] for p in report["problems"]] == ["read"]
    assert not report["passed"] and not report["checked"]  # main exits 2: unknown, not unhealthy


def test_the_kernel_log_comes_from_the_first_source_with_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = {"journalctl": "", "dmesg": (FIXTURES / "kernel-xid79.log").read_text()}
    monkeypatch.setattr(gpu_check.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(
        gpu_check.subprocess,
        "run",
        lambda command, **_: SimpleNamespace(returncode=0, stdout=outputs[command[0]], stderr=""),
    )
    assert gpu_check.parse_xids(gpu_check.kernel_log()) == [("0000:40:1c", 79)]
    outputs["dmesg"] = ""
    with pytest.raises(OSError, match="gave nothing"):
        gpu_check.kernel_log()


def test_xids_of_mig_instances_are_read() -> None:
    line = "NVRM: Xid (PCI:0000:40:1c GPU-I:05): 95, pid=1234, name=python, Uncontained: FBHUB. RST: Yes, D-RST: No"
    assert gpu_check.parse_xids(line) == [("0000:40:1c", 95)]


def test_ecc_switched_off_is_refused_and_mig_hides_rows_without_blaming_the_gpu(tmp_path: Path) -> None:
    nvml = recorded("h100-healthy.json")
    nvml.recording["gpus"][1]["ecc_mode"] = [0, 0]
    nvml.recording["gpus"][2].update(mig_mode=[1, 1], remapped_rows="not_supported", row_spares="not_supported")
    report = gpu_check.check(H100, nvml, log="", efa_root=str(tmp_path))
    found = {(p["gpu"], p["check"], p["fault"]) for p in report["problems"]}
    assert found == {(1, "ecc", True), (2, "memory", False)}
    assert report["checked"]  # the ECC fault is known


def _mig_node(layout: Sequence[str]) -> RecordedNvml:
    """The healthy H100s in MIG mode with these MIG devices on every GPU (NVML names them "<product> MIG <profile>"),
    their row remapping hidden, as NVML hides it while MIG instances exist."""
    nvml = recorded("h100-healthy.json")
    for gpu in nvml.recording["gpus"]:
        gpu.update(mig_mode=[1, 1], remapped_rows="not_supported", row_spares="not_supported",
                   mig_devices=[f"NVIDIA H100 80GB HBM3 MIG {p}" for p in layout])  # fmt: skip
    return nvml


H100_MIG = gpu_check.Expectation(
    **{**vars(H100), "mig": {"1g.10gb": 4, "3g.40gb": 1}, "resources": {"nvidia.com/mig-1g.10gb": 32}}
)


def test_a_mig_node_with_the_pools_layout_passes_and_says_what_it_must_offer(tmp_path: Path) -> None:
    report = gpu_check.check(H100_MIG, _mig_node(["3g.40gb", *["1g.10gb"] * 4]), log="", efa_root=str(tmp_path))
    assert report["passed"] and report["checked"], report["problems"]
    assert report["reading"]["gpus"][0]["mig_devices"] == {"1g.10gb": 4, "3g.40gb": 1}
    assert report["expected_resources"] == {"nvidia.com/mig-1g.10gb": 32}  # the burn-in agent waits for these


@pytest.mark.parametrize(
    ("layout", "mig_mode", "detail"),
    [
        (["3g.40gb", "1g.10gb"], [1, 1], "MIG instances 1 x 1g.10gb, 1 x 3g.40gb, expected 4 x 1g.10gb, 1 x 3g.40gb"),
        ([], [1, 1], "MIG instances none, expected"),
        ([], [0, 1], "MIG mode is off"),  # enabled but pending: the mode switch needed a reset that did not happen
    ],
)
def test_a_mig_node_without_the_pools_layout_is_refused(
    tmp_path: Path, layout: list[str], mig_mode: list[int], detail: str
) -> None:
    nvml = _mig_node(layout)
    gpu = nvml.recording["gpus"][3]
    gpu["mig_mode"] = mig_mode
    if not mig_mode[0]:  # MIG off: NVML reads its row remapping again
        healthy = recorded("h100-healthy.json").recording["gpus"][3]
        gpu.update(remapped_rows=healthy["remapped_rows"], row_spares=healthy["row_spares"])
    report = gpu_check.check(H100_MIG, nvml, log="", efa_root=str(tmp_path))
    mine = [p for p in report["problems"] if p["gpu"] == 3]
    assert [(p["check"], p["fault"]) for p in mine] == [("mig", True)] and detail in mine[0]["detail"]
    assert not report["passed"] and report["checked"]  # a fault: the node goes off work, to be replaced


def test_nvml_that_cannot_start_is_a_reading_error(tmp_path: Path) -> None:
    nvml = RecordedNvml({"driver": "", "gpus": []}, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    report = gpu_check.check(H100, nvml, log="", efa_root=str(tmp_path))
    assert [p["check"] for p in report["problems"]] == ["read", "count"]
    assert "Driver Not Loaded" in report["problems"][0]["detail"]
    assert report["checked"] is False  # main exits 2: could not check, which is not "unhealthy"


def test_the_drivers_recovery_action_and_an_untrained_fabric_are_refused(tmp_path: Path) -> None:
    nvml = recorded("h100-healthy.json")
    completed = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    for gpu in nvml.recording["gpus"]:
        gpu["fabric"] = [completed, 0]
    nvml.recording["gpus"][0]["recovery_action"] = pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
    nvml.recording["gpus"][4]["fabric"] = [pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED, 0]
    nvml.recording["gpus"][5]["fabric"] = [completed, pynvml.NVML_ERROR_UNKNOWN]
    fabric = gpu_check.Expectation(**{**H100.__dict__, "fabric": True})
    slept: list[float] = []
    report = gpu_check.check(fabric, nvml, "", str(tmp_path), sleep=slept.append)
    found = [(p["gpu"], p["check"], p["detail"], p["fault"]) for p in report["problems"]]
    assert found == [
        (0, "driver", "the driver asks for recovery action 4 (drain and reset)", True),
        # Still in training after the wait: not judged, since NVML's status means nothing before COMPLETED.
        (4, "fabric", "NVSwitch fabric not trained after 180 s (state 1): is Fabric Manager running?", False),
        (5, "fabric", f"NVSwitch fabric training failed (NVML status {pynvml.NVML_ERROR_UNKNOWN})", True),
    ]
    assert sum(slept) == gpu_check.FABRIC_WAIT_SECONDS  # it waited for the fabric, in polls
    # Without NVSwitch in the expectation the fabric is not judged; nor where NVML has no fabric to report.
    assert {p["check"] for p in gpu_check.check(H100, nvml, "", str(tmp_path))["problems"]} == {"driver"}


def test_a_fabric_that_finishes_training_during_the_wait_passes(tmp_path: Path) -> None:
    """Right after boot Fabric Manager is still training: the check polls until COMPLETED, then judges."""
    nvml = recorded("h100-healthy.json")
    completed = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    for gpu in nvml.recording["gpus"]:
        gpu["fabric"] = [pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, 0]

    def train(seconds: float) -> None:  # the fabric completes during the first poll
        for gpu in nvml.recording["gpus"]:
            gpu["fabric"] = [completed, 0]

    fabric = gpu_check.Expectation(**{**H100.__dict__, "fabric": True})
    report = gpu_check.check(fabric, nvml, "", str(tmp_path), sleep=train)
    assert report["passed"] is True and report["checked"] is True


def test_efa_devices_are_counted_from_the_kernel(tmp_path: Path) -> None:
    for name in ("rdmap0s26", "rdmap16s27", "mlx5_0"):
        (tmp_path / name).mkdir()
    assert gpu_check.count_efa(str(tmp_path)) == 2
    with_efa = gpu_check.Expectation(**{**H100.__dict__, "efa_devices": 32})
    (problem,) = gpu_check.check(with_efa, recorded("h100-healthy.json"), log="", efa_root=str(tmp_path))["problems"]
    assert problem["detail"] == "2 EFA devices, 32 expected"


def test_throughput_below_its_floor_is_refused_and_an_unmeasured_floor_too() -> None:
    floors = gpu_check.Expectation(**{**H100.__dict__, "gemm_tflops_floor": 600.0, "bandwidth_gbs_floor": 2600.0})
    node = gpu_check.NodeReading(driver="570", gpus=[
        gpu_check.GpuReading(index=i, name="NVIDIA H100 80GB HBM3",
                             remapped_rows={"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0},
                             uncorrectable_ecc=0, gemm_tflops=t, bandwidth_gbs=b)
        for i, (t, b) in enumerate([(700.0, 2900.0)] * 6 + [(410.0, 2900.0), (None, None)])
    ])  # fmt: skip
    found = [(p.gpu, p.check, p.detail) for p in gpu_check.problems(floors, node)]
    assert [p.fault for p in gpu_check.problems(floors, node)] == [True, False, False]
    assert found == [
        (6, "gemm", "410 TFLOPS BF16, below the floor of 600"),
        (7, "gemm", "not measured"),
        (7, "bandwidth", "not measured"),
    ]


def _diag(*tests: tuple[str, list[str], str], runtime_error: str = "") -> dict[str, Any]:
    """A dcgmi -j report in DCGM's schema (testing/python3/dcgm_diag_schema.json): tests as (name, per-GPU
    statuses, summary status)."""
    diag: dict[str, Any] = {
        "test_categories": [
            {
                "category": "Hardware",
                "tests": [
                    {
                        "name": name,
                        "results": [
                            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": i, "status": status}
                            for i, status in enumerate(statuses)
                        ],
                        "test_summary": {"status": summary},
                    }
                    for name, statuses, summary in tests
                ],
            }
        ]
    }
    if runtime_error:
        diag["runtime_error"] = runtime_error
    return {"DCGM Diagnostic": diag, "entity_groups": [], "metadata": {"version": "4.5.3"}}


@pytest.mark.parametrize(
    ("report", "failures"),
    [
        (_diag(("memory", ["Pass", "Pass"], "Pass"), ("pcie", ["Pass", "Skip"], "Pass")), []),
        (_diag(("memory", ["Pass", "Fail"], "Fail")), ["memory (GPU 1)"]),
        (_diag(("diagnostic", ["Pass"], "Fail")), ["diagnostic"]),
        (_diag(runtime_error="unable to load the NVML library"), ["runtime error: unable to load the NVML library"]),
        ({"error": "not a diagnostic"}, ["no 'DCGM Diagnostic' in dcgmi's report"]),
        (  # DCGM 3 names the report "DCGM GPU Diagnostic"
            {"DCGM GPU Diagnostic": _diag(("memory", ["Fail"], "Fail"))["DCGM Diagnostic"]},
            ["memory (GPU 0)"],
        ),
    ],
)
def test_dcgm_failures_follow_dcgms_report_schema(report: dict[str, Any], failures: list[str]) -> None:
    assert gpu_check.dcgm_failures(report) == failures


def test_main_cannot_check_without_an_expectation(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main(["gpu_check.py", "/nonexistent/expectation.json"]) == 2
    assert json.loads(capsys.readouterr().out)["passed"] is False


def test_main_writes_the_stamped_report_the_burn_in_agent_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    expectation = tmp_path / "expect.json"
    expect = {"gpu_count": 8, "products": list(H100.products), "memory_health": "row_remap", "failing_xids": {}}
    expectation.write_text(json.dumps(expect))
    report_file = tmp_path / "report.json"
    boot = tmp_path / "boot_id"
    boot.write_text("3f1c0d5e-boot\n")
    monkeypatch.setattr(gpu_check, "BOOT_ID", str(boot))
    monkeypatch.setattr(gpu_check, "kernel_log", lambda: "")
    monkeypatch.setitem(__import__("sys").modules, "pynvml", recorded("h100-healthy.json"))
    assert gpu_check.main(["gpu_check.py", str(expectation), "--report", str(report_file)]) == 0
    written = json.loads(report_file.read_text())
    assert written["verdict"] == "passed" and written["boot_id"] == "3f1c0d5e-boot"
    assert written["expected_gpus"] == 8 and written["finished_at"].endswith("Z")
    assert json.loads(capsys.readouterr().out)["passed"] is True
    assert not list(tmp_path.glob("*.partial"))  # written whole, by rename
    # One GPU short: a fault, so the verdict the agent acts on is "failed", and the exit 1.
    monkeypatch.setitem(__import__("sys").modules, "pynvml", recorded("h100-seven-gpus.json"))
    assert gpu_check.main(["gpu_check.py", str(expectation), "--report", str(report_file)]) == 1
    assert json.loads(report_file.read_text())["verdict"] == "failed"
    # A machine the check cannot read is not blamed: "unchecked", exit 2, and still a report.
    assert gpu_check.main(["gpu_check.py", str(tmp_path / "missing.json"), "--report", str(report_file)]) == 2
    assert json.loads(report_file.read_text())["verdict"] == "unchecked"
    assert gpu_check.main(["gpu_check.py", str(expectation), "--report"]) == 2  # --report without a file
    # An expectation without the Xid catalog judges nothing: not judged (a check built before the catalog was hoisted
    # out of the per-type entries would otherwise pass Xids unseen).
    del expect["failing_xids"]
    expectation.write_text(json.dumps(expect))
    assert gpu_check.main(["gpu_check.py", str(expectation), "--report", str(report_file)]) == 2


@pytest.mark.parametrize(
    ("output", "exit_code", "ran", "passed"),
    [
        # DCGM's own failure (paused, driver not supported...) is reported as a runtime error: GPUs not judged.
        ({"DCGM Diagnostic": {"runtime_error": "The diagnostic could not be run while DCGM is paused."}}, 226, False,
         False),
        ({"DCGM Diagnostic": {"test_categories": []}}, 1, False, False),  # an exit without a failed test
        (_diag(("memory", ["Pass", "Fail"], "Fail")), 226, True, False),  # a GPU failed a test: a fault
        (_diag(("memory", ["Pass"], "Pass")), 0, True, True),
    ],
)  # fmt: skip
def test_dcgmi_failing_by_itself_leaves_the_gpus_unjudged(
    output: dict[str, Any], exit_code: int, ran: bool, passed: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dcgmi = tmp_path / "dcgmi"
    dcgmi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(output)}\nEOF\nexit {exit_code}\n")
    dcgmi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    result = gpu_check.run_dcgm(2, timeout=120)
    assert (result["ran"], result["passed"]) == (ran, passed)


def test_dcgm_is_not_started_when_the_time_limit_leaves_too_little(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dcgmi = tmp_path / "dcgmi"
    dcgmi.write_text("#!/bin/sh\nexit 99\n")  # must not run
    dcgmi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    level2 = gpu_check.Expectation(**{**H100.__dict__, "dcgm_level": 2})
    report = gpu_check.check(level2, recorded("h100-healthy.json"), "", str(tmp_path / "ib"), time_limit=100)
    (problem,) = report["problems"]
    assert problem["check"] == "dcgm" and problem["fault"] is False and "not run" in problem["detail"]
    assert report["checked"] is False  # not judged: the agent settles the node off work, without blaming it


# The watch ---------------------------------------------------------------------------------------------------

T0 = 1799150400.0  # 2027-01-05T12:00:00Z
WATCH_CHECKS = {"xid", "memory", "ecc", "recovery", "count", "model", "nvml", "dcgm-health"}  # the health file's
# What dcgmi prints and exits with when it cannot reach nv-hostengine (dcgmi/Command.cpp DoExecuteConnectionFailure,
# errorString(DCGM_ST_CONNECTION_NOT_VALID) of dcgmlib/src/dcgm_errors.c; main returns the status, -21) and when the
# host engine holds no watches (dcgmi/Health.cpp CheckWatches, DCGM_ST_GENERIC_ERROR, -3).
NO_HOST_ENGINE = ("Error: Unable to connect to host engine. Host engine connection invalid/disconnected.", 235)
NO_WATCHES = ("Error: Health watches not enabled. Please enable watches. ", 253)


class FakeDcgmi:
    """A dcgmi on PATH that logs its calls and answers `health --set a` and `health --check --json` as told;
    anything else (`diag` above all) fails loudly."""

    def __init__(self, root: Path) -> None:
        self.root = root
        script = root / "dcgmi"
        script.write_text(
            "#!/bin/sh\n"
            f'echo "$*" >>"{root}/calls"\n'
            'case "$*" in\n'
            f'  "health --set a") cat "{root}/set.out"; exit "$(cat "{root}/set.rc")" ;;\n'
            f'  "health --check --json") cat "{root}/check.out"; exit "$(cat "{root}/check.rc")" ;;\n'
            '  *) echo "not a call of the watch: dcgmi $*" >&2; exit 99 ;;\n'
            "esac\n"
        )
        script.chmod(0o755)
        self.set("Health monitor systems set successfully.", 0)
        self.check((FIXTURES / "dcgmi-health-healthy.json").read_text(), 0)

    def set(self, output: str, code: int) -> None:
        (self.root / "set.out").write_text(output + "\n")
        (self.root / "set.rc").write_text(str(code))

    def check(self, output: str, code: int) -> None:
        (self.root / "check.out").write_text(output + "\n")
        (self.root / "check.rc").write_text(str(code))

    def calls(self) -> list[str]:
        path = self.root / "calls"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def dcgmi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDcgmi:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return FakeDcgmi(bin_dir)


@pytest.fixture
def h100_file(tmp_path: Path) -> str:
    """The H100 expectation as dlinfra writes it (gpu_health.expectation's keys)."""
    path = tmp_path / "expect.json"
    path.write_text(json.dumps({"gpu_count": 8, "products": list(H100.products), "memory_health": "row_remap",
                                "failing_xids": {str(k): v for k, v in CATALOG.items()}}))  # fmt: skip
    return str(path)


def boot(tmp_path: Path, boot_id: str = "3f1c0d5e-boot") -> str:
    path = tmp_path / "boot_id"
    path.write_text(f"{boot_id}\n")
    return str(path)


def clock(*times: float) -> Any:
    """Each call the next time; the last one again after that."""
    left = list(times)
    return lambda: left.pop(0) if len(left) > 1 else left[0]


def run_watch(expect_file: str, health: Path, nvml: Any, *, log: str = "", polls: int = 1, **kwargs: Any) -> Any:
    """The watch with recorded GPUs and kernel log, a clock from T0 a minute a poll, and no real sleep."""
    kwargs.setdefault("clock", clock(*(T0 + 60 * i for i in range(polls))))
    kwargs.setdefault("sleep", lambda seconds: None)
    if "boot_id_file" not in kwargs:
        kwargs["boot_id_file"] = boot(health.parent)
    return gpu_check.watch(expect_file, str(health), polls=polls, nvml=nvml, read_log=lambda: log, **kwargs)


def test_a_healthy_node_is_ok_and_dcgms_watches_are_set_once(tmp_path: Path, h100_file: str, dcgmi: FakeDcgmi) -> None:
    health = tmp_path / "health.json"
    slept: list[float] = []
    run_watch(h100_file, health, recorded("h100-healthy.json"), polls=3, sleep=slept.append)
    written = json.loads(health.read_text())
    assert written == {
        "boot_id": "3f1c0d5e-boot",
        "started_at": "2027-01-05T12:00:00Z",
        "updated_at": "2027-01-05T12:02:00Z",
        "status": "ok",
        "faults": [],
        "notes": [],
        "suspects": [],
    }
    assert health.stat().st_mode & 0o777 == 0o644 and not list(tmp_path.glob("*.partial"))  # whole, by rename
    assert slept == [60, 60]  # between polls, on the injected sleep
    # The watches are set once, then only checked; DCGM's diagnostic never runs.
    assert dcgmi.calls() == ["health --set a"] + ["health --check --json"] * 3


@pytest.mark.parametrize(
    ("recording", "log", "faults"),
    [
        ("h100-healthy.json", "kernel-xid79.log", {(3, "xid", "Xid 79 logged (0000:40:1c): RESTART_BM")}),
        (
            "h100-memory-errors.json",
            None,
            {
                (2, "memory", "1 memory banks have no spare rows left: the next uncorrectable error there cannot be "
                              "remapped"),
                (3, "memory", "a row remapping is pending: reset the GPU to apply it"),
                (5, "memory", "a row remapping failed: the GPU needs replacing"),
                (6, "ecc", "4 uncorrectable ECC errors since the driver loaded"),
            },
        ),
        ("h100-seven-gpus.json", None, {(None, "count", "7 GPUs visible, 8 expected")}),
    ],
)  # fmt: skip
def test_recorded_faults_are_written_with_the_health_files_check_names(
    recording: str, log: str | None, faults: set[tuple[int | None, str, str]], tmp_path: Path, h100_file: str,
    dcgmi: FakeDcgmi,
) -> None:  # fmt: skip
    health = tmp_path / "health.json"
    run_watch(h100_file, health, recorded(recording), log=(FIXTURES / log).read_text() if log else "")
    written = json.loads(health.read_text())
    assert written["status"] == "faulted"
    assert {(f["gpu"], f["check"], f["detail"]) for f in written["faults"]} == faults
    assert {f["first_seen"] for f in written["faults"]} == {"2027-01-05T12:00:00Z"}


def test_the_drivers_recovery_action_is_a_recovery_fault_and_a_wrong_model_a_model_fault(
    tmp_path: Path, h100_file: str, dcgmi: FakeDcgmi
) -> None:
    nvml = recorded("h100-healthy.json")
    nvml.recording["gpus"][4]["recovery_action"] = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    nvml.recording["gpus"][7]["name"] = "NVIDIA H100 PCIe"
    health = run_watch(h100_file, tmp_path / "health.json", nvml)
    assert [(f["gpu"], f["check"], f["detail"]) for f in health["faults"]] == [
        (4, "recovery", "the driver asks for recovery action 1 (GPU reset)"),
        (7, "model", "'NVIDIA H100 PCIe', expected 'NVIDIA H100 80GB HBM3'"),
    ]


class LosingNvml(RecordedNvml):
    """NVML of a node whose GPUs in `lost` have fallen off the bus: the driver still counts them, NVML cannot open
    them (nvmlDeviceGetHandleByIndex: NVML_ERROR_GPU_IS_LOST)."""

    lost: frozenset[int] = frozenset()

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return index


def test_the_burn_in_names_a_gpu_nvml_cannot_read(tmp_path: Path) -> None:
    nvml = LosingNvml(json.loads((FIXTURES / "h100-healthy.json").read_text()))
    nvml.lost = frozenset({2})
    report = gpu_check.check(H100, nvml, log="", efa_root=str(tmp_path))
    assert [(p["gpu"], p["check"], p["detail"]) for p in report["problems"]] == [
        (None, "count", "7 GPUs visible, 8 expected"),
        (2, "nvml", "NVML cannot read this GPU: GPU is lost"),
    ]
    assert report["checked"] and report["reading"]["gpu_errors"] == [(2, "GPU is lost")]


def test_a_gpu_that_falls_off_the_bus_is_a_fault_and_its_xid_still_names_it(
    tmp_path: Path, h100_file: str, dcgmi: FakeDcgmi
) -> None:
    nvml = LosingNvml(json.loads((FIXTURES / "h100-healthy.json").read_text()))
    logs = ["", (FIXTURES / "kernel-xid79.log").read_text()]

    def fall_off(seconds: float) -> None:  # between the polls GPU 3 (PCI 0000:40:1c) leaves and the driver logs Xid 79
        nvml.lost = frozenset({3})

    health = gpu_check.watch(
        h100_file, str(tmp_path / "health.json"), polls=2, nvml=nvml, read_log=lambda: logs.pop(0),
        clock=clock(T0, T0 + 60), sleep=fall_off, boot_id_file=boot(tmp_path),
    )  # fmt: skip
    assert {(f["gpu"], f["check"], f["detail"], f["first_seen"]) for f in health["faults"]} == {
        (None, "count", "7 GPUs visible, 8 expected", "2027-01-05T12:01:00Z"),
        # NVML no longer knows GPU 3's address; the watch learned it on the first poll.
        (3, "xid", "Xid 79 logged (0000:40:1c): RESTART_BM", "2027-01-05T12:01:00Z"),
    }
    # NVML's own error is a suspect until it persists (SOFT_POLLS); the Xid and the count are facts at once.
    assert health["suspects"] == [{"gpu": 3, "check": "nvml", "what": "NVML cannot read this GPU",
                                   "seen": ["2027-01-05T12:01:00Z"]}]  # fmt: skip


def test_a_fault_seen_once_is_kept_for_the_boot_with_when_it_was_first_seen(
    tmp_path: Path, h100_file: str, dcgmi: FakeDcgmi
) -> None:
    nvml = recorded("h100-healthy.json")
    nvml.recording["gpus"][3]["remapped_rows"] = [0, 1, 1, 0]  # one remap pending

    def reset(seconds: float) -> None:  # the condition is gone at the next poll (the GPU was reset, say)
        nvml.recording["gpus"][3]["remapped_rows"] = [0, 1, 0, 0]

    health = tmp_path / "health.json"
    run_watch(h100_file, health, nvml, polls=3, sleep=reset)
    written = json.loads(health.read_text())
    assert written["status"] == "faulted" and written["updated_at"] == "2027-01-05T12:02:00Z"
    assert written["faults"] == [
        {"gpu": 3, "check": "memory", "detail": "a row remapping is pending: reset the GPU to apply it",
         "first_seen": "2027-01-05T12:00:00Z"},
    ]  # fmt: skip


def test_a_restart_on_the_same_boot_keeps_the_faults_and_a_new_boot_starts_empty(
    tmp_path: Path, h100_file: str, dcgmi: FakeDcgmi
) -> None:
    health = tmp_path / "health.json"
    earlier = {"gpu": 6, "check": "ecc", "detail": "4 uncorrectable ECC errors since the driver loaded",
               "first_seen": "2027-01-05T11:00:00Z"}  # fmt: skip
    health.write_text(json.dumps({"boot_id": "3f1c0d5e-boot", "started_at": "2027-01-05T10:58:00Z",
                                  "updated_at": "2027-01-05T11:30:00Z", "status": "faulted", "faults": [earlier],
                                  "notes": []}))  # fmt: skip
    # The unit restarted on the same boot; the GPUs read healthy now: the fault stays, and the watch's start too.
    kept = run_watch(h100_file, health, recorded("h100-healthy.json"))
    assert kept["status"] == "faulted" and kept["faults"] == [earlier]
    assert kept["started_at"] == "2027-01-05T10:58:00Z" and kept["updated_at"] == "2027-01-05T12:00:00Z"
    assert json.loads(health.read_text()) == kept
    # After a reboot the file is the last boot's: replaced, with nothing of it.
    fresh = run_watch(h100_file, health, recorded("h100-healthy.json"), boot_id_file=boot(tmp_path, "9a7e-next"))
    assert fresh["boot_id"] == "9a7e-next" and fresh["status"] == "ok" and fresh["faults"] == []
    assert fresh["started_at"] == "2027-01-05T12:00:00Z"


@pytest.mark.parametrize(
    ("output", "faults", "notes"),
    [
        ("dcgmi-health-healthy.json", [], []),
        # A warning (PCIe replays) is a note; the node stays ok.
        (
            "dcgmi-health-warning.json",
            [],
            ["GPU 0: DCGM PCIe system: Detected more than 8 PCIe replays per minute for GPU 0 : 13 (a warning)"],
        ),
        # Failures (DCGM_HEALTH_RESULT_FAIL) are faults of their GPUs, DCGM's message rejoined from its lines.
        (
            "dcgmi-health-failure.json",
            [
                (3, "dcgm-health", "DCGM Memory system: Detected 2 volatile double-bit ECC error(s) in GPU 3."),
                (5, "dcgm-health",
                 "DCGM Memory system: GPU 5 had uncorrectable memory errors and row remapping failed."),
            ],
            ["GPU 0: DCGM PCIe system: Detected more than 8 PCIe replays per minute for GPU 0 : 13 (a warning)"],
        ),
    ],
)  # fmt: skip
def test_dcgm_health_failures_are_faults_and_warnings_are_not(
    output: str, faults: list[tuple[int, str, str]], notes: list[str], tmp_path: Path, h100_file: str,
    dcgmi: FakeDcgmi,
) -> None:  # fmt: skip
    dcgmi.check((FIXTURES / output).read_text(), 0)
    # A DCGM failure is a fault once seen on SOFT_POLLS polls (a single NVLink replay fails DCGM's watch for a minute).
    health = run_watch(h100_file, tmp_path / "health.json", recorded("h100-healthy.json"), polls=gpu_check.SOFT_POLLS)
    assert [(f["gpu"], f["check"], f["detail"]) for f in health["faults"]] == faults
    assert [n for n in health["notes"] if not n.startswith("suspected: ")] == notes
    assert health["status"] == ("faulted" if faults else "ok")


def test_dcgmis_own_errors_are_notes_never_faults(tmp_path: Path, h100_file: str, dcgmi: FakeDcgmi) -> None:
    dcgmi.set(*NO_HOST_ENGINE)  # nv-hostengine not (yet) answering
    health = run_watch(h100_file, tmp_path / "health.json", recorded("h100-healthy.json"), polls=2)
    assert health["status"] == "ok" and health["faults"] == []
    assert health["notes"] == [f"dcgmi health --set a: exited 235: {NO_HOST_ENGINE[0]}"]
    assert dcgmi.calls() == ["health --set a"] * 2  # tried again at each poll; nothing to check without watches


def test_watches_lost_with_a_host_engine_restart_are_set_again_at_the_next_poll(
    tmp_path: Path, h100_file: str, dcgmi: FakeDcgmi
) -> None:
    health = tmp_path / "health.json"
    dcgmi.check(*NO_WATCHES)
    first: list[dict[str, Any]] = []

    def engine_back(seconds: float) -> None:
        first.append(json.loads(health.read_text()))
        dcgmi.check((FIXTURES / "dcgmi-health-failure.json").read_text(), 0)

    last = run_watch(h100_file, health, recorded("h100-healthy.json"), polls=1 + gpu_check.SOFT_POLLS,
                     sleep=engine_back)  # fmt: skip
    assert first[0]["status"] == "ok" and first[0]["faults"] == []
    assert first[0]["notes"] == ["dcgmi health --check: exited 253: Error: Health watches not enabled. Please enable "
                                 "watches."]  # fmt: skip
    assert last["status"] == "faulted"
    assert dcgmi.calls()[:4] == ["health --set a", "health --check --json", "health --set a", "health --check --json"]


def test_a_dcgm_failure_seen_once_is_a_suspect_but_one_that_keeps_coming_back_is_a_fault(
    tmp_path: Path, h100_file: str, dcgmi: FakeDcgmi
) -> None:
    """A single NVLink replay fails DCGM's watch for a minute on a good GPU; a failure on SOFT_POLLS polls within
    SOFT_WINDOW_SECONDS, even with good polls between (flapping), is a fault for the boot."""
    failure, healthy = ((FIXTURES / f"dcgmi-health-{name}.json").read_text() for name in ("failure", "healthy"))
    health = tmp_path / "health.json"
    dcgmi.check(failure, 0)
    once = run_watch(h100_file, health, recorded("h100-healthy.json"))
    assert once["status"] == "ok" and once["faults"] == []
    assert any(n.startswith("suspected: GPU 3 dcgm-health: DCGM Memory system, seen 1 of the 3") for n in once["notes"])
    # Good and bad polls in turn, a minute apart: the third failing poll within 30 minutes makes the fault.
    answers = [healthy, failure, healthy, failure]

    def next_answer(seconds: float) -> None:
        dcgmi.check(answers.pop(0), 0)

    dcgmi.check(healthy, 0)
    flapping = run_watch(h100_file, health, recorded("h100-healthy.json"), polls=5, sleep=next_answer,
                         clock=clock(*(T0 + 60 * (i + 1) for i in range(5))))  # fmt: skip
    assert flapping["status"] == "faulted" and {f["gpu"] for f in flapping["faults"]} == {3, 5}
    assert {f["first_seen"] for f in flapping["faults"]} == {"2027-01-05T12:05:00Z"}
    # Sightings older than the window do not count: one failure an hour is never a fault.
    gpu_check_suspects = {(3, "dcgm-health", "DCGM Memory system"): ["2027-01-05T10:00:00Z", "2027-01-05T11:00:00Z"]}
    problem = gpu_check.Problem(3, "dcgm-health", "DCGM Memory system: Detected 2 volatile double-bit ECC error(s)")
    kept, left = gpu_check.confirmed([problem], gpu_check_suspects, "2027-01-05T12:00:00Z")
    assert kept == [] and left == {(3, "dcgm-health", "DCGM Memory system"): ["2027-01-05T12:00:00Z"]}


def test_the_watch_never_runs_the_disruptive_checks(
    tmp_path: Path, dcgmi: FakeDcgmi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An expectation with every burn-in part switched on: DCGM's diagnostic, the throughput floors, the NVSwitch
    fabric (here still in training, which the burn-in would wait out) and EFA; the watch reads, and that is all."""
    everything = {"gpu_count": 8, "products": list(H100.products), "memory_health": "row_remap", "failing_xids": {},
                  "efa_devices": 32, "fabric": True, "dcgm_level": 3, "gemm_tflops_floor": 600.0,
                  "bandwidth_gbs_floor": 2600.0}  # fmt: skip
    expect_file = tmp_path / "expect.json"
    expect_file.write_text(json.dumps(everything))

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the watch ran a disruptive check")

    monkeypatch.setattr(gpu_check, "measure_throughput", refuse)
    monkeypatch.setattr(gpu_check, "run_dcgm", refuse)
    monkeypatch.setattr(gpu_check, "count_efa", refuse)
    nvml = recorded("h100-healthy.json")
    for gpu in nvml.recording["gpus"]:
        gpu["fabric"] = [pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, 0]
    slept: list[float] = []
    health = run_watch(str(expect_file), tmp_path / "health.json", nvml, polls=2, sleep=slept.append)
    assert health["status"] == "ok" and health["faults"] == [] and health["notes"] == []
    assert slept == [60]  # no wait for the fabric: only the interval between the two polls
    assert not any(call.startswith("diag") for call in dcgmi.calls())


def test_without_nvml_nothing_is_judged_but_the_kernels_xids(tmp_path: Path, h100_file: str, dcgmi: FakeDcgmi) -> None:
    no_driver = RecordedNvml({"driver": "", "gpus": []}, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    health = run_watch(h100_file, tmp_path / "health.json", no_driver)
    assert health["status"] == "unreadable" and health["faults"] == []  # no "0 GPUs visible": nothing was read
    assert health["notes"] == ["NVML: Driver Not Loaded"]
    assert dcgmi.calls() == []  # DCGM's host engine needs the same driver
    xid79 = (FIXTURES / "kernel-xid79.log").read_text()
    health = run_watch(h100_file, tmp_path / "health.json", no_driver, log=xid79)
    assert health["status"] == "faulted"
    assert [(f["gpu"], f["check"]) for f in health["faults"]] == [(None, "xid")]


def test_what_the_watch_cannot_read_is_a_note_never_a_fault(tmp_path: Path, dcgmi: FakeDcgmi) -> None:
    health = tmp_path / "health.json"
    missing = run_watch(str(tmp_path / "missing.json"), health, recorded("h100-healthy.json"))
    assert missing["status"] == "unreadable" and missing["faults"] == []
    assert missing["notes"][0].startswith("cannot watch: FileNotFoundError")

    def no_log() -> str:
        raise OSError("cannot read the kernel log: journalctl -k and dmesg gave nothing")

    expect = tmp_path / "expect.json"
    expect.write_text(json.dumps({"gpu_count": 8, "products": list(H100.products), "memory_health": "row_remap",
                                  "failing_xids": {}}))  # fmt: skip
    unlogged = gpu_check.watch(
        str(expect), str(health), polls=1, nvml=recorded("h100-healthy.json"), read_log=no_log,
        clock=clock(T0), sleep=lambda s: None, boot_id_file=boot(tmp_path),
    )  # fmt: skip
    assert unlogged["status"] == "ok" and unlogged["notes"] == ["the kernel log could not be read: Xid events unknown"]


def test_every_check_name_the_watch_writes_is_the_health_files() -> None:
    problems = gpu_check.problems(
        gpu_check.passive(H100),
        gpu_check.NodeReading(nvml=True, gpus=[gpu_check.GpuReading(index=0, name="x", recovery_action=2)],
                              gpu_errors=[(1, "GPU is lost")], xids=[("0000:40:1c", 79)]),
    )  # fmt: skip
    watched = {gpu_check.WATCH_CHECKS.get(p.check, p.check) for p in problems if p.fault}
    assert watched <= WATCH_CHECKS and {"recovery", "nvml", "xid", "model", "memory", "count"} <= watched


def test_the_faults_kept_are_bounded() -> None:
    found = [gpu_check.Problem(0, "ecc", f"{n} uncorrectable ECC errors since the driver loaded") for n in range(150)]
    faults = gpu_check.latch([], found, "2027-01-05T12:00:00Z")
    assert len(faults) == gpu_check.MAX_FAULTS and faults[0]["detail"].startswith("0 ")
    assert gpu_check.latch(faults, found[:3], "later") == faults  # the same faults again add nothing


def test_main_watch_once_exits_by_the_health_it_wrote(
    tmp_path: Path, h100_file: str, dcgmi: FakeDcgmi, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    health = tmp_path / "health.json"
    monkeypatch.setattr(gpu_check, "BOOT_ID", boot(tmp_path))
    monkeypatch.setattr(gpu_check, "kernel_log", lambda: "")
    command = ["gpu_check.py", "watch", h100_file, "--health", str(health), "--once"]
    monkeypatch.setitem(__import__("sys").modules, "pynvml", recorded("h100-healthy.json"))
    assert gpu_check.main(command) == 0
    assert json.loads(health.read_text())["status"] == "ok"
    assert json.loads(capsys.readouterr().out)["status"] == "ok"  # printed too, for the journal
    monkeypatch.setitem(__import__("sys").modules, "pynvml", recorded("h100-seven-gpus.json"))
    assert gpu_check.main(command) == 1
    no_driver = RecordedNvml({"driver": "", "gpus": []}, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", no_driver)
    assert gpu_check.main(command) == 1  # the fault of this boot is kept: still faulted
    health.unlink()
    assert gpu_check.main(command) == 2  # "unreadable": what the image's validation expects on a machine without GPUs
    assert json.loads(health.read_text())["status"] == "unreadable"
    assert gpu_check.main([*command[:-1], "--interval", "0", "--once"]) == 2
    # The check's own command line is unchanged beside it.
    assert gpu_check.main(["gpu_check.py", h100_file, "--report", str(tmp_path / "report.json")]) == 2


def test_nvml_lost_after_it_read_the_gpus_is_a_fault_once_it_persists(
    tmp_path: Path, h100_file: str, dcgmi: FakeDcgmi
) -> None:
    """A driver that crashed after the burn-in leaves NVML unreadable: not "unreadable" for ever (the node would stay
    on work with nothing said), but a node fault once it lasts SOFT_POLLS polls."""
    nvml = recorded("h100-healthy.json")

    def driver_gone(seconds: float) -> None:
        nvml.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED

    polls = 1 + gpu_check.SOFT_POLLS
    health = run_watch(h100_file, tmp_path / "health.json", nvml, polls=polls, sleep=driver_gone)
    assert health["status"] == "faulted"
    ((fault),) = health["faults"]
    assert (fault["gpu"], fault["check"]) == (None, "nvml") and "NVML cannot read the GPUs any more" in fault["detail"]
    # One poll without NVML is only a suspect.
    nvml.init_error = None
    flicker = run_watch(h100_file, tmp_path / "other.json", nvml, polls=2, sleep=driver_gone)
    assert flicker["status"] == "unreadable" and flicker["faults"] == [] and len(flicker["suspects"]) == 1


def test_a_check_that_passes_again_on_the_boot_clears_what_the_watch_had_seen_before_it(
    tmp_path: Path, h100_file: str, dcgmi: FakeDcgmi
) -> None:
    """Drain, reset the GPU (a pending row remap needs it), `dlinfra gpu check`: a pass judges the earlier faults gone;
    what persists is seen again, first seen after the pass."""
    health = tmp_path / "health.json"
    earlier = {"gpu": 3, "check": "memory", "detail": "a row remapping is pending: reset the GPU to apply it",
               "first_seen": "2027-01-05T11:00:00Z"}  # fmt: skip
    health.write_text(json.dumps({"boot_id": "3f1c0d5e-boot", "started_at": "2027-01-05T10:58:00Z",
                                  "updated_at": "2027-01-05T11:30:00Z", "status": "faulted", "faults": [earlier],
                                  "notes": []}))  # fmt: skip
    report = {"verdict": "passed", "finished_at": "2027-01-05T11:45:00Z", "boot_id": "3f1c0d5e-boot"}
    (tmp_path / "report.json").write_text(json.dumps(report))
    cleared = run_watch(h100_file, health, recorded("h100-healthy.json"))
    assert cleared["status"] == "ok" and cleared["faults"] == []
    # Still there after the pass (an Xid of this boot the check would have failed on is a fact): seen again, now.
    again = run_watch(h100_file, health, recorded("h100-healthy.json"), log=(FIXTURES / "kernel-xid79.log").read_text())
    assert [(f["check"], f["first_seen"]) for f in again["faults"]] == [("xid", "2027-01-05T12:00:00Z")]
    # A report that failed, or is another boot's, clears nothing.
    health.write_text(json.dumps({**json.loads(health.read_text()), "faults": [earlier]}))
    (tmp_path / "report.json").write_text(json.dumps({**report, "verdict": "failed"}))
    assert run_watch(h100_file, health, recorded("h100-healthy.json"))["faults"] == [earlier]


# -- the repair ----------------------------------------------------------------------------------------------------

BOOT = "6c2b1f0e-3d4a-4e5f-8a9b-0c1d2e3f4a5b"


class FakeImds:
    """IMDSv2 as the EC2 User Guide describes it: a token by PUT with its TTL header, then reads that carry it."""

    def __init__(self, metadata: dict[str, str]) -> None:
        self.metadata = metadata
        self.requests: list[tuple[str, str, float]] = []

    def __call__(self, request: urllib.request.Request, timeout: float) -> io.BytesIO:
        self.requests.append((request.get_method(), request.full_url, timeout))
        if request.full_url == "http://169.254.169.254/latest/api/token":
            assert request.get_method() == "PUT" and request.get_header("X-aws-ec2-metadata-token-ttl-seconds")
            return io.BytesIO(b"TOKEN")
        assert request.get_method() == "GET" and request.get_header("X-aws-ec2-metadata-token") == "TOKEN"
        item = request.full_url.removeprefix("http://169.254.169.254/latest/meta-data/")
        if item not in self.metadata:
            raise urllib.error.HTTPError(request.full_url, 404, "Not Found", None, None)  # type: ignore[arg-type]
        return io.BytesIO(self.metadata[item].encode())


class FakeRun:
    """Records each command instead of running it, and answers with `status`."""

    def __init__(self, status: int = 0) -> None:
        self.status = status
        self.commands: list[list[str]] = []

    def __call__(self, command: Sequence[str]) -> int:
        self.commands.append(list(command))
        return self.status


def no_imds(request: urllib.request.Request, timeout: float) -> io.BytesIO:
    raise AssertionError(f"IMDS read: {request.full_url}")


def write_request(tmp_path: Path, text: str | bytes | None = None, **fields: Any) -> tuple[Path, Path]:
    """(the request, this boot's id file): the request as the burn-in agent writes it, `fields` changed, or `text`."""
    boot_id = tmp_path / "boot_id"
    boot_id.write_text(BOOT + "\n")
    request = {"action": "replace", "boot_id": BOOT, "node": "ip-10-1-2-3.us-west-2.compute.internal",
               "approved_at": "2027-01-05T12:00:00Z"} | fields  # fmt: skip
    path = tmp_path / "request"
    path.write_bytes(text.encode() if isinstance(text, str) else text or json.dumps(request).encode())
    return path, boot_id


def test_replace_marks_this_instance_unhealthy_by_its_id_and_region_from_imds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request, boot_id = write_request(tmp_path, action="replace")
    imds = FakeImds({"instance-id": "i-0123456789abcdef0", "placement/region": "us-west-2"})
    run = FakeRun()
    status = gpu_check.repair(str(request), aws_cli="/snap/bin/aws", run=run, opener=imds, boot_id_file=str(boot_id))
    assert status == 0
    # AWS CLI reference, "aws autoscaling set-instance-health": at once, not after the group's grace period.
    assert run.commands == [
        ["/snap/bin/aws", "autoscaling", "set-instance-health", "--instance-id", "i-0123456789abcdef0",
         "--health-status", "Unhealthy", "--no-should-respect-grace-period", "--region", "us-west-2"]
    ]  # fmt: skip
    assert [(method, url) for method, url, _ in imds.requests] == [
        ("PUT", "http://169.254.169.254/latest/api/token"),
        ("GET", "http://169.254.169.254/latest/meta-data/instance-id"),
        ("GET", "http://169.254.169.254/latest/meta-data/placement/region"),
    ]
    assert all(timeout <= 5 for _, _, timeout in imds.requests)
    assert request.exists()  # the machine goes away; the unit stays active, so the path unit does not start it again
    assert "i-0123456789abcdef0" in capsys.readouterr().out


def test_reboot_reboots_through_systemctl_and_reads_no_imds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    request, boot_id = write_request(tmp_path, action="reboot")
    run = FakeRun()
    # systemd-inhibit --list with the kubelet's graceful node shutdown on (its delay lock, as the kubelet names it).
    held = "kubelet 0 root 1234 kubelet shutdown Kubelet needs time to handle node shutdown delay\n"
    assert gpu_check.repair(str(request), run=run, opener=no_imds, boot_id_file=str(boot_id), locks=lambda: held) == 0
    assert run.commands == [["systemctl", "reboot"]]
    assert "systemctl reboot" in capsys.readouterr().out  # logged before it runs
    assert request.exists()  # in /run: gone with the reboot


def test_no_reboot_where_the_kubelet_would_not_give_the_pods_their_grace(tmp_path: Path) -> None:
    """Without the kubelet's delay lock (graceful node shutdown off, or logind refusing it), a reboot kills the pods:
    refused, the request removed (the agent writes it again a minute later; the controller gives up in time)."""
    request, boot_id = write_request(tmp_path, action="reboot")
    run = FakeRun()
    assert gpu_check.repair(str(request), run=run, opener=no_imds, boot_id_file=str(boot_id), locks=lambda: "") == 1
    assert run.commands == [] and not request.exists()


@pytest.mark.parametrize(
    ("text", "fields", "why"),
    [
        (None, {"boot_id": "0f0f0f0f-1111-2222-3333-444444444444"}, "for boot"),  # approved on an earlier boot
        (None, {"boot_id": None}, "for boot"),
        (None, {"action": "drain"}, "action"),
        (None, {"action": None}, "action"),
        ('{"action": "replace", "boot_id": ', {}, "cannot read"),
        (b"\xff\xfe{}", {}, "cannot read"),
        ('["replace"]', {}, "not a JSON object"),
    ],
    ids=["another-boot", "no-boot", "unknown-action", "no-action", "truncated", "not-text", "not-an-object"],
)
def test_a_request_that_is_not_this_boots_approved_action_is_refused_removed_and_nothing_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | bytes | None, fields: dict[str, Any], why: str
) -> None:
    request, boot_id = write_request(tmp_path, text, **fields)
    run = FakeRun()
    assert gpu_check.repair(str(request), run=run, opener=no_imds, boot_id_file=str(boot_id)) == 2
    assert run.commands == [] and not request.exists()  # removed: PathExists would start the unit again
    assert why in capsys.readouterr().err


def test_a_request_is_refused_where_this_boots_id_cannot_be_read(tmp_path: Path) -> None:
    request, _ = write_request(tmp_path, action="reboot")
    run = FakeRun()
    assert gpu_check.repair(str(request), run=run, boot_id_file=str(tmp_path / "missing")) == 2
    assert run.commands == [] and not request.exists()


def test_a_request_gone_before_the_unit_ran_is_refused_so_the_next_one_starts_it(tmp_path: Path) -> None:
    # Exit 0 would leave the unit active (RemainAfterExit), and the path unit would not start it for the next request.
    run = FakeRun()
    assert gpu_check.repair(str(tmp_path / "request"), run=run, opener=no_imds) == 2
    assert run.commands == []


@pytest.mark.parametrize("action", ["replace", "reboot"])
def test_a_command_that_fails_exits_1_and_removes_the_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], action: str
) -> None:
    request, boot_id = write_request(tmp_path, action=action)
    imds = FakeImds({"instance-id": "i-0123456789abcdef0", "placement/region": "us-west-2"})
    run = FakeRun(status=255)  # the AWS CLI's exit status for a failed call (AccessDenied, throttled past its retries)
    locks = lambda: "kubelet 0 root 1234 kubelet shutdown Kubelet needs time to handle node shutdown delay"  # noqa: E731
    assert gpu_check.repair(str(request), run=run, opener=imds, boot_id_file=str(boot_id), locks=locks) == 1
    # Removed: the agent writes it again a minute later, and the controller's timeout notices a repair that never is.
    assert len(run.commands) == 1 and not request.exists()
    assert "exited 255" in capsys.readouterr().err


def test_a_replace_without_imds_runs_nothing_and_exits_1(tmp_path: Path) -> None:
    # A site machine sent "replace" by mistake, or IMDS not answering: no instance to name.
    request, boot_id = write_request(tmp_path, action="replace")

    def unreachable(request: urllib.request.Request, timeout: float) -> io.BytesIO:
        raise urllib.error.URLError(TimeoutError("timed out"))

    run = FakeRun()
    assert gpu_check.repair(str(request), run=run, opener=unreachable, boot_id_file=str(boot_id)) == 1
    assert run.commands == [] and not request.exists()
    request, boot_id = write_request(tmp_path, action="replace")
    no_region = FakeImds({"instance-id": "i-0123456789abcdef0"})  # 404 for placement/region
    assert gpu_check.repair(str(request), run=run, opener=no_region, boot_id_file=str(boot_id)) == 1
    assert run.commands == [] and not request.exists()


def test_the_default_runner_reports_a_command_that_cannot_start(tmp_path: Path) -> None:
    assert gpu_check.run_command([str(tmp_path / "no-aws-cli-here")]) == 127


def test_main_repair_passes_the_request_and_the_aws_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(gpu_check, "repair", lambda request, *, aws_cli: seen.append((request, aws_cli)) or 0)
    assert (
        gpu_check.main(["gpu_check.py", "repair", "/run/dlinfra/gpu-repair/request", "--aws-cli", "/snap/bin/aws"]) == 0
    )
    assert gpu_check.main(["gpu_check.py", "repair", str(tmp_path / "request")]) == 0
    assert seen == [("/run/dlinfra/gpu-repair/request", "/snap/bin/aws"), (str(tmp_path / "request"), "aws")]
    assert gpu_check.main(["gpu_check.py", "repair"]) == 2  # no request file
    assert gpu_check.main(["gpu_check.py", "repair", "a", "--aws-cli"]) == 2


def test_main_repair_refuses_a_bad_request_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    request, boot_id = write_request(tmp_path, action="format-disks")
    monkeypatch.setattr(gpu_check, "BOOT_ID", str(boot_id))

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a refused request ran a command")

    monkeypatch.setattr(gpu_check.subprocess, "run", never)
    assert gpu_check.main(["gpu_check.py", "repair", str(request)]) == 2
    assert not request.exists()
