"""HybridNodes: how a site's physical GPU machines join the region's EKS cluster as hybrid nodes.

Credentials come from AWS Systems Manager hybrid activations, not IAM Roles Anywhere: activations need no
PKI of our own, nodeadm supports them directly, and the SSM agent they install also gives the infra team
Session Manager access to site machines. An activation only limits new registrations (count and expiry);
machines that registered keep their identity, so adding machines later means a new activation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components.iam import service_trust
from dlinfra.naming import Names

HYBRID_POLICIES = {
    "ssm": "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
    "ecr": "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
}


@dataclass(frozen=True, kw_only=True)
class HybridNodesArgs:
    names: Names  # naming and tags of this stack
    cluster_name: pulumi.Input[str]
    cluster_arn: pulumi.Input[str]
    machines: Mapping[str, int]  # site -> number of machines that may register (its gpu_nodes)
    activation_expiry: str | None = None  # RFC 3339; None: AWS's default of 24 hours after creation

    def __post_init__(self) -> None:
        for site, count in self.machines.items():
            if not 1 <= count <= 1000:
                raise ValueError(f"machines.{site}: {count} is outside 1..1000 (SSM activation registration limit)")


class HybridNodes(pulumi.ComponentResource):
    """The hybrid node IAM role and one SSM activation per site."""

    role_arn: pulumi.Output[str]
    activations: pulumi.Output[dict[str, dict[str, str]]]  # site -> {id, code}; the code is a secret

    def __init__(self, name: str, args: HybridNodesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:cluster:HybridNodes", name, None, opts)
        names = args.names
        tags = names.tags("hybrid-nodes")
        role = aws.iam.Role(
            f"{name}-role",
            name=names.physical("hybrid-nodes", max_len=64),
            assume_role_policy=service_trust("ssm.amazonaws.com"),
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        for key, arn in HYBRID_POLICIES.items():
            aws.iam.RolePolicyAttachment(
                f"{name}-{key}", role=role.name, policy_arn=arn, opts=pulumi.ResourceOptions(parent=role)
            )
        # nodeadm reads the cluster's endpoint and CA itself: DescribeCluster on this cluster only.
        aws.iam.RolePolicy(
            f"{name}-describe-cluster",
            role=role.id,
            policy=pulumi.Output.from_input(args.cluster_arn).apply(
                lambda arn: json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [{"Effect": "Allow", "Action": "eks:DescribeCluster", "Resource": arn}],
                    }
                )
            ),
            opts=pulumi.ResourceOptions(parent=role),
        )
        activations: dict[str, pulumi.Output[dict[str, str]]] = {}
        for site, count in sorted(args.machines.items()):
            activation = aws.ssm.Activation(
                f"{name}-{site}",
                name=names.physical("hybrid", site),
                description=f"EKS hybrid nodes of site {site}",
                iam_role=role.name,
                registration_limit=count,
                expiration_date=args.activation_expiry,
                tags=names.tags("hybrid-nodes", extra={"dlinfra:site": site}),
                opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["activationCode"]),
            )
            activations[site] = pulumi.Output.all(activation.id, activation.activation_code).apply(
                lambda parts: {"id": parts[0], "code": parts[1]}
            )
        self.role_arn = role.arn
        self.activations = pulumi.Output.secret(pulumi.Output.all(**activations).apply(dict))
        self.register_outputs({"role_arn": self.role_arn, "activations": self.activations})
