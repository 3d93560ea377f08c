"""The AWS side of a site's VPN for the vpn_peer tests, written by hand from AWS's documentation.

Only addresses, pre-shared keys, ASNs and the tunnel number are filled in: the AWS side must not share
dlinfra's renderer constants, or a wrong constant would be wrong on both ends and the test would pass.
"""

from __future__ import annotations

import ipaddress
import string
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).parent
# charon's updown hook for the AWS side (executable): a tunnel's interface follows its CHILD_SA.
UPDOWN = HERE / "updown"


def _fill(name: str, **values: str) -> str:
    # substitute, not safe_substitute: a placeholder left unfilled is a test bug, not a config value.
    return string.Template((HERE / name).read_text()).substitute(values)


def strongswan_conf() -> str:
    """charon settings (retransmission) that give AWS's 30 s DPD timeout."""
    return (HERE / "strongswan.conf").read_text()


def updown_script() -> str:
    """The updown hook's text, for a lab that installs it elsewhere (the XFRM guest's share)."""
    return UPDOWN.read_text()


def swanctl_conf(*, number: int, aws_outside: str, site_outside: str, psk: str, updown: Path = UPDOWN) -> str:
    """swanctl.conf for AWS's endpoint of tunnel `number` (1 or 2); `updown`: where its updown hook is."""
    for value in (aws_outside, site_outside):
        ipaddress.IPv4Address(value)
    return _fill(
        "swanctl.conf",
        number=str(number),
        aws_outside=aws_outside,
        site_outside=site_outside,
        psk=psk,
        updown=str(updown),
    )


def frr_conf(*, aws_asn: int, site_asn: int, inside_cidrs: Sequence[str], networks: Sequence[str]) -> str:
    """frr.conf for the transit gateway's BGP over both tunnels' inside /30s, announcing `networks`."""
    first, second = (ipaddress.IPv4Network(c) for c in inside_cidrs)
    return _fill(
        "frr.conf",
        aws_asn=str(aws_asn),
        site_asn=str(site_asn),
        aws_inside_1=str(first[1]),
        site_inside_1=str(first[2]),
        site_inside_2=str(second[2]),
        networks="\n".join(f"  network {ipaddress.IPv4Network(n)}" for n in networks),
    )
