"""The site VPN view's input checks: keys, tunnels, CIDRs, ASNs and proposals, each refused naming its field."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlinfra.render import aws_tunnel
from tests.render.vpn_views import PSK1, PSK2, bgp_view, tunnel, view


def test_repr_hides_keys() -> None:
    for obj in (tunnel(1), view(), bgp_view()):
        assert PSK1 not in repr(obj) and PSK2 not in repr(obj) and "golden.psk" not in str(obj)


@pytest.mark.parametrize(
    "psk",
    [
        "short.1",  # 7 characters
        "x" * 65,
        "has-dash-in-it",
        "has space in it",
        'quote"inside',
        "0starts.with.zero",
        "newline\ninside",
    ],
)
def test_bad_key_is_rejected_without_echoing_it(psk: str) -> None:
    with pytest.raises(ValueError, match="preshared_key") as err:
        tunnel(1, preshared_key=psk)
    assert psk not in str(err.value)
    assert "value not shown" in str(err.value)


@pytest.mark.parametrize("psk", ["abcdefgh", "x" * 64, ".dot.first", "_under_first", "A1b2C3d4.E_"])
def test_keys_aws_accepts_are_accepted(psk: str) -> None:
    assert tunnel(1, preshared_key=psk).preshared_key == psk


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"number": 3}, "number"),
        ({"number": 0}, "number"),
        ({"number": True}, "number"),
        ({"outside_ip": 3325256715}, "outside_ip"),
        ({"inside_cidr": 42}, "inside_cidr"),
        ({"outside_ip": "198.51.100"}, "outside_ip"),
        ({"outside_ip": "2001:db8::1"}, "outside_ip"),
        ({"inside_cidr": "169.254.10.0/29"}, "inside_cidr"),
        ({"inside_cidr": "169.254.10.0/31"}, "inside_cidr"),
        ({"inside_cidr": "10.0.0.0/30"}, "inside_cidr"),
        ({"inside_cidr": "169.254.10.1/30"}, "inside_cidr"),
        ({"inside_cidr": "not-a-cidr"}, "inside_cidr"),
        ({"inside_cidr": "169.254.0.0/30"}, "inside_cidr"),
        ({"inside_cidr": "169.254.1.0/30"}, "inside_cidr"),
        ({"inside_cidr": "169.254.2.0/30"}, "inside_cidr"),
        ({"inside_cidr": "169.254.3.0/30"}, "inside_cidr"),
        ({"inside_cidr": "169.254.4.0/30"}, "inside_cidr"),
        ({"inside_cidr": "169.254.5.0/30"}, "inside_cidr"),
        ({"inside_cidr": "169.254.169.252/30"}, "inside_cidr"),
    ],
)
def test_bad_tunnel_is_rejected_naming_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        tunnel(**overrides)


def test_reserved_block_message_says_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"reserved by AWS; choose another /30"):
        tunnel(1, inside_cidr="169.254.169.252/30")


def test_host_bits_message_suggests_the_network() -> None:
    with pytest.raises(ValueError, match=r"did you mean 169\.254\.10\.0/30"):
        tunnel(1, inside_cidr="169.254.10.1/30")


RESERVED = {ipaddress.IPv4Network(n) for n in aws_tunnel.AWS_RESERVED_INSIDE_CIDRS}


@given(st.integers(min_value=0, max_value=2**14 - 1))
def test_every_unreserved_link_local_slash30_is_accepted(index: int) -> None:
    net = ipaddress.IPv4Network("169.254.0.0/16").network_address + 4 * index
    cidr = ipaddress.IPv4Network(f"{net}/30")
    if cidr in RESERVED:
        with pytest.raises(ValueError, match="reserved by AWS"):
            tunnel(1, inside_cidr=str(cidr))
    else:
        t = tunnel(1, inside_cidr=str(cidr))
        assert t.aws_inside_ip == str(cidr[1]) and t.site_inside_ip == str(cidr[2])


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"site": "SJC 1"}, "site"),
        ({"site": "sjc1\n}"}, "site"),
        ({"site": ""}, "site"),
        ({"connection_name": "aws tunnel"}, "connection_name"),
        ({"local_public_ip": "203.0.113"}, "local_public_ip"),
        ({"local_public_ip": "169.254.1.1"}, "local_public_ip"),
        ({"local_public_ip": "127.0.0.1"}, "local_public_ip"),
        ({"local_public_ip": "198.51.100.11"}, "local_public_ip"),
        ({"lan_cidr": "10.200.0.1/20"}, "lan_cidr"),
        ({"lan_cidr": "10.200.0.0/33"}, "lan_cidr"),
        ({"remote_cidrs": ()}, "remote_cidrs"),
        ({"remote_cidrs": "10.0.0.0/16"}, "remote_cidrs"),
        ({"remote_cidrs": ("10.0.0.0/16", "10.0.128.0/17")}, "remote_cidrs"),
        ({"remote_cidrs": ("10.200.0.0/16",)}, "remote_cidrs"),
        ({"remote_cidrs": ("10.0.0.1/16",)}, r"remote_cidrs\[0\]"),
        ({"remote_cidrs": ("169.254.0.0/16",)}, "169.254.0.0/16"),
        ({"pod_cidrs": ("10.200.8.0/21",)}, "pod_cidrs"),
        ({"pod_cidrs": ("10.0.64.0/18",)}, "remote_cidrs"),
        ({"tunnels": (tunnel(1),)}, "tunnels"),
        ({"tunnels": (tunnel(2), tunnel(1))}, "tunnels"),
        ({"tunnels": (tunnel(1), tunnel(2, outside_ip="198.51.100.11"))}, "tunnels"),
        ({"tunnels": (tunnel(1), tunnel(2, inside_cidr="169.254.10.0/30"))}, "tunnels"),
        ({"routing": "ospf"}, "routing"),
        ({"routing": "BGP"}, "routing"),
        ({"local_asn": 0}, "local_asn"),
        ({"local_asn": 23456}, "local_asn"),
        ({"local_asn": 2**32}, "local_asn"),
        ({"local_asn": True}, "local_asn"),
        ({"remote_asn": -1}, "remote_asn"),
        ({"local_asn": 64512}, "local_asn"),
        ({"ike_proposals": ()}, "ike_proposals"),
        ({"ike_proposals": ("aes128-sha256-ecp256",)}, "ike_proposals"),
        ({"ike_proposals": ("aes256-sha1-ecp384",)}, "ike_proposals"),
        ({"ike_proposals": ("aes256-sha256-modp1024",)}, "ike_proposals"),
        ({"ike_proposals": ("aes256-sha256",)}, "ike_proposals"),
        ({"ike_proposals": ("aes256gcm16-ecp384",)}, "ike_proposals"),
        ({"ike_proposals": ("aes256gcm16-aes256-prfsha384-sha384-ecp384",)}, "ike_proposals"),
        ({"ike_proposals": ("aes256gcm16-sha384-prfsha384-ecp384",)}, "ike_proposals"),
        ({"ike_proposals": ("aes256-sha256-ecp256\n}",)}, "ike_proposals"),
        ({"esp_proposals": ("aes256gcm16",)}, "esp_proposals"),
        ({"esp_proposals": ("aes256-ecp384",)}, "esp_proposals"),
        ({"esp_proposals": ("aes256gcm16-prfsha384-ecp384",)}, "esp_proposals"),
        ({"esp_proposals": ("aes128gcm16-ecp384",)}, "esp_proposals"),
    ],
)
def test_bad_view_is_rejected_naming_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        view(**overrides)


@pytest.mark.parametrize(
    "proposals",
    [("aes256gcm16-prfsha256-ecp256",), ("aes256-sha256-ecp521",), ("aes256-sha384-prfsha384-ecp384",)],
)
def test_narrower_ike_proposals_within_the_aws_set_are_accepted(proposals: tuple[str, ...]) -> None:
    assert view(ike_proposals=proposals).ike_proposals == proposals


def test_view_is_hashable_and_frozen() -> None:
    v = view()
    assert hash(v) == hash(view())
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.routing = "bgp"  # type: ignore[misc]


def test_unknown_tunnel_mode_is_refused() -> None:
    with pytest.raises(ValueError, match=r"SiteVpnView\.tunnel_mode: must be 'route' or 'policy', got 'vti'"):
        view(tunnel_mode="vti")


def test_pod_cidr_smaller_than_a_node_block_is_refused() -> None:
    with pytest.raises(ValueError, match=r"pod_cidrs\[0\]: 10.202.0.0/26 is smaller than one node's /25"):
        view(routing="bgp", pod_cidrs=("10.202.0.0/26",))
