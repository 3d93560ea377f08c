"""The reachability model as `dlinfra access`'s network seam: what a VPN group or a site really reaches.

Where the default answer reads authorization rules and transit routes, this one proves a flow hop by hop
(routes both ways, security groups, the site's IPsec selectors) to a representative address of each named
network of the environment: a node of the region's first pool for a VPC, a host for a site LAN, a pod for
a site's pod range. A network is listed only when that flow is allowed.
"""

from __future__ import annotations

from collections.abc import Sequence

from dlinfra.checks.reach.endpoints import place_endpoints, site_endpoint
from dlinfra.checks.reach.engine import Endpoint, OnClientVpn, evaluate
from dlinfra.checks.reach.topology import Topology
from dlinfra.model import planner
from dlinfra.model import sites as site_plan
from dlinfra.model.fleet.schema import Fleet
from dlinfra.review.access import NetworkAccess, Principal, Reach

PORT = 443  # the probe: HTTPS, which every named network serves somewhere


def model_reach(topo: Topology, fleet: Fleet, address_plan: planner.Plan) -> Reach:
    """A `Reach` that lists the networks a principal's traffic is proven to get to, and back."""

    def targets(env: str) -> list[tuple[str, str, Endpoint]]:
        out = []
        for d in site_plan.environment_networks(fleet, address_plan, env):
            if d.site is not None:
                side = topo.sites.get(d.site)
                if side is not None:
                    out.append((d.key, str(d.cidr), site_endpoint(side, "lan" if d.key.startswith("lan-") else "pods")))
                continue
            pools = sorted(
                (p for p in topo.places if p.kind == "pool" and p.environment == env and p.region == d.region),
                key=lambda p: p.name,
            )
            if pools:
                out.append((d.key, str(d.cidr), place_endpoints(topo, pools[0], 18)[0]))
        return out

    def reach(principal: Principal) -> Sequence[NetworkAccess]:
        env = principal.environment
        if env not in fleet.environments:
            return ()
        found: list[NetworkAccess] = []
        if principal.kind in ("vpn-group", "vpn-users") and principal.group:
            group = None if principal.group == "*" else principal.group
            for endpoint in sorted(topo.client_vpns.values(), key=lambda e: e.region):
                if endpoint.environment != env:
                    continue
                laptop = Endpoint("laptop", endpoint.client_cidr.network_address + 10, OnClientVpn(endpoint.id, group))
                for name, cidr, target in targets(env):
                    if evaluate(topo, laptop, target, "tcp", PORT).allowed:
                        found.append(NetworkAccess(name, cidr, f"client-vpn {endpoint.region}", True))
        elif principal.kind == "site" and principal.name in topo.sites:
            side = topo.sites[principal.name]
            source = site_endpoint(side, "lan")
            for name, cidr, target in targets(env):
                if (
                    name not in (f"lan-{side.name}", f"pods-{side.name}")
                    and evaluate(topo, source, target, "tcp", PORT).allowed
                ):
                    found.append(NetworkAccess(name, cidr, f"transit-gateway {side.region}", True))
        return found

    return reach
