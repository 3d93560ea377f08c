"""Flows the fleet implies, derived with no configuration; each intent names where its requirement comes from."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from dlinfra.checks.reach import dev_box_intents
from dlinfra.checks.reach.endpoints import INTERNET, laptop_endpoints, place_endpoints, site_endpoint
from dlinfra.checks.reach.engine import Endpoint, PortRange, Protocol
from dlinfra.checks.reach.topology import Topology
from dlinfra.model.fleet.schema import Fleet

Expect = Literal["allow", "deny"]
TENSORBOARD_PORT = 6006
POD_PORTS: tuple[PortRange, ...] = ((1, 65535),)  # Kubernetes pods reach each other on every port
WEBHOOK_PORT = 9443  # admission webhooks served by pods (Kueue, the termination handler)
LUSTRE_PORTS: tuple[PortRange, ...] = ((988, 988), (1018, 1023))
LUSTRE_CLIENT_PORTS: tuple[PortRange, ...] = ((1018, 1023),)  # Lustre connects from reserved ports
EVERY_PORT: tuple[PortRange, ...] = ((0, 65535),)


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
    ports: tuple[PortRange, ...]  # destination ports
    expect: Expect
    source_doc: str  # where the requirement comes from
    source_ports: tuple[PortRange, ...] | None = None  # None: each source's ephemeral ports

    def port_text(self) -> str:
        """`tcp/988,1018-1023`, or `icmp`."""
        if self.protocol == "icmp":
            return "icmp"
        return f"{self.protocol}/" + ",".join(str(a) if a == b else f"{a}-{b}" for a, b in self.ports)


def _name(endpoint: Endpoint) -> str:
    """An end's label without its addresses, for intent ids."""
    return endpoint.label.split(" (")[0]


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

    def eps(kind: str, region: str | None = None, names: Iterable[str] | None = None) -> tuple[Endpoint, ...]:
        wanted = set(names) if names is not None else None
        return tuple(
            e
            for p in sorted(places, key=lambda p: (p.region, p.kind, p.name))
            if p.kind == kind and (region is None or p.region == region) and (wanted is None or p.name in wanted)
            for e in place_endpoints(topo, p)
        )

    def intent(
        family: str,
        ident: str,
        description: str,
        stack: str,
        sources: Sequence[Endpoint],
        destinations: Sequence[Endpoint],
        protocol: Protocol,
        ports: Sequence[int | PortRange],
        source_doc: str,
        expect: Expect = "allow",
        source_ports: tuple[PortRange, ...] | None = None,
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
                tuple((p, p) if isinstance(p, int) else p for p in ports),
                expect,
                source_doc,
                source_ports,
            )

    for region in regions:
        stack = f"{env}-{region}"
        pools = eps("pool", region)
        homed = [s for s in sites if s.region == region]
        hybrid_pods = tuple(site_endpoint(s, "pods") for s in homed)
        hybrid_nodes = tuple(site_endpoint(s, "lan") for s in homed)
        dns = eps("pool", region, _untainted_pools(fleet, env, region))
        api = eps("control-plane", region)
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
            "pods of every pool and site reach each other on every port",
            stack,
            pools + hybrid_pods,
            eps("pool", region) + hybrid_pods,
            "tcp",
            POD_PORTS,
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
            eps("pool", region) + hybrid_pods,
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
            eps("efs", region),
            "tcp",
            (2049,),
            "EFS guide 'Using VPC security groups' (NFS 2049 from clients)",
        )
        fsx = eps("fsx", region)
        yield from intent(
            "storage",
            f"{stack}/fsx-clients",
            "nodes reach FSx for Lustre",
            stack,
            pools,
            fsx,
            "tcp",
            LUSTRE_PORTS,
            "FSx for Lustre guide 'File system access control with Amazon VPC' (988, 1018-1023; Lustre connects "
            "from the reserved ports 1018-1023, so replies go back to them)",
            source_ports=LUSTRE_CLIENT_PORTS,
        )
        yield from intent(
            "storage",
            f"{stack}/fsx-servers",
            "FSx for Lustre reaches its clients",
            stack,
            fsx,
            pools,
            "tcp",
            LUSTRE_PORTS,
            "FSx for Lustre guide 'File system access control with Amazon VPC' (client groups admit "
            "988 and 1018-1023 from the file system, which connects from its reserved ports)",
            source_ports=LUSTRE_CLIENT_PORTS,
        )
        yield from intent(
            "endpoints",
            stack,
            "nodes reach the interface endpoints",
            stack,
            pools,
            eps("endpoint", region),
            "tcp",
            (443,),
            "VPC guide 'Access an AWS service using an interface VPC endpoint' (HTTPS 443)",
        )
        yield from intent(
            "ci",
            stack,
            "the in-VPC CI runner reaches the EKS API",
            stack,
            eps("ci-runner", region),
            api,
            "tcp",
            (443,),
            "EKS guide 'Cluster API server endpoint' (private endpoint only from the VPC)",
        )
        # Must stay closed: nothing on the internet reaches a node, a pod, the API or a data store, on any port.
        for kind in ("pool", "instance", "control-plane", "efs", "fsx"):
            for proto in ("tcp", "udp"):
                yield from intent(
                    "deny-internet",
                    f"{stack}/{kind}" + ("/udp" if proto == "udp" else ""),
                    f"the internet reaches no {kind} ({proto}, every port)",
                    stack,
                    (INTERNET,),
                    eps(kind, region),
                    proto,  # type: ignore[arg-type]
                    EVERY_PORT,
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
            eps("pool", manager, _untainted_pools(fleet, env, manager)),
            eps("control-plane", worker),
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
            pools = eps("pool", region)
            lan, pods = site_endpoint(site, "lan"), site_endpoint(site, "pods")
            yield from intent(
                "site",
                f"{site.name}->{stack}",
                f"site {site.name} LAN and hybrid pods reach {stack} nodes and pods",
                stack,
                (lan, pods),
                pools,
                "tcp",
                POD_PORTS,
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
                POD_PORTS,
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
                    POD_PORTS,
                    "dlinfra design: each site's tunnels carry only its own networks (site_plan.site_remote_cidrs)",
                )
    for region, laptop in laptop_endpoints(topo, fleet, env):
        stack = f"{env}-{region}"
        for target in regions:
            yield from intent(
                "laptop",
                f"{_name(laptop)}->{env}-{target}/pods",
                f"{_name(laptop)} reaches pods in {env}-{target} (TensorBoard)",
                stack,
                (laptop,),
                eps("pool", target),
                "tcp",
                (TENSORBOARD_PORT,),
                "dlinfra design: laptops reach their jobs' dashboards",
            )
            yield from intent(
                "laptop",
                f"{_name(laptop)}->{env}-{target}/api",
                f"{_name(laptop)} reaches the EKS API of {env}-{target}",
                stack,
                (laptop,),
                eps("control-plane", target),
                "tcp",
                (443,),
                "EKS guide 'Cluster API server endpoint' (private endpoint over VPN)",
            )
    # People's dev boxes: their own laptop reaches SSH, nothing else reaches them (dev_box_intents).
    yield from dev_box_intents.environment(fleet, topo, env, intent, eps)
    # Environments are isolated from each other, both ways (each environment declares its own way out).
    for other_env in sorted(e for e in fleet.environments if e != env):
        theirs = tuple(
            e
            for p in sorted(topo.places, key=lambda p: (p.region, p.kind, p.name))
            if p.environment == other_env and p.kind in ("pool", "control-plane", "efs")
            for e in place_endpoints(topo, p)
        )
        ours = eps("pool") + tuple(site_endpoint(s, n) for s in sites for n in ("lan", "pods"))
        for proto in ("tcp", "udp"):
            yield from intent(
                "deny-environment",
                f"{env}->{other_env}" + ("/udp" if proto == "udp" else ""),
                f"nothing of {env} reaches {other_env} ({proto}, every port)",
                f"{env}-{regions[0]}",
                ours,
                theirs,
                proto,  # type: ignore[arg-type]
                EVERY_PORT,
                "dlinfra design: environments share no network",
                "deny",
            )
