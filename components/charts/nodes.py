"""The labels and taints of our nodes, and the node affinities and tolerations that place add-ons on them."""

from __future__ import annotations

from typing import Any

from dlinfra.model import gpu_health
from dlinfra.model.fleet import labels
from dlinfra.render import nodeadm

POOL_LABEL = "dlinfra.io/pool"
SITE_LABEL = nodeadm.SITE_LABEL  # the label a site's hybrid nodes register with
GPU_PRODUCT_LABEL = labels.GPU_PRODUCT_LABEL  # NVIDIA's product name, as its feature discovery writes it
GPU_MODEL_LABEL = labels.GPU_MODEL_LABEL  # dlinfra's short model name
COMPUTE_TYPE_LABEL = "eks.amazonaws.com/compute-type"  # EKS sets it to "hybrid" on hybrid nodes
GPU_TAINT_KEY = "nvidia.com/gpu"
Taint = tuple[str, str, str]  # key, value, effect
# GPU machines of a site register with it (dlinfra/render/nodeadm.py), as the cloud GPU pools' nodes do.
SITE_GPU_TAINT: Taint = (GPU_TAINT_KEY, "true", "NoSchedule")

# GPU nodes: our pools and sites label them with NVIDIA's product label (every GPU node has it, whatever its
# value: dlinfra.io/gpu-model came later, and a term for it would only restart these DaemonSets); NVIDIA's feature
# discovery, if ever run, sets gpu.present.
GPU_NODE_AFFINITY: dict[str, Any] = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": GPU_PRODUCT_LABEL, "operator": "Exists"}]},
                {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]},
            ]
        }
    }
}
# The GPU health taints (dlinfra.model.gpu_health): the GPU DaemonSets run through the burn-in, so the device plugin
# advertises the GPUs the agent waits for, and on a node that failed, so what failed stays visible.
GPU_HEALTH_TOLERATIONS: list[dict[str, str]] = [
    {"key": key, "operator": "Exists", "effect": effect}
    for key, _, effect in (gpu_health.BURN_IN_TAINT, gpu_health.SITE_BURN_IN_TAINT, gpu_health.UNHEALTHY_TAINT)
]
GPU_TOLERATIONS: list[dict[str, str]] = [
    {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
    *GPU_HEALTH_TOLERATIONS,
    {"key": "CriticalAddonsOnly", "operator": "Exists"},
]
# Controllers that call AWS run on cloud nodes: Pod Identity and the VPC reach them there.
CLOUD_NODE_AFFINITY: dict[str, Any] = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": COMPUTE_TYPE_LABEL, "operator": "NotIn", "values": ["hybrid"]}]}
            ]
        }
    }
}
HYBRID_NODE_AFFINITY: dict[str, Any] = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": COMPUTE_TYPE_LABEL, "operator": "In", "values": ["hybrid"]}]}
            ]
        }
    }
}
