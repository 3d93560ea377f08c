"""A site gateway's failover budget, read back from its rendered files (so a test checks what a gateway runs)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dlinfra.render.strongswan import ike_give_up_seconds


@dataclass(frozen=True, kw_only=True)
class FailoverBudget:
    """Worst case from an AWS endpoint going silent to the site routing around its tunnel, in seconds."""

    dpd_delay: float  # silence before charon sends the first DPD probe (swanctl dpd_delay)
    ike_give_up: float  # from that probe to charon declaring the peer dead (charon.retransmit_*)
    bgp_hold: float | None  # BGP sites: the hold timer, an independent detector of the same loss
    # charon keeps an SA's last-inbound time in whole seconds (time_monotonic), so a probe can go out up to 1 s
    # after dpd_delay has really passed.
    clock_granularity: float = 1.0

    @property
    def seconds(self) -> float:
        # The DPD path fires dpd_action (restart): updown takes the tunnel's interface down, and the routes
        # through it (FRR static nexthops, or the BGP session by fast external failover) go at once. A BGP
        # site also loses the session when the hold timer runs out, whichever comes first.
        dpd = self.dpd_delay + self.clock_granularity + self.ike_give_up
        return dpd if self.bgp_hold is None else min(dpd, self.bgp_hold)


def _setting(text: str, key: str, what: str) -> str:
    values = set(re.findall(rf"^\s*{re.escape(key)}\s*=\s*(\S+)\s*$", text, flags=re.MULTILINE))
    if len(values) != 1:
        raise ValueError(f"{what}: expected one value of {key}, found {sorted(values) or 'none'}")
    return str(values.pop())


def failover_budget(charon_conf: str, swanctl_conf: str, frr_conf: str | None) -> FailoverBudget:
    """The failover budget the rendered strongswan.conf snippet, swanctl.conf and frr.conf give."""
    timeout = float(_setting(charon_conf, "retransmit_timeout", "strongswan.conf"))
    base = float(_setting(charon_conf, "retransmit_base", "strongswan.conf"))
    tries = int(_setting(charon_conf, "retransmit_tries", "strongswan.conf"))
    dpd = _setting(swanctl_conf, "dpd_delay", "swanctl.conf")
    if _setting(swanctl_conf, "dpd_action", "swanctl.conf") != "restart":
        raise ValueError("swanctl.conf: dpd_action must be restart, or a dead tunnel stays down")
    hold = None
    if frr_conf and (timers := re.findall(r"^ neighbor 169\.254\.\S+ timers (\d+) (\d+)$", frr_conf, re.MULTILINE)):
        hold = float(max(int(h) for _, h in timers))
    return FailoverBudget(
        dpd_delay=float(dpd.removesuffix("s")), ike_give_up=ike_give_up_seconds(timeout, base, tries), bgp_hold=hold
    )
