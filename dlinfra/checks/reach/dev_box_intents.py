"""What the fleet's dev boxes imply for the network: each person reaches their box's SSH over their region's laptop
VPN, the box reaches its home and the Session Manager endpoints, and nothing else reaches the box (other teams'
laptops, other regions' VPNs, other ports, nodes and pods, sites, other environments, the internet).

`intents._environment_intents` hands in its `intent` and `eps` helpers, so the intents read like the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from dlinfra.checks.reach.endpoints import INTERNET, laptop_endpoints, place_endpoints, site_endpoint
from dlinfra.checks.reach.engine import Endpoint, OnClientVpn, PortRange
from dlinfra.checks.reach.topology import Topology
from dlinfra.model import dev_boxes
from dlinfra.model.fleet.schema import Fleet

SSH = 22
NFS = 2049
# Session Manager reaches an instance through these endpoints (AWS Systems Manager user guide, "Improve the security
# of EC2 instances by using VPC endpoints for Systems Manager": ssm, ssmmessages, ec2messages, HTTPS).
SSM_ENDPOINTS = ("ssm", "ssmmessages", "ec2messages")
NOT_SSH: tuple[PortRange, ...] = ((0, SSH - 1), (SSH + 1, 65535))
EVERY_PORT: tuple[PortRange, ...] = ((0, 65535),)
SOURCE = "docs/dev-boxes.md, 'Access'"

Eps = Callable[..., tuple[Endpoint, ...]]
MakeIntent = Callable[..., Iterator[Any]]


def _region_of(topo: Topology, laptop: Endpoint) -> str:
    assert isinstance(laptop.location, OnClientVpn)
    endpoint = topo.client_vpns.get(laptop.location.endpoint_id)
    return endpoint.region if endpoint else ""


def _group_of(laptop: Endpoint) -> str | None:
    assert isinstance(laptop.location, OnClientVpn)
    return laptop.location.group


def environment(fleet: Fleet, topo: Topology, env: str, intent: MakeIntent, eps: Eps) -> Iterator[Any]:
    """Every dev box intent of one environment."""
    planned = dev_boxes.plan(fleet, env)
    laptops = list(laptop_endpoints(topo, fleet, env))
    sites = [s for s in topo.sites.values() if s.environment == env]
    site_ends = tuple(site_endpoint(s, n) for s in sites for n in ("lan", "pods"))
    others = tuple(
        e
        for p in sorted(topo.places, key=lambda p: (p.environment, p.region, p.kind, p.name))
        if p.environment != env and p.kind in ("pool", "dev-box")
        for e in place_endpoints(topo, p)
    )
    for place in sorted((p for p in topo.places if p.environment == env and p.kind == "dev-box"), key=lambda p: p.name):
        box = planned.get(place.name)
        if box is None:
            continue
        stack = f"{env}-{place.region}"
        target = place_endpoints(topo, place)
        groups = set(box.vpn_groups.values())
        # Certificate sign-in carries no group (None): every listed person's laptop may reach the port; the key decides.
        own = [ep for r, ep in laptops if r == place.region and (not groups or _group_of(ep) in groups)]
        foreign = [ep for r, ep in laptops if r == place.region and groups and _group_of(ep) not in groups]
        elsewhere = [ep for r, ep in laptops if r != place.region]
        who = f"{env}/{place.name}"
        yield from intent(
            "dev-box",
            f"{who}/ssh",
            f"{place.name}'s laptop reaches their dev box's SSH over the {place.region} laptop VPN",
            stack,
            own,
            target,
            "tcp",
            (SSH,),
            "Client VPN admin guide, 'Authorization rules' and 'Security groups' (the endpoint's group in the "
            f"target's rules); {SOURCE}",
        )
        yield from intent(
            "dev-box",
            f"{who}/other-ports",
            f"laptops reach {place.name}'s dev box on no port but SSH",
            stack,
            [ep for _r, ep in laptops],
            target,
            "tcp",
            NOT_SSH,
            SOURCE,
            "deny",
        )
        for label, sources, why in (
            ("other-groups", foreign, "the box's own authorization rule names only its person's groups"),
            ("other-regions", elsewhere, "security group references do not cross a transit gateway"),
        ):
            yield from intent(
                "dev-box",
                f"{who}/{label}",
                f"laptops of {label.replace('-', ' ')} do not reach {place.name}'s dev box ({why})",
                stack,
                sources,
                target,
                "tcp",
                EVERY_PORT,
                f"Client VPN admin guide, 'Authorization rules'; VPC user guide, 'Security group rules'; {SOURCE}",
                "deny",
            )
        for proto in ("tcp", "udp"):
            suffix = "/udp" if proto == "udp" else ""
            neighbours = eps("dev-box", None, [n for n in planned if n != place.name])
            for label, strangers in _strangers(eps, neighbours, site_ends, others):
                yield from intent(
                    "dev-box",
                    f"{who}/from-{label}{suffix}",
                    f"{label.replace('-', ' ')} do not reach {place.name}'s dev box ({proto}, every port)",
                    stack,
                    strangers,
                    target,
                    proto,
                    EVERY_PORT,
                    f"{SOURCE}: only its person's laptop, and Session Manager through the agent's own connection",
                    "deny",
                )
        yield from intent(
            "dev-box",
            f"{who}/home",
            f"{place.name}'s dev box reaches the EFS mount targets (its home)",
            stack,
            target,
            eps("efs", place.region),
            "tcp",
            (NFS,),
            "EFS guide 'Using VPC security groups' (NFS 2049 to the mount targets)",
        )
        yield from intent(
            "dev-box",
            f"{who}/session-manager",
            f"{place.name}'s dev box reaches the Systems Manager endpoints (the admins' way in, no public address)",
            stack,
            target,
            eps("endpoint", place.region, SSM_ENDPOINTS),
            "tcp",
            (443,),
            "Systems Manager user guide, 'Improve the security of EC2 instances by using VPC endpoints for Systems "
            "Manager' (HTTPS to ssm, ssmmessages, ec2messages)",
        )
        yield from intent(
            "dev-box",
            f"{who}/idle-verdict",
            f"{place.name}'s dev box reaches CloudWatch's public endpoint over HTTPS (its idle check's verdict, which "
            "drives the backstop alarm)",
            stack,
            target,
            (INTERNET,),
            "tcp",
            (443,),
            "CloudWatch API (monitoring.<region>.amazonaws.com, PutMetricData over HTTPS): no interface endpoint in "
            "the VPC, so through the NAT gateway; docs/dev-boxes.md, 'Idle stop'",
        )


def _strangers(
    eps: Eps, neighbours: tuple[Endpoint, ...], site_ends: tuple[Endpoint, ...], others: tuple[Endpoint, ...]
) -> Iterable[tuple[str, tuple[Endpoint, ...]]]:
    """What must never reach a box: nodes and pods, other boxes, the CI runner, sites, other environments, the
    internet."""
    yield "nodes-and-pods", eps("pool")
    yield "other-dev-boxes", neighbours
    yield "ci-runners", eps("ci-runner")
    yield "sites", site_ends
    yield "other-environments", others
    yield "the-internet", (INTERNET,)
