"""The AWS EFA device plugin: on the nodes of EFA pools, advertising their EFA interfaces as a resource."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.charts.nodes import GPU_HEALTH_TOLERATIONS, GPU_TAINT_KEY
from components.charts.pinned import image_registry

# EFA pools label their nodes with this (components/nodepool.py EFA_LABEL); the EFA device plugin runs there and
# advertises this resource, one per EFA interface.
EFA_NODE_LABEL = "vpc.amazonaws.com/efa.present"
EFA_RESOURCE = "vpc.amazonaws.com/efa"


def efa_device_plugin_values(
    region: str, instance_types: Sequence[str], taints: Sequence[tuple[str, str, str]] = ()
) -> dict[str, Any]:
    """AWS EFA device plugin: advertises vpc.amazonaws.com/efa on the nodes of EFA pools, and nowhere else.

    `instance_types` are the EFA pools' types: the chart's own node affinity lists the EFA instance types it
    knew when released, so a newer type would get no plugin. `taints` are the EFA pools' taints; the GPU
    taint is always tolerated.
    """
    if not instance_types:
        raise ValueError("instance_types: the EFA device plugin is for EFA pools; none were given")
    tolerated = {(GPU_TAINT_KEY, "NoSchedule")} | {(key, effect) for key, _, effect in taints}
    return {
        "image": {"repository": f"{image_registry('aws-efa-k8s-device-plugin', region)}/eks/aws-efa-k8s-device-plugin"},
        "nodeSelector": {EFA_NODE_LABEL: "true"},
        "supportedInstanceLabels": {
            "keys": ["node.kubernetes.io/instance-type"],
            "values": sorted(set(instance_types)),
        },
        # The GPU health taints too: EFA devices are part of what the burn-in counts.
        "tolerations": [{"key": key, "operator": "Exists", "effect": effect} for key, effect in sorted(tolerated)]
        + GPU_HEALTH_TOLERATIONS,
    }
