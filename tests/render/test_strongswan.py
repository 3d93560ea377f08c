"""strongSwan's files: traffic selectors, connection names, keys only in the secrets section, timers, retransmission."""

from __future__ import annotations

from typing import Any

import pytest

from dlinfra.render import aws_tunnel, frr, kernel, strongswan
from tests.render.vpn_views import PSK1, PSK2, bgp_view, policy_view, view


def test_route_based_tunnels_carry_everything_routed_into_their_interface() -> None:
    for text in (strongswan.render_swanctl(view()), strongswan.render_swanctl(bgp_view())):
        # AWS's route-based VPN: 0.0.0.0/0 both ways, one CHILD_SA per tunnel, each bound to its own if_id.
        assert text.count("local_ts = 0.0.0.0/0\n") == 2 and text.count("remote_ts = 0.0.0.0/0\n") == 2
        assert text.count("children {") == 2
        for n in (1, 2):
            assert f"if_id_in = {n}\n                if_id_out = {n}\n" in text
        assert text.count(f"updown = {kernel.XFRM_SCRIPT} updown\n") == 2
    assert "install_routes = no\n" in strongswan.render_charon(view())


def test_policy_static_selectors_are_lan_to_remote_only() -> None:
    text = strongswan.render_swanctl(policy_view())
    assert text.count("local_ts = 10.200.0.0/20\n") == 2
    assert text.count("remote_ts = 10.0.0.0/16,10.1.0.0/16,10.201.0.0/20\n") == 2
    assert not [line for line in text.splitlines() if "_ts =" in line and "169.254." in line]
    assert "if_id" not in text and "updown" not in text
    assert "install_routes = yes\n" in strongswan.render_charon(policy_view())


def test_policy_bgp_selectors_add_each_tunnels_inside_pair() -> None:
    text = strongswan.render_swanctl(policy_view(routing="bgp", pod_cidrs=("10.202.0.0/18",)))
    assert "local_ts = 10.200.0.0/20,10.202.0.0/18,169.254.10.2/32\n" in text
    assert "remote_ts = 10.0.0.0/16,10.1.0.0/16,10.201.0.0/20,169.254.10.1/32\n" in text
    assert "local_ts = 10.200.0.0/20,10.202.0.0/18,169.254.10.6/32\n" in text
    assert "remote_ts = 10.0.0.0/16,10.1.0.0/16,10.201.0.0/20,169.254.10.5/32\n" in text


def test_connection_name_prefixes_every_tunnel() -> None:
    text = strongswan.render_swanctl(view(connection_name="aws-usw2"))
    assert "    aws-usw2-tunnel1 {" in text and "    ike-aws-usw2-tunnel2 {" in text


def _secrets_section(text: str) -> str:
    return text[text.index("\nsecrets {") :]


@pytest.mark.parametrize("make", [view, bgp_view])
def test_keys_appear_only_in_the_secrets_section(make: Any) -> None:
    text = strongswan.render_swanctl(make())
    for psk in (PSK1, PSK2):
        assert text.count(psk) == 1
        assert f'secret = "{psk}"' in _secrets_section(text)
    assert PSK1 not in (frr.render_frr(make()) or "")


def _earliest_aws_rekey(lifetime: int) -> float:
    return lifetime - aws_tunnel.AWS_REKEY_MARGIN_TIME_SECONDS * (1 + aws_tunnel.AWS_REKEY_FUZZ_PERCENTAGE / 100)


def test_site_rekeys_before_aws_and_expires_within_aws_lifetimes() -> None:
    ike_hard_lifetime = strongswan.SITE_IKE_REKEY_SECONDS + strongswan.SITE_IKE_OVER_SECONDS
    assert ike_hard_lifetime < _earliest_aws_rekey(aws_tunnel.AWS_PHASE1_LIFETIME_SECONDS)
    assert strongswan.SITE_CHILD_REKEY_SECONDS < strongswan.SITE_CHILD_LIFE_SECONDS
    child_hard_lifetime = strongswan.SITE_CHILD_LIFE_SECONDS
    assert child_hard_lifetime < _earliest_aws_rekey(aws_tunnel.AWS_PHASE2_LIFETIME_SECONDS)
    assert strongswan.SITE_DPD_DELAY_SECONDS < aws_tunnel.AWS_DPD_TIMEOUT_SECONDS


def test_strongswans_default_schedule_gives_up_after_165_seconds() -> None:
    # strongSwan docs ("Retransmission"): with 4 s, 1.8 and 5 tries the retransmissions go out after
    # 4, 7.2, 13, 23.3 and 42 s, and charon gives up 75.6 s after the last: 165 s in all, the 170 s failover
    # the issue measured.
    assert strongswan.ike_give_up_seconds(4.0, 1.8, 5) == pytest.approx(165.0, abs=0.1)
