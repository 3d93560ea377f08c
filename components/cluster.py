"""Cluster: an EKS control plane with API-mode access entries, a private endpoint, every control-plane log,
secrets encryption, remote networks for the physical sites and pinned managed add-ons.

The Kubernetes objects inside the cluster belong to the in-cluster stack (stacks/in_cluster.py), which builds
its Kubernetes provider from this cluster's outputs read through StackReference (`kubeconfig_json`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pulumi
import pulumi_aws as aws

from components import security_groups as sg
from components.efs_policy import access_point_pattern, node_mount_policy
from components.iam import pod_identity_trust, protected_key, service_trust
from dlinfra.model import dns, eks
from dlinfra.model.naming import Names

NODE_PREREQUISITE_ADDONS = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent")
LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")
ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
# Read-only like Kubernetes' `view` role, which leaves out Secrets (AmazonEKSAdminViewPolicy would include them).
# Source: Amazon EKS user guide, "Review access policy permissions".
VIEW_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy"
# Add-ons that call AWS APIs, with the service account Pod Identity binds and the managed policy they need.
ADDON_IDENTITIES = {
    "vpc-cni": ("aws-node", "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"),
    "aws-efs-csi-driver": ("efs-csi-controller-sa", "arn:aws:iam::aws:policy/service-role/AmazonEFSCSIDriverPolicy"),
}
# The EFS CSI node DaemonSet's service account: with the `iam` mount option it mounts as this account's IAM identity
# (aws-efs-csi-driver docs/parameters.md: "iam: Use the CSI Node Pod's IAM identity"; efs-utils reads Pod Identity
# credentials since v2.3.0, which the add-on's v2.1.10 image bundles).
EFS_CSI_NODE_SA = "efs-csi-node-sa"


@dataclass(frozen=True, kw_only=True)
class ClusterArgs:
    names: Names  # naming and tags of this stack
    version: str  # Kubernetes minor version EKS offers and dlinfra pins add-ons for, e.g. "1.33"
    upgrade_policy: Literal[
        "standard", "extended"
    ]  # support EKS keeps the version on (fleet: kubernetes.upgrade_policy)
    vpc_id: pulumi.Input[str]
    subnet_ids: Mapping[str, pulumi.Input[str]]  # AZ -> private subnet id for the control-plane ENIs
    service_cidr: str  # from the address plan (service/<env>/<region>)
    api_client_cidrs: Sequence[str]  # may reach the private endpoint: VPC, site LANs, laptop VPN pool
    remote_node_cidrs: Sequence[str] = ()  # site LANs of the sites homed here (EKS Hybrid Nodes)
    remote_pod_cidrs: Sequence[str] = ()  # pod CIDRs of those sites
    public_access_cidrs: Sequence[str] = ()  # empty: private endpoint only
    admin_role_arns: Sequence[str] = ()  # cluster-admin access entries
    ci_apply_role_arn: str | None = None  # role apply.yml assumes: cluster admin, to apply the in-cluster stack
    ci_preview_role_arn: str | None = None  # role the previews assume: view only, no Secrets
    hybrid_role_arn: pulumi.Input[str] | None = None  # role of the site machines (HYBRID_LINUX)
    team_role_arns: Mapping[str, str] = field(default_factory=dict)  # team -> role, bound to group team:<name>
    log_retention_days: int = 365  # control-plane logs are audit records: keep a year
    log_kms_key_arn: pulumi.Input[str] | None = None  # KMS key the control-plane log group is encrypted with
    # The node security group every pool carries: who may open connections to nodes and pods.
    node_peer_cidrs: Sequence[str] = ()  # other regions' VPCs, site LANs and hybrid pods: any traffic
    laptop_security_group_id: pulumi.Input[str] | None = None  # Client VPN interfaces: TCP on any port
    lustre_security_group_id: pulumi.Input[str] | None = None  # FSx for Lustre servers: 988 and 1018-1023
    # The EFS file system the CSI node mounts with IAM (Storage.efs_arn); None: the node gets no EFS permission.
    efs_file_system_arn: pulumi.Input[str] | None = None
    efs_read_only_access_point_arns: Sequence[pulumi.Input[str]] = ()  # mounted, never written (the datasets)
    # The region at its largest (every pool at max_size, every site machine): bounds CoreDNS's autoscaler.
    max_nodes: int = 0
    max_cores: int = 0

    def __post_init__(self) -> None:
        problem = eks.version_problem(self.version)
        if problem:
            raise ValueError(f"version: {problem}")
        if len(self.subnet_ids) < 2:
            raise ValueError(f"subnet_ids: EKS needs subnets in at least two AZs, got {len(self.subnet_ids)}")
        ci_roles = [r for r in (self.ci_apply_role_arn, self.ci_preview_role_arn) if r is not None]
        for arn in ci_roles:
            if arn in self.admin_role_arns:
                raise ValueError(f"ci role {arn}: already an admin role; a principal has one access entry")
        if len(set(ci_roles)) != len(ci_roles):
            raise ValueError("ci_apply_role_arn and ci_preview_role_arn: previews must not use the apply role")
        if self.max_nodes < 0 or self.max_cores < 0:
            raise ValueError(f"max_nodes/max_cores: must be >= 0, got {self.max_nodes}/{self.max_cores}")
        if bool(self.remote_node_cidrs) != bool(self.remote_pod_cidrs):
            raise ValueError("remote_node_cidrs and remote_pod_cidrs: give both (hybrid nodes) or neither")


def team_group(team: str) -> str:
    """The Kubernetes group a team's IAM role is mapped to; the platform binds RBAC to it."""
    return f"team:{team}"


class Cluster(pulumi.ComponentResource):
    """EKS control plane, access entries and managed add-ons."""

    name: pulumi.Output[str]
    arn: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    certificate_authority: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    oidc_issuer: pulumi.Output[str]
    join_prerequisites: list[pulumi.Resource]  # what node groups must wait for before launching nodes

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:cluster:Cluster", name, None, opts)
        names = args.names
        child = pulumi.ResourceOptions(parent=self)
        cluster_name = names.physical("eks")
        tags = names.tags("cluster")

        # Losing the secrets key makes every Kubernetes secret unreadable.
        key = protected_key(
            f"{name}-secrets-key",
            description=f"{cluster_name} Kubernetes secrets",
            tags=names.tags("cluster", names.physical("eks-secrets")),
            parent=self,
        )
        role = aws.iam.Role(
            f"{name}-role",
            name=names.physical("eks-cluster", max_len=64),
            assume_role_policy=service_trust("eks.amazonaws.com", tag_session=True),
            tags=tags,
            opts=child,
        )
        attach = aws.iam.RolePolicyAttachment(
            f"{name}-cluster-policy",
            role=role.name,
            policy_arn="arn:aws:iam::aws:policy/AmazonEKSClusterPolicy",
            opts=pulumi.ResourceOptions(parent=role),
        )
        # EKS encrypts secrets with the key as the cluster role; grant exactly that, on this key only.
        secrets_access = aws.iam.RolePolicy(
            f"{name}-secrets-key-access",
            role=role.id,
            policy=pulumi.Output.json_dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ListGrants", "kms:DescribeKey"],
                            "Resource": key.arn,
                        }
                    ],
                }
            ),
            opts=pulumi.ResourceOptions(parent=role),
        )
        # Created before the cluster so retention applies from the first log line.
        logs = aws.cloudwatch.LogGroup(
            f"{name}-logs",
            name=f"/aws/eks/{cluster_name}/cluster",
            retention_in_days=args.log_retention_days,
            kms_key_id=args.log_kms_key_arn,
            tags=tags,
            opts=child,
        )
        sg_name = names.physical("eks-api")
        api_sg = aws.ec2.SecurityGroup(
            f"{name}-api-sg",
            name=sg_name,
            description="Kubernetes API from the VPC, site LANs and the laptop VPN",
            vpc_id=args.vpc_id,
            tags=names.tags("cluster", sg_name),
            opts=child,
        )
        for cidr in sorted(args.api_client_cidrs):
            sg.rule(
                f"{name}-api-from-{sg.cidr_key(cidr)}", "ingress", group=api_sg, peer=sg.Peer(cidr=cidr),
                description="Kubernetes API (private endpoint)", names=names, component="cluster", protocol="tcp",
                ports=(443, 443),
            )  # fmt: skip
        remote = None
        if args.remote_node_cidrs:
            remote = aws.eks.ClusterRemoteNetworkConfigArgs(
                remote_node_networks=aws.eks.ClusterRemoteNetworkConfigRemoteNodeNetworksArgs(
                    cidrs=list(args.remote_node_cidrs)
                ),
                remote_pod_networks=aws.eks.ClusterRemoteNetworkConfigRemotePodNetworksArgs(
                    cidrs=list(args.remote_pod_cidrs)
                ),
            )
        cluster = aws.eks.Cluster(
            f"{name}-eks",
            name=cluster_name,
            version=args.version,
            role_arn=role.arn,
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API", bootstrap_cluster_creator_admin_permissions=False
            ),
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=[args.subnet_ids[az] for az in sorted(args.subnet_ids)],
                security_group_ids=[api_sg.id],
                endpoint_private_access=True,
                endpoint_public_access=bool(args.public_access_cidrs),
                public_access_cidrs=list(args.public_access_cidrs) or None,
            ),
            kubernetes_network_config=aws.eks.ClusterKubernetesNetworkConfigArgs(
                service_ipv4_cidr=args.service_cidr, ip_family="ipv4"
            ),
            remote_network_config=remote,
            enabled_cluster_log_types=list(LOG_TYPES),
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=key.arn), resources=["secrets"]
            ),
            # Explicit, from the fleet: what EKS does when standard support ends (dlinfra/data/eks.yaml dates).
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type=args.upgrade_policy.upper()),
            bootstrap_self_managed_addons=False,
            tags=names.tags("cluster", cluster_name),
            # Deleting or replacing the cluster loses every Kubernetes object in it.
            opts=pulumi.ResourceOptions(parent=self, protect=True, depends_on=[attach, secrets_access, logs]),
        )
        # Access entries, add-ons and add-on roles are the component's children, not the cluster's: a child
        # inherits `protect`, and removing a team, an admin or a site's hybrid access must be appliable. The
        # alias keeps the URNs they had under the cluster, so nothing is replaced by the move.
        on_cluster = pulumi.ResourceOptions(parent=self, protect=False, aliases=[pulumi.Alias(parent=cluster)])

        entries = {f"admin-{_role_key(arn)}": (arn, ADMIN_POLICY) for arn in args.admin_role_arns}
        if args.ci_apply_role_arn is not None:
            entries["ci-apply"] = (args.ci_apply_role_arn, ADMIN_POLICY)
        if args.ci_preview_role_arn is not None:
            entries["ci-preview"] = (args.ci_preview_role_arn, VIEW_POLICY)
        for entry_key, (arn, access_policy) in entries.items():
            entry = aws.eks.AccessEntry(
                f"{name}-{entry_key}", cluster_name=cluster.name, principal_arn=arn, type="STANDARD", tags=tags,
                opts=on_cluster,
            )  # fmt: skip
            aws.eks.AccessPolicyAssociation(
                f"{name}-{entry_key}-policy",
                cluster_name=cluster.name,
                principal_arn=arn,
                policy_arn=access_policy,
                access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                opts=pulumi.ResourceOptions(parent=entry),
            )
        if args.hybrid_role_arn is not None:
            aws.eks.AccessEntry(
                f"{name}-hybrid-nodes", cluster_name=cluster.name, principal_arn=args.hybrid_role_arn,
                type="HYBRID_LINUX", tags=tags, opts=on_cluster,
            )  # fmt: skip
        for team, team_role in sorted(args.team_role_arns.items()):
            aws.eks.AccessEntry(
                f"{name}-team-{team}", cluster_name=cluster.name, principal_arn=team_role, type="STANDARD",
                kubernetes_groups=[team_group(team)], tags=tags, opts=on_cluster,
            )  # fmt: skip

        efs_node = self._efs_node_identity(name, args, cluster.name, on_cluster)
        versions = eks.addon_versions(args.version)
        addons: dict[str, aws.eks.Addon] = {}
        for addon in eks.ADDONS:
            identities = None
            if addon in ADDON_IDENTITIES:
                service_account, policy = ADDON_IDENTITIES[addon]
                addon_role = aws.iam.Role(
                    f"{name}-{addon}-role",
                    name=names.physical("eks", addon, max_len=64),
                    # Only this add-on's service account in this cluster may assume it.
                    assume_role_policy=pulumi.Output.json_dumps(
                        pod_identity_trust(cluster.name, "kube-system", service_account)
                    ),
                    tags=tags,
                    opts=on_cluster,
                )
                aws.iam.RolePolicyAttachment(
                    f"{name}-{addon}-policy", role=addon_role.name, policy_arn=policy,
                    opts=pulumi.ResourceOptions(parent=addon_role),
                )  # fmt: skip
                identities = [
                    aws.eks.AddonPodIdentityAssociationArgs(role_arn=addon_role.arn, service_account=service_account)
                ]
            addons[addon] = aws.eks.Addon(
                f"{name}-{addon}",
                cluster_name=cluster.name,
                addon_name=addon,
                addon_version=versions[addon],
                resolve_conflicts_on_create="OVERWRITE",
                resolve_conflicts_on_update="PRESERVE",
                pod_identity_associations=identities,
                # CoreDNS scales with nodes and cores, spreads over AZs and stays on cloud nodes (dlinfra/model/dns.py).
                configuration_values=json.dumps(dns.coredns_configuration(args.max_nodes, args.max_cores))
                if addon == "coredns"
                else None,
                tags=tags,
                # The node DaemonSet's pods get Pod Identity credentials only if the association exists when
                # they start (EKS guide, "Pod Identity": the webhook mutates pods at creation).
                opts=on_cluster.merge(
                    pulumi.ResourceOptions(depends_on=[efs_node] if addon == "aws-efs-csi-driver" and efs_node else [])
                ),
            )

        self.node_security_group_id = self._node_group(name, args, cluster.vpc_config)

        # Nodes may only start once they can join and get pod networking; CoreDNS and the EFS driver become
        # ready after nodes exist, so nodes must not wait for them.
        self.join_prerequisites = [cluster, *(addons[a] for a in NODE_PREREQUISITE_ADDONS)]
        self.name = cluster.name
        self.arn = cluster.arn
        self.endpoint = cluster.endpoint
        self.certificate_authority = cluster.certificate_authority.apply(lambda ca: ca.data or "")
        self.security_group_id = cluster.vpc_config.apply(lambda v: v.cluster_security_group_id or "")
        self.oidc_issuer = cluster.identities.apply(
            lambda ids: (ids[0].oidcs[0].issuer or "") if ids and ids[0].oidcs else ""
        )
        self.register_outputs(
            {
                "name": self.name,
                "arn": self.arn,
                "endpoint": self.endpoint,
                "certificate_authority": self.certificate_authority,
                "security_group_id": self.security_group_id,
                "node_security_group_id": self.node_security_group_id,
                "oidc_issuer": self.oidc_issuer,
            }
        )

    def _efs_node_identity(
        self, name: str, args: ClusterArgs, cluster_name: pulumi.Output[str], opts: pulumi.ResourceOptions
    ) -> aws.eks.PodIdentityAssociation | None:
        """The EFS CSI node's own IAM role, so `iam` mounts need nothing from the EC2 node role.

        A standalone Pod Identity association, not the add-on's: add-ons before v3.0.0-eksbuild.1 take
        associations for the controller's service account only (re:Post, "How to use a dedicated IAM role with the
        EFS CSI driver node component in Amazon EKS using Pod Identity").
        """
        if args.efs_file_system_arn is None:
            return None
        names = args.names
        invoke = pulumi.InvokeOutputOptions(parent=self)
        pattern = access_point_pattern(
            aws.get_partition_output(opts=invoke).partition,
            names.region or "",
            aws.get_caller_identity_output(opts=invoke).account_id,
        )
        role_name = names.physical("eks", "efs-csi-node", max_len=64)
        role = aws.iam.Role(
            f"{name}-efs-csi-node-role",
            name=role_name,
            assume_role_policy=pulumi.Output.json_dumps(
                pod_identity_trust(cluster_name, "kube-system", EFS_CSI_NODE_SA)
            ),
            tags=names.tags("cluster", role_name),
            opts=opts,
        )
        policy = aws.iam.RolePolicy(
            f"{name}-efs-csi-node-policy",
            role=role.name,
            name="efs-mount",
            policy=pulumi.Output.json_dumps(
                node_mount_policy(args.efs_file_system_arn, pattern, list(args.efs_read_only_access_point_arns))
            ),
            opts=pulumi.ResourceOptions(parent=role),
        )
        return aws.eks.PodIdentityAssociation(
            f"{name}-efs-csi-node-identity",
            cluster_name=cluster_name,
            namespace="kube-system",
            service_account=EFS_CSI_NODE_SA,
            role_arn=role.arn,
            tags=names.tags("cluster", role_name),
            opts=pulumi.ResourceOptions(parent=role, depends_on=[policy]),
        )

    def _node_group(self, name: str, args: ClusterArgs, vpc_config: pulumi.Output[Any]) -> pulumi.Output[str]:
        """The security group on every node of every pool: pods of all pools, and who else may reach them.

        With the VPC CNI a pod has its node's security groups, so this decides pod reachability too. Each rule
        carries a flow `dlinfra reach` derives from the fleet (docs/reachability.md): pods of every pool reach
        CoreDNS and each other (EKS guide "View Amazon EKS security group requirements for clusters"); sites,
        hybrid pods and other regions reach nodes and pods ("Networking concepts for hybrid nodes"); laptops
        reach their jobs; FSx for Lustre servers reach their clients ("File system access control with Amazon
        VPC"). Nothing else is admitted.
        """
        names = args.names
        sg_name = names.physical("nodes")
        group = aws.ec2.SecurityGroup(
            f"{name}-nodes-sg",
            name=sg_name,
            description="Every node and pod of the cluster: pods of all pools, sites, regions, laptops",
            vpc_id=args.vpc_id,
            tags=names.tags("cluster", sg_name),
            opts=pulumi.ResourceOptions(parent=self),
        )

        def rule(
            key: str, peer: sg.Peer, description: str, protocol: str = "-1", ports: tuple[int, int] | None = None
        ) -> None:
            sg.rule(
                f"{name}-nodes-{key}", "ingress", group=group, peer=peer, description=description, names=names,
                component="cluster", protocol=protocol, ports=ports,
            )  # fmt: skip

        rule("self", sg.Peer(security_group_id=group.id), "pods and nodes of every pool: DNS, services, NCCL")
        control_plane = vpc_config.apply(lambda v: v.cluster_security_group_id or "")
        rule("from-cluster", sg.Peer(security_group_id=control_plane), "EKS control plane to kubelet and webhooks")
        for cidr in sorted(set(args.node_peer_cidrs)):
            rule(f"from-{sg.cidr_key(cidr)}", sg.Peer(cidr=cidr), "other regions, site LANs and hybrid pods")
        if args.laptop_security_group_id is not None:
            rule("from-laptops", sg.Peer(security_group_id=args.laptop_security_group_id),
                 "laptops on the Client VPN: notebooks, TensorBoard, port-forwards", "tcp", (0, 65535))  # fmt: skip
        if args.lustre_security_group_id is not None:
            servers = sg.Peer(security_group_id=args.lustre_security_group_id)
            for lo, hi in ((988, 988), (1018, 1023)):
                rule(f"from-lustre-{lo}", servers, "FSx for Lustre servers to their clients", "tcp", (lo, hi))
        return group.id


def _role_key(arn: str) -> str:
    """A stable logical-name fragment for an IAM role ARN: its name, lower-case."""
    return arn.rsplit("/", 1)[-1].lower()


def kubeconfig_json(cluster_name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig that authenticates with `aws eks get-token` (no long-lived credentials in state)."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}
            ],
            "users": [
                {
                    "name": cluster_name,
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": "aws",
                            "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region],
                        }
                    },
                }
            ],
            "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
            "current-context": cluster_name,
        }
    )
