"""The NVIDIA device plugin and DCGM exporter: on GPU nodes only."""

from __future__ import annotations

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
