"""Shared GPUs: a GPU pool's MIG layout or time-slicing (fleet: node_pools.<pool>.gpu_sharing), checked against each
GPU's real MIG profiles (dlinfra/data/mig_profiles.yaml), and what a shared node then offers Kubernetes.

A shared node never offers nvidia.com/gpu, which everywhere else in dlinfra means one whole GPU (Kueue quotas, the
autoscaler's templates, the burn-in's count): the NVIDIA device plugin offers MIG instances as nvidia.com/mig-<profile>
(its `mixed` MIG strategy) and time-sliced GPUs as nvidia.com/gpu.shared (time-slicing with renameByDefault), so a
job asks for a share by name and a whole-GPU job never lands on a share (NVIDIA k8s-device-plugin README, "Shared
Access to GPUs with CUDA Time-Slicing" and "Configuration Option Details"; MIG User Guide, "MIG with Kubernetes").

Pure planning code: no pulumi, no NVML.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from dlinfra.errors import DlinfraError
from dlinfra.model.fleet.pools import GpuSharing

TABLE_PATH = "dlinfra/data/mig_profiles.yaml"
COMPUTE_SLICES = 7  # a MIG-capable GPU's compute slices (MIG User Guide, "Concepts": up to 7 instances)
MEMORY_SLICES = 8  # its memory slices: the placements' axis (nvmlGpuInstancePlacement_t: start and size in slices)
WHOLE_GPU = "nvidia.com/gpu"
# The device plugin's name for a time-sliced GPU under renameByDefault: true (k8s-device-plugin README: "the
# resource ... will be advertised as nvidia.com/gpu.shared"); a whole-GPU request can then never take a slice.
TIME_SLICED_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # the `mixed` strategy's resource per profile: nvidia.com/mig-1g.10gb
# The device plugin's configuration for whole-GPU nodes, the chart's `config.default` (a node without the
# nvidia.com/device-plugin.config label gets it); a shared pool's configuration is named after the pool.
WHOLE_GPU_CONFIG = "whole-gpus"
# On a shared pool's Auto Scaling group: what each GPU offers (resource=count, space-separated, sorted), so the rule
# `shared-gpu-pools-advertise-shares` can hold the autoscaler's node template to the fleet's layout.
SHARES_TAG = "dlinfra:gpu-shares-per-gpu"
# The same, on a shared pool's Kueue ResourceFlavor: `dlinfra quota --revision` turns its queues' shares back into
# GPUs by it (dlinfra.model.gpu_quotas.from_plans).
SHARES_ANNOTATION = "dlinfra.io/gpu-shares-per-gpu"
# On the node: the MIG instances to create on every GPU, as `nvidia-smi mig -cgi` takes them (ID:START,...), written
# by the user data and applied by MIG_UNIT before the GPU check and the kubelet (Chef, dlinfra_gpu::mig).
MIG_LAYOUT_PATH = "/etc/dlinfra/mig-layout"
MIG_UNIT = "dlinfra-mig.service"
# Where the unit notes the one reboot it asked for, when a GPU's new MIG mode needed a reset the VM does not offer
# (nvmlDeviceSetMigMode: "On certain platforms like pass-through virtualization ... VM reboot is required"): a second
# boot with the mode still pending fails instead of rebooting again (NVIDIA/mig-parted deployments/systemd, whose
# service keeps the same kind of marker under /var/lib).
MIG_REBOOT_MARKER = "/var/lib/dlinfra/mig-reboot"
# Present only while the user data runs the unit on a node's first boot (/run does not survive a reboot): the unit
# then leaves the reboot to the user data, which first writes the node's join, so kubelet, enabled, starts with it
# on the next boot.
MIG_DEFER_REBOOT = "/run/dlinfra/mig-defer-reboot"

# cluster-autoscaler's AWS provider builds a node of a group at zero with nvidia.com/gpu set to its own instance
# table's count for the type (8 on a p4d), and node-template/resources tags override only the resources they name
# (cloudprovider/aws/aws_manager.go buildNodeFromTemplate, tags cluster-autoscaler-1.31.5 .. 1.36.1). A shared
# pool's template must therefore say 0 whole GPUs, or a whole-GPU pod scales the pool out and never fits.
AUTOSCALER_RESOURCE_TAG = "k8s.io/cluster-autoscaler/node-template/resources/"
# A shared node has no k8s.amazonaws.com/accelerator label (components/nodepool.py node_labels says why), so the
# autoscaler judges it by CPU and memory requests against --scale-down-utilization-threshold (0.5), which would
# consolidate away a node whose notebooks ask for little. The AWS provider takes a per-group threshold from this tag
# (cloudprovider/aws/README.md "autoscaling-options"; aws_manager.go GetAsgOptions, 1.31.5 .. 1.36.1).
SCALE_DOWN_THRESHOLD_TAG = "k8s.io/cluster-autoscaler/node-template/autoscaling-options/scaledownutilizationthreshold"
# Remove a shared node only when no pod but DaemonSets asks for CPU or memory on it (ignore-daemonsets-utilization).
# Not 0: before 1.32 a node is a candidate only strictly below the threshold (core/scaledown/eligibility
# isNodeBelowUtilizationThreshold, 1.31.5: `>=` keeps it), so 0 would keep an empty node forever; from 1.32 at or
# below it (isNodeAtOrBelowUtilizationThreshold). One millionth is below any request of 1m CPU on the largest GPU
# instance (192 vCPUs: 5.2 millionths), so a pod that asks for any CPU keeps its node (tests/model check the table).
SHARED_SCALE_DOWN_THRESHOLD = 1e-6


class MigTableError(DlinfraError):
    """The MIG profile table itself is malformed (a bug in dlinfra, not in the fleet file)."""


class MigProfile(BaseModel):
    """One GPU instance profile of one GPU product (see the header of mig_profiles.yaml)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int = Field(ge=0)  # GPU instance profile id (nvidia-smi mig -lgip)
    compute: int = Field(ge=1, le=COMPUTE_SLICES)  # compute slices of 7
    memory: int = Field(ge=1, le=MEMORY_SLICES)  # memory slices of 8: the placement's size
    instances: int = Field(ge=1, le=COMPUTE_SLICES)  # most instances one GPU holds
    starts: tuple[int, ...] = Field(min_length=1)  # memory slices an instance may start at

    @model_validator(mode="after")
    def _fits(self) -> MigProfile:
        if any(s < 0 or s + self.memory > MEMORY_SLICES for s in self.starts):
            raise ValueError(f"a start in {self.starts} puts {self.memory} memory slices past slice {MEMORY_SLICES}")
        if self.instances > len(self.starts):
            raise ValueError(f"{self.instances} instances but only {len(self.starts)} starts")
        return self


class MigTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: Mapping[str, Mapping[str, Mapping[str, MigProfile]]]  # model -> NVML product -> profile -> figures


@functools.cache
def table() -> MigTable:
    text = resources.files("dlinfra").joinpath("data/mig_profiles.yaml").read_text(encoding="utf-8")
    try:
        return MigTable.model_validate(YAML(typ="safe").load(text))
    except (YAMLError, ValidationError) as exc:
        raise MigTableError(f"{TABLE_PATH}: {exc}") from None


def profiles(gpu_model: str, product: str) -> Mapping[str, MigProfile] | None:
    """The MIG profiles of a GPU product, or None when it has no MIG."""
    return table().models.get(gpu_model, {}).get(product)


def place(layout: Mapping[str, int], known: Mapping[str, MigProfile]) -> tuple[tuple[str, int], ...] | None:
    """Where every instance of `layout` (profile -> instances) starts on one GPU, in memory slices, or None when no
    placement fits. Deterministic: larger instances first, each at its lowest free start."""
    wanted = sorted(
        (name for name, count in layout.items() for _ in range(count)),
        key=lambda n: (-known[n].memory, -known[n].compute, n),
    )

    def search(i: int, used: int, after: int) -> list[tuple[str, int]] | None:
        if i == len(wanted):
            return []
        profile = known[wanted[i]]
        for start in profile.starts:
            # Instances of one profile are interchangeable: try their starts in increasing order only.
            if start < after:
                continue
            mask = ((1 << profile.memory) - 1) << start
            if used & mask:
                continue
            same_next = i + 1 < len(wanted) and wanted[i + 1] == wanted[i]
            rest = search(i + 1, used | mask, start + 1 if same_next else 0)
            if rest is not None:
                return [(wanted[i], start), *rest]
        return None

    found = search(0, 0, 0)
    return None if found is None else tuple(found)


def layout_problem(layout: Mapping[str, int], gpu_model: str, product: str) -> str | None:
    """Why `layout` (profile -> instances per GPU) cannot be made on one GPU of `product`, or None when it can."""
    known = profiles(gpu_model, product)
    if known is None:
        return (
            f"{product} ({gpu_model}) has no MIG ({TABLE_PATH} lists {', '.join(sorted(table().models))}); "
            "share it by time_slicing instead"
        )
    for name, count in layout.items():
        if name not in known:
            return f"{product} has no MIG profile {name!r}; its profiles: {', '.join(known)}"
        if count > known[name].instances:
            return f"{product} holds at most {known[name].instances} x {name} per GPU, not {count}"
    compute = sum(known[n].compute * c for n, c in layout.items())
    if compute > COMPUTE_SLICES:
        return f"the layout takes {compute} compute slices; a GPU has {COMPUTE_SLICES}"
    if place(layout, known) is None:
        # 3g + 3g + 1g is 7 compute slices, but each 3g instance takes 4 of the 8 memory slices.
        memory = sum(known[n].memory * c for n, c in layout.items())
        starts = "; ".join(f"{n}: {known[n].memory} from {list(known[n].starts)}" for n in layout)
        return (
            f"the compute slices add up ({compute} of {COMPUTE_SLICES}) but the instances do not fit the GPU's "
            f"{MEMORY_SLICES} memory slices without overlapping ({memory} wanted; each profile takes so many memory "
            f"slices starting only at certain ones, `nvidia-smi mig -lgipp`: {starts})"
        )
    return None


def mig_resource(profile: str) -> str:
    """The extended resource a MIG profile's instances are offered as (device plugin, migStrategy mixed)."""
    return f"{MIG_RESOURCE_PREFIX}{profile}"


def per_gpu(sharing: GpuSharing) -> dict[str, int]:
    """What one shared GPU offers: resource -> count."""
    if sharing.mig is not None:
        return {mig_resource(p): n for p, n in sorted(sharing.mig.items())}
    assert sharing.time_slicing is not None
    return {TIME_SLICED_RESOURCE: sharing.time_slicing.replicas}


def per_node(sharing: GpuSharing, gpus: int) -> dict[str, int]:
    """What a node of `gpus` shared GPUs offers: resource -> count."""
    return {resource: count * gpus for resource, count in per_gpu(sharing).items()}


def template_resources(sharing: GpuSharing, gpus: int) -> dict[str, int]:
    """What the autoscaler's template of a shared node must offer: its shares, and no whole GPU (WHOLE_GPU: 0)."""
    return {WHOLE_GPU: 0, **per_node(sharing, gpus)}


def autoscaler_options() -> dict[str, str]:
    """A shared pool's per-group autoscaler options, as Auto Scaling group tags."""
    return {SCALE_DOWN_THRESHOLD_TAG: format(SHARED_SCALE_DOWN_THRESHOLD, "f")}


def shares_tag(sharing: GpuSharing) -> str:
    """SHARES_TAG's value: resource=count per GPU, sorted, separated by spaces (AWS tag values allow letters, digits,
    spaces and + - = . _ : / @, not commas: Tagging AWS resources, "Tag naming limits and requirements")."""
    return shares_text(per_gpu(sharing).items())


def shares_text(shares: Iterable[tuple[str, int]]) -> str:
    """Shares per GPU as SHARES_TAG and SHARES_ANNOTATION write them."""
    return " ".join(f"{r}={n}" for r, n in sorted(shares))


def parse_shares_tag(value: str) -> dict[str, int]:
    """SHARES_TAG's value back as resource -> count per GPU; ValueError when malformed."""
    out: dict[str, int] = {}
    for part in value.split():
        resource, eq, count = part.partition("=")
        if not eq or not resource or not count.isdigit():
            raise ValueError(f"{part!r} is not resource=count")
        out[resource] = int(count)
    if not out:
        raise ValueError("no resource=count")
    return out


def create_argument(layout: Mapping[str, int], gpu_model: str, product: str) -> str:
    """The layout as `nvidia-smi mig -cgi` takes it, each instance at the start validation found: ID:START,..."""
    known = profiles(gpu_model, product)
    placed = place(layout, known) if known is not None else None
    if known is None or placed is None:
        raise ValueError(f"{dict(layout)} cannot be made on {product}: validation refuses it")
    return ",".join(f"{known[name].id}:{start}" for name, start in sorted(placed, key=lambda p: p[1]))


def config_name(pool: str) -> str:
    """The device plugin configuration of a shared pool's nodes: their nvidia.com/device-plugin.config label's value
    and the configuration's name in the chart's `config.map` (never WHOLE_GPU_CONFIG: a pool name has no "pool-")."""
    return f"pool-{pool}"


def device_plugin_config(sharing: GpuSharing | None) -> dict[str, Any]:
    """One named configuration of the device plugin (its config file, version v1: k8s-device-plugin README,
    "Configuration Option Details"): whole GPUs, MIG instances by profile, or time-sliced GPUs."""
    if sharing is None:
        return {"version": "v1", "flags": {"migStrategy": "none"}}
    if sharing.mig is not None:
        # mixed: every profile its own resource, nvidia.com/gpu none (single would offer them as nvidia.com/gpu).
        return {"version": "v1", "flags": {"migStrategy": "mixed"}}
    assert sharing.time_slicing is not None
    return {
        "version": "v1",
        "flags": {"migStrategy": "none"},
        "sharing": {
            "timeSlicing": {
                # nvidia.com/gpu.shared, not nvidia.com/gpu: a pod asking for a whole GPU must never get a turn.
                "renameByDefault": True,
                # A pod asking for 2 replicas would get no more of the GPU than with 1 (the README's own warning):
                # the device plugin refuses it instead.
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": WHOLE_GPU, "replicas": sharing.time_slicing.replicas}],
            }
        },
    }


def share_prices(node_usd: float, shares_per_gpu: Mapping[str, int], gpus: int) -> dict[str, float]:
    """What an hour (or month) of one share costs, resource -> USD, from the node's price: split by the compute
    slices each MIG share takes (a 3g instance costs three 1g ones), or evenly between time-sliced replicas. The
    node's CPUs and memory come with its shares, as with whole GPUs; shares no job uses still cost."""
    weights = {r: _compute_slices(r) for r in shares_per_gpu}
    total = sum(weights[r] * n for r, n in shares_per_gpu.items()) * gpus
    return {r: node_usd * weights[r] / total for r in sorted(shares_per_gpu)} if total else {}


def share_price_note(node_usd: float, shares_tag: str, gpus: int) -> str:
    """The cost report's note on a shared pool: each share's price per hour, from its group's shares tag."""
    per = share_prices(node_usd, parse_shares_tag(shares_tag), gpus)
    return "per share and hour: " + ", ".join(f"{r} ${usd:.3f}" for r, usd in per.items())


def _compute_slices(resource: str) -> int:
    """Compute slices of one share: a MIG profile's "<n>g"; a time-sliced replica counts as one."""
    profile = resource.removeprefix(MIG_RESOURCE_PREFIX)
    head = profile.split("g.", 1)[0]
    return int(head) if resource.startswith(MIG_RESOURCE_PREFIX) and head.isdigit() else 1
