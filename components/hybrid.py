"""HybridNodes: how a site's physical GPU machines join the region's EKS cluster as hybrid nodes.

Credentials come from AWS Systems Manager hybrid activations, not IAM Roles Anywhere: activations need no
PKI of our own, nodeadm supports them directly, and the SSM agent they install also gives the infra team
Session Manager access to site machines. An activation only limits new registrations (count and expiry);
machines that registered keep their identity, so adding machines later means a new activation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from components.iam import scoped_service_trust
from dlinfra.model.naming import Names

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
    # site -> RFC 3339 instant its activation stops registering machines; absent: AWS's 24 hours after creation
    activation_expiry: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for site, count in self.machines.items():
            if not 1 <= count <= 1000:
                raise ValueError(f"machines.{site}: {count} is outside 1..1000 (SSM activation registration limit)")
        for site in self.activation_expiry:
            if site not in self.machines:
                raise ValueError(f"activation_expiry.{site}: no machines of that site register here")


class HybridNodes(pulumi.ComponentResource):
    """The hybrid node IAM role and one SSM activation per site."""

    role_arn: pulumi.Output[str]
    activations: pulumi.Output[dict[str, dict[str, str]]]  # site -> {id, code}; the code is a secret

    def __init__(self, name: str, args: HybridNodesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:cluster:HybridNodes", name, None, opts)
        names = args.names
        tags = names.tags("hybrid-nodes")
        invoke = pulumi.InvokeOutputOptions(parent=self)
        account_id = aws.get_caller_identity_output(opts=invoke).account_id
        partition = aws.get_partition_output(opts=invoke).partition
        ssm_arn = pulumi.Output.concat("arn:", partition, ":ssm:", names.region or "", ":", account_id, ":")
        role = aws.iam.Role(
            f"{name}-role",
            name=names.physical("hybrid-nodes", max_len=64),
            # Only SSM acting for this account's activations in this region (confused-deputy protection), as the
            # EKS guide "Prepare credentials for hybrid nodes" gives it.
            assume_role_policy=pulumi.Output.json_dumps(
                scoped_service_trust("ssm.amazonaws.com", account_id, pulumi.Output.concat(ssm_arn, "*"))
            ),
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        for key, arn in HYBRID_POLICIES.items():
            aws.iam.RolePolicyAttachment(
                f"{name}-{key}", role=role.name, policy_arn=arn, opts=pulumi.ResourceOptions(parent=role)
            )
        # nodeadm reads the cluster's endpoint and CA itself (DescribeCluster on this cluster only), and
        # `nodeadm uninstall` deregisters the machine from SSM when a site takes it out.
        aws.iam.RolePolicy(
            f"{name}-describe-cluster",
            role=role.id,
            policy=pulumi.Output.json_dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {"Sid": "DescribeCluster", "Effect": "Allow", "Action": "eks:DescribeCluster",
                         "Resource": args.cluster_arn},
                        {"Sid": "UninstallDescribe", "Effect": "Allow", "Action": "ssm:DescribeInstanceInformation",
                         "Resource": "*"},  # a List/Describe action without resource-level scoping
                        # Only machines registered for this cluster: managed instances inherit their activation's
                        # tags, and each activation carries the cluster's ARN (EKS hybrid-nodes credentials guide).
                        {"Sid": "UninstallDeregister", "Effect": "Allow", "Action": "ssm:DeregisterManagedInstance",
                         "Resource": pulumi.Output.concat(ssm_arn, "managed-instance/*"),
                         "Condition": {"StringEquals": {"ssm:resourceTag/EKSClusterARN": args.cluster_arn}}},
                    ],
                }
            ),
            opts=pulumi.ResourceOptions(parent=role),
        )  # fmt: skip
        activations: dict[str, pulumi.Output[dict[str, str]]] = {}
        for site, count in sorted(args.machines.items()):
            activation = aws.ssm.Activation(
                f"{name}-{site}",
                name=names.physical("hybrid", site),
                description=f"EKS hybrid nodes of site {site}",
                iam_role=role.name,
                registration_limit=count,
                expiration_date=args.activation_expiry.get(site),
                tags={**names.tags("hybrid-nodes", extra={"dlinfra:site": site}), "EKSClusterARN": args.cluster_arn},
                opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["activationCode"]),
            )
            activations[site] = pulumi.Output.all(activation.id, activation.activation_code).apply(
                lambda parts: {"id": parts[0], "code": parts[1]}
            )
        self.role_arn = role.arn
        self.activations = pulumi.Output.secret(pulumi.Output.all(**activations).apply(dict))
        self.register_outputs({"role_arn": self.role_arn, "activations": self.activations})
