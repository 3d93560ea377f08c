"""The nodeadm NodeConfig a site's physical GPU machines join the region's EKS cluster with (hybrid nodes).

Pure rendering (no pulumi import). The activation code is a secret: the rendered file is written mode 0600
and installed on the machines, never committed.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml

from dlinfra.model import gpu_health
from dlinfra.model.fleet.pools import MAX_CHECKPOINT_GRACE
from dlinfra.model.kueue import site_flavor

NODE_CONFIG_API = "node.eks.aws/v1alpha1"
SITE_LABEL = "dlinfra.io/site"
# Every node carries a pool label, a site's machines too: Kueue compares a job's node selector with a flavor's node
# labels on the flavor's own keys only (v0.19.2 flavorassigner.go flavorSelector), so a site flavor without this key
# would be given to a job pinned to a cloud pool, whose pods could then never be placed.
POOL_LABEL = "dlinfra.io/pool"
GPU_TAINT = ("nvidia.com/gpu", "true", "NoSchedule")

# On hybrid nodes nodeadm owns containerd's configuration; the NVIDIA runtime must be declared here so
# GPU pods get the devices (the Chef site-gpu-node role installs the toolkit that provides the binary).
NVIDIA_CONTAINERD = """\
[plugins."io.containerd.grpc.v1.cri".containerd]
default_runtime_name = "nvidia"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
BinaryName = "/usr/bin/nvidia-container-runtime"
SystemdCgroup = true
"""


@dataclass(frozen=True, kw_only=True)
class HybridNodeView:
    """What a site's machines need to join: the cluster, the SSM activation and their labels."""

    site: str
    cluster_name: str
    region: str
    activation_id: str
    activation_code: str = field(repr=False)  # secret
    # The machines' GPU model labels (dlinfra.model.gpu_health.gpu_labels); empty for CPU-only machines.
    gpu_labels: Mapping[str, str] = field(default_factory=dict)
    max_pods: int = 110
    # kubelet clusterDNS, in order: the node's NodeLocal DNS cache, then kube-dns (dlinfra.model.dns.node_dns_servers)
    cluster_dns: tuple[str, ...]

    def __post_init__(self) -> None:
        if not re.fullmatch(
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[\w-]{8,}", self.activation_id
        ):
            raise ValueError(f"activation_id: {self.activation_id!r} does not look like an SSM activation id")
        if not self.activation_code or self.activation_code == "[secret]":
            raise ValueError("activation_code: missing or masked; read outputs with --show-secrets")
        if not self.cluster_dns:
            raise ValueError("cluster_dns: at least one address is needed")
        for address in self.cluster_dns:
            try:
                ipaddress.IPv4Address(address)
            except ValueError:
                raise ValueError(f"cluster_dns: {address!r} is not an IPv4 address") from None


def site_pool(site: str) -> str:
    """The pool label value of a site's machines: its Kueue flavor's name (dlinfra.model.kueue.site_flavor), which
    no fleet pool may take (dlinfra.model.fleet.checks)."""
    return site_flavor(site)


def node_labels(view: HybridNodeView) -> dict[str, str]:
    """Labels every machine of the site registers with (Kueue flavors and the device plugin select on them)."""
    return {SITE_LABEL: view.site, POOL_LABEL: site_pool(view.site), **view.gpu_labels}


def graceful_shutdown() -> dict[str, str]:
    """The kubelet's graceful node shutdown (Kubernetes "Node Shutdowns"): when the machine shuts down or reboots (the
    GPU repair reboots a site machine, dlinfra.model.gpu_health), it holds the shutdown and stops pods with their own
    termination grace, up to the longest checkpoint grace a pod may ask for (the checkpoint-grace policy caps it);
    the node's critical pods last. Off unless both are set; the kubelet raises logind's InhibitDelayMaxSec to match."""
    critical = 30
    return {
        "shutdownGracePeriod": f"{MAX_CHECKPOINT_GRACE + critical}s",
        "shutdownGracePeriodCriticalPods": f"{critical}s",
    }


def render_node_config(view: HybridNodeView) -> str:
    """The NodeConfig YAML for `nodeadm init -c file://...` on every machine of the site."""
    flags = ["--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(node_labels(view).items()))]
    if view.gpu_labels:
        # The site burn-in taint too: work waits until the machine's GPUs pass their check (dlinfra.model.gpu_health).
        # Taints given at registration apply once, when the node object is created; after a reboot the burn-in agent
        # puts the burn-in taint back until that boot's check has passed.
        taints = (GPU_TAINT, gpu_health.SITE_BURN_IN_TAINT)
        flags.append("--register-with-taints=" + ",".join("{}={}:{}".format(*t) for t in taints))
    flags.append(f"--max-pods={view.max_pods}")
    config = {
        "apiVersion": NODE_CONFIG_API,
        "kind": "NodeConfig",
        "spec": {
            "cluster": {"name": view.cluster_name, "region": view.region},
            "hybrid": {"ssm": {"activationId": view.activation_id, "activationCode": view.activation_code}},
            # nodeadm merges spec.kubelet.config into the KubeletConfiguration it generates (nodeadm docs,
            # awslabs/amazon-eks-ami "Examples"); its own clusterDNS would be kube-dns alone.
            "kubelet": {"config": {"clusterDNS": list(view.cluster_dns), **graceful_shutdown()}, "flags": flags},
            **({"containerd": {"config": NVIDIA_CONTAINERD}} if view.gpu_labels else {}),
        },
    }
    header = (
        f"# Generated by `dlinfra site render` for site {view.site}: nodeadm init -c file://<this file>.\n"
        "# Holds the SSM activation code: install root-owned, mode 0600; never commit it.\n"
    )
    return header + yaml.dump(config, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


class _Dumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings as literal blocks, so the embedded TOML stays readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)
