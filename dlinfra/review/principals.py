"""The reachability model as `dlinfra access`'s network seam: what a VPN group or a site really reaches.

Where the default answer reads authorization rules and transit routes, this one asks the symbolic engine
(`dlinfra.checks.reach`): from every address a principal can come from (a Client VPN's whole client range, a
site's whole LAN) to every address of each named network of the environment (every node pool, the control
plane and the file systems of a VPC, a site's LAN or hybrid pods), on every TCP and UDP port. A network is
listed when some packet gets there and back; the ports it was proved open on are part of the answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from dlinfra.checks.reach.endpoints import place_endpoints, site_endpoint
from dlinfra.checks.reach.engine import ANY_PORT, Endpoint, OnClientVpn, evaluate
from dlinfra.checks.reach.topology import Topology
from dlinfra.model import planner
from dlinfra.model import sites as site_plan
from dlinfra.model.fleet.schema import Fleet
from dlinfra.review.access import NetworkAccess, Principal, Reach

PROTOCOLS = ("tcp", "udp")


def model_reach(topo: Topology, fleet: Fleet, address_plan: planner.Plan) -> Reach:
    """A `Reach` that lists the networks some packet of a principal's is proven to get to, and back."""

    def targets(env: str) -> list[tuple[str, str, tuple[Endpoint, ...]]]:
        out: list[tuple[str, str, tuple[Endpoint, ...]]] = []
        for d in site_plan.environment_networks(fleet, address_plan, env):
            if d.site is not None:
                side = topo.sites.get(d.site)
                if side is not None:
                    end = site_endpoint(side, "lan") if d.key.startswith("lan-") else site_endpoint(side, "pods")
                    out.append((d.key, str(d.cidr), (end,)))
                continue
            places = sorted(
                (p for p in topo.places if p.environment == env and p.region == d.region and p.kind != "endpoint"),
                key=lambda p: (p.kind, p.name),
            )
            out.append((d.key, str(d.cidr), tuple(e for p in places for e in place_endpoints(topo, p))))
        return out

    def reaches(source: Endpoint, ends: Sequence[Endpoint]) -> bool:
        return any(
            evaluate(topo, source, end, proto, (ANY_PORT[0],), ANY_PORT).reachable  # type: ignore[arg-type]
            for proto in PROTOCOLS
            for end in ends
        )

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
                laptop = Endpoint("laptop", endpoint.client_cidr, OnClientVpn(endpoint.id, group), ANY_PORT)
                for name, cidr, ends in targets(env):
                    if reaches(laptop, ends):
                        found.append(NetworkAccess(name, cidr, f"client-vpn {endpoint.region}", True))
        elif principal.kind == "site" and principal.name in topo.sites:
            side = topo.sites[principal.name]
            source = site_endpoint(side, "lan")
            for name, cidr, ends in targets(env):
                if name not in (f"lan-{side.name}", f"pods-{side.name}") and reaches(source, ends):
                    found.append(NetworkAccess(name, cidr, f"transit-gateway {side.region}", True))
        return found

    return reach
