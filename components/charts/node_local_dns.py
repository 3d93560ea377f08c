"""NodeLocal DNSCache: a DNS cache on every node, cloud and hybrid, answering on the kube-dns address."""

from __future__ import annotations

from typing import Any

from dlinfra.model import dns


def node_local_dns_values(kube_dns_ip: str) -> dict[str, Any]:
    """NodeLocal DNSCache on every node, cloud and hybrid, in the guide's iptables mode.

    Both data paths hand service traffic to kube-proxy's iptables rules (the VPC CNI; Cilium without kube-proxy
    replacement, cilium_values), so the cache intercepts the kube-dns address with NOTRACK rules and also answers
    on its link-local address, which kubelets list first (dlinfra.model.dns.node_dns_servers). cluster.local goes to
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
