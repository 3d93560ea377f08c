"""Security-group rules as separate resources (not a component): one rule per source or destination.

A security group never mixes inline `ingress`/`egress` blocks with separate rule resources: the provider then
fights itself, showing perpetual diffs and revoking rules the other declared (pulumi-aws `ec2.SecurityGroup`
docs, "NOTE on Security Groups and Security Group Rules"). dlinfra declares groups with no inline rules and
every rule through these helpers; the `sg-no-inline-rules` policy rule keeps it that way. A group created this
way has no egress until a rule says so (the provider removes AWS's default allow-all egress), and replies to
admitted traffic still flow, since security groups are stateful.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import pulumi
import pulumi_aws as aws

from dlinfra.model.naming import Names

Direction = Literal["ingress", "egress"]


@dataclass(frozen=True, kw_only=True)
class Peer:
    """The other side of a rule: a CIDR, another security group, or the group itself."""

    cidr: str | None = None  # IPv4 block, e.g. the VPC or a site LAN
    security_group_id: pulumi.Input[str] | None = None  # another group (or this one, for node-to-node)

    def __post_init__(self) -> None:
        if (self.cidr is None) == (self.security_group_id is None):
            raise ValueError("Peer: give exactly one of cidr and security_group_id")


def cidr_key(cidr: str) -> str:
    """A stable logical-name fragment for a CIDR (10.2.0.0/16 -> 10-2-0-0-16): CIDRs are never renumbered."""
    return re.sub(r"[^0-9a-z]+", "-", cidr.lower()).strip("-")


def rule(
    name: str,
    direction: Direction,
    *,
    group: aws.ec2.SecurityGroup,
    peer: Peer,
    description: str,
    names: Names,
    component: str,
    protocol: str = "-1",
    ports: tuple[int, int] | None = None,
) -> aws.vpc.SecurityGroupIngressRule | aws.vpc.SecurityGroupEgressRule:
    """One ingress or egress rule of `group`, a child of it; `protocol` "-1" means all (and takes no ports)."""
    if (protocol == "-1") != (ports is None):
        raise ValueError(f"{name}: protocol {protocol!r} {'takes no' if ports else 'needs'} ports")
    from_port, to_port = ports if ports else (None, None)
    opts = pulumi.ResourceOptions(parent=group)
    tags = names.tags(component, name)
    if direction == "ingress":
        return aws.vpc.SecurityGroupIngressRule(
            name, security_group_id=group.id, description=description, ip_protocol=protocol, from_port=from_port,
            to_port=to_port, cidr_ipv4=peer.cidr, referenced_security_group_id=peer.security_group_id, tags=tags,
            opts=opts,
        )  # fmt: skip
    return aws.vpc.SecurityGroupEgressRule(
        name, security_group_id=group.id, description=description, ip_protocol=protocol, from_port=from_port,
        to_port=to_port, cidr_ipv4=peer.cidr, referenced_security_group_id=peer.security_group_id, tags=tags,
        opts=opts,
    )  # fmt: skip
