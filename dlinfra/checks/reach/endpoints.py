"""The ends of a flow: a place's subnets, a site's LAN or hybrid pods, a laptop on each VPN group, the internet."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Literal

from dlinfra.checks.reach.engine import AtSite, Endpoint, InVpc, OnClientVpn, host
from dlinfra.checks.reach.topology import Place, SiteSide, Topology
from dlinfra.model.fleet.schema import Fleet

INTERNET_HOST = ipaddress.IPv4Address("198.51.100.7")  # TEST-NET-2: any host on the internet


def place_endpoints(topo: Topology, place: Place, offset: int = 10) -> tuple[Endpoint, ...]:
    """One endpoint per subnet of a place, at a representative address."""
    out = []
    for subnet_id in place.subnet_ids:
        subnet = topo.subnets.get(subnet_id)
        if subnet is None:
            continue
        label = f"{place.kind} {place.name} ({place.environment}-{place.region}, {subnet.az})"
        out.append(Endpoint(label, host(subnet.cidr, offset), InVpc(place.vpc_id, subnet_id, place.security_group_ids)))
    return tuple(out)


def site_endpoint(site: SiteSide, network: Literal["lan", "pods"]) -> Endpoint:
    net = site.lan if network == "lan" else site.pods
    what = "LAN host" if network == "lan" else "hybrid pod"
    return Endpoint(f"site {site.name} {what}", host(net, 10), AtSite(site.name, network))


def laptop_endpoints(topo: Topology, fleet: Fleet, env: str) -> Iterator[tuple[str, Endpoint]]:
    """(region, laptop) for every Client VPN endpoint of the environment and every group the fleet names."""
    spec = fleet.environments[env].client_vpn
    groups: list[tuple[str, str | None]] = []
    if spec is not None and spec.saml is not None:
        groups = [(f"team {t}", team.vpn_group) for t, team in sorted(fleet.teams.items()) if team.vpn_group]
        if spec.saml.admin_group:
            groups.append(("admins", spec.saml.admin_group))
    elif spec is not None:
        groups = [("certificate users", None)]
    for endpoint in sorted(topo.client_vpns.values(), key=lambda e: e.id):
        if endpoint.environment != env:
            continue
        for who, group in groups:
            yield (
                endpoint.region,
                Endpoint(
                    f"laptop of {who} on {env}-{endpoint.region} VPN",
                    host(endpoint.client_cidr, 10),
                    OnClientVpn(endpoint.id, group),
                ),
            )
