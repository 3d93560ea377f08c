"""The site gateway's kernel networking files: sysctl settings, nftables MSS clamping and the XFRM interface script."""

from __future__ import annotations

import ipaddress
from typing import Any, Final

from dlinfra.render.gateway_templates import render_template
from dlinfra.render.site_vpn import LINK_LOCAL, SiteVpnView

# TCP MSS clamped on the tunnels: fits every algorithm AWS is configured with, with or without NAT-T
# (AWS "Best practices for your customer gateway device", MTU/MSS table; docs/site-onboarding.md).
TUNNEL_MSS: Final = 1382
# Where the gateway cookbook installs the rendered XFRM interface script; charon's updown calls it.
XFRM_SCRIPT: Final = "/usr/local/sbin/dlinfra-xfrm"
# The metric of the gateway's unreachable route for the whole link-local range (the tunnels' inside /30s), the
# kernel's largest: more specific routes (a tunnel's /30 while its interface is up) and any other route for the
# range win, and less specific ones, the default route above all, lose to it.
LINK_LOCAL_FALLBACK_METRIC: Final = 2**32 - 1


def xfrm_interfaces(view: SiteVpnView) -> list[dict[str, Any]]:
    """Each tunnel's XFRM interface as the templates name it: the script creates them, FRR routes over them."""
    return [
        {
            "name": view.interface(t),
            "if_id": view.if_id(t),
            "connection": view.connection(t),
            "outside_ip": t.outside_ip,
            "site_ip": t.site_inside_ip,
            "aws_ip": t.aws_inside_ip,
            "prefixlen": ipaddress.IPv4Network(t.inside_cidr).prefixlen,
        }
        for t in view.tunnels
    ]


def render_xfrm_script(view: SiteVpnView) -> str | None:
    """The gateway's XFRM interface script (start/stop at boot, updown for charon); None for policy-based sites."""
    if not view.route_based:
        return None
    return render_template(
        "dlinfra-xfrm.sh.j2",
        site=view.site,
        interfaces=xfrm_interfaces(view),
        link_local=str(LINK_LOCAL),
        link_local_metric=LINK_LOCAL_FALLBACK_METRIC,
        # The inner packets' MTU that the clamped MSS fits: MSS + 20 (IPv4) + 20 (TCP) bytes of headers.
        mtu=TUNNEL_MSS + 40,
    )


def render_sysctl(view: SiteVpnView) -> str:
    """sysctl.d file for the gateway: forwarding and loose reverse-path filtering."""
    return render_template("sysctl-dlinfra.conf.j2", site=view.site, route_based=view.route_based)


def render_nftables(view: SiteVpnView) -> str:
    """nftables ruleset that clamps the TCP MSS of connections through the tunnels."""
    return render_template(
        "dlinfra-mss.nft.j2",
        site=view.site,
        route_based=view.route_based,
        interfaces=[view.interface(t) for t in view.tunnels],
        mss=TUNNEL_MSS,
    )
