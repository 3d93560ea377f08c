"""Every rule with its name, level and description, in the order the pack and `dlinfra check` run and report them."""

from __future__ import annotations

from . import (
    capacity_blocks,
    ci,
    cluster,
    compute,
    conventions,
    dev_boxes,
    gpu_health,
    iam,
    network,
    platform,
    provisioning,
    state,
    storage,
    vpn,
)
from .core import ResourceRule, StackRule

# `dlinfra check` lists findings in this order and the pack builds its policies in it: append, never reorder.
RULES: tuple[ResourceRule | StackRule, ...] = (
    StackRule(
        "multikueue-wired",
        "MultiKueue checks, configs and clusters are wired as Kueue requires",
        "mandatory",
        platform.multikueue_wired,
    ),
    ResourceRule(
        "ebs-encrypted",
        "EBS volumes and launch template block devices are encrypted",
        "mandatory",
        storage.ebs_encrypted,
    ),
    ResourceRule("efs-encrypted", "EFS file systems are encrypted at rest", "mandatory", storage.efs_encrypted),
    StackRule(
        "s3-encrypted", "S3 buckets have a server-side encryption configuration", "mandatory", storage.s3_encrypted
    ),
    ResourceRule(
        "fsx-encrypted", "FSx file systems use a customer-managed KMS key", "mandatory", storage.fsx_encrypted
    ),
    ResourceRule(
        "eks-secrets-encrypted",
        "EKS clusters encrypt Kubernetes secrets with KMS",
        "mandatory",
        cluster.eks_secrets_encrypted,
    ),
    StackRule("s3-no-public-access", "S3 buckets block all public access", "mandatory", storage.s3_no_public_access),
    ResourceRule(
        "imdsv2-required", "Launch templates and instances require IMDSv2", "mandatory", compute.imdsv2_required
    ),
    ResourceRule(
        "no-world-ingress",
        "No security-group ingress from anywhere outside the allowlist",
        "mandatory",
        network.no_world_ingress,
    ),
    StackRule(
        "vpc-cidr-planned",
        "VPC CIDRs are the planned, disjoint blocks of the address plan",
        "mandatory",
        network.vpc_cidrs_planned,
    ),
    ResourceRule(
        "stateful-protected", "Stateful resources are protected against deletion", "mandatory", state.stateful_protected
    ),
    ResourceRule(
        "protect-only-stateful", "Only resources that hold data are protected", "mandatory", state.protect_only_stateful
    ),
    ResourceRule(
        "required-tags", "Taggable AWS resources carry dlinfra's standard tags", "mandatory", conventions.required_tags
    ),
    StackRule(
        "gpu-pool-scale-from-zero",
        "GPU pools carry cluster-autoscaler scale-from-zero tags",
        "mandatory",
        compute.gpu_pools_scale_from_zero,
    ),
    ResourceRule(
        "vpn-strong-crypto", "Site VPN tunnels are IKEv2 only with strong proposals", "mandatory", vpn.vpn_strong_crypto
    ),
    StackRule("vpc-flow-logs", "Every VPC has a flow log", "advisory", network.vpc_flow_logs),
    ResourceRule(
        "client-vpn-connection-logs", "Client VPN endpoints log connections", "advisory", vpn.client_vpn_connection_logs
    ),
    ResourceRule("sg-no-inline-rules", "Security groups have no inline rules", "mandatory", network.sg_no_inline_rules),
    ResourceRule(
        "nodes-cluster-owned-tag",
        "Node groups tag instances kubernetes.io/cluster/<name>=owned",
        "mandatory",
        compute.nodes_cluster_owned,
    ),
    ResourceRule(
        "service-trust-scoped",
        "Roles SSM or CodeBuild assume are scoped to this account and source",
        "mandatory",
        iam.service_trust_scoped,
    ),
    StackRule(
        "s3-access-logs-delivered",
        "Buckets that receive access logs admit the S3 logging service and use SSE-S3",
        "mandatory",
        storage.s3_access_logs_delivered,
    ),
    ResourceRule(
        "eks-version-supported",
        "EKS clusters name their upgrade policy and run a version it still supports",
        "mandatory",
        cluster.eks_version_supported,
    ),
    ResourceRule(
        "eks-version-support-ending",
        "EKS cluster versions are not about to leave the support their upgrade policy pays for",
        "advisory",
        cluster.eks_version_support_ending,
    ),
    ResourceRule(
        "ssm-activation-expiry-in-range",
        "SSM activations for hybrid nodes expire at most 30 days ahead, as CreateActivation requires",
        "mandatory",
        cluster.ssm_activation_expiry_in_range,
    ),
    ResourceRule(
        "ssm-activation-not-expired",
        "SSM activations for hybrid nodes have not expired (a replacement with a past date is refused)",
        "advisory",
        cluster.ssm_activation_not_expired,
    ),
    StackRule(
        "server-cert-domain-san",
        "Server certificates name a domain in their subject alternative names",
        "mandatory",
        vpn.server_certificates_name_a_domain,
    ),
    ResourceRule(
        "client-vpn-revocable",
        "Client VPN certificate sign-in can refuse a removed person",
        "mandatory",
        vpn.client_vpn_revocable,
    ),
    ResourceRule(
        "explicit-provider",
        "AWS and Kubernetes resources use an explicit provider, in the regional stack's own region",
        "mandatory",
        conventions.explicit_provider,
    ),
    StackRule(
        "gpu-pools-no-auto-refresh",
        "GPU pools never replace running nodes by themselves (instance refresh, lifetime, AZ rebalance)",
        "mandatory",
        compute.gpu_pools_no_auto_refresh,
    ),
    ResourceRule(
        "team-namespaces-pod-security",
        "Team namespaces enforce the baseline or restricted Pod Security Standard",
        "mandatory",
        platform.team_namespaces_pod_security,
    ),
    ResourceRule(
        "drain-taints-not-tolerated",
        "Kueue flavors and workloads do not tolerate the maintenance, interruption or cordon taints",
        "mandatory",
        platform.drain_taints_not_tolerated,
    ),
    ResourceRule(
        "ci-runner-webhook-narrowed",
        "CodeBuild runner webhooks admit only their workflow's jobs (exact WORKFLOW_NAME) from listed accounts "
        "(ACTOR_ACCOUNT_ID), and hold no filter CodeBuild does not evaluate on workflow jobs (HEAD_REF)",
        "mandatory",
        ci.runner_webhook_narrowed,
    ),
    StackRule(
        "sg-rules-before-validating-resources",
        "Resources AWS checks against security-group rules at create time (FSx for Lustre) depend on those rules",
        "mandatory",
        network.sg_rules_before_validating_resources,
    ),
    StackRule(
        "reserved-capacity-no-placement-group",
        "Nothing on a Capacity Block, or on a reservation made outside placement groups, names a placement group",
        "mandatory",
        compute.reserved_capacity_no_placement_group,
    ),
    StackRule(
        "efs-file-system-policy",
        "EFS file systems have a policy that denies clients without TLS or an access point and locks out no API caller",
        "mandatory",
        storage.efs_file_system_policy,
    ),
    StackRule(
        "team-namespaces-volume-policy",
        "Team namespaces are covered by an admission policy that denies inline nfs and host volumes",
        "mandatory",
        platform.team_namespaces_volume_policy,
    ),
    StackRule(
        "gpu-pods-queued",
        "GPU workloads in team namespaces go through Kueue, and an admission policy refuses those that do not",
        "mandatory",
        platform.gpu_pods_queued,
    ),
    StackRule(
        "drain-outlasts-checkpoint-grace",
        "Every disruption waits for a job's checkpoint grace: each pool's termination hook outlasts its grace plus the "
        "drain margin, the termination handler's drain and the autoscaler's eviction the largest grace, and the "
        "autoscaler never scales down a node with a GPU requested",
        "mandatory",
        compute.drain_outlasts_checkpoint_grace,
    ),
    StackRule(
        "team-namespaces-have-local-queue",
        "Every team namespace has the LocalQueue `default` feeding a ClusterQueue, also where there are no GPUs",
        "mandatory",
        platform.team_namespaces_have_local_queue,
    ),
    StackRule(
        "gpu-queues-provision-whole",
        "Jobs on autoscaled GPU pools are admitted only once the autoscaler takes all their nodes, and evicted whole "
        "when the nodes come in part",
        "mandatory",
        provisioning.gpu_queues_provision_whole,
    ),
    StackRule(
        "gpu-nodes-burn-in",
        "GPU nodes register with the burn-in taint and start the GPU check; every cluster runs the agent that takes "
        "the taint off, held to its own node, and the autoscaler and Kueue wait for the burn-in",
        "mandatory",
        gpu_health.gpu_nodes_burn_in,
    ),
    StackRule(
        "gpu-node-model-labels",
        "GPU nodes register with valid dlinfra.io/gpu-model and nvidia.com/gpu.product labels, the same as their "
        "pool's scale-from-zero template, and Kueue flavors select dlinfra's own",
        "mandatory",
        gpu_health.gpu_node_model_labels,
    ),
    StackRule(
        "gpu-nodes-repaired",
        "A GPU node put off work is repaired by one controller, a share of its pool at a time, held to its annotation; "
        "the agent reaches the host's repair directory; nodes mark unhealthy only their own group's instances",
        "mandatory",
        gpu_health.gpu_nodes_repaired,
    ),
    StackRule(
        "capacity-block-closes-before-cut",
        "Pools on Capacity Blocks are open only inside the block's window, kept every minute and drained before EC2's "
        "30-minute cut, and the block's expiration warning reaches the keeper",
        "mandatory",
        capacity_blocks.capacity_block_closes_before_cut,
    ),
    StackRule(
        "shared-gpu-pools-advertise-shares",
        "Shared GPU pools (MIG or time-sliced) advertise their shares, not whole GPUs, in the autoscaler's "
        "scale-from-zero template",
        "mandatory",
        compute.shared_gpu_pools_advertise_shares,
    ),
    ResourceRule("dev-box-private", "Dev boxes ask for no public address", "mandatory", dev_boxes.dev_box_private),
    StackRule(
        "dev-box-ssh-from-vpn-only",
        "Dev boxes admit SSH from the laptop VPN endpoint's security group and nothing else",
        "mandatory",
        dev_boxes.dev_box_ssh_from_vpn_only,
    ),
    ResourceRule(
        "dev-box-stops-on-shutdown",
        "A dev box's own poweroff stops it, never terminates it",
        "mandatory",
        dev_boxes.dev_box_stops_on_shutdown,
    ),
    StackRule(
        "dev-box-idle-stop",
        "Every dev box has a CloudWatch alarm that stops it when its idle check reported idle (never on the CPU or on "
        "missing data), within CloudWatch's limits",
        "mandatory",
        dev_boxes.dev_box_idle_stop,
    ),
    ResourceRule(
        "dev-box-type-offered",
        "A dev box's instance type is sold in its region",
        "mandatory",
        dev_boxes.dev_box_type_offered,
    ),
    ResourceRule(
        "no-policy-on-identity-center-role",
        "No policy is put on or attached to an IAM Identity Center role (AWSReservedSSO_*): IAM refuses it",
        "mandatory",
        iam.no_policy_on_identity_center_role,
    ),
    ResourceRule(
        "instance-metadata-tag-keys",
        "Instances that serve their tags through the instance metadata have only tag keys it accepts",
        "mandatory",
        dev_boxes.instance_metadata_tag_keys,
    ),
)
