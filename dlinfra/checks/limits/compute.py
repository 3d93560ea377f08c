"""Compute limits counted over the plans, every pool at its maximum size: per cluster its control-plane security
groups, remote networks, nodes and pods; per pool subnet the addresses its nodes' VPC CNI and other interfaces take;
per account and region the vCPUs of each EC2 instance quota, On-Demand and Spot."""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dlinfra.checks.limits.scope import Stack, Usage, by_id, flat, label, name_of, number
from dlinfra.model import instances
from dlinfra.model import quotas as quota_data
from policy.dlinfra_policy.rules.capacity_blocks import block_window

# AWS reserves the first four addresses and the last of every subnet (Amazon VPC User Guide, "Subnet CIDR blocks").
SUBNET_RESERVED = 5
# A hybrid node's kubelet takes at most this many pods (dlinfra/render/nodeadm.py: nodeadm's default max pods).
HYBRID_MAX_PODS = 110
# With prefix delegation the VPC CNI hands out /28 prefixes (its README, ENABLE_PREFIX_DELEGATION) and keeps one
# spare (WARM_PREFIX_TARGET, default 1).
PREFIX_ADDRESSES = 16
WARM_PREFIXES = 1

# Inputs that place a resource's interface in a subnet (one address each). Route table associations and Client VPN
# routes name a subnet without an interface in it; Auto Scaling groups are counted as their nodes.
_SUBNET_KEYS = ("subnetId", "subnetIds", "subnets")
_NOT_INTERFACES = (
    "aws:ec2/routeTableAssociation:RouteTableAssociation",
    "aws:ec2clientvpn/route:Route",
    "aws:autoscaling/group:Group",
    "aws:ec2/subnet:Subnet",
)


# Inputs that list the security groups of a resource's interfaces; the security group types list referenced groups.
def _cidr_count(networks: Any) -> int:
    """CIDRs of a remote network block, written as one block or a list of them."""
    blocks = networks if isinstance(networks, list) else [networks] if networks else []
    return sum(len(b.get("cidrs") or ()) for b in blocks if isinstance(b, Mapping))


@dataclass(frozen=True)
class _Pool:
    """An Auto Scaling group at its maximum size, with what each of its nodes takes."""

    group: Mapping[str, Any]
    max_size: int
    subnets: tuple[str, ...]
    types: tuple[str, ...]  # known instance types it may launch
    unknown: tuple[str, ...]  # types the instance table lacks
    template: Mapping[str, Any]  # its launch template's inputs ({} when the plan has none)

    @property
    def capacity_block(self) -> bool:
        """Whether it launches into an EC2 Capacity Block (market type capacity-block)."""
        return (self.template.get("instanceMarketOptions") or {}).get("marketType") == "capacity-block"

    @property
    def markets(self) -> tuple[int, int]:
        """(on-demand, spot) instances at its maximum size. A mixed-instances split is counted at its worst for
        each: the on-demand base plus the share above it rounded up, and the rest with the share rounded down."""
        mixed = self.group["inputs"].get("mixedInstancesPolicy") or {}
        spread = mixed.get("instancesDistribution")
        if not spread:
            return self.max_size, 0
        base = min(self.max_size, number(spread.get("onDemandBaseCapacity")))
        above = self.max_size - base
        share = number(spread.get("onDemandPercentageAboveBaseCapacity", 100))
        return base + math.ceil(above * share / 100), above - math.floor(above * share / 100)

    @property
    def interfaces(self) -> int:
        """Network interfaces a node holds at its max pods: the VPC CNI's on card 0 (the primary among them), and
        one more per further network card the launch template gives an interface (EFA pools: one per card)."""
        cards = {number(n.get("networkCardIndex")) for n in self.template.get("networkInterfaces") or ()}
        return max((instances.lookup(t).max_enis for t in self.types), default=0) + len(cards - {0})


def pools(s: Stack) -> list[_Pool]:
    templates = {t["id"]: t for t in s.of("aws:ec2/launchTemplate:LaunchTemplate")}
    # A group declared closed and opened by its Capacity Block's keeper (components/capacity_block.py) reaches the
    # keeper's max inside the window: count that, not the declared 0.
    scheduled: dict[str, int] = {}
    for function in s.of("aws:lambda/function:Function"):
        if (window := block_window(function["inputs"])) is not None:
            scheduled[window.group] = max(scheduled.get(window.group, 0), window.max_size)
    out = []
    for group in s.of("aws:autoscaling/group:Group"):
        i = group["inputs"]
        mixed = (i.get("mixedInstancesPolicy") or {}).get("launchTemplate") or {}
        template_id = (i.get("launchTemplate") or {}).get("id") or (mixed.get("launchTemplateSpecification") or {}).get(
            "launchTemplateId"
        )
        names = [o.get("instanceType") for o in mixed.get("overrides") or ()]
        template: Mapping[str, Any] = templates.get(template_id or "") or {}
        names.append((template.get("inputs") or {}).get("instanceType"))
        wanted = sorted({n for n in names if n})
        known = tuple(n for n in wanted if n in instances.all_types())
        out.append(
            _Pool(
                group=group,
                max_size=max(number(i.get("maxSize")), scheduled.get(str(i.get("name")), 0)),
                subnets=tuple(i.get("vpcZoneIdentifiers") or ()),
                types=known,
                unknown=tuple(n for n in wanted if n not in known),
                template=template.get("inputs") or {},
            )
        )
    return out


def _prefix_delegation(s: Stack) -> bool:
    """Whether the stack's VPC CNI add-on hands out /28 prefixes (ENABLE_PREFIX_DELEGATION)."""
    for addon in s.of("aws:eks/addon:Addon"):
        if addon["inputs"].get("addonName") == "vpc-cni" and addon["inputs"].get("configurationValues"):
            try:
                env = json.loads(addon["inputs"]["configurationValues"]).get("env") or {}
            except (TypeError, ValueError, AttributeError):
                continue
            return str(env.get("ENABLE_PREFIX_DELEGATION", "")).lower() == "true"
    return False


def node_addresses(instance_type: str, *, prefix_delegation: bool) -> int:
    """Subnet addresses one node of a type holds at its max pods."""
    spec = instances.lookup(instance_type)
    if not prefix_delegation:
        return spec.vpc_cni_addresses  # every interface attached, every secondary address assigned
    needed = math.ceil((spec.max_pods or HYBRID_MAX_PODS) / PREFIX_ADDRESSES) + WARM_PREFIXES
    prefixes = min(needed, spec.max_enis * (spec.ipv4_per_eni - 1))  # each secondary slot holds one prefix
    return spec.max_enis + prefixes * PREFIX_ADDRESSES


def count_clusters(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """Per cluster: control-plane security groups, remote networks, and nodes and pods at every pool's maximum."""
    for s in stacks:
        for cluster in s.of("aws:eks/cluster:Cluster"):
            i, scope = cluster["inputs"], f"cluster {name_of(cluster)}"
            common = {"region": s.region or "", "scope": scope, "stack": s.name, "resource": cluster["urn"]}
            plane = len((i.get("vpcConfig") or {}).get("securityGroupIds") or ())
            yield Usage(quota="eks-control-plane-security-groups", used=plane, how="vpcConfig", **common)
            remote = i.get("remoteNetworkConfig") or {}
            for key, what in (("remoteNodeNetworks", "node"), ("remotePodNetworks", "pod")):
                count = _cidr_count(remote.get(key))
                yield Usage(quota=f"eks-remote-{what}-networks", used=count, how=f"site {what} CIDRs", **common)
            groups = pools(s)
            hybrid = sum(number(a["inputs"].get("registrationLimit")) for a in s.of("aws:ssm/activation:Activation"))
            nodes = sum(p.max_size for p in groups) + hybrid
            how = ", ".join([f"{p.group['name']} {p.max_size}" for p in groups] + [f"site machines {hybrid}"])
            yield Usage(quota="nodes-per-cluster", used=nodes, how=how, **common)
            pods = hybrid * HYBRID_MAX_PODS + sum(
                p.max_size * max((instances.lookup(t).max_pods or HYBRID_MAX_PODS for t in p.types), default=0)
                for p in groups
            )
            yield Usage(quota="pods-per-cluster", used=pods, how="each node at its max pods", **common)


def _interfaces_in(s: Stack, subnet: str) -> list[str]:
    """Resources of a stack with an interface in a subnet (one address each)."""
    out = []
    for r in s.resources:
        if r["type"] in _NOT_INTERFACES:
            continue
        for key, value in flat(r["inputs"]):
            if key in _SUBNET_KEYS and (value == subnet or (isinstance(value, list) and subnet in value)):
                out.append(label(r))
                break
    return out


def count_subnet_addresses(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """Addresses each pool subnet needs when every pool is at its maximum size, against the subnet's size."""
    indexed = by_id(stacks)
    for s in stacks:
        delegation = _prefix_delegation(s)
        counted = [p for p in pools(s) if p.types and p.subnets]
        for subnet_id in sorted({sub for p in counted for sub in p.subnets}):
            if subnet_id not in indexed:
                continue
            subnet = indexed[subnet_id][1]
            cidr = ipaddress.ip_network(str(subnet["inputs"].get("cidrBlock")), strict=False)
            parts, used = [], 0
            for p in counted:
                if subnet_id in p.subnets:
                    nodes = math.ceil(p.max_size / len(p.subnets))
                    per_node = max(node_addresses(t, prefix_delegation=delegation) for t in p.types)
                    used += nodes * per_node
                    parts.append(f"{p.group['name']} {nodes} nodes x {per_node}")
            others = _interfaces_in(s, subnet_id)
            used += len(others)
            parts.append(f"{len(others)} other interfaces")
            yield Usage(
                quota="subnet-addresses",
                region=s.region or "",
                scope=f"subnet {name_of(subnet)} ({cidr})",
                stack=s.name,
                resource=subnet["urn"],
                used=used,
                how=", ".join(parts),
                capacity=cidr.num_addresses - SUBNET_RESERVED,
            )


def count_vcpus(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """vCPUs per account and region for each EC2 instance quota, every pool at its maximum size: on-demand and
    reserved instances against the On-Demand quotas, spot against the Spot ones; Capacity Block pools apart."""
    vcpu_quotas = [q for q in quota_data.table().quotas.values() if q.market is not None]
    regions: dict[tuple[str, str], list[tuple[Stack, _Pool]]] = {}
    boxes: dict[tuple[str, str], list[tuple[Stack, Any]]] = {}
    for s in stacks:
        if s.region:
            regions.setdefault((s.account, s.region), []).extend((s, p) for p in pools(s))
            boxes.setdefault((s.account, s.region), []).extend((s, i) for i in s.of("aws:ec2/instance:Instance"))
    for (account, region), found in sorted(regions.items()):
        for quota in vcpu_quotas:
            used, parts = 0, []
            for s, p in found:
                kinds = [instances.lookup(t) for t in p.types]
                sizes = [k.vcpus for k in kinds if quota.counts_family(k.family)]
                if not sizes:
                    continue
                if p.capacity_block:
                    if quota.market == "on-demand":
                        parts.append(f"{s.name} {name_of(p.group)} on a Capacity Block, not counted")
                    continue
                nodes = p.markets[0 if quota.market == "on-demand" else 1]
                if nodes:
                    used += nodes * max(sizes)
                    parts.append(f"{s.name} {name_of(p.group)} {nodes} x {max(sizes)}")
            # Lone instances (dev boxes) run on demand, stopped or not: RunInstances and StartInstances count them.
            for s, instance in boxes.get((account, region), []):
                kind = instances.lookup(str(instance["inputs"].get("instanceType")))
                if quota.market == "on-demand" and quota.counts_family(kind.family):
                    used += kind.vcpus
                    parts.append(f"{s.name} {instance['name']} {kind.vcpus}")
            yield Usage(
                quota=quota.key,
                region=region,
                scope=f"{region} ({account})",
                stack="",
                resource="",
                used=used,
                how=f"{quota.market} vCPUs: " + (", ".join(parts) or "no pool"),
            )
