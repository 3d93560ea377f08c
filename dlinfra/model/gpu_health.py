"""What a GPU node must show before it takes work: the expectation the GPU health check reads
(chef/cookbooks/dlinfra_gpu/files/gpu_check.py), from the GPU model table (dlinfra/data/gpu_models.yaml) and the
instance type table or a site's declaration; and how the burn-in's parts meet (BURN_IN_TAINT below).

Pure planning code (no pulumi, no NVML): it writes what to expect; the check, on the machine, reads the GPUs.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from dlinfra.errors import DlinfraError
from dlinfra.model import instances
from dlinfra.model.fleet.labels import (
    GPU_BURN_IN_TAINT_KEY,
    GPU_MODEL_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_SITE_BURN_IN_TAINT_KEY,
    GPU_UNHEALTHY_TAINT_KEY,
)
from dlinfra.model.fleet.pools import GpuCheck, GpuSharing
from dlinfra.model.fleet.schema import Site

TABLE_PATH = "dlinfra/data/gpu_models.yaml"
ProductLabelStyle = Literal["nvidia", "short"]  # what nvidia.com/gpu.product carries (gpu_labels)
DCGM_LEVELS = (0, 1, 2, 3, 4)  # 0: no DCGM diagnostic; `dcgmi diag -r 1..4` (DCGM user guide, "Run levels")

# Burn-in: how a GPU node goes from registered to taking work.
# - It registers with BURN_IN_TAINT (kubelet --register-with-taints: the launch template's user data), or a site
#   machine with SITE_BURN_IN_TAINT (its NodeConfig), which no job tolerates. Two keys for the cluster-autoscaler:
#   the cloud one is a startup taint (a node coming up, not one pending pods cannot use), the site one a status
#   taint, since a startup-tainted node counts as unready after 15 minutes, site machines too, and enough unready
#   nodes stop the autoscaler (cluster-autoscaler 1.33 clusterstate.go IsClusterHealthy); a rebooted site machine
#   is that old at once.
# - On the machine, the unit dlinfra-gpu-check (Chef, dlinfra_gpu::gpu_check) runs the check at every boot against
#   EXPECT_PATH and writes REPORT_PATH.
# - In the cluster, the burn-in agent (components/gpu_burn_in.py) on the node reads the report and, through the API
#   (a kubelet may not remove its own taints: the NodeRestriction admission plugin), removes the taint and sets
#   HEALTH_CONDITION True, or replaces it with UNHEALTHY_TAINT and sets the condition False.
Taint = tuple[str, str, str]
BURN_IN_TAINT: Taint = (GPU_BURN_IN_TAINT_KEY, "pending", "NoSchedule")
SITE_BURN_IN_TAINT: Taint = (GPU_SITE_BURN_IN_TAINT_KEY, "pending", "NoSchedule")
# A node that failed, or whose check did not judge it in time, carries the unhealthy taint, its value saying why:
# check-failed, check-not-judged, check-not-finished, gpus-not-advertised, or gpu-fault (the watch found a fault after
# the burn-in). These are the agent's values; a passing check takes any of them off. The autoscaler treats the taint
# as a status taint: the node counts as ready but takes no work.
UNHEALTHY_TAINT: Taint = (GPU_UNHEALTHY_TAINT_KEY, "check-failed", "NoSchedule")
UNHEALTHY_VALUES = ("check-failed", "check-not-judged", "check-not-finished", "gpus-not-advertised", "gpu-fault")
HEALTH_CONDITION = "GPUHealthy"  # a node condition type of our own, as Node Problem Detector's are
CHECK_ANNOTATION = "dlinfra.io/gpu-check"  # the last check's verdict, time and first problems, as JSON
CORDON_ANNOTATION = "dlinfra.io/gpu-cordoned"  # the agent cordoned the node (off work), so it may lift that cordon
EXPECT_PATH = "/etc/dlinfra/gpu-expect.json"
REPORT_DIR = "/var/lib/dlinfra/gpu-check"
REPORT_PATH = f"{REPORT_DIR}/report.json"
CHECK_UNIT = "dlinfra-gpu-check.service"
# After the burn-in, while the node works: the watch (the same check's passive parts, `gpu_check.py watch`, under
# WATCH_UNIT) writes HEALTH_PATH every WATCH_INTERVAL_SECONDS with the faults seen on this boot, kept until the next
# boot (a fault that comes and goes is still a fault); the burn-in agent reads it and puts a faulted node off work.
HEALTH_PATH = f"{REPORT_DIR}/health.json"
WATCH_UNIT = "dlinfra-gpu-watch.service"
WATCH_INTERVAL_SECONDS = 60
# Repair of a node put off work by a failed check or a fault (docs/gpu-health.md, "Repair"): the repair controller in
# the cluster approves it, a pool's share at a time, by REPAIR_ANNOTATION on the node (JSON: action, boot_id,
# approved_at, attempt, state); the burn-in agent on that node, on this boot, writes REPAIR_REQUEST on the host, where
# REPAIR_PATH_UNIT starts REPAIR_UNIT: a cloud node marks its EC2 instance unhealthy (its Auto Scaling group replaces
# it, draining it through the termination hook with the jobs' checkpoint grace); a site machine reboots (the kubelet's
# graceful node shutdown gives its pods their grace) and its check runs again.
REPAIR_ANNOTATION = "dlinfra.io/gpu-repair"
REPAIR_DIR = "/run/dlinfra/gpu-repair"  # tmpfs: a request does not outlive the boot it was made for
REPAIR_REQUEST = f"{REPAIR_DIR}/request"
REPAIR_PATH_UNIT = "dlinfra-gpu-repair.path"
REPAIR_UNIT = "dlinfra-gpu-repair.service"
REPAIR_ACTIONS = ("replace", "reboot")  # a cloud node's, a site machine's
# The longest the check may take on the machine (the unit's TimeoutStartSec; the check bounds itself a minute under).
# With the boot before it (DEADLINE_SECONDS), inside the cluster-autoscaler's 15 minutes for a new node to become ready
# (BURN_IN_MAX_DCGM_LEVEL says why that matters).
BURN_IN_SECONDS = 10 * 60
# From boot to a settled node (burn-in taint off, or the unhealthy taint on): the burn-in and the boot before it.
DEADLINE_SECONDS = BURN_IN_SECONDS + 5 * 60


class GpuTableError(DlinfraError):
    """The GPU model table itself is malformed (a bug in dlinfra, not in the fleet file)."""


class Floor(BaseModel):
    """A throughput a healthy GPU of the model reaches in the check's test, and where that figure comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: float = Field(gt=0)
    source: str = Field(min_length=10)  # who measured what, how: a floor without a measurement is not a floor


class GpuModel(BaseModel):
    """One GPU model, by dlinfra's short name (the instance table's gpu_model)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    products: tuple[str, ...] = Field(min_length=1)  # NVML product names (nvmlDeviceGetName) it may report
    memory_health: Literal["row_remap", "retired_pages"]  # Ampere and later remap rows; older GPUs retire pages
    source: str = Field(min_length=10)  # where the product names and the generation come from
    gemm_tflops: Floor | None = None  # BF16 matrix multiply, per GPU; None: measured and reported, not judged
    bandwidth_gbs: Floor | None = None  # device memory copy, per GPU; None likewise


class XidAction(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    action: str = Field(min_length=3)  # NVIDIA's immediate action for it (Xid catalog)
    meaning: str = Field(min_length=3)


class GpuTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: Mapping[str, GpuModel]
    # Xids that take a GPU out of work when logged since boot, with NVIDIA's immediate action; Xids the catalog
    # leaves to the application (13, 31, 43, 45...) are not here.
    failing_xids: Mapping[int, XidAction]
    xid_source: str = Field(min_length=10)


@functools.cache
def table() -> GpuTable:
    text = resources.files("dlinfra").joinpath("data/gpu_models.yaml").read_text(encoding="utf-8")
    try:
        return GpuTable.model_validate(YAML(typ="safe").load(text))
    except (YAMLError, ValidationError) as exc:
        raise GpuTableError(f"{TABLE_PATH}: {exc}") from None


def model(name: str) -> GpuModel:
    try:
        return table().models[name]
    except KeyError:
        known = ", ".join(sorted(table().models))
        raise GpuTableError(f"{TABLE_PATH}: no GPU model {name!r} (known: {known})") from None


def expectation(
    gpu_model: str,
    gpu_count: int,
    *,
    efa_devices: int = 0,
    fabric: bool = False,
    dcgm_level: int = 0,
    throughput: bool = True,
) -> dict[str, Any]:
    """The check's expectation (gpu_check.Expectation.from_json) for a node with `gpu_count` GPUs of `gpu_model`.
    `throughput`: judge the model's floors (needs PyTorch on the machine)."""
    if gpu_count <= 0:
        raise ValueError(f"gpu_count: a GPU node has GPUs, got {gpu_count}")
    if dcgm_level not in DCGM_LEVELS:
        raise ValueError(f"dcgm_level: one of {DCGM_LEVELS}, got {dcgm_level}")
    spec = model(gpu_model)
    return {
        "gpu_count": gpu_count,
        "products": list(spec.products),
        "memory_health": spec.memory_health,
        "failing_xids": expectation_xids(),
        "efa_devices": efa_devices,
        "fabric": fabric,
        "dcgm_level": dcgm_level,
        "gemm_tflops_floor": spec.gemm_tflops.value if throughput and spec.gemm_tflops else None,
        "bandwidth_gbs_floor": spec.bandwidth_gbs.value if throughput and spec.bandwidth_gbs else None,
    }


def expectation_xids() -> dict[str, str]:
    """The Xids that fail a GPU, with NVIDIA's action for each, as the expectation writes them."""
    return {str(code): xid.action for code, xid in sorted(table().failing_xids.items())}


def site_expectation(gpu_model: str, product: str, gpus_per_node: int, check: GpuCheck) -> dict[str, Any]:
    """What each GPU machine of a site writes to EXPECT_PATH (`dlinfra site render`): the site's declaration, its
    product (site_product) the one its GPUs must report."""
    result = expectation(gpu_model, gpus_per_node, dcgm_level=check.dcgm_level, throughput=check.throughput)
    return result | {"products": list(same_product(gpu_model, product))}


def pool_expectations(
    instance_types: Sequence[str], *, efa: bool, check: GpuCheck, sharing: GpuSharing | None = None
) -> dict[str, Any]:
    """What a cloud pool's nodes write to EXPECT_PATH: one expectation per instance type the pool may launch, as the
    check picks its own by the machine's instance type (gpu_check.Expectation.select). `sharing`: a shared pool's
    nodes also show their MIG layout, and offer their shares rather than whole GPUs (dlinfra.model.gpu_sharing)."""
    by_type = {
        name: instance_expectation(name, efa=efa, dcgm_level=check.dcgm_level, throughput=check.throughput)
        | _shared(name, sharing)
        for name in sorted(set(instance_types))
    }
    # What every type shares (the Xid catalog) once, beside the types: user data holds at most 16 KB.
    shared = {"failing_xids": expectation_xids()}
    return shared | {
        "instance_types": {name: {k: v for k, v in e.items() if k not in shared} for name, e in by_type.items()}
    }


def instance_expectation(
    instance_type: str, *, efa: bool, dcgm_level: int = 0, throughput: bool = True
) -> dict[str, Any]:
    """The expectation of a cloud node of `instance_type` (instance_types.yaml); `efa`: the pool attaches EFA, one
    device per EFA interface the type supports (dlinfra attaches them all on an EFA pool)."""
    spec = instances.lookup(instance_type)
    if not spec.gpus or spec.gpu_model is None:
        raise ValueError(f"{instance_type}: not a GPU instance type")
    result = expectation(
        spec.gpu_model,
        spec.gpus,
        efa_devices=spec.efa_interfaces if efa else 0,
        fabric=spec.nvswitch,  # Fabric Manager trains the NVSwitch fabric (instance_types.yaml nvswitch)
        dcgm_level=dcgm_level,
        throughput=throughput,
    )
    # The type's own product: a model sold in two sizes (A100-SXM4-40GB on p4d, -80GB on p4de) passes only as its own.
    return result | {"products": list(same_product(spec.gpu_model, str(spec.gpu_product)))}


def _shared(instance_type: str, sharing: GpuSharing | None) -> dict[str, Any]:
    """A shared node's MIG layout per GPU (the check counts each GPU's MIG devices) and the shares it offers (the
    burn-in agent waits for them, not for nvidia.com/gpu, which a shared node never offers)."""
    from dlinfra.model import gpu_sharing  # it reads the fleet's pool models, as this module does

    if sharing is None:
        return {}
    mig = {"mig": dict(sharing.mig)} if sharing.mig is not None else {}
    return mig | {"resources": gpu_sharing.per_node(sharing, instances.lookup(instance_type).gpus)}


def same_product(gpu_model: str, product: str) -> tuple[str, ...]:
    """The model's product names that name `product`: itself, and as older drivers wrote it (without "NVIDIA ")."""
    names = tuple(p for p in model(gpu_model).products if _bare(p) == _bare(product))
    if product not in names:
        raise GpuTableError(f"{TABLE_PATH}: {product!r} is not a product of {gpu_model} ({_products(gpu_model)})")
    return names


def site_product(gpu_model: str, declared: str | None) -> str:
    """The product a site's machines report: as declared (sites.<site>.gpu_product), else the model's only one.
    ValueError when the model comes as more than one product and the site does not say which (fleet validation
    reports it under the site's key)."""
    spec = model(gpu_model)
    if declared is not None:
        if declared not in spec.products:
            raise ValueError(f"{declared!r} is not a product of {gpu_model}: one of {_products(gpu_model)}")
        return declared
    current = sorted({p for p in spec.products if p.startswith("NVIDIA ")} or set(spec.products))
    if len(current) > 1:
        raise ValueError(f"{gpu_model} comes as {_products(gpu_model)}: say which one the machines have")
    return current[0]


def gpu_labels(gpu_model: str, product: str, style: ProductLabelStyle = "nvidia") -> dict[str, str]:
    """A GPU node's model labels: dlinfra's short name, and NVIDIA's product label. `style` "short": an environment
    whose admitted jobs still select nvidia.com/gpu.product by the short name keeps it there (docs/gpu-health.md,
    "Labels")."""
    return {GPU_MODEL_LABEL: gpu_model, GPU_PRODUCT_LABEL: product_label(product) if style == "nvidia" else gpu_model}


def site_gpu_labels(site: Site, style: ProductLabelStyle) -> dict[str, str]:
    """The GPU model labels of a site's machines (empty for a site without GPUs)."""
    if not site.gpu_nodes or not site.gpus_per_node:
        return {}
    return gpu_labels(site.gpu_model, site_product(site.gpu_model, site.gpu_product), style)


def product_label(product: str) -> str:
    """NVIDIA's nvidia.com/gpu.product value for an NVML product name, as GPU feature discovery writes it: spaces
    turned to '-' (NVIDIA/k8s-device-plugin internal/lm/resource.go, productLabel)."""
    return product.replace(" ", "-")


def _bare(product: str) -> str:
    return product.removeprefix("NVIDIA ")


def _products(gpu_model: str) -> str:
    return ", ".join(repr(p) for p in model(gpu_model).products)
