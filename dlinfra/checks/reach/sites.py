"""Each site's gateway as `dlinfra site render` writes it, and what Cilium on its hybrid nodes announces to it:
the part of the network model no AWS resource holds (docs/reachability.md, "site gateway")."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dlinfra.checks.reach.from_plans import SITE_LABEL, VPN, _net
from dlinfra.checks.reach.topology import Net, SiteSide
from dlinfra.model import sites as site_plan
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.planner import Plan as AddressPlan
from dlinfra.render.frr import render_frr
from dlinfra.render.site_vpn import LINK_LOCAL, SiteVpnView, Tunnel
from dlinfra.render.strongswan import render_swanctl

# A placeholder key for rendering: the announcements and selectors do not depend on it.
_RENDER_KEY = "reachabilityModelKey"


def site_sides(fleet: Fleet, plan: AddressPlan, plans: Sequence[Mapping[str, Any]]) -> list[SiteSide]:
    """Each site's gateway as `dlinfra site render` writes it (what its frr.conf announces to AWS, what its
    swanctl.conf or routes carry), and what Cilium on its hybrid nodes announces to it."""
    out = []
    by_stack = {p["stack"]: p for p in plans}
    for name, site in sorted(fleet.sites.items()):
        lan, pods = site_plan.site_lan(plan, name), site_plan.site_pods(plan, name)
        remote = tuple(site_plan.site_remote_cidrs(fleet, plan, name))
        regional = by_stack.get(f"{site.environment}-{site.region}")
        k8s = by_stack.get(f"{site.environment}-{site.region}-k8s")
        view = _site_view(fleet, name, lan, pods, remote, regional)
        announce: tuple[Net, ...] = (lan, pods)
        local: tuple[Net, ...] = (lan, pods)
        accepted: tuple[Net, ...] = remote
        node_prefixes: list[tuple[Net, int]] = [(pods, 32)]
        if view is not None:
            announce, local, accepted, node_prefixes = _rendered(view)
        pod_networks, announced = _cilium(k8s, name, lan, site.asn) if k8s else ((), [])
        pod_routes = tuple(
            (block, how)
            for block, mask, how in announced
            if any(block.subnet_of(net) and mask >= ge for net, ge in node_prefixes)
        )
        out.append(
            SiteSide(
                name=name,
                environment=site.environment,
                region=site.region,
                lan=lan,
                pods=pods,
                announce=announce,
                local_selectors=local,
                remote_selectors=accepted,
                pod_routes=pod_routes,
                pod_networks=pod_networks or (pods,),
            )
        )
    return out


def _site_view(
    fleet: Fleet,
    name: str,
    lan: Net,
    pods: Net,
    remote: tuple[Net, ...],
    regional: Mapping[str, Any] | None,
) -> SiteVpnView | None:
    """The render helper's view of a site, from its VPN connection in the plan (the stack's `site_vpns` output
    is secret in plan exports)."""
    if regional is None:
        return None
    vpn = next(
        (
            r
            for r in regional["resources"]
            if r["type"] == VPN and (r["inputs"].get("tags") or {}).get("dlinfra:site") == name
        ),
        None,
    )
    if vpn is None:
        return None
    spec = fleet.sites[name]
    i, o = vpn["inputs"], vpn["outputs"]
    try:
        tunnels = tuple(
            Tunnel(
                number=n,
                outside_ip=str(o.get(f"tunnel{n}Address") or f"192.0.2.{n}"),
                inside_cidr=str(i.get(f"tunnel{n}InsideCidr") or f"169.254.{n * 10}.0/30"),
                preshared_key=_RENDER_KEY,
            )
            for n in (1, 2)
        )
        return SiteVpnView(
            site=name,
            local_public_ip=str(spec.public_ip),
            lan_cidr=str(lan),
            remote_cidrs=tuple(str(c) for c in remote),
            tunnels=tunnels,  # type: ignore[arg-type]  # two
            routing=spec.routing,
            local_asn=spec.asn,
            remote_asn=int(float(o.get("tunnel1BgpAsn") or 64512)),
            pod_cidrs=(str(pods),),
            tunnel_mode=spec.tunnel_mode,
        )
    except ValueError:
        return None


def _rendered(view: SiteVpnView) -> tuple[tuple[Net, ...], tuple[Net, ...], tuple[Net, ...], list[tuple[Net, int]]]:
    """From the gateway's rendered files: what it announces to AWS, the site-side and AWS-side networks its
    tunnels carry, and the pod blocks it accepts from its nodes (network, shortest prefix length)."""
    frr = render_frr(view) or ""
    # What BGP announces to AWS: the `network` statements, through the outbound filter DLINFRA-SITE when it has one.
    networks = [n for n in (_net(m) for m in re.findall(r"^  network (\S+)$", frr, re.M)) if n]
    allowed_out = [
        n for n in (_net(m) for m in re.findall(r"^ip prefix-list DLINFRA-SITE seq \d+ permit (\S+)$", frr, re.M)) if n
    ]
    announce = tuple(n for n in networks if not allowed_out or n in allowed_out)
    nodes = [
        (n, int(ge))
        for prefix, ge in re.findall(r"^ip prefix-list DLINFRA-NODES seq \d+ permit (\S+) ge (\d+)$", frr, re.M)
        if (n := _net(prefix))
    ]
    if view.route_based:
        # Route-based tunnels carry whatever is routed into them: the gateway's static routes or the networks it
        # accepts from AWS's BGP; AWS routes to the site what the gateway announces (or the static VPN routes).
        toward_aws = re.findall(r"^ip route (\S+) (?!blackhole)\S+$", frr, re.M) + re.findall(
            r"^ip prefix-list DLINFRA-AWS seq \d+ permit (\S+)$", frr, re.M
        )
        remote = tuple(n for n in (_net(m) for m in toward_aws) if n)
        local = (ipaddress.IPv4Network(view.lan_cidr), *(ipaddress.IPv4Network(p) for p in view.pod_cidrs))
        return announce, local, remote, nodes
    swanctl = render_swanctl(view)
    local_ts = _selectors(re.findall(r"local_ts\s*=\s*(.+)$", swanctl, re.M))
    remote_ts = _selectors(re.findall(r"remote_ts\s*=\s*(.+)$", swanctl, re.M))
    return announce, local_ts, remote_ts, nodes


def _selectors(lines: Sequence[str]) -> tuple[Net, ...]:
    """The networks of swanctl traffic selectors (every tunnel's), without the BGP inside /32s."""
    nets = {n for line in lines for n in (_net(part.strip()) for part in line.split(",")) if n}
    return tuple(sorted(n for n in nets if not n.subnet_of(LINK_LOCAL)))


def _cilium(
    plan: Mapping[str, Any], site: str, lan: Net, asn: int
) -> tuple[tuple[Net, ...], list[tuple[Net, int, str]]]:
    """Where the site's hybrid pods take addresses (the pod IP pools its nodes default to), and the pool blocks
    Cilium's BGP control plane announces to a peer on the site's LAN (block, mask size, how). The gateway peers
    with its nodes over iBGP in the site's ASN (frr.conf's HYBRID-NODES), so a session in another ASN never comes
    up and announces nothing."""
    objects = [r for r in plan["resources"] if str(r["inputs"].get("apiVersion", "")).startswith("cilium.io/")]

    def kind(k: str) -> list[Mapping[str, Any]]:
        return [r["inputs"] for r in objects if r["inputs"].get("kind") == k]

    def name_of(body: Mapping[str, Any]) -> str:
        return str((body.get("metadata") or {}).get("name", ""))

    def labels(body: Mapping[str, Any]) -> Mapping[str, str]:
        return (body.get("metadata") or {}).get("labels") or {}

    pools = {name_of(b): b for b in kind("CiliumPodIPPool")}
    used = {
        str(((b.get("spec") or {}).get("defaults") or {}).get("ipam-default-ip-pool") or "")
        for b in kind("CiliumNodeConfig")
        if _selects_site((b.get("spec") or {}).get("nodeSelector") or {}, site)
    }
    networks = tuple(n for p in sorted(used) if p in pools for n in (_net(c) for c in _pool_cidrs(pools[p])) if n)
    announced: list[tuple[Net, int, str]] = []
    peer_configs = {name_of(b): b for b in kind("CiliumBGPPeerConfig")}
    adverts = kind("CiliumBGPAdvertisement")
    for cluster in kind("CiliumBGPClusterConfig"):
        spec = cluster.get("spec") or {}
        if not _selects_site(spec.get("nodeSelector") or {}, site):
            continue
        for instance in spec.get("bgpInstances") or []:
            if _asn(instance.get("localASN")) != asn:
                continue
            for peer in instance.get("peers") or []:
                address = _address(peer.get("peerAddress"))
                config = peer_configs.get(str((peer.get("peerConfigRef") or {}).get("name", "")))
                if address is None or address not in lan or config is None or _asn(peer.get("peerASN")) != asn:
                    continue
                for family in (config.get("spec") or {}).get("families") or []:
                    if family.get("afi") != "ipv4":
                        continue
                    for advert in adverts:
                        if not _matches(family.get("advertisements") or {}, labels(advert)):
                            continue
                        for item in (advert.get("spec") or {}).get("advertisements") or []:
                            if item.get("advertisementType") != "CiliumPodIPPool":
                                continue
                            for pool_name, pool in sorted(pools.items()):
                                if not _matches(item.get("selector") or {}, labels(pool)):
                                    continue
                                mask = int(float(((pool.get("spec") or {}).get("ipv4") or {}).get("maskSize", 32)))
                                how = f"Cilium BGP {name_of(cluster)} (peer {address}), pool {pool_name}"
                                announced += [(n, mask, how) for n in (_net(c) for c in _pool_cidrs(pool)) if n]
    return networks, announced


def _asn(value: Any) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _pool_cidrs(pool: Mapping[str, Any]) -> list[str]:
    return [str(c) for c in (((pool.get("spec") or {}).get("ipv4") or {}).get("cidrs") or [])]


def _address(value: Any) -> ipaddress.IPv4Address | None:
    try:
        return ipaddress.IPv4Address(str(value or "").split("/")[0])
    except ValueError:
        return None


def _matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values):
            return False
        if (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


def _selects_site(selector: Mapping[str, Any], site: str) -> bool:
    return bool(selector) and _matches(selector, {SITE_LABEL: site})
