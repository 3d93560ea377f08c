"""Cluster DNS at scale, as data: the node-local cache's address, what every kubelet points pods at, and how the
managed CoreDNS add-on scales and spreads. Pure (no pulumi).

Sources: Kubernetes "Using NodeLocal DNSCache in Kubernetes Clusters" (link-local listen address; in iptables mode
the cache also binds the kube-dns service IP), Amazon EKS user guide "Scale CoreDNS Pods for high DNS traffic"
(autoScaling, replicas = max(nodes / 16, cores / 256)) and "Configure webhooks for hybrid nodes" (mixed mode).
"""

from __future__ import annotations

import ipaddress
import math

# The cache's link-local listen address (the guide's example; 169.254.20.0/24 is outside every range dlinfra plans,
# and AWS reserves none of it: IMDS and Time Sync are 169.254.169.x, VPN tunnel insides 169.254.0.0/16 /30s are
# allocated from the lock, never .20.x).
NODE_LOCAL_DNS = "169.254.20.10"
KUBE_DNS_OFFSET = 10  # EKS gives the kube-dns service the tenth address of the service range
# EKS's CoreDNS autoscaler: one replica per 16 nodes or per 256 cores, whichever needs more.
NODES_PER_REPLICA = 16
CORES_PER_REPLICA = 256
# The guide: "the minimum number of CoreDNS pods is always greater than 2"; also one per AZ of a 3-AZ region.
MIN_COREDNS_REPLICAS = 3
COREDNS_SELECTOR = {"k8s-app": "kube-dns"}  # the label EKS's CoreDNS pods carry
ZONE_LABEL = "topology.kubernetes.io/zone"
HOST_LABEL = "kubernetes.io/hostname"
COMPUTE_TYPE_LABEL = "eks.amazonaws.com/compute-type"  # "hybrid" on EKS Hybrid Nodes


def kube_dns_ip(service_cidr: str) -> str:
    """The kube-dns service address EKS assigns in a cluster's service range."""
    return str(ipaddress.IPv4Network(service_cidr)[KUBE_DNS_OFFSET])


def node_dns_servers(service_cidr: str) -> tuple[str, str]:
    """What every kubelet (cloud and hybrid) writes into pods' resolv.conf: the node's cache first, kube-dns second.

    The cache answers on both addresses while it runs. While it restarts it has removed its interface and its
    iptables rules (skipteardown=false), so the first server does not answer, the resolver moves on to the second
    after its timeout, and kube-proxy sends that query to CoreDNS: pods keep resolving, only slower.
    """
    return (NODE_LOCAL_DNS, kube_dns_ip(service_cidr))


def coredns_max_replicas(max_nodes: int, max_cores: int) -> int:
    """The replicas EKS's autoscaler would want at the region's largest size (every pool and site at its maximum)."""
    if max_nodes < 0 or max_cores < 0:
        raise ValueError(f"max_nodes/max_cores: must be >= 0, got {max_nodes}/{max_cores}")
    wanted = max(math.ceil(max_nodes / NODES_PER_REPLICA), math.ceil(max_cores / CORES_PER_REPLICA))
    return max(MIN_COREDNS_REPLICAS, wanted)


def coredns_configuration(max_nodes: int, max_cores: int) -> dict[str, object]:
    """configuration_values of the coredns EKS add-on: scaled by nodes and cores, spread over AZs and hosts, kept
    on cloud nodes.

    Spreading is ScheduleAnyway: GPU nodes, which CoreDNS does not tolerate, still count as zone domains, so a hard
    constraint could leave replicas pending; the preference spreads them wherever it can.
    """
    selector = {"matchLabels": dict(COREDNS_SELECTOR)}
    return {
        "autoScaling": {
            "enabled": True,
            "minReplicas": MIN_COREDNS_REPLICAS,
            "maxReplicas": coredns_max_replicas(max_nodes, max_cores),
        },
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": ZONE_LABEL, "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": selector}
        ],
        # Replaces the add-on's default affinity, so it repeats its Linux and architecture terms. Off hybrid nodes:
        # hybrid pods reach CoreDNS through their node's cache, and a replica on a site would answer the whole
        # cluster across the VPN.
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
                                {"key": COMPUTE_TYPE_LABEL, "operator": "NotIn", "values": ["hybrid", "fargate"]},
                            ]
                        }
                    ]
                }
            },
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "podAffinityTerm": {"topologyKey": HOST_LABEL, "labelSelector": selector}}
                ]
            },
        },
    }
