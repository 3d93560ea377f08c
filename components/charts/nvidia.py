"""NVIDIA's GPU DaemonSets, the device plugin and the DCGM exporter: one module, as both run on GPU nodes alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from components.charts.nodes import GPU_NODE_AFFINITY, GPU_TOLERATIONS
from dlinfra.model import gpu_sharing
from dlinfra.model.fleet.pools import GpuSharing


def device_plugin_values(shared: Mapping[str, GpuSharing] | None = None) -> dict[str, Any]:
    """NVIDIA device plugin: GPU nodes only. Feature discovery off: dlinfra writes nvidia.com/gpu.product itself, the
    value feature discovery would write, at registration (from the instance type or the site), so that the
    autoscaler's scale-from-zero templates and jobs see it before the node's first pod runs; feature discovery
    would also bring Node Feature Discovery's controllers and CRDs, and, under an environment's gpu_product_label
    "short", overwrite the value its admitted jobs select.

    `shared`: the pools of this cluster that share their GPUs (pool -> gpu_sharing). Each gets a named configuration
    in the chart's `config.map`, which the chart's config manager picks by the node's nvidia.com/device-plugin.config
    label (the launch template sets it to gpu_sharing.config_name); every other node gets `config.default`, whole
    GPUs (the chart's values.yaml, `config`; the plugin's README, "Multiple Config Files")."""
    configs = {}
    if shared:
        configs = {
            "config": {
                "map": {
                    gpu_sharing.WHOLE_GPU_CONFIG: _config_text(None),
                    **{gpu_sharing.config_name(p): _config_text(s) for p, s in sorted(shared.items())},
                },
                "default": gpu_sharing.WHOLE_GPU_CONFIG,
            }
        }
    return {
        "affinity": GPU_NODE_AFFINITY,
        "tolerations": GPU_TOLERATIONS,
        "gfd": {"enabled": False},
        "nfd": {"enabled": False},
        # With MOFED on (the default of plugin 0.19.0-0.19.2), every GPU container gets all of the node's
        # /dev/infiniband/uverbs* devices, which belong to the EFA device plugin (EKS user guide, "Manage EFA
        # devices on Amazon EKS"). Off explicitly, whatever the pinned chart's default.
        "mofedEnabled": False,
        **configs,
    }


def _config_text(sharing: GpuSharing | None) -> str:
    """One configuration as the chart's `config.map` takes it: the config file's text."""
    return yaml.safe_dump(gpu_sharing.device_plugin_config(sharing), sort_keys=True)


def dcgm_exporter_values() -> dict[str, Any]:
    """DCGM exporter reading the host's DCGM engine (baked into GPU images), on GPU nodes only."""
    return {
        "affinity": GPU_NODE_AFFINITY,
        "tolerations": GPU_TOLERATIONS,
        # The node already runs nv-hostengine; a second, embedded engine would contend for profiling counters.
        "arguments": ["-f", "/etc/dcgm-exporter/default-counters.csv", "-r", "localhost:5555"],
        "hostNetwork": True,
        # No Prometheus Operator in the platform: a ServiceMonitor would fail the install.
        "serviceMonitor": {"enabled": False},
    }
