"""A site gateway's failover figures, read back from its rendered files (so a test checks what a gateway runs),
with AWS's side of the same tunnels (the options dlinfra sets on it, dlinfra.render.aws_tunnel)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from dlinfra.render.aws_tunnel import AWS_DPD_IDLE_SECONDS, AWS_DPD_TIMEOUT_ACTION, AWS_DPD_TIMEOUT_SECONDS
from dlinfra.render.strongswan import ike_give_up_seconds


@dataclass(frozen=True, kw_only=True)
class FailoverBudget:
    """Worst cases from an AWS endpoint going silent to traffic going around its tunnel, each way, in seconds."""

    dpd_delay: float  # silence before charon sends the first DPD probe (swanctl dpd_delay)
    ike_give_up: float  # from that probe to charon declaring the peer dead (charon.retransmit_*)
    bgp_hold: float | None  # BGP sites: the hold timer (both ends: BGP uses the smaller of the two); None: static
    aws_dpd_idle: float = AWS_DPD_IDLE_SECONDS  # silence before AWS's first keep-alive (not published; ~10 s)
    aws_dpd_timeout: float = AWS_DPD_TIMEOUT_SECONDS  # AWS declares the site dead this long after that keep-alive
    # charon keeps an SA's last-inbound time in whole seconds (time_monotonic), so a probe can go out up to 1 s
    # after dpd_delay has really passed.
    clock_granularity: float = 1.0

    @property
    def routing(self) -> str:
        return "static" if self.bgp_hold is None else "bgp"

    @property
    def site(self) -> float:
        """Until the gateway sends over the other tunnel."""
        # The DPD path fires dpd_action (restart): updown takes the tunnel's interface down, and the routes
        # through it (FRR static nexthops, or the BGP session by fast external failover) go at once. A BGP
        # site also loses the session when the hold timer runs out, whichever comes first.
        dpd = self.dpd_delay + self.clock_granularity + self.ike_give_up
        return dpd if self.bgp_hold is None else min(dpd, self.bgp_hold)

    @property
    def aws(self) -> float:
        """Until AWS sends its return traffic over the other tunnel (by DPD an estimate: AWS does not publish when
        it sends its first keep-alive; by BGP a bound)."""
        # AWS's DPD (timeout action clear) takes the tunnel and its routes down; that is all a static VPN has.
        # With BGP, AWS also withdraws the site's routes from the tunnel when its hold timer runs out, which
        # runs from the last keepalive it got, so at most the hold time into the silence.
        dpd = self.aws_dpd_idle + self.aws_dpd_timeout
        return dpd if self.bgp_hold is None else min(dpd, self.bgp_hold)

    @property
    def end_to_end(self) -> float:
        """Until a flow whose two directions both crossed the silent tunnel works again."""
        return max(self.site, self.aws)


def _setting(text: str, key: str, what: str) -> str:
    values = set(re.findall(rf"^\s*{re.escape(key)}\s*=\s*(\S+)\s*$", text, flags=re.MULTILINE))
    if len(values) != 1:
        raise ValueError(f"{what}: expected one value of {key}, found {sorted(values) or 'none'}")
    return str(values.pop())


def failover_budget(
    charon_conf: str,
    swanctl_conf: str,
    frr_conf: str | None,
    *,
    aws_dpd_timeout: float = AWS_DPD_TIMEOUT_SECONDS,
    aws_dpd_action: str = AWS_DPD_TIMEOUT_ACTION,
) -> FailoverBudget:
    """The failover figures the rendered strongswan.conf snippet, swanctl.conf and frr.conf give, with AWS's DPD
    timeout and action (by default what dlinfra sets on AWS's side)."""
    timeout = float(_setting(charon_conf, "retransmit_timeout", "strongswan.conf"))
    base = float(_setting(charon_conf, "retransmit_base", "strongswan.conf"))
    tries = int(_setting(charon_conf, "retransmit_tries", "strongswan.conf"))
    dpd = _setting(swanctl_conf, "dpd_delay", "swanctl.conf")
    if _setting(swanctl_conf, "dpd_action", "swanctl.conf") != "restart":
        raise ValueError("swanctl.conf: dpd_action must be restart, or a dead tunnel stays down")
    hold = None
    if frr_conf and (timers := re.findall(r"^ neighbor 169\.254\.\S+ timers (\d+) (\d+)$", frr_conf, re.MULTILINE)):
        hold = float(max(int(h) for _, h in timers))
    if aws_dpd_action == "none":
        # "Site-to-Site VPN tunnel initiation options": with action none AWS keeps a dead tunnel and its routes.
        if hold is None:
            raise ValueError("AWS's DPD timeout action none: a static site's traffic would never leave a dead tunnel")
        aws_dpd_timeout = math.inf
    return FailoverBudget(
        dpd_delay=float(dpd.removesuffix("s")),
        ike_give_up=ike_give_up_seconds(timeout, base, tries),
        bgp_hold=hold,
        aws_dpd_timeout=aws_dpd_timeout,
    )
