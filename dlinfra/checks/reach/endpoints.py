"""The ends of a flow: a place's subnets, a site's LAN or hybrid pods, a laptop on each VPN group, the internet.

Each end holds every address it may have: a place's whole subnet (less the five addresses AWS keeps), a site's
whole LAN or pod pools, a Client VPN's whole client range, any public address for the internet. The source
ports it opens connections from follow its operating system (VPC user guide, "Ephemeral ports").
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Literal

from dlinfra.checks.reach.engine import (
    ANY_CLIENT_PORT,
    ANY_PORT,
    LINUX_EPHEMERAL,
    AtSite,
    Endpoint,
    InVpc,
    OnClientVpn,
    OnInternet,
    PortRange,
)
from dlinfra.checks.reach.topology import Place, SiteSide, Topology
from dlinfra.model.fleet.schema import Fleet

INTERNET = Endpoint("a host on the internet", ipaddress.IPv4Network("0.0.0.0/0"), OnInternet(), ANY_PORT)

# The source ports each kind of place opens connections from: nodes, pods and the CI runner run Linux (the
# kernel's 32768-60999); what AWS runs for us (the control plane, file systems, endpoints) is not documented,
# so any unprivileged port.
_EPHEMERAL: dict[str, tuple[PortRange, ...]] = {
    "pool": LINUX_EPHEMERAL,
    "ci-runner": LINUX_EPHEMERAL,
    "dev-box": LINUX_EPHEMERAL,
}
# Pods' traffic to outside the VPC leaves with its node's address and a port the VPC CNI's SNAT picks at random
# from 1024-65535 (amazon-vpc-cni-k8s defaults: AWS_VPC_K8S_CNI_EXTERNALSNAT false, RANDOMIZESNAT prng); the
# fleet sets neither.
_LEAVING: dict[str, tuple[PortRange, ...]] = {"pool": ANY_CLIENT_PORT}


def place_endpoints(topo: Topology, place: Place) -> tuple[Endpoint, ...]:
    """One endpoint per subnet of a place, with every address of the subnet (or the place's own address in it)."""
    out = []
    vpc = topo.vpcs.get(place.vpc_id)
    for subnet_id in place.subnet_ids:
        subnet = topo.subnets.get(subnet_id)
        if subnet is None:
            continue
        public = subnet.public_ip_on_launch if place.public_ip is None else place.public_ip
        addresses = place.address if place.address is not None and place.address.subnet_of(subnet.cidr) else subnet.cidr
        # An instance's own address is no one else's: the subnet's other places never have it.
        taken = tuple(
            sorted(p.address for p in topo.places if p.address is not None and p.address.subnet_of(addresses))
            if addresses == subnet.cidr
            else ()
        )
        label = f"{place.kind} {place.name} ({place.environment}-{place.region}, {subnet.az}, {addresses})"
        scope = None
        if place.remote_networks is not None:
            scope = (*(vpc.cidrs if vpc else ()), *place.remote_networks)
        out.append(
            Endpoint(
                label,
                addresses,
                InVpc(place.vpc_id, subnet_id, place.security_group_ids, public),
                _EPHEMERAL.get(place.kind, ANY_CLIENT_PORT),
                ephemeral_leaving=_LEAVING.get(place.kind),
                sends_only_to=scope,
                scope_origin=place.origin if scope is not None or place.public_api is not None else None,
                public_api=place.public_api,
                taken=taken,
            )
        )
    return tuple(out)


def site_endpoint(site: SiteSide, network: Literal["lan", "pods"]) -> Endpoint:
    """A site's LAN, or the pools its hybrid pods take addresses from (Linux machines either way)."""
    if network == "lan":
        return Endpoint(f"site {site.name} LAN ({site.lan})", site.lan, AtSite(site.name, "lan"))
    first, *rest = site.pod_networks
    where = ", ".join(str(n) for n in site.pod_networks)
    return Endpoint(f"site {site.name} hybrid pods ({where})", first, AtSite(site.name, "pods"), extra=tuple(rest))


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
                    f"laptop of {who} on {env}-{endpoint.region} VPN ({endpoint.client_cidr})",
                    endpoint.client_cidr,
                    OnClientVpn(endpoint.id, group),
                    ANY_CLIENT_PORT,
                ),
            )
