"""strongSwan on the site gateway: swanctl.conf (both tunnels, initiated and kept up by the site) and charon's
strongswan.conf snippet, with the IKE timers and retransmission schedule they carry."""

from __future__ import annotations

from typing import Final

from dlinfra.render.aws_tunnel import AWS_REPLAY_WINDOW_SIZE
from dlinfra.render.gateway_templates import render_template
from dlinfra.render.kernel import XFRM_SCRIPT
from dlinfra.render.site_vpn import SiteVpnView, Tunnel

# Site-side timers. The site always rekeys before AWS would (AWS starts at lifetime - 2 x margin with
# 100 % fuzz), and its hard lifetime stays under AWS's, so rekeys never collide or lapse.
SITE_IKE_REKEY_SECONDS: Final = 25200  # 7 h
SITE_IKE_OVER_SECONDS: Final = 2520  # hard IKE_SA lifetime 27720 s < 28260 s, AWS's earliest rekey
SITE_CHILD_REKEY_SECONDS: Final = 2700  # 45 min
SITE_CHILD_LIFE_SECONDS: Final = 2970  # < 3060 s, AWS's earliest phase 2 rekey
# A third of AWS's DPD timeout: a silent AWS endpoint is noticed quickly, and our probes keep AWS's
# DPD satisfied even when no data flows.
SITE_DPD_DELAY_SECONDS: Final = 10

# charon's retransmission schedule (strongswan.conf charon.retransmit_*). strongSwan sends an IKE
# request, then retransmits it `tries` times, the n-th retransmission after timeout * base^(n-1), and
# gives up one more timeout * base^tries later: sum(timeout * base^n for n in 0..tries) seconds
# (strongSwan docs, "Retransmission"). Its defaults (4 s, 1.8, 5) give up after 165 s, which is what made
# a silent AWS endpoint take 170 s to fail over. These give up after 2 x (1 + 1.4 + 1.96 + 2.744) = 14.2 s:
# four packets over 14 s still ride out a lost one or two on a healthy path.
CHARON_RETRANSMIT_TIMEOUT_SECONDS: Final = 2.0
CHARON_RETRANSMIT_BASE: Final = 1.4
CHARON_RETRANSMIT_TRIES: Final = 3


def ike_give_up_seconds(timeout: float, base: float, tries: int) -> float:
    """Seconds from an IKE request to charon giving up on it: sum(timeout * base^n, n = 0..tries) (strongSwan
    docs, "Retransmission": the n-th retransmission waits timeout * base^(n-1), and one more wait follows the
    last)."""
    return sum(timeout * base**n for n in range(tries + 1))


def _traffic_selectors(view: SiteVpnView, tunnel: Tunnel) -> tuple[list[str], list[str]]:
    if view.route_based:
        # AWS's route-based VPN: any traffic routed into the tunnel's interface is the tunnel's.
        return ["0.0.0.0/0"], ["0.0.0.0/0"]
    local = [view.lan_cidr, *view.pod_cidrs]
    remote = list(view.remote_cidrs)
    if view.routing == "bgp":
        local.append(f"{tunnel.site_inside_ip}/32")
        remote.append(f"{tunnel.aws_inside_ip}/32")
    return local, remote


def render_swanctl(view: SiteVpnView) -> str:
    """swanctl.conf for the site gateway: both tunnels, initiated and kept up by the site."""
    tunnels = []
    for tunnel in view.tunnels:
        local_ts, remote_ts = _traffic_selectors(view, tunnel)
        tunnels.append(
            {
                "name": view.connection(tunnel),
                "number": tunnel.number,
                "outside_ip": tunnel.outside_ip,
                "inside_cidr": tunnel.inside_cidr,
                "local_ts": local_ts,
                "remote_ts": remote_ts,
                "if_id": view.if_id(tunnel),
                "interface": view.interface(tunnel),
                "preshared_key": tunnel.preshared_key,
            }
        )
    return render_template(
        "swanctl.conf.j2",
        site=view.site,
        routing=view.routing,
        route_based=view.route_based,
        xfrm_script=XFRM_SCRIPT,
        local_public_ip=view.local_public_ip,
        tunnels=tunnels,
        ike_proposals=",".join(view.ike_proposals),
        esp_proposals=",".join(view.esp_proposals),
        ike_rekey=SITE_IKE_REKEY_SECONDS,
        ike_over=SITE_IKE_OVER_SECONDS,
        child_rekey=SITE_CHILD_REKEY_SECONDS,
        child_life=SITE_CHILD_LIFE_SECONDS,
        dpd_delay=SITE_DPD_DELAY_SECONDS,
        replay_window=AWS_REPLAY_WINDOW_SIZE,
    )


def render_charon(view: SiteVpnView) -> str:
    """strongswan.conf snippet (/etc/strongswan.d/dlinfra.conf): retransmission timing and route installation."""
    give_up = ike_give_up_seconds(CHARON_RETRANSMIT_TIMEOUT_SECONDS, CHARON_RETRANSMIT_BASE, CHARON_RETRANSMIT_TRIES)
    return render_template(
        "strongswan-dlinfra.conf.j2",
        site=view.site,
        route_based=view.route_based,
        timeout=CHARON_RETRANSMIT_TIMEOUT_SECONDS,
        base=CHARON_RETRANSMIT_BASE,
        tries=CHARON_RETRANSMIT_TRIES,
        give_up=round(give_up, 1),
    )
