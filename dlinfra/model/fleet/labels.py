"""Kubernetes label and taint syntax, the node labels dlinfra sets itself, and the taints that drain a node:
what a fleet's labels and taints are checked against."""

from __future__ import annotations

import re

# Kubernetes object names and label syntax ("Object Names and IDs", "Labels and Selectors"): a qualified name is an
# optional DNS subdomain prefix (<= 253) and '/', then a name (<= 63) of alphanumerics, '-', '_', '.', starting and
# ending alphanumeric; a label value is such a name or empty. Taint keys and values follow the same rules.
_K8S_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# The kubelet refuses to start with labels of its own namespaces other than these (kubelet --node-labels).
_KUBELET_PREFIXES = ("kubelet.kubernetes.io", "node.kubernetes.io")


def label_key_problem(key: str) -> str | None:
    """Why a string is not a Kubernetes label or taint key a node may register with, or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"{key!r}: the prefix before '/' must be a lower-case DNS subdomain of at most 253 characters"
    if not _K8S_NAME.fullmatch(name):
        return (
            f"{key!r}: the name (after any '/') must be 1-63 letters, digits, '-', '_' or '.', starting and ending "
            "with a letter or digit"
        )
    own = prefix in ("kubernetes.io", "k8s.io") or prefix.endswith((".kubernetes.io", ".k8s.io"))
    if own and not prefix.endswith(_KUBELET_PREFIXES):
        return f"{key!r}: the kubelet only registers labels of kubernetes.io under {' or '.join(_KUBELET_PREFIXES)}"
    return None


# Node labels dlinfra sets itself from the fleet's structure: Kueue flavors and the autoscaler select pools by
# them, the NVIDIA device plugin and the cluster-autoscaler's GPU handling read the GPU ones, and the EFA device
# plugin's selector reads the last. A fleet label with one of these keys would silently change what they select.
# Other keys under dlinfra.io/ are the lab's own (the reference fleet labels training pools dlinfra.io/workload).
OWN_LABELS = frozenset(
    {
        "dlinfra.io/pool",
        "dlinfra.io/capacity",
        "dlinfra.io/team",
        "dlinfra.io/site",
        "nvidia.com/gpu.product",
        "dlinfra.io/gpu-model",
        "k8s.amazonaws.com/accelerator",
        "vpc.amazonaws.com/efa.present",
        "nvidia.com/device-plugin.config",
    }
)


def own_label_problem(key: str) -> str | None:
    """Why a fleet node label may not use this key because dlinfra sets it, or None."""
    if key in OWN_LABELS:
        return (
            f"{key!r} is set by dlinfra from the pool's name, capacity, team, site, GPU, GPU sharing and EFA settings; "
            "choose "
            f"another key (dlinfra's own: {', '.join(sorted(OWN_LABELS))})"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why a string is not a Kubernetes label or taint value, or None."""
    if value and not _K8S_NAME.fullmatch(value):
        return (
            f"{value!r} is not a Kubernetes label value: at most 63 letters, digits, '-', '_' or '.', starting and "
            "ending with a letter or digit (or empty)"
        )
    return None


# Taints that keep new work off a node about to go: the node termination handler's (it puts them on a node when
# it learns of maintenance, a spot interruption, a rebalance or an ASG termination) and the cordon's. Work that
# tolerates one of them still lands on such a node. Source: aws-node-termination-handler v1.25.6 (the version
# addons.yaml pins), pkg/node/node.go, the *Taint constants; Kubernetes "Taints and Tolerations" (cordoned nodes
# carry node.kubernetes.io/unschedulable:NoSchedule).
DRAIN_TAINT_PREFIX = "aws-node-termination-handler/"
DRAIN_TAINT_KEYS = (
    f"{DRAIN_TAINT_PREFIX}scheduled-maintenance",
    f"{DRAIN_TAINT_PREFIX}spot-itn",
    f"{DRAIN_TAINT_PREFIX}asg-lifecycle-termination",
    f"{DRAIN_TAINT_PREFIX}rebalance-recommendation",
    "node.kubernetes.io/unschedulable",
)
# The GPU health taints (dlinfra.model.gpu_health): a GPU node registers with the burn-in taint and keeps work off
# until its GPUs pass the check; a failed check puts the unhealthy one on. A pool taint is one its jobs tolerate
# (Kueue copies it into the flavor), so neither may be a pool's: its jobs would start on unchecked or failed GPUs.
GPU_BURN_IN_TAINT_KEY = "dlinfra.io/gpu-burn-in"
GPU_SITE_BURN_IN_TAINT_KEY = "dlinfra.io/gpu-burn-in-site"  # a site machine's: see dlinfra.model.gpu_health
GPU_UNHEALTHY_TAINT_KEY = "dlinfra.io/gpu-unhealthy"
GPU_HEALTH_TAINT_KEYS = (GPU_BURN_IN_TAINT_KEY, GPU_SITE_BURN_IN_TAINT_KEY, GPU_UNHEALTHY_TAINT_KEY)


# A GPU node's model, under two keys. NVIDIA's carries the product name as NVIDIA's GPU feature discovery writes it
# (the NVML name with spaces turned to '-', "NVIDIA-H100-80GB-HBM3": NVIDIA/k8s-device-plugin internal/lm/resource.go,
# productLabel), which jobs and examples written for NVIDIA's and AWS's stacks select on. dlinfra's own carries the
# short model name of its tables ("H100"), which Kueue flavors select on (dlinfra.model.gpu_health.gpu_labels).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MODEL_LABEL = "dlinfra.io/gpu-model"
# The NVIDIA device plugin's config manager picks a node's configuration by this label (the chart's README,
# "Multiple Config Files"): dlinfra sets it on a pool that shares its GPUs (dlinfra.model.gpu_sharing).
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
