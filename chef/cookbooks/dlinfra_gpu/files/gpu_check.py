"""The GPU health check of one node: are all its GPUs there, of the expected model, healthy, and fast enough?

It runs on the GPU machine itself: in an image's validate step, as the node's burn-in before it takes work, and by
hand (`python3 gpu_check.py EXPECTATION.json`; dlinfra writes the expectation of each pool and site from its data,
dlinfra.model.gpu_health). Standard library plus NVIDIA's NVML bindings (nvidia-ml-py, module `pynvml`); PyTorch for
the throughput tests and `dcgmi` for DCGM's diagnostic, each only where the expectation asks for it.

What it reads, per GPU (NVML API reference, docs.nvidia.com/deploy/nvml-api):
- the product name (nvmlDeviceGetName) and the GPU count;
- memory health as the generation reports it: on Ampere and later the row remapper (nvmlDeviceGetRemappedRows: a
  pending remap needs a GPU reset, a failed one a new GPU; nvmlDeviceGetRowRemapperHistogram: banks with no spare row
  left cannot repair the next error, and refusing them is dlinfra's policy, stricter than NVIDIA's rule of a failed
  remap), where retired pages read "not supported"; before Ampere
  the retired pages (nvmlDeviceGetRetiredPages, nvmlDeviceGetRetiredPagesPendingStatus: a pending retirement needs a
  driver reload) (NVIDIA "Dynamic Page Retirement", "GPU Memory Error Management");
- uncorrectable ECC errors since the driver loaded (nvmlDeviceGetTotalEccErrors, volatile), and ECC switched off;
- the driver's own verdict: the recovery action it asks for (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, which
  Xid 154 announces), and on NVSwitch machines whether Fabric Manager trained the fabric (nvmlDeviceGetGpuFabricInfo);
and per node: the Xid events the driver logged to the kernel since boot, classed by NVIDIA's Xid catalog (the
expectation carries the codes that take a GPU out of work), the EFA devices (/sys/class/infiniband), and optionally
DCGM's diagnostic and a BF16 matrix multiply and a device-to-device copy against per-model floors.

Prints one JSON report: {"passed": bool, "problems": [...], "reading": {...}}; exits 0 when the node passes, 1 when it
does not, 2 when it could not be checked (no NVML, unreadable expectation). The expectation is one node's, or a cloud
pool's {"instance_types": {type: expectation}}, of which it takes the machine's own (EC2 Nitro instances name their
type in the DMI product name). With `--report FILE` it also writes the report, with the verdict, the time and the
boot it is for, to FILE (atomically, by rename): the burn-in's unit writes it at every boot and the burn-in agent in
the cluster reads it (components/scripts/gpu_burn_in.py).

The watch (`python3 gpu_check.py watch EXPECTATION.json --health FILE [--interval 60] [--once]`) runs after the burn-in
for the rest of the boot: every interval it takes the check's passive parts only (what NVML reads, judged as above
but for the fabric; the Xids logged since boot; a GPU NVML can no longer read; DCGM's background health watches where
its host engine answers, `dcgmi health`), never DCGM's diagnostic, the throughput tests or the wait for the fabric,
which load the GPUs or take minutes, nor the EFA devices. It writes
FILE the same way: {"boot_id", "started_at" (its first poll on this boot), "updated_at" (its last), "status": "ok" |
"faulted" | "unreadable", "faults": [{"gpu", "check", "detail", "first_seen"}], "notes": [...]}, keeping every fault
seen on this boot, also one a later poll no longer sees; a restarted watch keeps those its file holds for this boot.
What could not be read (dcgmi's own errors, a kernel log that gave nothing) is a note of the last poll, never a fault;
"unreadable": no fault, and NVML could not be read. `--once`: one poll, exit 0 ok, 1 faulted, 2 unreadable.

The repair (`python3 gpu_check.py repair REQUEST [--aws-cli PATH]`) carries out what the cluster approved for a node it
put off work (dlinfra.model.gpu_health, REPAIR_*): the burn-in agent writes the request, {"action", "boot_id", "node",
"approved_at"}, and the repair unit runs this on it. "replace" marks this EC2 instance unhealthy, so that its Auto
Scaling group replaces it; "reboot" reboots the machine. Exit 0 done, 1 the command failed, 2 the request refused (not
JSON, another action, another boot's); a request not carried out is removed, so that the path unit waits for the next.
"""

from __future__ import annotations

import argparse
import calendar
import http.client
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

# NVIDIA's kernel log line for an Xid: "NVRM: Xid (PCI:0000:10:1c): 79, pid=..., GPU has fallen off the bus."
# With MIG the address is followed by the instance: "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, ..."
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)(?: [^)]*)?\): (?P<code>\d+)\b")
EFA_PREFIX = "rdmap"  # EFA's RDMA devices under /sys/class/infiniband (the EFA kernel driver names them rdmapNsM)
INFINIBAND = "/sys/class/infiniband"
DMI_PRODUCT = "/sys/devices/virtual/dmi/id/product_name"  # "p5.48xlarge" on an EC2 Nitro instance
BOOT_ID = "/proc/sys/kernel/random/boot_id"  # changes at every boot; the kernel's, in a container too
# nvmlDeviceGpuRecoveryAction_t (NVML API reference): what the driver says a GPU needs before it is usable again.
RECOVERY_ACTIONS = {
    1: "GPU reset", 2: "node reboot", 3: "drain peer-to-peer", 4: "drain and reset", 5: "recover the IMEX domain",
    6: "bus reset", 7: "system reboot",
}  # fmt: skip
FABRIC_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
# Fabric Manager trains the NVSwitch fabric after it has started, so the check waits this long for every GPU's fabric
# to read COMPLETED before judging it (nvmlGpuFabricInfo_t: the status "must be checked only if state returns
# complete"); a fabric still in training after that is not judged, not failed.
FABRIC_WAIT_SECONDS = 180
FABRIC_POLL_SECONDS = 10
RUNTIME_ERROR = "runtime error: "
# What DCGM's diagnostic levels take at most, for the time limit ("dcgmi diag" reference: level 1 seconds, level 2
# about two minutes, level 3 about fifteen); levels 3 and 4 are for a drained node with no limit.
DCGM_SECONDS = {1: 60, 2: 240, 3: 1800, 4: 3 * 3600}
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # UTC: the report's and the health file's times, as the burn-in agent reads them
# The watch. Its interval is dlinfra.model.gpu_health.WATCH_INTERVAL_SECONDS, by which the burn-in agent tells a
# stopped watch (tests/chef checks they agree).
WATCH_INTERVAL_SECONDS = 60
WATCH_CHECKS = {"driver": "recovery"}  # the burn-in's check names that the health file spells otherwise
# dcgmi health (DCGM reference, "dcgmi health"; NVIDIA/DCGM dcgmi/CommandLineParser.cpp): --set a watches every system
# (PCIe, memory, InfoROM, thermal and power, NVLink, driver, NVSwitch, ConnectX) of the group -g, by default all GPUs,
# replacing the group's watches; they stay in the host engine after dcgmi exits, until the engine restarts.
DCGM_WATCHES = ("dcgmi", "health", "--set", "a")
DCGM_CHECK = ("dcgmi", "health", "--check", "--json")
DCGMI_SECONDS = 60  # one dcgmi call: it answers in a second or two, or its host engine is hung
# A fault whose detail carries a count (ECC errors, some of DCGM's messages) is a new one when the count changes; the
# node is off work from the first, so the file stops growing here rather than with every poll of a long boot.
MAX_FAULTS = 100
# Readings one poll may show of a good GPU: DCGM's health watches fail a GPU on a single NVLink replay or recovery
# error within a minute, and from DCGM 4.5.3 on any nonzero lifetime NVLink CRC, replay or recovery count on A100,
# H100 and H200 (NVIDIA/DCGM modules/health/DcgmHealthWatch.cpp, MonitorNVLinkErrorFields), events NVIDIA's own
# resiliency tooling (nvidia-resiliency-ext) treats as transient unless they persist; and an NVML read that fails once.
# These become faults only when seen on SOFT_POLLS polls within SOFT_WINDOW_SECONDS: one that keeps coming back, even
# between good polls, still does. The others (Xids of the catalog, memory, ECC, the driver's recovery action, a GPU
# missing or of another model) are facts on first sight.
SOFT_CHECKS = frozenset({"dcgm-health", "nvml"})
REPORT_NAME = "report.json"  # the check's report, beside the health file (dlinfra.model.gpu_health.REPORT_PATH)
SOFT_POLLS = 3
MIG_PROFILE = re.compile(r"MIG ([1-8]g\.[0-9]+gb)\b")  # the profile at the end of a MIG device's NVML name
SOFT_WINDOW_SECONDS = 30 * 60


@dataclass(frozen=True)
class Expectation:
    """What this node must show (dlinfra.model.gpu_health.expectation writes it)."""

    gpu_count: int
    products: tuple[str, ...]  # NVML product names any of which a GPU may report
    memory_health: str  # "row_remap" (Ampere and later) or "retired_pages"
    failing_xids: Mapping[int, str]  # Xid -> NVIDIA's immediate action; any of these logged since boot fails
    efa_devices: int = 0
    fabric: bool = False  # NVSwitch: Fabric Manager must have trained the fabric before CUDA works across GPUs
    dcgm_level: int = 0  # 0: no DCGM diagnostic; 1-4: `dcgmi diag -r LEVEL`
    gemm_tflops_floor: float | None = None  # BF16 matrix multiply, per GPU
    bandwidth_gbs_floor: float | None = None  # device memory, per GPU
    # A MIG pool's layout: MIG profile -> instances every GPU must hold (dlinfra.model.gpu_sharing); None: no MIG.
    mig: Mapping[str, int] | None = None
    # What the node must offer Kubernetes once the device plugin runs, resource -> count: a shared node's shares
    # (nvidia.com/mig-<profile>, nvidia.com/gpu.shared); None: gpu_count of nvidia.com/gpu.
    resources: Mapping[str, int] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Expectation:
        return cls(
            gpu_count=int(data["gpu_count"]),
            products=tuple(str(p) for p in data["products"]),
            memory_health=str(data["memory_health"]),
            # Required: an expectation without the Xid catalog would judge nothing of the Xids (not judged, exit 2).
            failing_xids={int(k): str(v) for k, v in data["failing_xids"].items()},
            efa_devices=int(data.get("efa_devices", 0)),
            fabric=bool(data.get("fabric", False)),
            dcgm_level=int(data.get("dcgm_level", 0)),
            gemm_tflops_floor=_float_or_none(data.get("gemm_tflops_floor")),
            bandwidth_gbs_floor=_float_or_none(data.get("bandwidth_gbs_floor")),
            mig={str(k): int(v) for k, v in data["mig"].items()} if data.get("mig") else None,
            resources={str(k): int(v) for k, v in data["resources"].items()} if data.get("resources") else None,
        )


def select(data: Mapping[str, Any], dmi_product: str = DMI_PRODUCT) -> Mapping[str, Any]:
    """The expectation for this machine: `data` itself, or its entry for this machine's instance type."""
    by_type = data.get("instance_types")
    if by_type is None:
        return data
    try:
        with open(dmi_product, encoding="utf-8") as f:
            instance_type = f.read().strip()
    except OSError as exc:
        raise ValueError(f"the expectation is per instance type and this machine's is unknown: {exc}") from None
    if instance_type not in by_type:
        raise ValueError(
            f"no expectation for instance type {instance_type!r} (the pool has {', '.join(sorted(by_type))})"
        )
    # What every type shares (the Xid catalog) is given once, beside the types.
    return {**{k: v for k, v in data.items() if k != "instance_types"}, **by_type[instance_type]}


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass
class GpuReading:
    index: int
    name: str
    pci_bus_id: str = ""
    remapped_rows: dict[str, int] | None = None  # correctable, uncorrectable, pending, failure; None: not supported
    row_spares: dict[str, int] | None = None  # memory banks by spare rows left: max, high, partial, low, none
    retired_pages: dict[str, int] | None = None  # single_bit, double_bit, pending; None: not supported
    uncorrectable_ecc: int | None = None  # volatile count; None: no ECC on this GPU or not supported
    ecc_enabled: bool | None = None  # nvmlDeviceGetEccMode, current; None: not supported
    mig: bool = False  # MIG mode on: NVML does not report remapped rows while MIG instances exist
    mig_devices: dict[str, int] | None = None  # MIG mode on: its MIG devices by profile (1g.10gb -> 7)
    recovery_action: int | None = None  # what the driver says the GPU needs (NVML_GPU_RECOVERY_ACTION_*); None: unknown
    fabric_state: int | None = None  # NVML_GPU_FABRIC_STATE_*; None: not supported (no NVSwitch fabric here)
    fabric_status: int | None = None  # the NVML return code of the fabric's training, once completed
    gemm_tflops: float | None = None
    bandwidth_gbs: float | None = None


@dataclass
class NodeReading:
    nvml: bool = False  # NVML started: without it nothing about the GPUs is known
    driver: str = ""
    gpus: list[GpuReading] = field(default_factory=list)
    xids: list[tuple[str, int]] = field(default_factory=list)  # (PCI address, Xid) logged since boot
    # (index, NVML's error) of each GPU NVML counts but cannot read: fallen off the bus (NVML_ERROR_GPU_IS_LOST), say
    gpu_errors: list[tuple[int, str]] = field(default_factory=list)
    efa_devices: int | None = None
    dcgm: dict[str, Any] | None = None  # {"level": n, "passed": bool, "failures": [...]}
    errors: list[str] = field(default_factory=list)  # what could not be read


@dataclass(frozen=True)
class Problem:
    gpu: int | None  # None: the node as a whole
    check: str
    detail: str
    fault: bool = True  # False: the check could not run, so nothing is known either way (exit 2, not 1)


# Reading ---------------------------------------------------------------------------------------------------


def _supported(nvml: Any, call: Callable[[], Any]) -> Any:
    """The call's value, or None where NVML says this GPU does not support it (a generation's N/A)."""
    try:
        return call()
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
            return None
        raise


def read_gpu(nvml: Any, index: int) -> GpuReading:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    reading = GpuReading(index=index, name=_text(nvml.nvmlDeviceGetName(handle)))
    pci = _supported(nvml, lambda: nvml.nvmlDeviceGetPciInfo(handle))
    if pci is not None:
        reading.pci_bus_id = _text(pci.busId)
    rows = _supported(nvml, lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    if rows is not None:
        correctable, uncorrectable, pending, failure = rows
        reading.remapped_rows = {
            "correctable": int(correctable), "uncorrectable": int(uncorrectable),
            "pending": int(pending), "failure": int(failure),
        }  # fmt: skip
    spares = _supported(nvml, lambda: nvml.nvmlDeviceGetRowRemapperHistogram(handle))
    if spares is not None:
        reading.row_spares = {k: int(getattr(spares, k)) for k in ("max", "high", "partial", "low", "none")}
    single = _supported(
        nvml,
        lambda: nvml.nvmlDeviceGetRetiredPages(handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
    )
    if single is not None:
        double = nvml.nvmlDeviceGetRetiredPages(handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending = nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
        reading.retired_pages = {"single_bit": len(single), "double_bit": len(double), "pending": int(pending)}
    ecc = _supported(nvml, lambda: nvml.nvmlDeviceGetEccMode(handle))
    if ecc is not None:
        reading.ecc_enabled = bool(ecc[0])
    reading.recovery_action = _recovery_action(nvml, handle)
    fabric = _fabric(nvml, handle)
    if fabric is not None:
        reading.fabric_state, reading.fabric_status = fabric
    mig = _supported(nvml, lambda: nvml.nvmlDeviceGetMigMode(handle))
    reading.mig = bool(mig and mig[0])
    if reading.mig:
        reading.mig_devices = _mig_devices(nvml, handle)
    reading.uncorrectable_ecc = _supported(
        nvml,
        lambda: int(
            nvml.nvmlDeviceGetTotalEccErrors(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
        ),
    )
    return reading


def _mig_devices(nvml: Any, handle: Any) -> dict[str, int]:
    """The GPU's MIG devices by profile: a MIG device's name ends in its profile ("NVIDIA A100-SXM4-80GB MIG
    1g.10gb", as `nvidia-smi -L` lists "MIG 1g.10gb Device 0"); an empty slot is NVML_ERROR_NOT_FOUND."""
    found: dict[str, int] = {}
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_FOUND:
                continue
            raise
        name = _text(nvml.nvmlDeviceGetName(device))
        match = MIG_PROFILE.search(name)
        profile = match.group(1) if match else name
        found[profile] = found.get(profile, 0) + 1
    return dict(sorted(found.items()))


def _recovery_action(nvml: Any, handle: Any) -> int | None:
    """The driver's recovery action for the GPU (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, R550 and later; the
    action Xid 154 announces): 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, ..."""
    field = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    if field is None:
        return None
    values = _supported(nvml, lambda: nvml.nvmlDeviceGetFieldValues(handle, [field]))
    if values is None or values[0].nvmlReturn != nvml.NVML_SUCCESS:  # a driver that does not know the field
        return None
    return int(values[0].value.uiVal)


def _fabric(nvml: Any, handle: Any) -> tuple[int, int] | None:
    """(state, status) of the GPU's NVSwitch fabric (nvmlDeviceGetGpuFabricInfo); None where there is none."""
    info = nvml.c_nvmlGpuFabricInfo_t()
    if _supported(nvml, lambda: nvml.nvmlDeviceGetGpuFabricInfo(handle, info)) is None:
        return None
    if info.state == nvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        return None
    return int(info.state), int(info.status)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml(nvml: Any) -> NodeReading:
    """Every GPU NVML sees; an NVML that cannot start is an error of the reading, not an exception."""
    node = NodeReading()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        node.errors.append(f"NVML: {exc}")
        return node
    node.nvml = True
    try:
        node.driver = _text(nvml.nvmlSystemGetDriverVersion())
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                node.gpus.append(read_gpu(nvml, index))
            except nvml.NVMLError as exc:
                node.gpu_errors.append((index, str(exc)))
    finally:
        nvml.nvmlShutdown()
    return node


def pci_key(address: str) -> tuple[int, int, int]:
    """(domain, bus, device) of a PCI address as NVML ("00000000:10:1C.0") or the kernel log ("0000:10:1c") write it."""
    parts = address.lower().split(":")
    domain = int(parts[-3], 16) if len(parts) >= 3 else 0
    return domain, int(parts[-2], 16), int(parts[-1].split(".")[0], 16)


def parse_xids(kernel_log: str) -> list[tuple[str, int]]:
    """(PCI address, Xid) of each NVRM Xid line of a kernel log."""
    return [(m["pci"].lower(), int(m["code"])) for m in XID_LINE.finditer(kernel_log)]


def kernel_log() -> str:
    """The kernel's messages since boot: the first of journald and the ring buffer that has any (in a container
    journalctl may succeed with nothing to show while dmesg has the lines)."""
    for command in (["journalctl", "-k", "-b", "-o", "cat", "--no-pager"], ["dmesg"]):
        if shutil.which(command[0]):
            done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout
    raise OSError("cannot read the kernel log: journalctl -k and dmesg gave nothing")


def read_xids(node: NodeReading, log: str | None) -> None:
    """The Xids of the kernel log into the reading; None (the log could not be read): an error of the reading."""
    if log is not None:
        node.xids = parse_xids(log)
    else:
        node.errors.append("the kernel log could not be read: Xid events unknown")


def count_efa(root: str = INFINIBAND) -> int:
    """EFA devices the kernel driver registered."""
    try:
        return sum(1 for name in os.listdir(root) if name.startswith(EFA_PREFIX))
    except FileNotFoundError:
        return 0


def run_dcgm(level: int, timeout: float = 3 * 3600) -> dict[str, Any]:
    """DCGM's diagnostic at `level` (`dcgmi diag -r LEVEL -j`): passed unless a test failed. "ran" is False when the
    diagnostic itself could not run to the end (no host engine, a runtime error, a timeout): the GPUs were not
    judged."""
    try:
        done = subprocess.run(
            ["dcgmi", "diag", "-r", str(level), "-j"], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {"level": level, "passed": False, "failures": [f"dcgmi did not finish within {timeout:.0f} s"],
                "ran": False}  # fmt: skip
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        # No JSON at all: dcgmi itself failed (nv-hostengine not running, say), so the GPUs were not judged.
        failure = f"dcgmi exited {done.returncode}: {(done.stderr or done.stdout)[-500:]}"
        return {"level": level, "passed": False, "failures": [failure], "ran": False}
    failures = dcgm_failures(report)
    tests_failed = [f for f in failures if not f.startswith(RUNTIME_ERROR)]
    if not tests_failed and (failures or done.returncode != 0):
        # DCGM's own failure (paused, unsupported driver, NVVS killed), reported in JSON as a runtime error
        # (dcgmi/Diag.cpp HelperDisplayFailureMessage), or an exit without a failed test: nothing is known of the GPUs.
        failures = failures or [f"dcgmi exited {done.returncode} without a failed test"]
        return {"level": level, "passed": False, "failures": failures, "ran": False}
    return {"level": level, "passed": not failures, "failures": failures, "ran": True}


def dcgm_failures(report: Mapping[str, Any]) -> list[str]:
    """What failed in dcgmi's JSON report (DCGM testing/python3/dcgm_diag_schema.json: "DCGM Diagnostic" holds
    test_categories, each with tests that have per-entity results and a test_summary, and a runtime_error when the
    run itself failed)."""
    diag = report.get("DCGM Diagnostic", report.get("DCGM GPU Diagnostic"))  # DCGM 4, DCGM 3
    if not isinstance(diag, Mapping):
        return ["no 'DCGM Diagnostic' in dcgmi's report"]
    failures = [f"{RUNTIME_ERROR}{diag['runtime_error']}"] if diag.get("runtime_error") else []
    for category in diag.get("test_categories") or ():
        for test in category.get("tests") or ():
            failed = [
                r.get("entity_id") for r in test.get("results") or () if str(r.get("status", "")).lower() == "fail"
            ]
            summary = str((test.get("test_summary") or {}).get("status", "")).lower()
            if failed or summary == "fail":
                where = f" (GPU {', '.join(str(e) for e in failed)})" if failed else ""
                failures.append(f"{test.get('name', 'unnamed test')}{where}")
    return failures


def measure_throughput(gpus: Sequence[GpuReading], size: int = 8192, seconds: float = 5.0) -> None:
    """BF16 matrix multiply (TFLOPS) and device-to-device copy (GB/s) on each GPU, with PyTorch."""
    # CUDA numbers GPUs fastest first unless told otherwise; NVML, whose index the readings carry, by PCI bus.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    import torch  # only where the expectation has floors: images with PyTorch

    for gpu in gpus:
        with torch.cuda.device(gpu.index):  # streams and timing events on the GPU under test
            _measure(torch, gpu, size, seconds)
            torch.cuda.empty_cache()


def _measure(torch: Any, gpu: GpuReading, size: int, seconds: float) -> None:
    device = torch.device(f"cuda:{gpu.index}")
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    gpu.gemm_tflops = 2 * size**3 * _rate(lambda: torch.matmul(a, b), device, seconds) / 1e12
    source = torch.empty(1 << 30, device=device, dtype=torch.uint8)  # 1 GiB
    target = torch.empty_like(source)
    # A copy reads and writes every byte.
    gpu.bandwidth_gbs = 2 * source.numel() * _rate(lambda: target.copy_(source), device, seconds) / 1e9


def _rate(step: Callable[[], Any], device: Any, seconds: float) -> float:
    """Steps per second, after a warm-up, timed on the GPU by events."""
    import torch

    for _ in range(3):
        step()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    count, began = 0, time.monotonic()
    start.record()
    while time.monotonic() - began < seconds:
        step()
        count += 1
    end.record()
    torch.cuda.synchronize(device)
    return float(count / (start.elapsed_time(end) / 1000))


# Judging ---------------------------------------------------------------------------------------------------


def problems(
    expect: Expectation, node: NodeReading, known_gpus: Mapping[tuple[int, int, int], int] | None = None
) -> list[Problem]:
    """Every reason this node must not take work; none: it passes. `known_gpus`: GPU indexes by PCI address (pci_key)
    from earlier readings, which name the GPU of an Xid after NVML has lost it (the watch's)."""
    found = [Problem(None, "read", error, fault=False) for error in node.errors]
    if len(node.gpus) != expect.gpu_count:
        found.append(Problem(None, "count", f"{len(node.gpus)} GPUs visible, {expect.gpu_count} expected"))
    # A GPU NVML counts but cannot read: lost (fallen off the bus) or broken, either way unusable.
    found += [Problem(index, "nvml", f"NVML cannot read this GPU: {error}") for index, error in node.gpu_errors]
    for gpu in node.gpus:
        found += _gpu_problems(expect, gpu)
    by_pci = {**(known_gpus or {}), **{pci_key(gpu.pci_bus_id): gpu.index for gpu in node.gpus if gpu.pci_bus_id}}
    for pci, code in node.xids:
        if code in expect.failing_xids:
            found.append(
                Problem(by_pci.get(pci_key(pci)), "xid", f"Xid {code} logged ({pci}): {expect.failing_xids[code]}")
            )
    if expect.efa_devices and node.efa_devices != expect.efa_devices:
        found.append(Problem(None, "efa", f"{node.efa_devices} EFA devices, {expect.efa_devices} expected"))
    if expect.dcgm_level:
        if node.dcgm is None:
            found.append(Problem(None, "dcgm", f"DCGM diagnostic level {expect.dcgm_level} did not run", fault=False))
        elif not node.dcgm["passed"]:
            failures = ", ".join(node.dcgm["failures"])
            found.append(Problem(None, "dcgm", f"level {node.dcgm['level']} failed: {failures}", node.dcgm["ran"]))
    return found


def _gpu_problems(expect: Expectation, gpu: GpuReading) -> list[Problem]:
    found = []

    def add(check: str, detail: str, fault: bool = True) -> None:
        found.append(Problem(gpu.index, check, detail, fault))

    if gpu.name not in expect.products:
        add("model", f"{gpu.name!r}, expected {' or '.join(repr(p) for p in expect.products)}")
    if expect.mig is not None:
        if not gpu.mig:
            add("mig", f"MIG mode is off, expected the pool's layout {_layout(expect.mig)} (dlinfra-mig.service)")
        elif gpu.mig_devices != dict(expect.mig):
            add("mig", f"MIG instances {_layout(gpu.mig_devices or {})}, expected {_layout(expect.mig)}")
    if expect.memory_health == "row_remap":
        rows = gpu.remapped_rows
        if rows is None and gpu.mig and expect.mig is not None:
            pass  # NVML hides row remapping while MIG instances exist; a MIG pool's GPUs keep theirs (Xids 63, 64 and
            # uncorrectable ECC errors, which are read, still show a failing memory)
        elif rows is None and gpu.mig:
            add("memory", "row remapping cannot be read while MIG instances exist: check it with MIG off", fault=False)
        elif rows is None:
            add("memory", "row remapping not readable (NVML: not supported), though this GPU generation remaps rows")
        else:
            if rows["failure"]:
                add("memory", "a row remapping failed: the GPU needs replacing")
            if rows["pending"]:
                add("memory", "a row remapping is pending: reset the GPU to apply it")
        if gpu.row_spares and gpu.row_spares["none"]:
            add(
                "memory",
                f"{gpu.row_spares['none']} memory banks have no spare rows left: the next uncorrectable error there "
                "cannot be remapped",
            )
    else:
        pages = gpu.retired_pages
        if pages is None:
            add("memory", "retired pages not readable (NVML: not supported)")
        elif pages["pending"]:
            add("memory", "a page retirement is pending: reload the driver (reboot) to apply it")
    if gpu.recovery_action:
        action = RECOVERY_ACTIONS.get(gpu.recovery_action, "unknown")
        add("driver", f"the driver asks for recovery action {gpu.recovery_action} ({action})")
    if expect.fabric and gpu.fabric_state is not None:
        if gpu.fabric_state != FABRIC_COMPLETED:
            add(
                "fabric",
                f"NVSwitch fabric not trained after {FABRIC_WAIT_SECONDS} s (state {gpu.fabric_state}): is Fabric "
                "Manager running?",
                fault=False,
            )
        elif gpu.fabric_status:
            add("fabric", f"NVSwitch fabric training failed (NVML status {gpu.fabric_status})")
    if gpu.ecc_enabled is False:
        add("ecc", "ECC is off: memory errors would go unseen (nvidia-smi -e 1, then a reset)")
    if gpu.uncorrectable_ecc:
        add("ecc", f"{gpu.uncorrectable_ecc} uncorrectable ECC errors since the driver loaded")
    for check, value, floor, unit in (
        ("gemm", gpu.gemm_tflops, expect.gemm_tflops_floor, "TFLOPS BF16"),
        ("bandwidth", gpu.bandwidth_gbs, expect.bandwidth_gbs_floor, "GB/s"),
    ):
        if floor is None:
            continue
        if value is None:
            add(check, "not measured", fault=False)
        elif value < floor:
            add(check, f"{value:.0f} {unit}, below the floor of {floor:.0f}")
    return found


def _layout(devices: Mapping[str, int]) -> str:
    return ", ".join(f"{n} x {p}" for p, n in sorted(devices.items())) or "none"


# The command -----------------------------------------------------------------------------------------------


def _fabric_training(expect: Expectation, node: NodeReading) -> bool:
    return expect.fabric and any(g.fabric_state not in (None, FABRIC_COMPLETED) for g in node.gpus)


def check(
    expect: Expectation,
    nvml: Any,
    log: str | None,
    efa_root: str = INFINIBAND,
    *,
    time_limit: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """The whole check; `time_limit`: seconds it may take (DCGM's diagnostic gets what is left), None: no limit."""
    started = time.monotonic()
    node = read_nvml(nvml)
    waited = 0
    while _fabric_training(expect, node) and waited < FABRIC_WAIT_SECONDS:
        sleep(FABRIC_POLL_SECONDS)
        waited += FABRIC_POLL_SECONDS
        node = read_nvml(nvml)
    read_xids(node, log)
    node.efa_devices = count_efa(efa_root)
    if node.gpus and (expect.gemm_tflops_floor is not None or expect.bandwidth_gbs_floor is not None):
        try:
            measure_throughput(node.gpus)
        except (ImportError, RuntimeError, OSError) as exc:  # no PyTorch, no CUDA: floors report "not measured"
            node.errors.append(f"throughput: {type(exc).__name__}: {exc}")
    if expect.dcgm_level and shutil.which("dcgmi"):
        left = 3 * 3600 if time_limit is None else time_limit - (time.monotonic() - started) - 30
        needed = DCGM_SECONDS.get(expect.dcgm_level, 3600)
        if left >= needed:
            node.dcgm = run_dcgm(expect.dcgm_level, timeout=left)
        else:  # it could not finish: not judged, rather than a timeout counted against the GPUs
            node.dcgm = {"level": expect.dcgm_level, "passed": False, "ran": False,
                         "failures": [f"{left:.0f} s left of the time limit, level {expect.dcgm_level} takes "
                                      f"{needed} s or more: not run"]}  # fmt: skip
    found = problems(expect, node)
    return {
        "passed": not found,
        # Unhealthy is known only from a fault; otherwise an unfinished check leaves the node unjudged.
        "checked": node.nvml and (any(p.fault for p in found) or not found),
        "expected_gpus": expect.gpu_count,  # the burn-in agent waits until the node advertises this many
        # ... or, on a shared node, these shares (resource -> count) instead of whole GPUs
        **({"expected_resources": dict(expect.resources)} if expect.resources else {}),
        "problems": [asdict(p) for p in found],
        "reading": asdict(node),
    }


def verdict(report: Mapping[str, Any]) -> str:
    """ "passed", "failed" (a fault was found) or "unchecked" (nothing is known either way)."""
    return "passed" if report.get("passed") else "failed" if report.get("checked") else "unchecked"


def write_report(path: str, report: Mapping[str, Any], *, boot_id_file: str | None = None) -> None:
    """The report as the burn-in agent reads it: with its verdict, when it finished and which boot it is for."""
    stamped = {
        "verdict": verdict(report),
        "finished_at": stamp(time.time()),
        "boot_id": read_boot_id(boot_id_file),
        **report,
    }
    write_json(path, stamped)


def read_boot_id(path: str | None = None) -> str:
    """This boot's id (BOOT_ID, or `path`); "" where it cannot be read."""
    try:
        with open(path or BOOT_ID, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def stamp(seconds: float) -> str:
    """A time (seconds since the epoch) as the report and the health file write it (TIME_FORMAT)."""
    return time.strftime(TIME_FORMAT, time.gmtime(seconds))


def write_json(path: str, data: Mapping[str, Any]) -> None:
    """`data` to `path` as JSON, whole or not at all (written aside, then renamed), mode 0644."""
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o644)  # whatever the umask: the burn-in agent's pod reads it through a host mount
        json.dump(data, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)  # the agent never reads half a file


def load_expectation(path: str) -> Expectation:
    """This machine's expectation from the file dlinfra writes (select)."""
    with open(path, encoding="utf-8") as f:
        return Expectation.from_json(select(json.load(f)))


def run_check(expect_file: str, time_limit: float | None = None) -> dict[str, Any]:
    """The whole check from an expectation file; any failure still gives a report (not passed, not judged)."""
    try:
        expect = load_expectation(expect_file)
        import pynvml
    except (OSError, ValueError, KeyError, TypeError, ImportError) as exc:
        return {"passed": False, "checked": False, "error": f"cannot check: {type(exc).__name__}: {exc}"}
    try:
        log: str | None = kernel_log()
    except (OSError, subprocess.SubprocessError):
        log = None
    try:
        return check(expect, pynvml, log, time_limit=time_limit)
    except Exception as exc:  # noqa: BLE001 - any failure still gives a verdict: not passed, not judged
        return {"passed": False, "checked": False, "error": f"{type(exc).__name__}: {exc}"}


def main(argv: Sequence[str]) -> int:
    """python3 gpu_check.py EXPECTATION.json [--report FILE]: exit 0 passed, 1 failed, 2 not judged; with `watch`
    first, the watch (watch_main); with `repair`, the repair (repair_main)."""
    if len(argv) > 1 and argv[1] == "watch":  # an expectation file named "watch" is given as ./watch
        return watch_main(argv[2:])
    if len(argv) > 1 and argv[1] == "repair":  # likewise ./repair
        return repair_main(argv[2:])
    parser = argparse.ArgumentParser(prog="gpu_check.py", description="The GPU health check of this machine.")
    parser.add_argument("expectation", help="the JSON `dlinfra gpu expect` writes (one node's, or per instance type)")
    parser.add_argument("--report", metavar="FILE", help="also write the stamped report here (the burn-in's)")
    parser.add_argument(
        "--time-limit", type=float, metavar="SECONDS", help="finish within this (DCGM's diagnostic gets what is left)"
    )
    try:
        args = parser.parse_args(argv[1:])
    except SystemExit as exc:
        return 2 if exc.code else 0
    report = run_check(args.expectation, args.time_limit)
    print(json.dumps(report, indent=2))
    if args.report:
        write_report(args.report, report)
    return {"passed": 0, "failed": 1}.get(verdict(report), 2)


# The watch -------------------------------------------------------------------------------------------------


def passive(expect: Expectation) -> Expectation:
    """The expectation as the watch judges it: what reading the GPUs shows, without loading them (DCGM's diagnostic,
    the throughput floors) or waiting on them (the fabric's training, judged once per boot by the burn-in, as the EFA
    devices are)."""
    return replace(expect, efa_devices=0, fabric=False, dcgm_level=0, gemm_tflops_floor=None, bandwidth_gbs_floor=None)


class DcgmWatches:
    """DCGM's background health watches: set once where the host engine answers, then checked at every poll. What
    dcgmi itself fails at (no host engine, the watches gone with its restart) is a note, never a GPU's fault."""

    def __init__(self) -> None:
        self.watching = False  # the watches are set on the host engine

    def check(self) -> tuple[list[Problem], list[str]]:
        """(faults, notes) of `dcgmi health --check`."""
        if shutil.which("dcgmi") is None:
            return [], ["dcgmi health: no dcgmi on PATH: DCGM's health watches not read"]
        if not self.watching:
            error = _dcgmi(DCGM_WATCHES)[1]
            if error:
                return [], [f"dcgmi health --set a: {error}"]
            self.watching = True
        output, error = _dcgmi(DCGM_CHECK)
        if not error:
            try:
                return dcgm_health(json.loads(output))
            except ValueError as exc:
                return [], [f"dcgmi health --check: not JSON ({exc}): {output[-300:]}"]
        # A host engine that restarted has no watches ("Error: Health watches not enabled"): set them again next poll.
        self.watching = False
        return [], [f"dcgmi health --check: {error}"]


def _dcgmi(command: Sequence[str]) -> tuple[str, str]:
    """(stdout, error) of a dcgmi call; error "" when it exits 0. dcgmi writes its errors to stdout ("Error: Unable
    to connect to host engine. ...", NVIDIA/DCGM dcgmi/Command.cpp) and exits non-zero."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=DCGMI_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        return "", f"no answer within {DCGMI_SECONDS} s"
    except OSError as exc:
        return "", str(exc)
    if done.returncode == 0:
        return done.stdout, ""
    return done.stdout, f"exited {done.returncode}: {' '.join((done.stdout + done.stderr).split())[-300:]}"


def dcgm_health(report: Any) -> tuple[list[Problem], list[str]]:
    """(faults, notes) of `dcgmi health --check --json`: a system that reads "Failure" (DCGM_HEALTH_RESULT_FAIL) is a
    fault, "Warning" a note. The report (NVIDIA/DCGM dcgmi/Health.cpp GenerateOutputFromResponse, in the JSON of
    dcgmi/DcgmiOutput.h): {"header": ["Health Monitor Report"], "body": {"Overall Health": {"value": "Healthy",
    "Warning" or "Failure"}, ENTITY GROUP ("GPU", "Switch", ...): {"children": {ENTITY ID: {"value": its worst,
    "children": {"Errors": {"children": {SYSTEM ("Memory system", ...): {"value": its result, "overflow": its
    messages, cut into lines of at most 54 characters}}}}}}}}}."""
    body = report.get("body") if isinstance(report, Mapping) else None
    if not isinstance(body, Mapping) or not isinstance(body.get("Overall Health"), Mapping):
        return [], ["dcgmi health --check: no 'Overall Health' in its report"]
    faults: list[Problem] = []
    notes: list[str] = []
    for group, entities in body.items():
        for entity, entry in _children(entities).items():
            for system, result in _children(_children(entry).get("Errors")).items():
                value = result.get("value") if isinstance(result, Mapping) else None
                lines = result.get("overflow") if isinstance(result, Mapping) else None
                message = " ".join(str(line) for line in lines) if isinstance(lines, list) else ""
                # DCGM numbers the GPUs as NVML enumerates them (dcgmlib/src/DcgmCacheManager.cpp: gpuId = NVML index).
                gpu = int(entity) if group == "GPU" and str(entity).isdigit() else None
                where = "" if gpu is not None else f" of {group} {entity}"
                detail = f"DCGM {system}{where}: {message}"
                if value == "Failure":
                    faults.append(Problem(gpu, "dcgm-health", detail))
                elif value == "Warning":
                    notes.append(("" if gpu is None else f"GPU {gpu}: ") + f"{detail} (a warning)")
    if not faults and body["Overall Health"].get("value") == "Failure":
        # A failure where this reading of the report finds none: the node's, rather than none at all.
        faults.append(
            Problem(None, "dcgm-health", "DCGM overall health: Failure (no failing system in dcgmi's report)")
        )
    return faults, notes


def _children(entry: Any) -> Mapping[str, Any]:
    """The children of a node of dcgmi's JSON report; none where it has none."""
    children = entry.get("children") if isinstance(entry, Mapping) else None
    return children if isinstance(children, Mapping) else {}


def watch_poll(
    expect: Expectation,
    nvml: Any,
    log: str | None,
    dcgm: DcgmWatches,
    known_gpus: dict[tuple[int, int, int], int],
) -> tuple[list[Problem], list[str], bool]:
    """One look at the GPUs, the check's passive parts only: (faults, notes, whether NVML could be read).
    `known_gpus` learns each GPU's PCI address (pci_key), so an Xid still names a GPU NVML has since lost."""
    node = read_nvml(nvml)
    read_xids(node, log)
    known_gpus.update({pci_key(gpu.pci_bus_id): gpu.index for gpu in node.gpus if gpu.pci_bus_id})
    found = problems(passive(expect), node, known_gpus)
    if not node.nvml:  # no driver: nothing of the GPUs is known, so no count or model to judge; the kernel's Xids are
        found = [p for p in found if p.check == "xid" or not p.fault]
    faults = [replace(p, check=WATCH_CHECKS.get(p.check, p.check)) for p in found if p.fault]
    notes = [("" if p.gpu is None else f"GPU {p.gpu}: ") + p.detail for p in found if not p.fault]
    if node.nvml:  # DCGM's host engine reads the GPUs through the same driver
        dcgm_faults, dcgm_notes = dcgm.check()
        faults += dcgm_faults
        notes += dcgm_notes
    return faults, notes, node.nvml


def latch(kept: Sequence[Mapping[str, Any]], found: Sequence[Problem], seen_at: str) -> list[dict[str, Any]]:
    """This boot's faults: those kept, then each found that is not among them (by GPU, check and detail), first seen
    at `seen_at`; at most MAX_FAULTS."""
    faults = [dict(f) for f in kept]
    known = {(f["gpu"], f["check"], f["detail"]) for f in faults}
    for p in found:
        if (p.gpu, p.check, p.detail) not in known and len(faults) < MAX_FAULTS:
            known.add((p.gpu, p.check, p.detail))
            faults.append({"gpu": p.gpu, "check": p.check, "detail": p.detail, "first_seen": seen_at})
    return faults


Suspects = dict[tuple[Any, str, str], list[str]]  # a soft reading (gpu, check, what) -> the polls that saw it


def confirmed(found: Sequence[Problem], suspects: Suspects, now: str) -> tuple[list[Problem], Suspects]:
    """The faults of this poll to keep: every one not in SOFT_CHECKS, and a soft one seen on SOFT_POLLS polls within
    SOFT_WINDOW_SECONDS (its sightings in `suspects`, by what it is rather than its exact words, whose counts change);
    and the suspects as they now stand."""

    def recent(times: list[str]) -> list[str]:
        return [t for t in times if _seconds(now) - _seconds(t) < SOFT_WINDOW_SECONDS]

    seen = {key: recent(times) for key, times in suspects.items()}
    keep = []
    for p in found:
        if p.check not in SOFT_CHECKS:
            keep.append(p)
            continue
        times = seen.setdefault((p.gpu, p.check, p.detail.split(":", 1)[0]), [])
        times.append(now)
        if len(times) >= SOFT_POLLS:
            keep.append(p)
    return keep, {key: times for key, times in seen.items() if times}


def _passed_at(health_file: str | None, boot_id: str) -> str:
    """When this boot's check last passed, from its report beside the health file ("" if it has not)."""
    if not health_file:
        return ""
    try:
        with open(os.path.join(os.path.dirname(health_file), REPORT_NAME), encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError):
        return ""
    if not isinstance(report, dict) or report.get("boot_id") != boot_id or report.get("verdict") != "passed":
        return ""
    return str(report.get("finished_at", ""))


def _seconds(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, TIME_FORMAT)))


def kept_faults(path: str, boot_id: str) -> tuple[str | None, list[dict[str, Any]], Suspects]:
    """(started_at, faults, suspects) of the health file a watch wrote earlier on this boot, which a restarted watch
    keeps; (None, [], {}) for a file of an earlier boot, no file, or one that cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None, [], {}
    if not boot_id or not isinstance(data, dict) or data.get("boot_id") != boot_id:
        return None, [], {}
    faults = [
        {"gpu": f.get("gpu"), "check": str(f["check"]), "detail": str(f["detail"]),
         "first_seen": str(f.get("first_seen", ""))}
        for f in data.get("faults") or ()
        if isinstance(f, dict) and "check" in f and "detail" in f
    ]  # fmt: skip
    suspects = {
        (s.get("gpu"), str(s["check"]), str(s["what"])): [str(t) for t in s.get("seen") or ()]
        for s in data.get("suspects") or ()
        if isinstance(s, dict) and "check" in s and "what" in s
    }
    return (str(data["started_at"]) if data.get("started_at") else None), faults, suspects


def _poll(
    expect_file: str,
    nvml: Any,
    read_log: Callable[[], str],
    dcgm: DcgmWatches,
    known_gpus: dict[tuple[int, int, int], int],
) -> tuple[list[Problem], list[str], bool]:
    """watch_poll from the files, what cannot be read a note: the watch outlives any one poll."""
    try:
        expect = load_expectation(expect_file)
        bindings = nvml if nvml is not None else importlib.import_module("pynvml")
    except (OSError, ValueError, KeyError, TypeError, ImportError) as exc:
        return [], [f"cannot watch: {type(exc).__name__}: {exc}"], False
    try:
        log: str | None = read_log()
    except (OSError, subprocess.SubprocessError):
        log = None
    try:
        return watch_poll(expect, bindings, log, dcgm, known_gpus)
    except Exception as exc:  # noqa: BLE001 - the next poll may read what this one could not; the faults stay kept
        return [], [f"{type(exc).__name__}: {exc}"], False


def watch(
    expect_file: str,
    health_file: str | None,
    *,
    interval: float = WATCH_INTERVAL_SECONDS,
    polls: int | None = None,
    nvml: Any = None,
    read_log: Callable[[], str] | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    boot_id_file: str | None = None,
) -> dict[str, Any]:
    """The watch: a poll every `interval` seconds (`polls` of them; None: for ever), the health file written after
    each, and printed when it changes; returns the last health. `nvml`: NVML's bindings (None: pynvml); `read_log`:
    the kernel's messages since boot (None: kernel_log)."""
    boot_id = read_boot_id(boot_id_file)
    started_at, faults, suspects = kept_faults(health_file, boot_id) if health_file else (None, [], {})
    dcgm = DcgmWatches()
    known_gpus: dict[tuple[int, int, int], int] = {}
    shown: tuple[Any, ...] = ()
    done = 0
    while True:
        now = stamp(clock())
        started_at = started_at or now
        found, notes, judged = _poll(expect_file, nvml, read_log or kernel_log, dcgm, known_gpus)
        if not judged and known_gpus:  # NVML read the GPUs earlier on this boot, and cannot now: the driver's fault
            found.append(
                Problem(None, "nvml", f"NVML cannot read the GPUs any more: {'; '.join(notes) or 'no reason'}")
            )
        passed_at = _passed_at(health_file, boot_id)
        if passed_at:  # a check that passed after them has judged them gone; what persists is seen again from now
            faults = [f for f in faults if f["first_seen"] >= passed_at]
            suspects = {key: [t for t in times if t >= passed_at] for key, times in suspects.items()}
        kept, suspects = confirmed(found, suspects, now)
        faults = latch(faults, kept, now)
        if len(faults) >= MAX_FAULTS:
            notes.append(f"the health file keeps the first {MAX_FAULTS} faults of the boot; later ones are not added")
        notes += [
            f"suspected: {'' if gpu is None else f'GPU {gpu} '}{check}: {what}, seen {len(times)} of the {SOFT_POLLS} "
            f"polls within {SOFT_WINDOW_SECONDS // 60} minutes that make it a fault"
            for (gpu, check, what), times in sorted(suspects.items(), key=str)
            if len(times) < SOFT_POLLS
        ]
        status = "faulted" if faults else "ok" if judged else "unreadable"
        health = {"boot_id": boot_id, "started_at": started_at, "updated_at": now, "status": status,
                  "faults": faults, "notes": notes,
                  "suspects": [{"gpu": gpu, "check": check, "what": what, "seen": times}
                               for (gpu, check, what), times in sorted(suspects.items(), key=str)]}  # fmt: skip
        if health_file:
            write_json(health_file, health)
        if (status, faults, notes) != shown:  # the journal gets each change, not every poll
            print(json.dumps(health, indent=2), flush=True)
            shown = (status, faults, notes)
        done += 1
        if polls is not None and done >= polls:
            return health
        sleep(interval)


def watch_main(argv: Sequence[str]) -> int:
    """gpu_check.py watch EXPECTATION.json [--health FILE] [--interval SECONDS] [--once]: for ever; with --once one
    poll, exit 0 ok, 1 faulted, 2 unreadable (2 also for a wrong command line)."""
    parser = argparse.ArgumentParser(prog="gpu_check.py watch", description="Watch this machine's GPUs' health.")
    parser.add_argument("expectation", help="the JSON `dlinfra gpu expect` writes (one node's, or per instance type)")
    parser.add_argument("--health", metavar="FILE", help="write the health here after every poll (the watch unit's)")
    parser.add_argument(
        "--interval", type=float, default=WATCH_INTERVAL_SECONDS, metavar="SECONDS", help="between polls"
    )
    parser.add_argument("--once", action="store_true", help="one poll, then exit by its status")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if args.interval <= 0:
        print(f"gpu_check.py watch: --interval must be more than 0 seconds, got {args.interval}", file=sys.stderr)
        return 2
    health = watch(args.expectation, args.health, interval=args.interval, polls=1 if args.once else None)
    return {"ok": 0, "faulted": 1}.get(health["status"], 2)


# The repair ------------------------------------------------------------------------------------------------

REPAIR_ACTIONS = ("replace", "reboot")  # dlinfra.model.gpu_health.REPAIR_ACTIONS: a cloud node's, a site machine's
# IMDSv2 (EC2 User Guide, "Use the Instance Metadata Service to access instance metadata"): a session token by PUT,
# then each read with it. This runs on the host, so the token's default hop limit of 1 is enough.
IMDS = "http://169.254.169.254/latest"
IMDS_TOKEN_TTL_SECONDS = 60  # the token outlives the two reads that need it
IMDS_SECONDS = 2.0  # IMDS answers at once on the instance; not at all elsewhere (a site machine sent "replace")
# One command of the repair: the AWS CLI's SetInstanceHealth call (one API request, with the CLI's own retries), or
# systemctl reboot, which returns once the reboot is queued (systemctl(1)). The unit's TimeoutStartSec stands above.
REPAIR_COMMAND_SECONDS = 120


def run_command(command: Sequence[str]) -> int:
    """The command's exit status, its output to the journal; 127 where it cannot start, 124 past
    REPAIR_COMMAND_SECONDS (as coreutils' timeout(1) says it)."""
    try:
        return subprocess.run(list(command), timeout=REPAIR_COMMAND_SECONDS, check=False).returncode
    except subprocess.TimeoutExpired:
        print(f"gpu_check.py repair: {command[0]}: no end within {REPAIR_COMMAND_SECONDS} s", file=sys.stderr)
        return 124
    except OSError as exc:
        print(f"gpu_check.py repair: {command[0]}: {exc}", file=sys.stderr)
        return 127


def imds(items: Sequence[str], opener: Callable[..., Any] = urllib.request.urlopen) -> tuple[str, ...]:
    """This instance's metadata at each of `items` (paths under meta-data/), by IMDSv2; OSError where IMDS cannot be
    read."""
    ttl = {"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_SECONDS)}
    token = _imds_read(opener, urllib.request.Request(f"{IMDS}/api/token", method="PUT", headers=ttl))
    auth = {"X-aws-ec2-metadata-token": token}
    return tuple(_imds_read(opener, urllib.request.Request(f"{IMDS}/meta-data/{item}", headers=auth)) for item in items)


def _imds_read(opener: Callable[..., Any], request: urllib.request.Request) -> str:
    try:
        with opener(request, timeout=IMDS_SECONDS) as response:
            text = str(response.read().decode("utf-8")).strip()
    except (http.client.HTTPException, UnicodeDecodeError) as exc:  # URLError and timeouts are OSErrors already
        raise OSError(f"{request.full_url}: {exc}") from None
    if not text:
        raise OSError(f"{request.full_url}: empty")
    return text


def set_unhealthy_command(aws_cli: str, instance_id: str, region: str) -> list[str]:
    """The AWS CLI call that marks the instance unhealthy, so that its Auto Scaling group terminates and replaces it
    (AWS CLI reference, "aws autoscaling set-instance-health"): at once, not after the group's health check grace
    period, which a node that booted minutes ago may still be in. The group's termination lifecycle hook lets the node
    termination handler drain it with the jobs' checkpoint grace, so the repair does not drain it itself."""
    return [
        aws_cli, "autoscaling", "set-instance-health", "--instance-id", instance_id, "--health-status", "Unhealthy",
        "--no-should-respect-grace-period", "--region", region,
    ]  # fmt: skip


# systemctl asks logind to reboot (systemd src/systemctl/systemctl-start-special.c: "First try logind"), which holds
# the reboot for the delay inhibitor lock the kubelet's graceful node shutdown takes, while it stops the pods.
REBOOT_COMMAND = ("systemctl", "reboot")
# The locks held on shutdown (systemd-inhibit(1) --list); the kubelet takes a "delay" lock named after itself when its
# graceful node shutdown is on (Kubernetes "Node Shutdowns": it is off unless shutdownGracePeriod is set, and fails
# to start where logind will not grant the delay).
INHIBITORS_COMMAND = ("systemd-inhibit", "--list", "--mode=delay", "--no-pager", "--no-legend")


def delay_locks() -> str:
    """The delay inhibitor locks, as systemd-inhibit lists them ("" where it cannot)."""
    try:
        done = subprocess.run(list(INHIBITORS_COMMAND), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout


def repair(
    request_file: str,
    *,
    aws_cli: str = "aws",
    run: Callable[[Sequence[str]], int] = run_command,
    opener: Callable[..., Any] = urllib.request.urlopen,
    boot_id_file: str | None = None,
    locks: Callable[[], str] = delay_locks,
) -> int:
    """Carry out the request in `request_file`: exit 0 done (the request stays: the machine goes away, or reboots and
    /run with it), 1 its command failed, 2 refused; both remove the request. `run` runs a command (run_command),
    `opener` opens an IMDS request (urllib's urlopen)."""
    try:
        with open(request_file, encoding="utf-8") as f:
            request = json.load(f)
    except FileNotFoundError:
        return _repair_failed(request_file, 2, "no request: nothing to do")
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        return _repair_failed(request_file, 2, f"cannot read the request: {exc}")
    if not isinstance(request, dict):
        return _repair_failed(request_file, 2, f"the request is not a JSON object: {str(request)[:200]}")
    action, boot_id = request.get("action"), request.get("boot_id")
    if action not in REPAIR_ACTIONS:
        return _repair_failed(request_file, 2, f"action {str(action)[:100]!r}: want one of {', '.join(REPAIR_ACTIONS)}")
    this_boot = read_boot_id(boot_id_file)
    # An approval is for the boot it was made on: after a reboot the check has run again, and judged the node afresh.
    if not this_boot or boot_id != this_boot:
        return _repair_failed(request_file, 2, f"the request is for boot {str(boot_id)[:100]!r}, this is {this_boot!r}")
    what = f"{action} of node {request.get('node')!r}, approved at {request.get('approved_at')!r} for this boot"
    if action == "replace":
        try:
            instance_id, region = imds(("instance-id", "placement/region"), opener)
        except OSError as exc:
            return _repair_failed(request_file, 1, f"{what}: this instance's id and region from IMDS: {exc}")
        command = set_unhealthy_command(aws_cli, instance_id, region)
    else:
        # Only where the kubelet will stop the pods with their grace first: without its lock the reboot kills them.
        if "kubelet" not in locks():
            why = "the kubelet holds no shutdown delay lock (its graceful node shutdown is off)"
            return _repair_failed(request_file, 1, f"{what}: {why}: not rebooting, the jobs would lose their grace")
        command = list(REBOOT_COMMAND)
    print(f"gpu_check.py repair: {what}: {' '.join(command)}", flush=True)  # before a reboot takes the journal away
    status = run(command)
    if status != 0:
        return _repair_failed(request_file, 1, f"{what}: {command[0]} exited {status}")
    done = "its Auto Scaling group replaces it" if action == "replace" else "rebooting"
    print(f"gpu_check.py repair: {what}: done, {done}", flush=True)
    return 0


def _repair_failed(request_file: str, status: int, message: str) -> int:
    """Log why, remove the request (PathExists starts the unit again while it is there), and return `status`."""
    print(f"gpu_check.py repair: {message}; removing {request_file}", file=sys.stderr, flush=True)
    try:
        os.remove(request_file)
    except FileNotFoundError:
        pass
    except OSError as exc:
        print(f"gpu_check.py repair: cannot remove {request_file}: {exc}", file=sys.stderr, flush=True)
    return status


def repair_main(argv: Sequence[str]) -> int:
    """gpu_check.py repair REQUEST [--aws-cli PATH]: exit 0 done, 1 failed, 2 refused (2 also for a wrong command
    line)."""
    parser = argparse.ArgumentParser(prog="gpu_check.py repair", description="Carry out an approved GPU repair.")
    parser.add_argument("request", help="the request the burn-in agent wrote (the repair unit's)")
    parser.add_argument("--aws-cli", default="aws", metavar="PATH", help="the AWS CLI, for a replace")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    return repair(args.request, aws_cli=args.aws_cli)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
