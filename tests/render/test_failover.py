"""The failover figures from the rendered files, each way and per routing: the gateway's own side within 30 s and
read from the files, not the constants; AWS's side from the options dlinfra sets on it."""

from __future__ import annotations

from typing import Any

import pytest

from dlinfra.render import aws_tunnel, failover, frr, strongswan
from tests.render.vpn_views import bgp_view, policy_view, view


@pytest.mark.parametrize("make", [view, bgp_view, policy_view])
def test_worst_case_failover_from_the_rendered_files(make: Any) -> None:
    v = make()
    budget = failover.failover_budget(strongswan.render_charon(v), strongswan.render_swanctl(v), frr.render_frr(v))
    # AWS's endpoint falls silent just after its last packet: charon probes dpd_delay (10 s) later, up to 1 s
    # late (its clock has whole seconds), and gives up on the probe 2 x (1 + 1.4 + 1.4^2 + 1.4^3) = 14.2 s
    # after that; dpd_action = restart takes the tunnel down (updown: its interface down, so its routes go).
    # BGP's 30 s hold timer is the backstop.
    assert budget.routing == v.routing
    assert budget.dpd_delay == 10.0
    assert budget.ike_give_up == pytest.approx(14.208)
    assert budget.bgp_hold == (30.0 if v.routing == "bgp" else None)
    assert budget.site == pytest.approx(25.208)
    assert budget.site <= 30


def test_a_static_site_waits_for_aws_dead_peer_detection() -> None:
    v = view()
    assert v.routing == "static"
    budget = failover.failover_budget(strongswan.render_charon(v), strongswan.render_swanctl(v), frr.render_frr(v))
    # Nothing but AWS's DPD tells a static VPN that a tunnel is gone: a keep-alive after about 10 s of silence,
    # the gateway dead a whole DPD timeout (30 s) after it ("Tunnel options": the later of AWS's two readings).
    assert (budget.aws_dpd_idle, budget.aws_dpd_timeout) == (10, aws_tunnel.AWS_DPD_TIMEOUT_SECONDS) == (10, 30)
    assert budget.aws == 40
    assert budget.end_to_end == 40


def test_a_bgp_site_has_aws_move_within_its_hold_time() -> None:
    v = bgp_view()
    budget = failover.failover_budget(strongswan.render_charon(v), strongswan.render_swanctl(v), frr.render_frr(v))
    # AWS's hold timer runs from the last keepalive it got, so it runs out at most 30 s into the silence, before
    # its DPD would (40 s).
    assert budget.aws == 30
    assert budget.end_to_end == 30


def test_failover_budget_reads_the_files_not_the_constants() -> None:
    v = view()
    slow = strongswan.render_charon(v).replace("retransmit_tries = 3", "retransmit_tries = 5")
    assert failover.failover_budget(slow, strongswan.render_swanctl(v), None).site > 30
    with pytest.raises(ValueError, match="dpd_action must be restart"):
        failover.failover_budget(
            strongswan.render_charon(v), strongswan.render_swanctl(v).replace("= restart", "= clear"), None
        )
    with pytest.raises(ValueError, match="expected one value of retransmit_timeout"):
        failover.failover_budget("charon {\n}\n", strongswan.render_swanctl(v), None)


def test_aws_side_follows_its_dpd_options() -> None:
    v, b = view(), bgp_view()
    charon, swanctl = strongswan.render_charon(v), strongswan.render_swanctl(v)
    assert failover.failover_budget(charon, swanctl, frr.render_frr(v), aws_dpd_timeout=60).aws == 70
    # With action none, AWS keeps a dead tunnel and its static routes: a static site would never fail over back.
    with pytest.raises(ValueError, match="never leave a dead tunnel"):
        failover.failover_budget(charon, swanctl, frr.render_frr(v), aws_dpd_action="none")
    # BGP still moves it, when AWS's hold timer runs out.
    bgp = failover.failover_budget(
        strongswan.render_charon(b), strongswan.render_swanctl(b), frr.render_frr(b), aws_dpd_action="none"
    )
    assert bgp.aws == 30
