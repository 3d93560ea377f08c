"""A physical site's networks in the address plan: its LAN, its hybrid pods, its tunnels' inside /30s, and what
an environment's networks route to; how far ahead its SSM activation may expire. Pure (no pulumi import)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from dlinfra.model import planner
from dlinfra.model.fleet.schema import Fleet

Net = ipaddress.IPv4Network
# AWS Systems Manager API reference, CreateActivation ExpirationDate (read 2026-11): "You can specify a date up to
# 30 days in advance. If you don't provide an expiration date, the activation code expires in 24 hours."
ACTIVATION_MAX_DAYS = 30


@dataclass(frozen=True)
class Destination:
    """A network of an environment that other networks route to, keyed by a stable fleet-derived name."""

    key: str  # vpc-<region>, lan-<site> or pods-<site>: used in logical resource names
    cidr: Net
    region: str  # where it attaches: the VPC's region, or the site's home region
    site: str | None = None  # the site it belongs to, for site networks


def site_lan(plan: planner.Plan, site: str) -> Net:
    """The site's LAN (explicit in the fleet, or allocated)."""
    return plan.cidr(f"site-lan/{site}")


def site_pods(plan: planner.Plan, site: str) -> Net:
    """The pod CIDR of the site's hybrid nodes."""
    return plan.cidr(f"hybrid-pods/{site}")


def tunnel_cidrs(plan: planner.Plan, site: str) -> tuple[Net, Net]:
    """Inside /30s of the site's VPN tunnels 1 and 2."""
    return plan.cidr(f"tunnel/{site}/1"), plan.cidr(f"tunnel/{site}/2")


def environment_networks(fleet: Fleet, plan: planner.Plan, env: str) -> list[Destination]:
    """Every VPC of an environment and every network of its sites (LAN and hybrid pods), in fleet order."""
    out = [Destination(f"vpc-{region}", plan.vpc(env, region), region) for region in fleet.environments[env].regions]
    for name, site in fleet.sites_of(env).items():
        out.append(Destination(f"lan-{name}", site_lan(plan, name), site.region, name))
        out.append(Destination(f"pods-{name}", site_pods(plan, name), site.region, name))
    return out


def site_remote_cidrs(fleet: Fleet, plan: planner.Plan, site: str) -> list[Net]:
    """What a site reaches through its tunnels: the environment's VPCs and the other sites' networks."""
    env = fleet.sites[site].environment
    return [d.cidr for d in environment_networks(fleet, plan, env) if d.site != site]


def stack_of(fleet: Fleet, site: str) -> str:
    """The regional stack that declares a site's VPN: `<environment>-<home region>`."""
    spec = fleet.sites[site]
    return f"{spec.environment}-{spec.region}"


def activation_expiry_problem(expiry: datetime.datetime, now: datetime.datetime) -> str | None:
    """What is wrong with an activation expiry for an activation created from `now` on; None when AWS takes it."""
    stamp = expiry.isoformat().replace("+00:00", "Z")
    if expiry <= now:
        return f"{stamp} has passed, so no machine could register; give one in the next {ACTIVATION_MAX_DAYS} days"
    latest = now + datetime.timedelta(days=ACTIVATION_MAX_DAYS)
    if expiry > latest:
        return (
            f"{stamp} is more than {ACTIVATION_MAX_DAYS} days ahead: AWS refuses an SSM activation that expires later "
            f"than {ACTIVATION_MAX_DAYS} days after it is created (CreateActivation ExpirationDate); give "
            f"{latest.replace(microsecond=0).isoformat().replace('+00:00', 'Z')} or earlier, and renew it later "
            "(docs/site-onboarding.md, section 9)"
        )
    return None
