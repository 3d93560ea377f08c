"""Valid site VPN views for the gateway renderers' tests: the golden fixture (site sjc1) and its variants."""

from __future__ import annotations

from typing import Any

from dlinfra.render.site_vpn import SiteVpnView, Tunnel

PSK1 = "golden.psk.tunnel1"
PSK2 = "golden.psk.tunnel2"


def tunnel(number: int = 1, **overrides: Any) -> Tunnel:
    """A valid tunnel (TEST-NET-2 outside address, fake key), with fields overridden."""
    fields: dict[str, Any] = {
        "number": number,
        "outside_ip": f"198.51.100.{10 + number}",
        "inside_cidr": f"169.254.10.{4 * (number - 1)}/30",
        "preshared_key": PSK1 if number == 1 else PSK2,
    }
    return Tunnel(**(fields | overrides))


def view(**overrides: Any) -> SiteVpnView:
    """The golden fixture: site sjc1, TEST-NET-3 gateway, three remote networks, static routing."""
    fields: dict[str, Any] = {
        "site": "sjc1",
        "local_public_ip": "203.0.113.10",
        "lan_cidr": "10.200.0.0/20",
        "remote_cidrs": ("10.0.0.0/16", "10.1.0.0/16", "10.201.0.0/20"),
        "tunnels": (tunnel(1), tunnel(2)),
        "routing": "static",
        "local_asn": 65101,
        "remote_asn": 64512,
    }
    return SiteVpnView(**(fields | overrides))


def bgp_view() -> SiteVpnView:
    return view(routing="bgp", pod_cidrs=("10.202.0.0/18",))


def policy_view(**overrides: Any) -> SiteVpnView:
    return view(tunnel_mode="policy", **overrides)
