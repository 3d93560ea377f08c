"""How a site's hybrid nodes and its gateway exchange pod routes (pure; no pulumi import).

Cilium on each hybrid node takes a per-node pod block from its own site's pool and announces it over iBGP to
the site gateway's FRR, which installs it in the kernel and keeps announcing only the site's aggregate pod
range to AWS. The Cilium objects (components/platform.py) and the gateway's frr.conf (dlinfra/render) read
their shared numbers from here, so the two ends cannot drift apart.
"""

from __future__ import annotations

import ipaddress

NODE_POD_PREFIX = 25  # every hybrid node's pod block (Cilium pool maskSize): 128 addresses, above max-pods 110
# BGP timers of the node <-> gateway sessions. Both ends sit on one LAN, so a short hold time detects a dead
# node in seconds; FRR and Cilium each negotiate the smaller hold time anyway.
BGP_KEEPALIVE_SECONDS = 3
BGP_HOLD_SECONDS = 9
BGP_CONNECT_RETRY_SECONDS = 5
# While a Cilium agent restarts, the gateway (a graceful-restart helper by FRR's default) keeps the node's
# routes this long instead of cutting its pods off.
BGP_RESTART_SECONDS = 120


def pool_name(site: str) -> str:
    """The CiliumPodIPPool of a site (and its nodes' default pool)."""
    return f"site-{site}"


def gateway_lan_ip(lan: str | ipaddress.IPv4Network) -> ipaddress.IPv4Address:
    """The site gateway's address on the site LAN: by convention its first usable host.

    Hybrid nodes peer with it and route through it; the fleet has no key for it, so every site must give its
    gateway this address (README, "Physical GPU sites").
    """
    net = ipaddress.IPv4Network(lan)
    if net.num_addresses < 4:
        raise ValueError(f"lan: {net} has no room for a gateway and nodes")
    return net[1]
