"""The NVIDIA device plugin and DCGM exporter: on GPU nodes only."""

from __future__ import annotations

import yaml

from components.charts import nvidia
from dlinfra.model import gpu_sharing
from dlinfra.model.fleet.pools import GpuSharing
from tests.components._platform import Stack


def test_gpu_addons_run_only_on_gpu_nodes(stacks: dict[str, Stack]) -> None:
    stack = stacks["prod-us-west-2"]
    for addon in ("nvidia-device-plugin", "dcgm-exporter"):
        values = stack.release(addon)["values"]
        terms = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        keys = {e["key"] for term in terms for e in term["matchExpressions"]}
        assert keys == {"nvidia.com/gpu.product", "nvidia.com/gpu.present"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]
    assert stack.release("nvidia-device-plugin")["values"]["gfd"] == {"enabled": False}
    # /dev/infiniband belongs to the EFA device plugin: the NVIDIA plugin must not hand it to GPU containers.
    assert stack.release("nvidia-device-plugin")["values"]["mofedEnabled"] is False
    assert stack.release("dcgm-exporter")["values"]["serviceMonitor"] == {"enabled": False}


def test_a_shared_pool_gets_its_own_device_plugin_config_selected_by_its_node_label(stacks: dict[str, Stack]) -> None:
    """staging's interactive pool time-slices its L4s: the chart's config map holds whole GPUs as the default and
    the pool's own configuration under the name its nodes' nvidia.com/device-plugin.config label carries (the chart's
    config manager picks by it). A region without a shared pool keeps the chart's single default configuration."""
    config = stacks["staging-us-west-2"].release("nvidia-device-plugin")["values"]["config"]
    assert config["default"] == gpu_sharing.WHOLE_GPU_CONFIG
    assert set(config["map"]) == {gpu_sharing.WHOLE_GPU_CONFIG, "pool-interactive"}
    assert yaml.safe_load(config["map"][gpu_sharing.WHOLE_GPU_CONFIG]) == {
        "version": "v1", "flags": {"migStrategy": "none"}
    }  # fmt: skip
    sliced = yaml.safe_load(config["map"]["pool-interactive"])["sharing"]["timeSlicing"]
    assert sliced == {
        "renameByDefault": True,
        "failRequestsGreaterThanOne": True,
        "resources": [{"name": "nvidia.com/gpu", "replicas": 4}],
    }
    assert "config" not in stacks["prod-us-east-1"].release("nvidia-device-plugin")["values"]


def test_a_mig_pool_runs_the_mixed_strategy() -> None:
    values = nvidia.device_plugin_values({"notebooks": GpuSharing(mig={"1g.10gb": 7})})
    assert yaml.safe_load(values["config"]["map"]["pool-notebooks"]) == {
        "version": "v1",
        "flags": {"migStrategy": "mixed"},
    }
