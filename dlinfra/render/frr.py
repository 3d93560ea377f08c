"""FRR on the site gateway: routes to AWS over the tunnels (static routes or eBGP) and iBGP with the site's hybrid
nodes."""

from __future__ import annotations

from typing import Final

from dlinfra.model import hybrid_routing
from dlinfra.render.gateway_templates import render_template
from dlinfra.render.kernel import xfrm_interfaces
from dlinfra.render.site_vpn import SiteVpnView

# BGP with AWS: AWS's VPN BGP uses a 30 s hold time (keepalive 10 s) and the site must match ("Customer
# gateway device" BGP requirements). The connect-retry timer is FRR's own (120 s by default in
# "traditional" defaults); a short one lets the session come back soon after a tunnel does.
BGP_KEEPALIVE_SECONDS: Final = 10
BGP_HOLD_SECONDS: Final = 30
BGP_CONNECT_RETRY_SECONDS: Final = 5


def render_frr(view: SiteVpnView) -> str | None:
    """frr.conf: routes to AWS over the tunnel interfaces (route-based: static routes or eBGP with ECMP), and
    iBGP with the site's hybrid nodes; for policy-based sites, None when neither BGP nor hybrid pods apply."""
    bgp = view.routing == "bgp"
    if not view.route_based and not bgp and not view.pod_cidrs:
        return None
    hybrid = None
    if view.pod_cidrs:
        hybrid = {
            "lan": view.lan_cidr,
            "pods": list(view.pod_cidrs),
            "node_prefix": hybrid_routing.NODE_POD_PREFIX,
            "keepalive": hybrid_routing.BGP_KEEPALIVE_SECONDS,
            "hold": hybrid_routing.BGP_HOLD_SECONDS,
        }
    interfaces = xfrm_interfaces(view)
    return render_template(
        "frr.conf.j2",
        site=view.site,
        route_based=view.route_based,
        hybrid=hybrid,
        local_asn=view.local_asn,
        remote_asn=view.remote_asn,
        router_id=view.local_public_ip,
        keepalive=BGP_KEEPALIVE_SECONDS,
        hold=BGP_HOLD_SECONDS,
        connect_retry=BGP_CONNECT_RETRY_SECONDS,
        announce=[view.lan_cidr, *view.pod_cidrs] if bgp else [],
        # Exactly the planned networks: a more specific route inside a VPC range would come from some other
        # attachment claiming part of it, and would win by longest match.
        accept=list(view.remote_cidrs) if bgp else [],
        static_routes=list(view.remote_cidrs) if view.route_based and not bgp else [],
        fallback_routes=list(view.remote_cidrs) if view.route_based else [],
        interfaces=interfaces,
        neighbors=[
            {"name": n["connection"], "aws_ip": n["aws_ip"], "site_ip": n["site_ip"], "interface": n["name"]}
            for n in interfaces
        ]
        if bgp
        else [],
    )
