"""Flows the fleet implies, derived with no configuration, plus the user's own from a flows file.

Each intent names where its requirement comes from. `check` evaluates every (source, destination, port)
combination of an intent over the model and reports each that does not come out as expected.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dlinfra.checks.reach import topology
from dlinfra.checks.reach.engine import (
    AtSite,
    Endpoint,
    InVpc,
    OnClientVpn,
    OnInternet,
    Protocol,
    Verdict,
    evaluate,
    host,
)
from dlinfra.checks.reach.topology import Place, SiteSide, Topology
from dlinfra.errors import DlinfraError
from dlinfra.model import sites as site_plan
from dlinfra.model.fleet.load import parse_yaml
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.planner import Plan as AddressPlan

Expect = Literal["allow", "deny"]
SITE_LABEL = "dlinfra.io/site"
TENSORBOARD_PORT = 6006
POD_PORT = 8080  # a representative pod port: Kubernetes pods reach each other on every port
WEBHOOK_PORT = 9443  # admission webhooks served by pods (Kueue, the termination handler)
INTERNET_HOST = ipaddress.IPv4Address("198.51.100.7")  # TEST-NET-2: any host on the internet


@dataclass(frozen=True)
class Intent:
    """A set of flows that must all be open (allow) or all be closed (deny)."""

    id: str
    family: str
    description: str
    stack: str  # the stack a failure is reported against
    sources: tuple[Endpoint, ...]
    destinations: tuple[Endpoint, ...]
    protocol: Protocol
    ports: tuple[int, ...]
    expect: Expect
    source_doc: str  # where the requirement comes from


@dataclass(frozen=True)
class Failure:
    intent: Intent
    source: Endpoint
    destination: Endpoint
    port: int
    verdict: Verdict
    why: str  # the sentence a reader needs: where it stopped and why, or that it got through


@dataclass
class ReachResult:
    intents: list[Intent] = field(default_factory=list)
    flows: int = 0
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0

    def failed_intents(self) -> set[str]:
        return {f.intent.id for f in self.failures}

    def by_family(self) -> dict[str, tuple[int, int, int]]:
        """family -> (intents, flows, failed intents)."""
        out: dict[str, list[int]] = {}
        failed = self.failed_intents()
        for intent in self.intents:
            row = out.setdefault(intent.family, [0, 0, 0])
            row[0] += 1
            row[1] += len(intent.sources) * len(intent.destinations) * len(intent.ports)
            row[2] += intent.id in failed
        return {k: (v[0], v[1], v[2]) for k, v in sorted(out.items())}


# --- sites as their gateways are rendered ------------------------------------------------------------
def site_sides(fleet: Fleet, plan: AddressPlan, plans: Sequence[Mapping[str, Any]]) -> list[SiteSide]:
    """Each site's gateway: what it announces, its IPsec selectors, and how it learns its pods' routes."""
    out = []
    for name, site in sorted(fleet.sites.items()):
        lan, pods = site_plan.site_lan(plan, name), site_plan.site_pods(plan, name)
        remote = tuple(site_plan.site_remote_cidrs(fleet, plan, name))
        k8s = next((p for p in plans if p["stack"] == f"{site.environment}-{site.region}-k8s"), None)
        out.append(
            SiteSide(
                name=name,
                environment=site.environment,
                region=site.region,
                lan=lan,
                pods=pods,
                announce=(lan, pods),
                local_selectors=(lan, pods),
                remote_selectors=remote,
                pod_routes=_pod_route_source(k8s, name, lan) if k8s else None,
            )
        )
    return out


def _pod_route_source(plan: Mapping[str, Any], site: str, lan: topology.Net) -> str | None:
    """How the site gateway learns pod routes: a Cilium BGP peering from the site's nodes to an address on its LAN."""
    for r in plan["resources"]:
        body = r["inputs"]
        if body.get("kind") != "CiliumBGPClusterConfig":
            continue
        spec = body.get("spec") or {}
        selector = spec.get("nodeSelector") or {}
        labels = selector.get("matchLabels") or {}
        expressions = selector.get("matchExpressions") or []
        selects_site = labels.get(SITE_LABEL) == site or any(
            e.get("key") == SITE_LABEL and site in (e.get("values") or []) for e in expressions
        )
        if not selects_site:
            continue
        for instance in spec.get("bgpInstances") or []:
            for peer in instance.get("peers") or []:
                try:
                    address = ipaddress.IPv4Address(str(peer.get("peerAddress", "")).split("/")[0])
                except ValueError:
                    continue
                if address in lan:
                    return f"Cilium BGP {body.get('metadata', {}).get('name', r['name'])} (peer {address})"
    return None


# --- endpoints -------------------------------------------------------------------------------------
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


# --- derived intents -----------------------------------------------------------------------------------
def _untainted_pools(fleet: Fleet, env: str, region: str) -> set[str]:
    """Pools CoreDNS can run on: EKS's CoreDNS tolerates no NoSchedule taint of ours."""
    return {
        name
        for name, pool in fleet.pools_in(env, region).items()
        if not any(t.effect != "PreferNoSchedule" for t in pool.taints)
    }


def derive(fleet: Fleet, topo: Topology) -> list[Intent]:
    """Every intent the fleet implies, over the places the plans declare."""
    intents: list[Intent] = []
    for env in sorted(fleet.environments):
        intents.extend(_environment_intents(fleet, topo, env))
    return intents


def _environment_intents(fleet: Fleet, topo: Topology, env: str) -> Iterator[Intent]:
    places = [p for p in topo.places if p.environment == env]
    regions = sorted(fleet.environments[env].regions)
    sites = [s for s in topo.sites.values() if s.environment == env]

    def eps(
        kind: str, region: str | None = None, names: Iterable[str] | None = None, offset: int = 10
    ) -> tuple[Endpoint, ...]:
        wanted = set(names) if names is not None else None
        return tuple(
            e
            for p in sorted(places, key=lambda p: (p.region, p.kind, p.name))
            if p.kind == kind and (region is None or p.region == region) and (wanted is None or p.name in wanted)
            for e in place_endpoints(topo, p, offset)
        )

    def intent(
        family: str,
        ident: str,
        description: str,
        stack: str,
        sources: Sequence[Endpoint],
        destinations: Sequence[Endpoint],
        protocol: Protocol,
        ports: Sequence[int],
        source_doc: str,
        expect: Expect = "allow",
    ) -> Iterator[Intent]:
        if sources and destinations:
            yield Intent(
                f"{family}/{ident}",
                family,
                description,
                stack,
                tuple(sources),
                tuple(destinations),
                protocol,
                tuple(ports),
                expect,
                source_doc,
            )

    for region in regions:
        stack = f"{env}-{region}"
        pools = eps("pool", region)
        homed = [s for s in sites if s.region == region]
        hybrid_pods = tuple(site_endpoint(s, "pods") for s in homed)
        hybrid_nodes = tuple(site_endpoint(s, "lan") for s in homed)
        dns = eps("pool", region, _untainted_pools(fleet, env, region), offset=11)
        api = eps("control-plane", region, offset=20)
        for proto in ("udp", "tcp"):
            # Pods ask their node's NodeLocal DNS cache, which asks CoreDNS from the node's own address (hybrid
            # nodes: the site LAN); while the cache restarts, pods ask CoreDNS through kube-dns themselves.
            yield from intent(
                "dns",
                f"{stack}/{proto}",
                f"nodes (their DNS caches) and pods of every pool and site reach CoreDNS ({proto}/53)",
                stack,
                pools + hybrid_nodes + hybrid_pods,
                dns,
                proto,
                (53,),  # type: ignore[arg-type]
                "Kubernetes DNS for Services and Pods; 'Using NodeLocal DNSCache in Kubernetes Clusters' (the "
                "cache forwards misses to CoreDNS over TCP, pods fall back over UDP and TCP); EKS guide 'Prepare "
                "networking for hybrid nodes' (TCP and UDP 53 to the hosts running CoreDNS)",
            )
        yield from intent(
            "pod-to-pod",
            stack,
            "pods of every pool and site reach each other",
            stack,
            pools + hybrid_pods,
            eps("pool", region, offset=12) + hybrid_pods,
            "tcp",
            (POD_PORT,),
            "Kubernetes networking model: every pod reaches every pod without NAT",
        )
        yield from intent(
            "control-plane",
            f"{stack}/api",
            "nodes and pods reach the Kubernetes API",
            stack,
            pools + hybrid_nodes + hybrid_pods,
            api,
            "tcp",
            (443,),
            "EKS guide 'View Amazon EKS security group requirements for clusters'; 'Prepare networking "
            "for hybrid nodes' (nodes and pods to the control plane on 443)",
        )
        yield from intent(
            "control-plane",
            f"{stack}/kubelet",
            "the control plane reaches every kubelet",
            stack,
            api,
            pools + hybrid_nodes,
            "tcp",
            (10250,),
            "EKS guide 'Prepare networking for hybrid nodes' (control plane to kubelet 10250 for logs, "
            "exec, port-forward)",
        )
        yield from intent(
            "control-plane",
            f"{stack}/webhooks",
            "the control plane reaches webhook pods",
            stack,
            api,
            eps("pool", region, offset=12) + hybrid_pods,
            "tcp",
            (WEBHOOK_PORT,),
            "EKS guide 'Prepare networking for hybrid nodes' (webhooks on hybrid nodes need routable "
            "remote pod networks)",
        )
        yield from intent(
            "storage",
            f"{stack}/efs",
            "nodes reach EFS mount targets",
            stack,
            pools,
            eps("efs", region, offset=30),
            "tcp",
            (2049,),
            "EFS guide 'Using VPC security groups' (NFS 2049 from clients)",
        )
        fsx = eps("fsx", region, offset=40)
        yield from intent(
            "storage",
            f"{stack}/fsx-clients",
            "nodes reach FSx for Lustre",
            stack,
            pools,
            fsx,
            "tcp",
            (988, 1018, 1023),
            "FSx for Lustre guide 'File system access control with Amazon VPC' (988, 1018-1023)",
        )
        yield from intent(
            "storage",
            f"{stack}/fsx-servers",
            "FSx for Lustre reaches its clients",
            stack,
            fsx,
            pools,
            "tcp",
            (988, 1018, 1023),
            "FSx for Lustre guide 'File system access control with Amazon VPC' (client groups admit "
            "988 and 1018-1023 from the file system)",
        )
        yield from intent(
            "endpoints",
            stack,
            "nodes reach the interface endpoints",
            stack,
            pools,
            eps("endpoint", region, offset=50),
            "tcp",
            (443,),
            "VPC guide 'Access an AWS service using an interface VPC endpoint' (HTTPS 443)",
        )
        yield from intent(
            "ci",
            stack,
            "the in-VPC CI runner reaches the EKS API",
            stack,
            eps("ci-runner", region, offset=60),
            api,
            "tcp",
            (443,),
            "EKS guide 'Cluster API server endpoint' (private endpoint only from the VPC)",
        )
        # Must stay closed: nothing on the internet reaches a node, a pod, the API or a data store.
        for kind, ports in (
            ("pool", (22, 443, POD_PORT)),
            ("control-plane", (443,)),
            ("efs", (2049,)),
            ("fsx", (988,)),
        ):
            yield from intent(
                "deny-internet",
                f"{stack}/{kind}",
                f"the internet reaches no {kind}",
                stack,
                (Endpoint("a host on the internet", INTERNET_HOST, OnInternet()),),
                eps(kind, region, offset=13),
                "tcp",
                ports,
                "dlinfra design: nodes, pods and data stores are private",
                "deny",
            )

    # MultiKueue: the manager's Kueue controller (on its untainted pools) reaches each worker's private EKS API,
    # across the transit gateway peering; the endpoint's public name resolves to its private addresses.
    manager = fleet.multikueue_manager(env)
    for worker in fleet.multikueue_workers(env):
        yield from intent(
            "multikueue",
            f"{env}-{manager}/{worker}",
            f"the MultiKueue manager in {manager} reaches the {worker} cluster's API",
            f"{env}-{manager}",
            eps("pool", manager, _untainted_pools(fleet, env, manager), offset=15),
            eps("control-plane", worker, offset=21),
            "tcp",
            (443,),
            "Kueue docs 'MultiKueue' (the manager creates and watches workloads and jobs in each worker through its "
            "API server); AWS re:Post 'Connect to a private EKS cluster endpoint from outside the VPC' (private-only "
            "endpoints advertise private IPs through the public DNS name)",
        )

    # Sites and laptops reach every region of their environment, and back.
    for site in sites:
        for region in regions:
            stack = f"{env}-{region}"
            pools = eps("pool", region, offset=14)
            lan, pods = site_endpoint(site, "lan"), site_endpoint(site, "pods")
            yield from intent(
                "site",
                f"{site.name}->{stack}",
                f"site {site.name} LAN and hybrid pods reach {stack} nodes and pods",
                stack,
                (lan, pods),
                pools,
                "tcp",
                (POD_PORT,),
                "EKS guide 'Networking concepts for hybrid nodes' (the VPC is the hub between hybrid and cloud pods)",
            )
            yield from intent(
                "site",
                f"{stack}->{site.name}",
                f"{stack} nodes and pods reach site {site.name}",
                stack,
                pools,
                (lan, pods),
                "tcp",
                (POD_PORT,),
                "EKS guide 'Networking concepts for hybrid nodes'",
            )
    # Sites reach each other through AWS, never through a third site's tunnel (checked on every allowed flow).
    for site in sites:
        for other in sites:
            if other.name != site.name:
                yield from intent(
                    "site-to-site",
                    f"{site.name}->{other.name}",
                    f"site {site.name} reaches site {other.name} through AWS only",
                    f"{env}-{site.region}",
                    (site_endpoint(site, "lan"),),
                    (site_endpoint(other, "lan"), site_endpoint(other, "pods")),
                    "tcp",
                    (22,),
                    "dlinfra design: each site's tunnels carry only its own networks (site_plan.site_remote_cidrs)",
                )
    for region, laptop in laptop_endpoints(topo, fleet, env):
        stack = f"{env}-{region}"
        for target in regions:
            yield from intent(
                "laptop",
                f"{laptop.label}->{env}-{target}/pods",
                f"{laptop.label} reaches pods in {env}-{target} (TensorBoard)",
                stack,
                (laptop,),
                eps("pool", target, offset=15),
                "tcp",
                (TENSORBOARD_PORT,),
                "dlinfra design: laptops reach their jobs' dashboards",
            )
            yield from intent(
                "laptop",
                f"{laptop.label}->{env}-{target}/api",
                f"{laptop.label} reaches the EKS API of {env}-{target}",
                stack,
                (laptop,),
                eps("control-plane", target, offset=20),
                "tcp",
                (443,),
                "EKS guide 'Cluster API server endpoint' (private endpoint over VPN)",
            )
    # Environments are isolated from each other, both ways (each environment declares its own way out).
    for other_env in sorted(e for e in fleet.environments if e != env):
        theirs = tuple(
            e
            for p in sorted(topo.places, key=lambda p: (p.region, p.kind, p.name))
            if p.environment == other_env and p.kind in ("pool", "control-plane", "efs")
            for e in place_endpoints(topo, p, 16)
        )
        ours = eps("pool", offset=16) + tuple(site_endpoint(s, n) for s in sites for n in ("lan", "pods"))
        yield from intent(
            "deny-environment",
            f"{env}->{other_env}",
            f"nothing of {env} reaches {other_env}",
            f"{env}-{regions[0]}",
            ours,
            theirs,
            "tcp",
            (22, 443, 2049),
            "dlinfra design: environments share no network",
            "deny",
        )


# --- the user's own flows -------------------------------------------------------------------------------
class _Selector(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    environment: str | None = None  # default: every environment
    region: str | None = None  # default: every region of the environment
    pool: str | None = None  # a node pool's pods
    control_plane: bool = False  # the EKS API
    efs: bool = False
    fsx: bool = False
    endpoint: str | None = None  # an interface endpoint's service, e.g. sts
    ci_runner: bool = False
    site: str | None = None
    network: Literal["lan", "pods"] = "lan"  # with site
    vpn_team: str | None = None  # laptops of a team (federated VPN), or "*" for certificate users
    internet: bool = False


class _Flow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    from_: _Selector = Field(alias="from")
    to: _Selector
    protocol: Literal["tcp", "udp", "icmp"] = "tcp"
    ports: tuple[int, ...] = Field(default=(0,), min_length=1)
    expect: Expect = "allow"
    why: str = ""  # where the requirement comes from


class _FlowsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    flows: list[_Flow] = Field(default_factory=list)


def load_flows(path: Path, fleet: Fleet, topo: Topology) -> list[Intent]:
    """Intents from a flows file (docs/reachability.md); one clear error naming the file and key."""
    data = parse_yaml(path) or {}
    try:
        spec = _FlowsFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        raise DlinfraError(f"{err['msg']}", file=str(path), key=key) from None
    out = []
    for index, flow in enumerate(spec.flows):
        key = f"flows.{index}"
        sources = _select(flow.from_, fleet, topo, str(path), f"{key}.from")
        destinations = _select(flow.to, fleet, topo, str(path), f"{key}.to")
        for port in flow.ports:
            if flow.protocol != "icmp" and not 1 <= port <= 65535:
                raise DlinfraError(f"port {port} is not in 1-65535", file=str(path), key=f"{key}.ports")
        out.append(
            Intent(
                f"user/{flow.name}",
                "user",
                flow.name,
                "",
                sources,
                destinations,
                flow.protocol,
                flow.ports,
                flow.expect,
                flow.why or f"{path.name}: {flow.name}",
            )
        )
    return out


def _select(sel: _Selector, fleet: Fleet, topo: Topology, file: str, key: str) -> tuple[Endpoint, ...]:
    kinds = [
        k
        for k, v in (
            ("pool", sel.pool),
            ("control-plane", sel.control_plane),
            ("efs", sel.efs),
            ("fsx", sel.fsx),
            ("endpoint", sel.endpoint),
            ("ci-runner", sel.ci_runner),
            ("site", sel.site),
            ("vpn", sel.vpn_team),
            ("internet", sel.internet),
        )
        if v
    ]
    if len(kinds) != 1:
        raise DlinfraError(
            "give exactly one of pool, control_plane, efs, fsx, endpoint, ci_runner, site, vpn_team, internet",
            file=file,
            key=key,
        )
    if sel.environment is not None and sel.environment not in fleet.environments:
        raise DlinfraError(f"unknown environment {sel.environment!r}", file=file, key=f"{key}.environment")
    kind = kinds[0]
    if kind == "internet":
        return (Endpoint("a host on the internet", INTERNET_HOST, OnInternet()),)
    if kind == "site":
        site = topo.sites.get(str(sel.site))
        if site is None:
            raise DlinfraError(f"unknown site {sel.site!r}", file=file, key=f"{key}.site")
        return (site_endpoint(site, sel.network),)
    envs = [sel.environment] if sel.environment else sorted(fleet.environments)
    if kind == "vpn":
        found = tuple(
            laptop
            for env in envs
            for region, laptop in laptop_endpoints(topo, fleet, env)
            if (sel.region is None or region == sel.region)
            and (sel.vpn_team == "*" or f"team {sel.vpn_team}" in laptop.label)
        )
    else:
        name = sel.pool or sel.endpoint
        found = tuple(
            e
            for p in topo.places
            if p.kind == kind
            and p.environment in envs
            and (sel.region is None or p.region == sel.region)
            and (name is None or p.name == name)
            for e in place_endpoints(topo, p, 17)
        )
    if not found:
        raise DlinfraError(f"selects nothing the plans declare ({kind})", file=file, key=key)
    return found


# --- evaluation --------------------------------------------------------------------------------------------
def run(topo: Topology, intents: Sequence[Intent]) -> ReachResult:
    """Evaluate every flow of every intent; failures carry the hop and reason."""
    started = time.perf_counter()
    result = ReachResult(intents=list(intents))
    for intent in intents:
        for src in intent.sources:
            for dst in intent.destinations:
                for port in intent.ports:
                    result.flows += 1
                    verdict = evaluate(topo, src, dst, intent.protocol, port)
                    failure = _judge(intent, src, dst, verdict)
                    if failure:
                        result.failures.append(Failure(intent, src, dst, port, verdict, failure))
    result.seconds = time.perf_counter() - started
    return result


def _own_sites(*endpoints: Endpoint) -> set[str]:
    return {e.location.site for e in endpoints if isinstance(e.location, AtSite)}


def _judge(intent: Intent, src: Endpoint, dst: Endpoint, verdict: Verdict) -> str | None:
    if verdict.allowed:
        transit = verdict.tunnels - _own_sites(src, dst)
        if transit:
            return (
                f"crosses site {', '.join(sorted(transit))}'s tunnel: one site's traffic is routed through another site"
            )
        if intent.expect == "deny":
            return "allowed, but must stay closed: " + " -> ".join(verdict.hops)
        return None
    if intent.expect == "allow":
        return f"denied at {verdict.denied_at}: {verdict.reason}"
    return None
