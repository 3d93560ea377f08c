"""Which stacks a change to the sites touches: what each stack reads of them, compared before and after.

A stack reads the sites through the model functions its code calls, so `reads` calls the same ones:
`sites.environment_networks` (stacks/regional.py's transit and laptop-VPN routes, compute.py's internal ranges,
cluster.py's API clients; stacks/global_stack.py's peering routes), the sites homed on its region (regional.py's
VPN, cluster.py's activation and remote networks; in_cluster.py's BGP peers) and `kueue.plan` (in_cluster.py's
flavors and every team's share, which a site's GPUs move in every region of its environment).
A homed site is read whole, so this may name a stack with nothing to change (applying it is a no-op); leaving one
out is what it must not do. tests/ops/test_site_stacks.py previews a fixture before and after `site add` and
`site remove` and checks that the list is exactly the stacks whose plans changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlinfra.model import kueue, planner, sites, stackroles
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.stackroles import StackRole

# What a stack reads of the sites, named by what it declares from it (the words `site add` prints).
NETWORKS = "VPC and laptop-VPN routes"
HOMED = "site VPN, hybrid nodes"
SITE_ROUTES = "site VPN routes"
PEERS = "site BGP peers"
QUOTAS = "Kueue quotas"
PEERING = "peering routes"


@dataclass(frozen=True)
class Touched:
    """A stack to apply after a site change, and what of it the change moves."""

    role: StackRole
    why: tuple[str, ...]  # the reads that differ; empty for a stack the change creates


def reads(fleet: Fleet, plan: planner.Plan, role: StackRole) -> dict[str, object]:
    """What a stack reads of the fleet's sites, by what it declares from it."""
    env = role.environment
    if role.kind == "global":
        return {PEERING: sites.environment_networks(fleet, plan, env)}
    region = role.region
    if region is None:
        raise ValueError(f"{role.name}: a {role.kind} stack has a region")
    homed = {
        name: (spec, sites.site_lan(plan, name), sites.site_pods(plan, name))
        for name, spec in fleet.sites_of(env, region).items()
    }
    if role.kind == "regional":
        return {
            NETWORKS: sites.environment_networks(fleet, plan, env),
            HOMED: {name: (*seen, sites.tunnel_cidrs(plan, name)) for name, seen in homed.items()},
            SITE_ROUTES: {name: sites.site_remote_cidrs(fleet, plan, name) for name in homed},
        }
    quotas = kueue.plan(fleet, env, fleet.environments[env].gpu_quotas)
    return {PEERS: homed, QUOTAS: (quotas.region(region), kueue.overflow(fleet, quotas))}


def touched(before: tuple[Fleet, planner.Plan], after: tuple[Fleet, planner.Plan]) -> list[Touched]:
    """The stacks of `after` whose reads of the sites differ from `before`'s, or that are new, in apply order."""
    old_fleet, old_plan = before
    new_fleet, new_plan = after
    existing = set(stackroles.roles(old_fleet))
    out = []
    for role in stackroles.roles(new_fleet):
        if role not in existing:
            out.append(Touched(role, ()))
            continue
        old, new = reads(old_fleet, old_plan, role), reads(new_fleet, new_plan, role)
        why = tuple(part for part in new if old[part] != new[part])
        if why:
            out.append(Touched(role, why))
    return out
