"""The failover budget from the rendered files: within 30 s, and read from the files, not the constants."""

from __future__ import annotations

from typing import Any

import pytest

from dlinfra.render import failover, frr, strongswan
from tests.render.vpn_views import bgp_view, policy_view, view


@pytest.mark.parametrize("make", [view, bgp_view, policy_view])
def test_worst_case_failover_from_the_rendered_files_is_within_30_seconds(make: Any) -> None:
    v = make()
    budget = failover.failover_budget(strongswan.render_charon(v), strongswan.render_swanctl(v), frr.render_frr(v))
    # AWS's endpoint falls silent just after its last packet: charon probes dpd_delay (10 s) later, up to 1 s
    # late (its clock has whole seconds), and gives up on the probe 2 x (1 + 1.4 + 1.4^2 + 1.4^3) = 14.2 s
    # after that; dpd_action = restart takes the tunnel down (updown: its interface down, so its routes go).
    # BGP's 30 s hold timer is the backstop.
    assert budget.dpd_delay == 10.0
    assert budget.ike_give_up == pytest.approx(14.208)
    assert budget.bgp_hold == (30.0 if v.routing == "bgp" else None)
    assert budget.seconds == pytest.approx(25.208)
    assert budget.seconds <= 30


def test_failover_budget_reads_the_files_not_the_constants() -> None:
    v = view()
    slow = strongswan.render_charon(v).replace("retransmit_tries = 3", "retransmit_tries = 5")
    assert failover.failover_budget(slow, strongswan.render_swanctl(v), None).seconds > 30
    with pytest.raises(ValueError, match="dpd_action must be restart"):
        failover.failover_budget(
            strongswan.render_charon(v), strongswan.render_swanctl(v).replace("= restart", "= clear"), None
        )
    with pytest.raises(ValueError, match="expected one value of retransmit_timeout"):
        failover.failover_budget("charon {\n}\n", strongswan.render_swanctl(v), None)
