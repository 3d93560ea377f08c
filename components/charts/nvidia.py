"""NVIDIA's GPU DaemonSets, the device plugin and the DCGM exporter: one module, as both run on GPU nodes alike."""

from __future__ import annotations

from typing import Any

from components.charts.nodes import GPU_NODE_AFFINITY, GPU_TOLERATIONS


def device_plugin_values() -> dict[str, Any]:
    """NVIDIA device plugin: GPU nodes only. Feature discovery off: dlinfra writes nvidia.com/gpu.product itself, the
    value feature discovery would write, at registration (from the instance type or the site), so that the
    autoscaler's scale-from-zero templates and jobs see it before the node's first pod runs; feature discovery
    would also bring Node Feature Discovery's controllers and CRDs, and, under an environment's gpu_product_label
    "short", overwrite the value its admitted jobs select."""
    return {
        "affinity": GPU_NODE_AFFINITY,
        "tolerations": GPU_TOLERATIONS,
        "gfd": {"enabled": False},
        "nfd": {"enabled": False},
        # With MOFED on (the default of plugin 0.19.0-0.19.2), every GPU container gets all of the node's
        # /dev/infiniband/uverbs* devices, which belong to the EFA device plugin (EKS user guide, "Manage EFA
        # devices on Amazon EKS"). Off explicitly, whatever the pinned chart's default.
        "mofedEnabled": False,
    }


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
