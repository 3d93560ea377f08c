"""What the Platform component declares, as data: pinned charts, Helm values, IAM and event documents, Kueue specs.

Pure functions (no resources), so each piece can be read and tested on its own. Values may hold
`pulumi.Input`s (cluster name, queue URL); Pulumi resolves them where the dicts are used as inputs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import pulumi
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dlinfra.errors import DlinfraError
from dlinfra.model import dns, hybrid_routing, kueue
from dlinfra.render import nodeadm

ADDONS_FILE = "dlinfra/data/addons.yaml"
AUTOSCALER_TAG = "k8s.io/cluster-autoscaler"
PRIORITY_CONFIGMAP = "cluster-autoscaler-priority-expander"  # the name cluster-autoscaler watches
AUTOSCALER_SA = "cluster-autoscaler"
TERMINATION_HANDLER_SA = "aws-node-termination-handler"
SYSTEM_NAMESPACE = "kube-system"
POOL_LABEL = "dlinfra.io/pool"
SITE_LABEL = nodeadm.SITE_LABEL  # the label a site's hybrid nodes register with
TEAM_LABEL = "dlinfra.io/team"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
COMPUTE_TYPE_LABEL = "eks.amazonaws.com/compute-type"  # EKS sets it to "hybrid" on hybrid nodes
GPU_TAINT_KEY = "nvidia.com/gpu"
# EFA pools label their nodes with this (components/nodepool.py EFA_LABEL); the EFA device plugin runs there and
# advertises this resource, one per EFA interface.
EFA_NODE_LABEL = "vpc.amazonaws.com/efa.present"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
LOCAL_QUEUE = "default"  # Kueue sends jobs without a queue-name label to the LocalQueue named "default"
KUEUE_API = "kueue.x-k8s.io/v1beta2"  # the storage version of the pinned Kueue; v1beta1 is deprecated there
# Cilium 1.18 (addons.yaml) serves CiliumNodeConfig and the BGP control plane's objects as cilium.io/v2 (the BGP
# ones promoted in cilium/cilium#37765, v2alpha1 deprecated); CiliumPodIPPool is still cilium.io/v2alpha1 there.
CILIUM_API = "cilium.io/v2"
CILIUM_POOL_API = "cilium.io/v2alpha1"
CILIUM_GATEWAY_PEER = "site-gateway"  # the one BGP peer of a site's nodes
# IPs a node reserves ahead in its site's pool; more blocks are allocated as pods need them.
CILIUM_PRE_ALLOCATION = 8
# Autoscaler priorities (higher wins): capacity we pay for anyway first, spot last.
CLASS_PRIORITY: Mapping[str, int] = {"reserved": 30, "on-demand": 20, "spot": 10}

# GPU nodes: our pools label them with the GPU model; NVIDIA's feature discovery, if ever run, sets gpu.present.
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
GPU_TOLERATIONS: list[dict[str, str]] = [
    {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
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

# What the termination handler listens to, by rule. Patterns follow the AWS event shapes NTH's queue processor reads.
TERMINATION_EVENTS: Mapping[str, dict[str, Any]] = {
    # AWS Health scheduled changes for EC2: every AWS_EC2_*_SCHEDULED type (retirement, stop, reboot, network and
    # power maintenance), by category rather than by a list of type codes that AWS extends. Health sends the event
    # when it announces the change ("upcoming", about two weeks ahead for MAINTENANCE_SCHEDULED types) and again
    # on each update; the handler cordons, taints and drains on every one it gets (docs/maintenance.md). A
    # "closed" update means the work is done or cancelled: draining then would empty a node back in service. The
    # second branch keeps events without a statusCode (NTH's own example has none) rather than miss a maintenance.
    # Sources: AWS Health user guide, "Reference: AWS Health events Amazon EventBridge schema"; NTH v1.25.6
    # pkg/monitor/sqsevent/scheduled-change-event.go (service EC2, eventTypeCategory scheduledChange).
    "scheduled-change": {
        "source": ["aws.health"],
        "detail-type": ["AWS Health Event"],
        "detail": {
            "service": ["EC2"],
            "eventTypeCategory": ["scheduledChange"],
            "$or": [{"statusCode": ["upcoming", "open"]}, {"statusCode": [{"exists": False}]}],
        },
    },
    "spot-interruption": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "state-change": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Instance State-change Notification"],
        # The states NTH drains on; running/pending notifications would only be noise in the queue.
        "detail": {"state": ["stopping", "stopped", "shutting-down", "terminated"]},
    },
}
LIFECYCLE_RULE = "asg-lifecycle"  # added per stack: it is filtered to this cluster's Auto Scaling groups


class AddonSpec(BaseModel):
    """One pinned Helm chart from dlinfra/data/addons.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chart: str  # chart name in `repository`, or a full oci:// reference
    repository: str | None = None  # classic Helm repository URL; None for OCI charts
    # One exact version: no ranges, no pre-releases. Some repositories (eks-charts) spell versions with a
    # leading "v"; pin them exactly as the repository index does.
    version: str = Field(pattern=r"^v?\d+\.\d+\.\d+$")
    namespace: str
    verified: str  # where the pin was checked
    image_tags: Mapping[str, str] = Field(default_factory=dict)  # Kubernetes minor -> image tag
    image_registries: Mapping[str, str] = Field(default_factory=dict)  # AWS region -> registry host of the image

    @model_validator(mode="after")
    def _source(self) -> AddonSpec:
        oci = self.chart.startswith("oci://")
        if oci == (self.repository is not None):
            raise ValueError("give either an oci:// chart, or a chart name with a repository URL")
        if self.repository is not None and not self.repository.startswith("https://"):
            raise ValueError(f"repository {self.repository!r}: use an https:// URL")
        return self


ADDONS = (
    "nvidia-device-plugin",
    "dcgm-exporter",
    "cluster-autoscaler",
    "aws-node-termination-handler",
    "kueue",
    "cilium",
    "aws-efa-k8s-device-plugin",
    "node-local-dns",
)


@functools.cache
def load_addons() -> Mapping[str, AddonSpec]:
    """The pinned charts; DlinfraError naming the file and key when an entry is malformed or missing."""
    raw = yaml.safe_load(resources.files("dlinfra").joinpath("data/addons.yaml").read_text(encoding="utf-8"))
    if not isinstance(raw, Mapping):
        raise DlinfraError("expected a mapping of add-on name -> chart", file=ADDONS_FILE)
    out: dict[str, AddonSpec] = {}
    for name in ADDONS:
        if name not in raw:
            raise DlinfraError(
                "missing: every add-on the Platform installs needs a pinned chart", file=ADDONS_FILE, key=name
            )
    for name, spec in raw.items():
        if name not in ADDONS:
            raise DlinfraError(f"unknown add-on; known: {', '.join(ADDONS)}", file=ADDONS_FILE, key=str(name))
        try:
            out[name] = AddonSpec.model_validate(spec)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}" for e in exc.errors())
            raise DlinfraError(problems, file=ADDONS_FILE, key=str(name)) from None
    return out


def autoscaler_image_tag(kubernetes_version: str) -> str:
    """The cluster-autoscaler image whose minor version matches the cluster's."""
    tags = load_addons()["cluster-autoscaler"].image_tags
    if kubernetes_version not in tags:
        raise DlinfraError(
            f"no cluster-autoscaler image pinned for Kubernetes {kubernetes_version} (pinned: {', '.join(tags)})",
            file=ADDONS_FILE,
            key="cluster-autoscaler.image_tags",
        )
    return tags[kubernetes_version]


def image_registry(addon: str, region: str) -> str:
    """The registry an add-on's image is pulled from in a region (the region's own, through the ECR endpoint)."""
    registries = load_addons()[addon].image_registries
    if region not in registries:
        raise DlinfraError(
            f"no image registry pinned for region {region} (pinned: {', '.join(sorted(registries))})",
            file=ADDONS_FILE,
            key=f"{addon}.image_registries",
        )
    return registries[region]


# Helm values --------------------------------------------------------------------------------------------


def device_plugin_values() -> dict[str, Any]:
    """NVIDIA device plugin: GPU nodes only; feature discovery off (it would overwrite our gpu.product label)."""
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
        "tolerations": [{"key": key, "operator": "Exists", "effect": effect} for key, effect in sorted(tolerated)],
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


def autoscaler_discovery_tags(cluster_name: pulumi.Input[str]) -> list[pulumi.Input[str]]:
    """ASG tags auto-discovery requires: the ones NodePool puts on every pool of the cluster."""
    return [f"{AUTOSCALER_TAG}/enabled", pulumi.Output.concat(AUTOSCALER_TAG, "/", cluster_name)]


def autoscaler_args() -> dict[str, str]:
    """cluster-autoscaler flags: priority expander, and scale-down that never evicts running GPU work."""
    return {
        # Priorities first (reserved > on-demand > spot), then the least idle capacity among equals.
        "expander": "priority,least-waste",
        "balance-similar-node-groups": "true",
        # Training pods use emptyDir scratch; that must not pin an idle node forever.
        "skip-nodes-with-local-storage": "false",
        # CPU nodes: consolidate below half use.
        "scale-down-utilization-threshold": "0.5",
        # GPU nodes: only when no GPU is requested at all (one GPU of eight is 0.125), so consolidation never
        # evicts a running training job. Applies to nodes labelled k8s.amazonaws.com/accelerator (see report).
        "scale-down-gpu-utilization-threshold": "0.1",
        "scale-down-unneeded-time": "10m",
        "scale-down-delay-after-add": "10m",
        # Large GPU instances take long to boot, load drivers and start Fabric Manager.
        "max-node-provision-time": "25m",
        # The GPU DaemonSets (device plugin, DCGM) must not make an idle GPU node look used.
        "ignore-daemonsets-utilization": "true",
        "cordon-node-before-terminating": "true",
    }


def autoscaler_values(cluster_name: pulumi.Input[str], region: str, image_tag: str) -> dict[str, Any]:
    """cluster-autoscaler: AWS auto-discovery by this cluster's tags, credentials from Pod Identity."""
    return {
        "cloudProvider": "aws",
        "awsRegion": region,
        "autoDiscovery": {"clusterName": cluster_name, "tags": autoscaler_discovery_tags(cluster_name)},
        "image": {"tag": image_tag},
        "rbac": {"serviceAccount": {"create": True, "name": AUTOSCALER_SA}},
        "extraArgs": autoscaler_args(),
        "affinity": CLOUD_NODE_AFFINITY,
        # Scale-down must not evict the autoscaler itself mid-decision.
        "podAnnotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
    }


def _regex_literal(name: str) -> str:
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", name)


def render_priorities(groups: Mapping[str, Sequence[str]]) -> str:
    """The priority expander's configuration: capacity class -> ASG names, as priority -> anchored regexes."""
    unknown = set(groups) - set(CLASS_PRIORITY)
    if unknown:
        raise ValueError(f"unknown capacity class {sorted(unknown)}; known: {', '.join(CLASS_PRIORITY)}")
    table = {
        CLASS_PRIORITY[cls]: [f"^{_regex_literal(name)}$" for name in sorted(names)]
        for cls, names in sorted(groups.items(), key=lambda kv: -CLASS_PRIORITY[kv[0]])
        if names
    }
    return yaml.safe_dump(table, sort_keys=False)


def termination_handler_values(queue_url: pulumi.Input[str], region: str) -> dict[str, Any]:
    """aws-node-termination-handler in queue-processor mode: cordon, taint and drain before the node goes."""
    return {
        "enableSqsTerminationDraining": True,
        "queueURL": queue_url,
        "awsRegion": region,
        "serviceAccount": {"create": True, "name": TERMINATION_HANDLER_SA},
        # Drain, not only cordon; and taint nodes with scheduled maintenance so nothing new starts there.
        "cordonOnly": False,
        "taintNode": True,
        "deleteLocalData": True,
        "ignoreDaemonSets": True,
        "podTerminationGracePeriod": -1,  # each pod's own grace period: training jobs checkpoint on SIGTERM
        # The rules see every instance of the account and region; the handler acts only on nodes of its own
        # cluster (others are not found) and drops those messages instead of letting them pile up.
        "checkTagBeforeDraining": False,
        "deleteSqsMsgIfNodeNotFound": True,
        "emitKubernetesEvents": True,
        "replicas": 2,
        "podDisruptionBudget": {"maxUnavailable": 1},
        "affinity": CLOUD_NODE_AFFINITY,
    }


# The job kinds Kueue manages (its integrations), as "<API group>/<kind in lower case>"; MultiKueue workers grant
# the manager these and nothing else.
KUEUE_FRAMEWORKS = (
    "batch/job",
    "jobset.x-k8s.io/jobset",
    "kubeflow.org/pytorchjob",
    "kubeflow.org/mpijob",
    "trainer.kubeflow.org/trainjob",
    "ray.io/rayjob",
    "ray.io/raycluster",
)


def kueue_manager_config() -> dict[str, Any]:
    """Kueue's controller configuration (config.kueue.x-k8s.io/v1beta2), replacing the chart's default."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443", "enableClusterQueueResources": True},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "clientConnection": {"qps": 300, "burst": 500},
        # Every job in a team namespace is queued (the LocalQueue "default" catches unlabelled ones), so a
        # team cannot bypass its quota by omitting the queue name; other namespaces are left alone.
        "manageJobsWithoutQueueName": True,
        "managedJobsNamespaceSelector": {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]},
        # Quotas cover GPUs only; CPU, memory and EFA requests are not Kueue's business here.
        "resources": {"quotaCheckStrategy": "IgnoreUndeclared"},
        # A gang whose pods cannot all start (capacity shortage) gives its quota back and requeues; the timeout
        # leaves room for scaling GPU pools up from zero.
        "waitForPodsReady": {
            "timeout": "30m",
            "blockAdmission": False,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 60, "backoffMaxSeconds": 3600},
        },
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
    }


def kueue_values() -> dict[str, Any]:
    """Kueue: two replicas (its admission webhooks fail closed), our manager configuration."""
    return {
        "controllerManager": {"replicas": 2, "podDisruptionBudget": {"enabled": True, "minAvailable": 1}},
        "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(kueue_manager_config(), sort_keys=False)},
    }


def cilium_values() -> dict[str, Any]:
    """Cilium for EKS Hybrid Nodes only: agents on hybrid nodes, multi-pool IPAM with one pool per site (the
    pools and the BGP peering with each site's gateway are declared as objects: cilium_*_spec below)."""
    return {
        "affinity": HYBRID_NODE_AFFINITY,
        # Every node takes its pod blocks from its own site's pool (CiliumNodeConfig), so a node never gets a
        # block of another site's range, which the gateways could not route. Cluster-pool IPAM has one pool.
        "ipam": {"mode": "multi-pool"},
        # Multi-pool IPAM supports native routing only, with per-endpoint routes instead of a local node route
        # (Cilium docs, "Multi-Pool IPAM", limitations).
        "routingMode": "native",
        "endpointRoutes": {"enabled": True},
        # Nodes of one site share a LAN and route pod traffic to each other directly; other sites' nodes are
        # reached through the site gateway (the node's default route), so their routes are skipped.
        "autoDirectNodeRoutes": True,
        "directRoutingSkipUnreachable": True,
        # The cluster declares the sites' pod ranges as remote pod networks, and the gateways route them: pods
        # keep their addresses (EKS guide, "Configure CNI for hybrid nodes"). Without masquerading Cilium needs
        # no ipv4NativeRoutingCIDR, which the disjoint per-site pools could not share anyway.
        "enableIPv4Masquerade": False,
        # Each node announces its pod blocks to its site gateway (cilium_bgp_*_spec).
        "bgpControlPlane": {"enabled": True},
        # Services stay with kube-proxy, which EKS runs on hybrid nodes too: NodeLocal DNSCache then intercepts the
        # kube-dns address with iptables as on cloud nodes. With the replacement on, pods' service traffic would
        # bypass those rules and the cache would need a CiliumLocalRedirectPolicy (Cilium docs, "Local Redirect
        # Policy", which relies on the replacement).
        "kubeProxyReplacement": "false",
        # Pods on cloud nodes belong to the VPC CNI; Cilium must not restart them.
        "operator": {"unmanagedPodWatcher": {"restart": False}},
    }


def node_local_dns_values(kube_dns_ip: str) -> dict[str, Any]:
    """NodeLocal DNSCache on every node, cloud and hybrid, in the guide's iptables mode.

    Both data paths hand service traffic to kube-proxy's iptables rules (the VPC CNI; Cilium without kube-proxy
    replacement, cilium_values), so the cache intercepts the kube-dns address with NOTRACK rules and also answers
    on its link-local address, which kubelets list first (dlinfra.dns.node_dns_servers). cluster.local goes to
    CoreDNS through the chart's own upstream service (same pods as kube-dns, another address), never back into
    the cache; so do other names: CoreDNS forwards them to the VPC resolver, so hybrid pods resolve private
    hosted zones and endpoint names as cloud pods do.
    """
    return {
        "config": {
            "localDns": dns.NODE_LOCAL_DNS,
            "dnsServer": kube_dns_ip,
            # Bind only the two addresses: 0.0.0.0:53 on the host network would clash with systemd-resolved and
            # answer on the node's own addresses.
            "bindIp": True,
            "setupInterface": True,
            "setupIptables": True,
            # On shutdown the cache removes its interface and rules, so kube-dns queries reach CoreDNS meanwhile.
            "skipTeardown": False,
            "upstreamServers": "__PILLAR__CLUSTER__DNS__",
            # A site whose VPN is down keeps answering names it has seen, after trying CoreDNS first.
            "serveStale": {"enabled": True, "duration": "1h", "mode": "verify"},
        },
        # Every node: GPU pools, tainted pools and hybrid machines alike (an empty key with Exists tolerates all).
        "tolerations": [{"operator": "Exists"}],
        # One node at a time: its pods fall back to kube-dns meanwhile (node_dns_servers).
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
    }


def _site_selector(site: str) -> dict[str, Any]:
    """The nodes of one site: the label they register with (dlinfra/render/nodeadm.py node_labels)."""
    return {"matchLabels": {SITE_LABEL: site}}


def cilium_pool_spec(pod_cidr: str) -> dict[str, Any]:
    """A site's CiliumPodIPPool: its whole pod range, handed out in one node block at a time."""
    return {"ipv4": {"cidrs": [pod_cidr], "maskSize": hybrid_routing.NODE_POD_PREFIX}}


def cilium_node_config_spec(site: str) -> dict[str, Any]:
    """CiliumNodeConfig of a site's nodes: their pods come from the site's pool, and only from it."""
    pool = hybrid_routing.pool_name(site)
    return {
        "nodeSelector": _site_selector(site),
        "defaults": {
            "ipam-default-ip-pool": pool,
            # Replaces the global "default=8", so nodes pre-allocate from no pool but their own.
            "ipam-multi-pool-pre-allocation": f"{pool}={CILIUM_PRE_ALLOCATION}",
        },
    }


def cilium_bgp_cluster_config_spec(site: str, asn: int, gateway_ip: str) -> dict[str, Any]:
    """CiliumBGPClusterConfig of a site's nodes: iBGP in the site's own ASN with the site gateway on the LAN.

    The site's ASN, not a new one: the gateway already speaks for the site to AWS, and re-announces only the
    aggregate pod range there, so the nodes need no ASN of their own and no eBGP policy.
    """
    pool = hybrid_routing.pool_name(site)
    return {
        "nodeSelector": _site_selector(site),
        "bgpInstances": [
            {
                "name": pool,
                "localASN": asn,
                "peers": [
                    {
                        "name": CILIUM_GATEWAY_PEER,
                        "peerASN": asn,
                        "peerAddress": gateway_ip,
                        "peerConfigRef": {"name": pool},
                    }
                ],
            }
        ],
    }


def cilium_bgp_peer_config_spec(site: str) -> dict[str, Any]:
    """CiliumBGPPeerConfig of the gateway session: the timers frr.conf also uses, graceful restart, and the
    site's advertisement."""
    return {
        "timers": {
            "connectRetryTimeSeconds": hybrid_routing.BGP_CONNECT_RETRY_SECONDS,
            "holdTimeSeconds": hybrid_routing.BGP_HOLD_SECONDS,
            "keepAliveTimeSeconds": hybrid_routing.BGP_KEEPALIVE_SECONDS,
        },
        # An agent restart keeps its pods reachable: the gateway holds the routes meanwhile.
        "gracefulRestart": {"enabled": True, "restartTimeSeconds": hybrid_routing.BGP_RESTART_SECONDS},
        "families": [{"afi": "ipv4", "safi": "unicast", "advertisements": _site_selector(site)}],
    }


def cilium_bgp_advertisement_spec(site: str) -> dict[str, Any]:
    """CiliumBGPAdvertisement: the node's blocks of its site's pool (PodCIDR does not apply to multi-pool)."""
    return {"advertisements": [{"advertisementType": "CiliumPodIPPool", "selector": _site_selector(site)}]}


# IAM and EventBridge documents ---------------------------------------------------------------------------


def pod_identity_trust(cluster_name: pulumi.Input[str], namespace: str, service_account: str) -> dict[str, Any]:
    """Trust policy for EKS Pod Identity, limited by session tags to one service account of one cluster."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "pods.eks.amazonaws.com"},
                "Action": ["sts:AssumeRole", "sts:TagSession"],
                "Condition": {
                    "StringEquals": {
                        "aws:RequestTag/eks-cluster-name": cluster_name,
                        "aws:RequestTag/kubernetes-namespace": namespace,
                        "aws:RequestTag/kubernetes-service-account": service_account,
                    }
                },
            }
        ],
    }


def autoscaler_policy(cluster_name: pulumi.Input[str]) -> dict[str, Any]:
    """Read-only discovery everywhere; resizing only Auto Scaling groups tagged for this cluster."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "Discover",
                "Effect": "Allow",
                # Describe calls support no resource-level permissions.
                "Action": [
                    "autoscaling:DescribeAutoScalingGroups",
                    "autoscaling:DescribeAutoScalingInstances",
                    "autoscaling:DescribeLaunchConfigurations",
                    "autoscaling:DescribeScalingActivities",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplateVersions",
                    "ec2:GetInstanceTypesFromInstanceRequirements",
                ],
                "Resource": "*",
            },
            {
                "Sid": "ScaleOwnGroups",
                "Effect": "Allow",
                "Action": ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
                "Resource": "*",
                "Condition": {
                    "StringEquals": {
                        pulumi.Output.concat("aws:ResourceTag/", AUTOSCALER_TAG, "/", cluster_name): "owned",
                        f"aws:ResourceTag/{AUTOSCALER_TAG}/enabled": "true",
                    }
                },
            },
        ],
    }


def termination_handler_policy(queue_arn: pulumi.Input[str], asg_arns: Sequence[pulumi.Input[str]]) -> dict[str, Any]:
    """Consume the queue, look instances up, and complete lifecycle hooks of this cluster's groups only."""
    statements: list[dict[str, Any]] = [
        {
            "Sid": "ConsumeQueue",
            "Effect": "Allow",
            "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage"],
            "Resource": queue_arn,
        },
        {"Sid": "DescribeInstances", "Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"},
    ]
    if asg_arns:
        statements.append(
            {
                "Sid": "CompleteLifecycle",
                "Effect": "Allow",
                "Action": "autoscaling:CompleteLifecycleAction",
                "Resource": list(asg_arns),
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}


def queue_policy(queue_arn: pulumi.Input[str], rule_arns: Sequence[pulumi.Input[str]]) -> dict[str, Any]:
    """EventBridge may send only from our rules; nothing may use the queue without TLS."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "FromEventBridgeRules",
                "Effect": "Allow",
                "Principal": {"Service": "events.amazonaws.com"},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"ArnEquals": {"aws:SourceArn": list(rule_arns)}},
            },
            {
                "Sid": "DenyInsecureTransport",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "sqs:*",
                "Resource": queue_arn,
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
        ],
    }


def lifecycle_pattern(asg_names: Sequence[pulumi.Input[str]]) -> dict[str, Any]:
    """ASG termination lifecycle actions of this cluster's groups (other clusters' hooks are theirs)."""
    return {
        "source": ["aws.autoscaling"],
        "detail-type": ["EC2 Instance-terminate Lifecycle Action"],
        "detail": {"AutoScalingGroupName": list(asg_names)},
    }


# Kueue objects ------------------------------------------------------------------------------------------

Taint = tuple[str, str, str]  # key, value, effect


def resource_flavor_spec(flavor: kueue.Flavor, taints: Sequence[Taint] = ()) -> dict[str, Any]:
    """A flavor's node labels (so Kueue pins admitted pods to its nodes) and the taints jobs must tolerate."""
    labels = {GPU_PRODUCT_LABEL: flavor.gpu_model}
    if flavor.source == "pool":
        labels[POOL_LABEL] = flavor.source_name
    else:
        labels |= {SITE_LABEL: flavor.source_name, COMPUTE_TYPE_LABEL: "hybrid"}
    spec: dict[str, Any] = {"nodeLabels": dict(sorted(labels.items()))}
    if taints:
        spec["nodeTaints"] = [{"key": k, "value": v, "effect": e} for k, v, e in taints]
    return spec


def _gpu_group(quotas: Mapping[str, tuple[int, int | None]]) -> dict[str, Any]:
    """One resource group over nvidia.com/gpu: flavor -> (nominal, borrowing limit or None)."""
    flavors = []
    for name, (nominal, borrowing) in quotas.items():
        resource: dict[str, str] = {"name": kueue.GPU_RESOURCE, "nominalQuota": str(nominal)}
        if borrowing is not None:
            resource["borrowingLimit"] = str(borrowing)
        flavors.append({"name": name, "resources": [resource]})
    return {"coveredResources": [kueue.GPU_RESOURCE], "flavors": flavors}


def cluster_queue_spec(team: str, namespace: str, quotas: kueue.RegionQuotas) -> dict[str, Any]:
    """A team's ClusterQueue: its nominal GPUs per flavor, borrowing up to each flavor's size, reclaim by preemption."""
    group = _gpu_group(
        {f.name: (quotas.nominal[team][f.name], f.gpus - quotas.nominal[team][f.name]) for f in quotas.flavors}
    )
    return {
        "cohortName": kueue.COHORT,
        # Only the team's own namespace may point a LocalQueue at this queue.
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [group],
        # Try every flavor before borrowing or preempting in the first one that would fit.
        "flavorFungibility": {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "TryNextFlavor"},
        # Guarantees hold: a team within its quota takes lent GPUs back; borrowers never preempt owners.
        "preemption": {
            "reclaimWithinCohort": "Any",
            "borrowWithinCohort": {"policy": "Never"},
            "withinClusterQueue": "LowerPriority",
        },
    }


def cohort_spec(quotas: kueue.RegionQuotas) -> dict[str, Any]:
    """The cohort's own quota: the GPUs no team is guaranteed, which any team may borrow."""
    return {"resourceGroups": [_gpu_group({f.name: (quotas.spare(f.name), None) for f in quotas.flavors})]}


def local_queue_spec(team: str) -> dict[str, Any]:
    """The team namespace's LocalQueue, feeding the team's ClusterQueue."""
    return {"clusterQueue": team}


# MultiKueue (Kueue docs, "MultiKueue" and "Setup a MultiKueue environment", v0.19) -------------------------------

MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"  # AdmissionCheck controllerName of MultiKueue
MULTIKUEUE_NAMESPACE = "kueue-system"  # kubeconfig Secrets live where the Kueue controller runs (addons.yaml)
MULTIKUEUE_SA = "multikueue"  # the manager's identity in each worker cluster
MULTIKUEUE_READ_ROLE = "dlinfra-multikueue-read"
MULTIKUEUE_WRITE_ROLE = "dlinfra-multikueue-write"
MULTIKUEUE_TOKEN_SECRET = "multikueue-token"
KUBECONFIG_KEY = "kubeconfig"  # the key MultiKueue reads a Secret's kubeconfig from


def multikueue_cluster_name(region: str) -> str:
    """The MultiKueueCluster (and its kubeconfig Secret's suffix) of a worker region."""
    return region


def multikueue_secret_name(region: str) -> str:
    return f"multikueue-{region}"


def overflow_check_name(team: str) -> str:
    """A team's AdmissionCheck and MultiKueueConfig: its overflowing jobs go to its worker regions."""
    return f"overflow-{team}"


def overflow_cluster_queue_name(team: str) -> str:
    return f"{team}-{kueue.OVERFLOW_QUEUE}"


def multikueue_cluster_spec(region: str) -> dict[str, Any]:
    """A worker cluster, reached with the kubeconfig in a Secret next to the Kueue controller."""
    return {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": multikueue_secret_name(region)}}}


def multikueue_config_spec(regions: Sequence[str]) -> dict[str, Any]:
    """The worker clusters a team's overflowing jobs are offered to (all at once: the first to admit runs it)."""
    return {"clusters": [multikueue_cluster_name(r) for r in sorted(regions)]}


def overflow_admission_check_spec(team: str) -> dict[str, Any]:
    return {
        "controllerName": MULTIKUEUE_CONTROLLER,
        "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": overflow_check_name(team)},
    }


def overflow_cluster_queue_spec(team: str, namespace: str, gpus: int) -> dict[str, Any]:
    """The manager's queue for a team's overflowing jobs: the team's GPUs in its worker regions, dispatched there.

    The MultiKueue check applies to the whole queue: Kueue deactivates a ClusterQueue whose MultiKueue check is
    limited to some flavors (pkg/cache/scheduler/clusterqueue.go, "Cannot specify MultiKueue AdmissionCheck per
    flavor"), which is why overflow is a queue of its own and not a last flavor of the team's queue. No cohort:
    remote GPUs are not lent to local queues.
    """
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [_gpu_group({kueue.OVERFLOW_FLAVOR: (gpus, None)})],
        "admissionChecksStrategy": {"admissionChecks": [{"name": overflow_check_name(team)}]},
    }


def overflow_local_queue_spec(cluster_queue: str) -> dict[str, Any]:
    return {"clusterQueue": cluster_queue}


def _framework_resources() -> list[tuple[str, str]]:
    """(API group, resource) of every job kind Kueue manages: "batch/job" -> ("batch", "jobs")."""
    out = []
    for framework in KUEUE_FRAMEWORKS:
        group, kind = framework.rsplit("/", 1)
        out.append((group, f"{kind}s"))
    return out


def multikueue_read_rules() -> list[dict[str, Any]]:
    """Cluster-wide reads the manager needs in a worker: it watches its remote workloads and jobs everywhere."""
    jobs = _framework_resources()
    rules = [
        {"apiGroups": [group], "resources": [resource], "verbs": ["get", "list", "watch"]} for group, resource in jobs
    ]
    rules += [{"apiGroups": [group], "resources": [f"{resource}/status"], "verbs": ["get"]} for group, resource in jobs]
    rules.append({"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch"]})
    rules.append(
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["clusterqueues", "localqueues"],
            "verbs": ["get", "list", "watch"],
        }
    )
    return rules


def multikueue_write_rules() -> list[dict[str, Any]]:
    """Writes the manager needs, granted only in the namespaces of teams that overflow to the worker: it creates
    and deletes copies of jobs and their workloads and keeps the workloads' status in sync."""
    rules = [
        {"apiGroups": [group], "resources": [resource], "verbs": ["create", "delete"]}
        for group, resource in _framework_resources()
    ]
    # Kueue's own example role also lets the manager update RayClusters (create-multikueue-kubeconfig.sh).
    rules.append({"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["update", "patch"]})
    rules.append(
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["create", "delete", "update", "patch"]}
    )
    rules.append({"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"], "verbs": ["update", "patch"]})
    return rules


def multikueue_kubeconfig(cluster_name: str, endpoint: str, ca_data: str, token: str) -> str:
    """The kubeconfig a manager uses for a worker: its service account's token, no exec plugin and no file paths,
    which MultiKueue refuses (Kueue docs, "Security Notice")."""
    user = f"{MULTIKUEUE_SA}@{cluster_name}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": user}}],
        "current-context": cluster_name,
    }
    return yaml.safe_dump(config, sort_keys=False)
