"""Rules for VPCs and security groups: planned, disjoint CIDRs, flow logs, no ingress from the whole internet, rules
in place before what AWS checks against them."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from .core import Context, Resource, Violation, as_int, as_list, as_objects, refers_to, tags_of

VPC = "aws:ec2/vpc:Vpc"
FLOW_LOG = "aws:ec2/flowLog:FlowLog"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SECURITY_GROUP_INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SECURITY_GROUP_EGRESS_RULE = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SECURITY_GROUP_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"


def _is_world(cidr: Any) -> bool:
    """True for a block that is (nearly) the whole internet: /0, or a public block of /8 or wider."""
    try:
        net = ipaddress.ip_network(str(cidr), strict=False)
    except ValueError:
        return False
    # 0.0.0.0/1 + 128.0.0.0/1 is as open as 0.0.0.0/0; a wide private block (10.0.0.0/8) is not.
    limit = 8 if net.version == 4 else 16
    return net.prefixlen == 0 or (net.prefixlen <= limit and not net.is_private)


_PROTOCOLS = {"6": "tcp", "17": "udp", "1": "icmp", "all": "-1"}


def _allowed(ctx: Context, component: str | None, protocol: Any, from_port: Any, to_port: Any) -> bool:
    proto = _PROTOCOLS.get(str(protocol).lower(), str(protocol).lower())
    return any(
        e.component == component
        and e.protocol == proto
        and e.from_port == as_int(from_port)
        and e.to_port == as_int(to_port)
        for e in ctx.ingress_allowlist
    )


def _ports(protocol: Any, from_port: Any, to_port: Any) -> str:
    proto = _PROTOCOLS.get(str(protocol).lower(), str(protocol).lower())
    if proto == "-1":
        return "all traffic"
    low, high = as_int(from_port), as_int(to_port)
    return f"{proto}/{low}" if low == high else f"{proto}/{low}-{high}"


def no_world_ingress(resource: Resource, ctx: Context) -> list[str]:
    """No security-group ingress from 0.0.0.0/0 or ::/0, except what INGRESS_ALLOWLIST declares."""
    inputs = resource.inputs
    component = tags_of(resource).get("component")
    found: list[tuple[str, Any, Any, Any, str]] = []  # (where, protocol, from, to, cidr)
    if resource.type == SECURITY_GROUP:
        for i, rule in enumerate(as_objects(inputs.get("ingress"))):
            for cidr in as_list(rule.get("cidrBlocks")) + as_list(rule.get("ipv6CidrBlocks")):
                found.append((f"ingress[{i}]", rule.get("protocol"), rule.get("fromPort"), rule.get("toPort"), cidr))
    elif resource.type == SECURITY_GROUP_INGRESS_RULE:
        for key in ("cidrIpv4", "cidrIpv6"):
            if inputs.get(key) is not None:
                found.append((key, inputs.get("ipProtocol"), inputs.get("fromPort"), inputs.get("toPort"), inputs[key]))
    elif resource.type == SECURITY_GROUP_RULE and inputs.get("type") == "ingress":
        component = None  # this type carries no tags, so no allowlist entry can name it
        for cidr in as_list(inputs.get("cidrBlocks")) + as_list(inputs.get("ipv6CidrBlocks")):
            found.append(("cidrBlocks", inputs.get("protocol"), inputs.get("fromPort"), inputs.get("toPort"), cidr))
    return [
        f"{where} allows {_ports(proto, low, high)} from {cidr}: restrict the source, or add an IngressException "
        "with a reason to INGRESS_ALLOWLIST"
        for where, proto, low, high, cidr in found
        if _is_world(cidr) and not _allowed(ctx, component, proto, low, high)
    ]


def _vpc_cidr(vpc: Resource) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(str(vpc.inputs.get("cidrBlock")))
    except ValueError:
        return None


def vpcs_disjoint(resources: Sequence[Resource], *, across_stacks_only: bool = False) -> list[Violation]:
    """No two VPCs among `resources` overlap (one stack's resources, or every stack's)."""
    out: list[Violation] = []
    seen: list[tuple[Resource, ipaddress.IPv4Network | ipaddress.IPv6Network]] = []
    for vpc in (r for r in resources if r.type == VPC):
        cidr = _vpc_cidr(vpc)
        if cidr is None:
            continue
        for other, other_cidr in seen:
            if cidr.overlaps(other_cidr) and not (across_stacks_only and other.stack == vpc.stack):
                out.append(
                    Violation(vpc.urn, f"cidrBlock {cidr} overlaps VPC {other.name} ({other_cidr}) of {other.stack}")
                )
        seen.append((vpc, cidr))
    return out


def vpc_cidrs_planned(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every VPC has exactly its planned block, which overlaps no other planned block and no other VPC."""
    vpcs = [r for r in resources if r.type == VPC]
    if not vpcs:
        return []
    plan = ctx.address_plan
    if plan is None:
        why = ctx.address_plan_error or "no address plan was given"
        return [Violation(v.urn, f"cannot check the VPC's CIDR against the address plan: {why}") for v in vpcs]
    out: list[Violation] = []
    for vpc in vpcs:
        raw = vpc.inputs.get("cidrBlock")
        planned, key = plan.vpcs.get(vpc.stack), plan.vpc_keys.get(vpc.stack, "?")
        cidr = _vpc_cidr(vpc)
        if planned is None:
            out.append(Violation(vpc.urn, f"stack {vpc.stack} has no VPC in the address plan ({plan.source})"))
        elif cidr is None:
            out.append(Violation(vpc.urn, f"cidrBlock {raw!r} is not a CIDR; the plan has {planned} ({key})"))
        elif cidr != planned:
            out.append(
                Violation(vpc.urn, f"cidrBlock {cidr} is not the planned block {planned} ({plan.source}: {key})")
            )
        if cidr is None:
            continue
        for other_key, block in plan.blocks.items():
            if other_key != key and cidr.overlaps(block):
                out.append(Violation(vpc.urn, f"cidrBlock {cidr} overlaps {other_key} ({block}) in {plan.source}"))
    return out + vpcs_disjoint(vpcs)


def vpc_flow_logs(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every VPC has a flow log (investigating a network incident without one is guesswork)."""
    logs = [r for r in resources if r.type == FLOW_LOG]
    return [
        Violation(vpc.urn, "VPC has no flow log")
        for vpc in resources
        if vpc.type == VPC and not any(refers_to(log, vpc, "vpcId") for log in logs)
    ]


def sg_no_inline_rules(resource: Resource, ctx: Context) -> list[str]:
    """Security groups declare no inline rules: every rule is its own resource.

    Inline `ingress`/`egress` blocks and separate rule resources on one group fight each other: perpetual
    diffs, and an apply that revokes the other's rules. Source: pulumi-aws `ec2.SecurityGroup` docs, "NOTE on
    Security Groups and Security Group Rules" (use `vpc.SecurityGroupIngressRule`/`EgressRule`).
    """
    if resource.type != SECURITY_GROUP:
        return []
    inline = [key for key in ("ingress", "egress") if as_list(resource.inputs.get(key))]
    return [f"inline {key} rules: declare them as separate rule resources" for key in inline]


RULE_TYPES = (SECURITY_GROUP_INGRESS_RULE, SECURITY_GROUP_EGRESS_RULE, SECURITY_GROUP_RULE)
# Types whose create call checks the rules of the security groups it is given, and fails while they are missing.
VALIDATES_GROUP_RULES: dict[str, str] = {
    # "The file system cannot be created because ... the provided security groups do not permit Lustre LNET
    # network traffic on port 988" (InvalidNetworkSettings): FSx for Lustre guide, "Creating an FSx for Lustre
    # file system fails"; the race with the rules: aws-parallelcluster issue 6181.
    "aws:fsx/lustreFileSystem:LustreFileSystem": "securityGroupIds",
    # Lustre-based too: the same 988 rules (File Cache guide, "Cache access control with Amazon VPC"), and
    # CreateFileCache answers InvalidNetworkSettings (FSx API reference, CreateFileCache errors).
    "aws:fsx/fileCache:FileCache": "securityGroupIds",
}
# Not here, checked: EFS CreateMountTarget validates that its groups exist (SecurityGroupNotFound, at most five),
# not their rules (EFS API reference, CreateMountTarget errors); EKS, Client VPN, CodeBuild and launch templates
# take groups without reading their rules.


def _groups_of(resource: Resource, key: str, groups: Sequence[Resource]) -> list[Resource]:
    """The stack's security groups a resource is given under `key` (by dependency first: ids may be unknown)."""
    found = [g for g in groups if g.urn in resource.dependencies]
    rest = [g for g in groups if g not in found and g.id]
    if rest:
        ids = {str(v) for v in as_list(resource.inputs.get(key))}
        found += [g for g in rest if g.id in ids]
    return found


def _rules_of(group: Resource, rules: Sequence[Resource], groups: Sequence[Resource]) -> list[Resource]:
    """Rule resources of a group (not rules of other groups that name it as their peer)."""

    def owned(rule: Resource) -> bool:
        if group.id:  # known ids (plan exports, existing groups): the rule names its own group
            return rule.inputs.get("securityGroupId") == group.id
        if rule.parent:  # dlinfra parents every rule to its group (components/security_groups.py)
            return rule.parent == group.urn
        # Unknown ids and no parent: a rule that depends on this group and no other can only be its.
        return group.urn in rule.dependencies and not any(
            g.urn in rule.dependencies for g in groups if g.urn != group.urn
        )

    return [r for r in rules if owned(r)]


def sg_rules_before_validating_resources(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """What AWS validates against security-group rules at create time depends on those rules.

    Rules declared as their own resources are created in parallel with whatever uses their group unless it
    depends on them; FSx for Lustre then refuses to create the file system (sources: VALIDATES_GROUP_RULES).
    """
    groups = [r for r in resources if r.type == SECURITY_GROUP]
    rules = [r for r in resources if r.type in RULE_TYPES]
    out: list[Violation] = []
    for resource in resources:
        key = VALIDATES_GROUP_RULES.get(resource.type)
        if key is None:
            continue
        for group in _groups_of(resource, key, groups):
            missing = sorted(r.name for r in _rules_of(group, rules, groups) if r.urn not in resource.dependencies)
            if missing:
                out.append(
                    Violation(
                        resource.urn,
                        f"AWS checks the rules of security group {group.name} when it creates this resource, but it "
                        f"does not depend on {', '.join(missing)}: add them to depends_on, or the create can race them",
                    )
                )
    return out
