"""Network quotas counted over the plans: VPCs, Elastic IPs, transit gateways, Client VPN endpoints and network
interfaces per account and region, routes per route table, rules per security group, security groups per
interface, peering attachments per transit gateway, interface endpoints per VPC, and the Client VPN's routes and
authorization rules."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dlinfra.checks.limits import compute
from dlinfra.checks.limits.scope import Stack, Usage, by_id, flat, label, name_of

# Inputs that list the security groups of a resource's interfaces; the security group types list referenced groups.
_SG_KEYS = ("securityGroupIds", "vpcSecurityGroupIds", "securityGroups")
_SG_TYPES = (
    "aws:ec2/securityGroup:SecurityGroup",
    "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup",
    "aws:ec2/securityGroupRule:SecurityGroupRule",
)


def _per_region(
    stacks: Sequence[Stack], quota: str, type_: str, what: str, extra: tuple[str, int] | None = None
) -> Iterator[Usage]:
    """Resources of a type per account and region, across every stack that declares them there, plus `extra`
    (what, how many) once in each account and region that has any."""
    groups: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    for s in stacks:
        count = len(s.of(type_))
        if count and s.region:
            groups[(s.account, s.region)].append((s.name, count))
    for (account, region), parts in sorted(groups.items()):
        used = sum(n for _, n in parts)
        how = f"{what}: " + ", ".join(f"{stack} {n}" for stack, n in parts)
        if extra is not None:
            used += extra[1]
            how += f"; {extra[0]} {extra[1]}"
        yield Usage(
            quota=quota,
            region=region,
            scope=f"{region} ({account})",
            stack=parts[0][0] if len(parts) == 1 else "",
            resource="",
            used=used,
            how=how,
        )


def count_per_region(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """VPCs (and the default VPC while it remains), Elastic IPs, transit gateways and Client VPN endpoints per
    account and region."""
    # AWS creates a default VPC in every region of a new account ("Default VPCs"); it counts until deleted.
    default = ("the default VPC", 1) if any(s.default_vpc for s in stacks) else None
    yield from _per_region(stacks, "vpcs-per-region", "aws:ec2/vpc:Vpc", "VPCs", default)
    yield from _per_region(stacks, "elastic-ips-per-region", "aws:ec2/eip:Eip", "Elastic IPs (NAT gateways)")
    tgw = "aws:ec2transitgateway/transitGateway:TransitGateway"
    yield from _per_region(stacks, "transit-gateways-per-region", tgw, "transit gateways")
    cvpn = "aws:ec2clientvpn/endpoint:Endpoint"
    yield from _per_region(stacks, "client-vpn-endpoints-per-region", cvpn, "Client VPN endpoints")


# Inputs that place a resource's interfaces in subnets, one per subnet named. Route table associations, Client VPN
# routes and subnets themselves name a subnet without an interface in it; pools (and their launch templates) are
# counted as their nodes.
_SUBNET_KEYS = ("subnetId", "subnetIds", "subnets")
_NO_INTERFACE = (
    "aws:ec2/routeTableAssociation:RouteTableAssociation",
    "aws:ec2clientvpn/route:Route",
    "aws:autoscaling/group:Group",
    "aws:ec2/launchTemplate:LaunchTemplate",
    "aws:ec2/subnet:Subnet",
)


def _subnet_interfaces(resource: Mapping[str, Any]) -> int:
    """Interfaces a resource places: one per subnet it names."""
    if resource["type"] in _NO_INTERFACE:
        return 0
    named: set[str] = set()
    for key, value in flat(resource["inputs"]):
        if key in _SUBNET_KEYS:
            named |= {str(v) for v in value} if isinstance(value, list) else {str(value)} if value else set()
    return len(named)


def count_network_interfaces(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """Network interfaces per account and region: every node of every pool at its maximum size, with the VPC CNI's
    interfaces at max pods and one per further EFA network card, and one per subnet for every other resource."""
    regions: dict[tuple[str, str], list[str]] = defaultdict(list)
    used: dict[tuple[str, str], int] = defaultdict(int)
    for s in stacks:
        if not s.region:
            continue
        key = (s.account, s.region)
        for p in compute.pools(s):
            if p.types and p.max_size:
                used[key] += p.max_size * p.interfaces
                regions[key].append(f"{name_of(p.group)} {p.max_size} x {p.interfaces}")
        others = sum(_subnet_interfaces(r) for r in s.resources)
        if others:
            used[key] += others
            regions[key].append(f"{others} others in {s.name}")
    for (account, region), parts in sorted(regions.items()):
        yield Usage(
            quota="network-interfaces-per-region",
            region=region,
            scope=f"{region} ({account})",
            stack="",
            resource="",
            used=used[(account, region)],
            how="nodes x interfaces, other resources one per subnet: " + ", ".join(parts),
        )


def count_routes(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """IPv4 routes per VPC route table: declared ones, the local route and gateway endpoints' routes."""
    for s in stacks:
        routes = s.of("aws:ec2/route:Route")
        gateway_endpoints = [
            e for e in s.of("aws:ec2/vpcEndpoint:VpcEndpoint") if e["inputs"].get("vpcEndpointType") == "Gateway"
        ]
        for table in s.of("aws:ec2/routeTable:RouteTable"):
            declared = sum(
                1
                for r in routes
                if r["inputs"].get("routeTableId") == table["id"] and not r["inputs"].get("destinationIpv6CidrBlock")
            )
            declared += sum(1 for r in table["inputs"].get("routes") or () if not r.get("ipv6CidrBlock"))
            endpoints = sum(1 for e in gateway_endpoints if table["id"] in (e["inputs"].get("routeTableIds") or ()))
            yield Usage(
                quota="routes-per-route-table",
                region=s.region or "",
                scope=f"route table {name_of(table)}",
                stack=s.name,
                resource=table["urn"],
                used=declared + 1 + endpoints,
                how=f"{declared} routes, the local route and {endpoints} gateway endpoint route(s)",
            )


def _rule_counts(rule: Mapping[str, Any], cidrs: str, cidrs6: str, refs: Sequence[str]) -> tuple[int, int]:
    """IPv4 and IPv6 rules one rule entry makes: each CIDR once, each referenced group or prefix list in both."""
    referenced = sum(_items(rule.get(k)) for k in refs)
    return _items(rule.get(cidrs)) + referenced, _items(rule.get(cidrs6)) + referenced


def _items(value: Any) -> int:
    """How many values an input holds: a list's length, one for a scalar, none for an empty one."""
    if isinstance(value, list):
        return len(value)
    return 1 if value else 0


_GROUP_TYPES = ("aws:ec2/securityGroup:SecurityGroup", "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup")
# Rule resources: (type, direction or None when the rule says its own in `type`, CIDR keys, reference keys).
_RULE_TYPES = (
    (
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
        "ingress",
        "cidrIpv4",
        "cidrIpv6",
        ("referencedSecurityGroupId", "prefixListId"),
    ),
    (
        "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
        "egress",
        "cidrIpv4",
        "cidrIpv6",
        ("referencedSecurityGroupId", "prefixListId"),
    ),
    (
        "aws:ec2/securityGroupRule:SecurityGroupRule",
        None,
        "cidrBlocks",
        "ipv6CidrBlocks",
        ("sourceSecurityGroupId", "self", "prefixListIds"),
    ),
)


def _rule_totals(s: Stack) -> dict[tuple[str, str], tuple[int, int]]:
    """(security group id, ingress|egress) -> its IPv4 and IPv6 rule counts, inline rules and rule resources."""
    totals: dict[tuple[str, str], tuple[int, int]] = defaultdict(lambda: (0, 0))

    def add(key: tuple[str, str], counts: tuple[int, int]) -> None:
        totals[key] = (totals[key][0] + counts[0], totals[key][1] + counts[1])

    for group in s.of(*_GROUP_TYPES):
        for direction in ("ingress", "egress"):
            for rule in group["inputs"].get(direction) or ():
                inline = ("securityGroups", "self", "prefixListIds")
                add((group["id"], direction), _rule_counts(rule, "cidrBlocks", "ipv6CidrBlocks", inline))
    for type_, fixed, cidrs, cidrs6, refs in _RULE_TYPES:
        for rule in s.of(type_):
            i = rule["inputs"]
            add(
                (str(i.get("securityGroupId", "")), fixed or str(i.get("type", ""))),
                _rule_counts(i, cidrs, cidrs6, refs),
            )
    return totals


def count_security_group_rules(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """Inbound and outbound rules per security group, the larger of its IPv4 and IPv6 counts."""
    for s in stacks:
        totals = _rule_totals(s)
        for group in s.of(*_GROUP_TYPES):
            for direction, key in (("ingress", "inbound"), ("egress", "outbound")):
                v4, v6 = totals.get((group["id"], direction), (0, 0))
                yield Usage(
                    quota=f"{key}-rules-per-security-group",
                    region=s.region or "",
                    scope=f"security group {name_of(group)}",
                    stack=s.name,
                    resource=group["urn"],
                    used=max(v4, v6),
                    how=f"{v4} IPv4 and {v6} IPv6 {key} rules",
                )


def _group_lists(value: Any) -> Iterator[list[str]]:
    """Every list of security group ids under an input, at any depth (a launch template's interfaces)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key in _SG_KEYS and isinstance(item, list):
                yield [str(g) for g in item]
            else:
                yield from _group_lists(item)
    elif isinstance(value, list):
        for item in value:
            yield from _group_lists(item)


def count_groups_per_interface(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """Security groups on each interface a resource creates; EKS adds its cluster security group to the control
    plane's (EKS user guide, "View Amazon EKS security group requirements for clusters")."""
    for s in stacks:
        for r in s.resources:
            if r["type"] in _SG_TYPES:
                continue
            lists = list(_group_lists(r["inputs"]))
            if not lists:
                continue
            extra = 1 if r["type"] == "aws:eks/cluster:Cluster" else 0
            used = max(len(set(groups)) for groups in lists) + extra
            eks = " and the cluster security group EKS creates" if extra else ""
            yield Usage(
                quota="security-groups-per-interface",
                region=s.region or "",
                scope=f"the interfaces of {label(r)}",
                stack=s.name,
                resource=r["urn"],
                used=used,
                how=f"{used - extra} security group(s){eks}",
            )


def count_transit_peering(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """Peering attachments per transit gateway: each attachment counts on both of its transit gateways."""
    indexed = by_id(stacks)
    peers: dict[str, list[str]] = defaultdict(list)
    region_of: dict[str, str] = {}
    for s in stacks:
        for a in s.of("aws:ec2transitgateway/peeringAttachment:PeeringAttachment"):
            own, peer = a["inputs"].get("transitGatewayId", ""), a["inputs"].get("peerTransitGatewayId", "")
            peers[own].append(peer)
            peers[peer].append(own)
            region_of.setdefault(peer, str(a["inputs"].get("peerRegion", "")))
    for tgw, others in sorted(peers.items()):
        owner = indexed.get(tgw)
        region = (owner[0].region if owner else None) or region_of.get(tgw, "")
        name = name_of(owner[1]) if owner else tgw
        named = ", ".join(sorted(indexed[o][0].name if o in indexed else o for o in others))
        for quota, how in (
            ("tgw-peering-attachments", f"peerings with {named}"),
            ("tgw-pending-peering-attachments", f"all pending at once on the first apply: {named}"),
        ):
            yield Usage(
                quota=quota,
                region=region,
                scope=f"transit gateway {name}",
                stack=owner[0].name if owner else "",
                resource=owner[1]["urn"] if owner else "",
                used=len(others),
                how=how,
            )


def count_interface_endpoints(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """Interface and Gateway Load Balancer endpoints per VPC."""
    for s in stacks:
        for vpc in s.of("aws:ec2/vpc:Vpc"):
            names = sorted(
                str(e["inputs"].get("serviceName", e["name"])).rsplit(".", 1)[-1]
                for e in s.of("aws:ec2/vpcEndpoint:VpcEndpoint")
                if e["inputs"].get("vpcId") == vpc["id"]
                and e["inputs"].get("vpcEndpointType") in ("Interface", "GatewayLoadBalancer")
            )
            yield Usage(
                quota="interface-endpoints-per-vpc",
                region=s.region or "",
                scope=f"VPC {name_of(vpc)}",
                stack=s.name,
                resource=vpc["urn"],
                used=len(names),
                how=f"interface endpoints {', '.join(names) or 'none'}",
            )


def count_client_vpn(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """Authorization rules per Client VPN endpoint and routes per target network association."""
    for s in stacks:
        rules = s.of("aws:ec2clientvpn/authorizationRule:AuthorizationRule")
        routes = s.of("aws:ec2clientvpn/route:Route")
        for endpoint in s.of("aws:ec2clientvpn/endpoint:Endpoint"):
            own = [r for r in rules if r["inputs"].get("clientVpnEndpointId") == endpoint["id"]]
            yield Usage(
                quota="client-vpn-authorization-rules",
                region=s.region or "",
                scope=f"Client VPN endpoint {name_of(endpoint)}",
                stack=s.name,
                resource=endpoint["urn"],
                used=len(own),
                how=f"{len({r['inputs'].get('targetNetworkCidr') for r in own})} networks for "
                f"{len({r['inputs'].get('accessGroupId') for r in own})} groups",
            )
        for assoc in s.of("aws:ec2clientvpn/networkAssociation:NetworkAssociation"):
            endpoint_id, subnet = assoc["inputs"].get("clientVpnEndpointId"), assoc["inputs"].get("subnetId")
            declared = sum(
                1
                for r in routes
                if r["inputs"].get("clientVpnEndpointId") == endpoint_id
                and r["inputs"].get("targetVpcSubnetId") == subnet
            )
            yield Usage(
                quota="client-vpn-routes-per-association",
                region=s.region or "",
                scope=f"Client VPN association {assoc['name']}",
                stack=s.name,
                resource=assoc["urn"],
                used=declared + 1,
                how=f"{declared} routes and the VPC route the association adds",
            )
