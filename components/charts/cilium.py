"""Cilium for EKS Hybrid Nodes: the chart's values, and per site its pod IP pool, node config and BGP session."""

from __future__ import annotations

from typing import Any

from components.charts.nodes import HYBRID_NODE_AFFINITY, SITE_LABEL
from dlinfra.model import hybrid_routing

# Cilium 1.18 (addons.yaml) serves CiliumNodeConfig and the BGP control plane's objects as cilium.io/v2 (the BGP
# ones promoted in cilium/cilium#37765, v2alpha1 deprecated); CiliumPodIPPool is still cilium.io/v2alpha1 there.
CILIUM_API = "cilium.io/v2"
CILIUM_POOL_API = "cilium.io/v2alpha1"
# The cilium.io kinds declared per site (Platform._cilium): their CRDs must be served before they are created.
CILIUM_KINDS = (
    "CiliumPodIPPool",
    "CiliumNodeConfig",
    "CiliumBGPClusterConfig",
    "CiliumBGPPeerConfig",
    "CiliumBGPAdvertisement",
)
CILIUM_GATEWAY_PEER = "site-gateway"  # the one BGP peer of a site's nodes
# IPs a node reserves ahead in its site's pool; more blocks are allocated as pods need them.
CILIUM_PRE_ALLOCATION = 8


def crd_name(kind: str) -> str:
    """The CustomResourceDefinition of a cilium.io kind: its lower-case plural (CiliumPodIPPool ->
    ciliumpodippools.cilium.io, as the chart's operator ClusterRole names them)."""
    return f"{kind.lower()}s.cilium.io"


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
