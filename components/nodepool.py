"""NodePool: a GPU or CPU Auto Scaling group of Kubernetes nodes that scales from zero and drains before it goes."""

from __future__ import annotations

import base64
import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import pulumi
import pulumi_aws as aws

from components import security_groups as sg
from components.iam import service_trust
from components.node_user_data import render_user_data
from dlinfra.model import gpu_health, gpu_sharing, instances
from dlinfra.model.fleet.labels import DEVICE_PLUGIN_CONFIG_LABEL
from dlinfra.model.fleet.pools import (
    CHECKPOINT_GRACE_TAG,
    DEFAULT_CHECKPOINT_GRACE,
    DRAIN_MARGIN_SECONDS,
    RESERVATION_GROUP_TAG,
    GpuCheck,
    GpuSharing,
)
from dlinfra.model.naming import Names


def cluster_owned_tag(cluster_name: str) -> str:
    """The tag key that marks an instance as a node of the cluster (value `owned`)."""
    return f"kubernetes.io/cluster/{cluster_name}"


# Node role policies every node needs; the CNI policy only when the VPC CNI does not use Pod Identity.
WORKER_POLICIES = {
    "worker": "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "ecr": "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
    "ssm": "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
}
CNI_POLICY = "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"
ROOT_DEVICE = "/dev/sda1"  # Ubuntu AMIs boot from /dev/sda1
# The termination hook's longest hold: EC2 Auto Scaling's HeartbeatTimeout is 30..7200 seconds (API reference,
# PutLifecycleHook; user guide "Amazon EC2 Auto Scaling lifecycle hooks").
MAX_HOOK_TIMEOUT_SECONDS = 7200
AUTOSCALER_PREFIX = "k8s.io/cluster-autoscaler"
# Set on every node of an EFA pool: the EFA device plugin runs where this label is (components/charts/efa.py).
EFA_LABEL = "vpc.amazonaws.com/efa.present"  # in dlinfra.model.fleet.labels.OWN_LABELS: the fleet cannot set it


@dataclass(frozen=True, kw_only=True)
class NodePoolArgs:
    names: Names  # naming and tags of this stack
    pool: str  # pool name from the fleet file (stable: part of every child's name)
    kind: Literal["gpu", "cpu"]  # GPU pools must use GPU instance types only
    cluster_name: str  # EKS cluster the nodes join (physical name)
    ami_id: str  # from the images manifest for this variant and region
    instance_types: Sequence[str]  # first is preferred; several only for mixed-instances (spot) pools
    subnet_ids: Mapping[str, pulumi.Input[str]]  # AZ name -> private subnet id; EFA pools: exactly one
    vpc_id: pulumi.Input[str]  # for the node security group
    min_size: int = 0  # instances, per region
    max_size: int = 4  # instances, per region
    efa: bool = False  # EFA interfaces on every network card; on on-demand capacity, in one cluster placement group
    capacity_reservation_id: str | None = None  # target this reservation (or capacity block)
    capacity_block: bool = False  # the reservation is an EC2 capacity block (market type capacity-block)
    # The cluster placement group the reservation was created in (fleet: capacity_reservations.<region>
    # .placement_group); the nodes launch into it. None: no placement group on reserved capacity.
    reservation_placement_group: str | None = None
    spot: bool = False  # mixed instances: on-demand base, spot above it
    on_demand_base: int = 0  # with spot: instances always on demand
    on_demand_percentage_above_base: int = 0  # with spot: percent on demand above the base
    spot_allocation_strategy: str = "price-capacity-optimized"
    labels: Mapping[str, str] = field(default_factory=dict)  # Kubernetes node labels
    taints: Sequence[tuple[str, str, str]] = ()  # (key, value, effect)
    pod_imds_access: bool = False  # hop limit 2 lets pods reach IMDS; 1 keeps it to the node
    root_volume_gib: int = 200  # encrypted gp3 root volume size
    # Seconds the pool's pods may take to checkpoint (fleet: checkpoint_grace): the termination hook holds a
    # terminating instance this long plus DRAIN_MARGIN_SECONDS while the termination handler drains it.
    checkpoint_grace: int = DEFAULT_CHECKPOINT_GRACE
    # GPU pools: what each new node's burn-in runs before the burn-in taint comes off (fleet: gpu_check)
    gpu_check: GpuCheck = field(default_factory=GpuCheck)
    # What the nodes carry as nvidia.com/gpu.product (the environment's gpu_product_label): NVIDIA's product name, or
    # the short model name an environment keeps while admitted jobs select it (dlinfra.model.gpu_health.gpu_labels).
    gpu_product_label: gpu_health.ProductLabelStyle = "nvidia"
    # GPU pools: MIG instances or time-slicing instead of whole GPUs (fleet: gpu_sharing; dlinfra.model.gpu_sharing)
    gpu_sharing: GpuSharing | None = None
    attach_cni_policy: bool = False  # only when the VPC CNI has no Pod Identity association
    internal_cidrs: Sequence[str] = ()  # VPCs and site networks nodes may reach on any port
    # The cluster's group on every node (Cluster): pods of all pools, the control plane, sites, laptops.
    node_security_group_id: pulumi.Input[str] | None = None
    join_after: Sequence[pulumi.Resource] = ()  # the cluster and the add-ons nodes need before they launch
    # kubelet clusterDNS, in order: the node's NodeLocal DNS cache, then kube-dns (dlinfra.model.dns.node_dns_servers)
    cluster_dns: Sequence[str]

    def __post_init__(self) -> None:
        if not 0 <= self.min_size <= self.max_size:
            raise ValueError(
                f"{self.pool}: min_size/max_size: need 0 <= min <= max, got {self.min_size}/{self.max_size}"
            )
        if not self.instance_types:
            raise ValueError(f"{self.pool}: instance_types: at least one is needed")
        for name in self.instance_types:
            spec = instances.lookup(name)
            if self.kind == "gpu" and spec.gpus == 0:
                raise ValueError(f"{self.pool}: instance_types: {name} has no GPU; a GPU pool takes GPU types only")
            if self.kind == "cpu" and spec.gpus > 0:
                raise ValueError(f"{self.pool}: instance_types: {name} is a GPU type in a CPU pool")
            if self.efa and not spec.efa_supported:
                raise ValueError(f"{self.pool}: efa: {name} does not support EFA")
        if self.efa and len(self.subnet_ids) != 1:
            raise ValueError(f"{self.pool}: subnet_ids: an EFA pool lives in one AZ, got {len(self.subnet_ids)}")
        if self.efa and len(self.instance_types) != 1:
            raise ValueError(f"{self.pool}: instance_types: an EFA pool uses one type (one EFA layout)")
        if self.spot and self.kind == "gpu":
            raise ValueError(f"{self.pool}: spot: GPU pools run on demand or on reserved capacity")
        if self.gpu_sharing is not None and self.kind != "gpu":
            raise ValueError(f"{self.pool}: gpu_sharing: only a GPU pool has GPUs to share")
        if self.gpu_sharing is not None and self.gpu_sharing.mig is not None:
            for name in self.instance_types:
                spec = instances.lookup(name)
                problem = gpu_sharing.layout_problem(self.gpu_sharing.mig, str(spec.gpu_model), str(spec.gpu_product))
                if problem:
                    raise ValueError(f"{self.pool}: gpu_sharing.mig: {name}: {problem}")
        if not self.cluster_dns:
            raise ValueError(f"{self.pool}: cluster_dns: at least one address is needed")
        for address in self.cluster_dns:
            try:
                ipaddress.IPv4Address(address)
            except ValueError:
                raise ValueError(f"{self.pool}: cluster_dns: {address!r} is not an IPv4 address") from None
        if not 30 <= termination_hook_timeout(self.checkpoint_grace) <= MAX_HOOK_TIMEOUT_SECONDS:
            raise ValueError(
                f"{self.pool}: checkpoint_grace: {self.checkpoint_grace} s plus the {DRAIN_MARGIN_SECONDS} s drain "
                f"margin must fit the termination hook's {MAX_HOOK_TIMEOUT_SECONDS} s limit"
            )
        if self.capacity_block and self.capacity_reservation_id is None:
            raise ValueError(f"{self.pool}: capacity_block needs capacity_reservation_id")
        on_reservation = self.capacity_reservation_id is not None and not self.capacity_block
        if self.reservation_placement_group is not None and not on_reservation:
            raise ValueError(
                f"{self.pool}: reservation_placement_group: only for a capacity reservation (not a Capacity Block) "
                "created in that placement group"
            )

    @property
    def primary(self) -> instances.InstanceType:
        return instances.lookup(self.instance_types[0])


TERMINATION_HOOK = "drain-before-terminate"  # the termination lifecycle hook the node termination handler completes
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
# The timeout every group was created with before timeouts followed checkpoint_grace; kept on the group itself, since
# changing initial_lifecycle_hooks would replace it (the hook resource sets the real timeout).
INITIAL_HOOK_TIMEOUT_SECONDS = 900


def termination_hook_timeout(checkpoint_grace: int) -> int:
    """Seconds the termination lifecycle hook holds an instance: the pool's grace plus the drain margin.

    Every way an Auto Scaling group terminates a node (scale-in, `pool roll`'s instance refresh, a health
    replacement) waits in Terminating:Wait until the handler completes the action after its drain, or this timeout
    passes and the default result (CONTINUE) applies (user guide "Amazon EC2 Auto Scaling lifecycle hooks"). The
    handler can renew it with heartbeats (NTH v1.25.6 heartbeatInterval), but grace + margin <= 3900 s fits one
    timeout, so dlinfra needs none: one figure per pool, visible on the group.
    """
    return checkpoint_grace + DRAIN_MARGIN_SECONDS


class EfaInterface(NamedTuple):
    """One EFA network interface of a launch template."""

    network_card_index: int
    device_index: int
    interface_type: str


def efa_interfaces(instance_type: str) -> list[EfaInterface]:
    """One EFA per network card: card 0 carries the primary ENA+EFA interface, the rest are EFA-only."""
    count = instances.lookup(instance_type).efa_interfaces
    return [EfaInterface(card, 0 if card == 0 else 1, "efa" if card == 0 else "efa-only") for card in range(count)]


def autoscaler_tags(args: NodePoolArgs) -> dict[str, str]:
    """Auto-discovery and node-template tags, so cluster-autoscaler can scale the pool up from zero."""
    spec = args.primary
    tags = {
        f"{AUTOSCALER_PREFIX}/enabled": "true",
        f"{AUTOSCALER_PREFIX}/{args.cluster_name}": "owned",
    }
    for key, value in node_labels(args).items():
        tags[f"{AUTOSCALER_PREFIX}/node-template/label/{key}"] = value
    for key, value, effect in args.taints:
        tags[f"{AUTOSCALER_PREFIX}/node-template/taint/{key}"] = f"{value}:{effect}"
    # A shared node offers its shares and nvidia.com/gpu: 0 (the autoscaler would otherwise fill in the type's GPUs),
    # or a pool of shares never scales out from zero (aws/karpenter-provider-aws issue 3376, 2023); its own scale-down
    # threshold keeps notebooks from being consolidated away (dlinfra.model.gpu_sharing says why and how).
    sharing = args.gpu_sharing
    offered = gpu_sharing.template_resources(sharing, spec.gpus) if sharing else {"nvidia.com/gpu": spec.gpus}
    for resource, count in offered.items() if spec.gpus else ():
        tags[f"{AUTOSCALER_PREFIX}/node-template/resources/{resource}"] = str(count)
    tags |= gpu_sharing.autoscaler_options() if sharing else {}
    if args.efa:
        tags[f"{AUTOSCALER_PREFIX}/node-template/resources/vpc.amazonaws.com/efa"] = str(spec.efa_interfaces)
    return tags


def pool_group_name(args: NodePoolArgs) -> str:
    """The pool's Auto Scaling group name in this region."""
    return args.names.physical("pool", args.pool, max_len=255)


def node_labels(args: NodePoolArgs) -> dict[str, str]:
    """Labels every node of the pool carries (fleet labels plus the pool, its capacity type and GPU model)."""
    spec = args.primary
    labels = {"dlinfra.io/pool": args.pool, "dlinfra.io/capacity": capacity_class(args)}
    if spec.gpu_model and spec.gpu_product:
        labels |= gpu_health.gpu_labels(spec.gpu_model, spec.gpu_product, args.gpu_product_label)
    if spec.gpu_model and args.gpu_sharing is not None:
        # The device plugin's config manager gives the node its pool's sharing (components/charts/nvidia.py). No
        # accelerator label: the autoscaler holds a node with it unready until it offers nvidia.com/gpu (its
        # processors/customresources/gpu_processor.go FilterOutNodesWithUnreadyResources); a shared one never does.
        labels[DEVICE_PLUGIN_CONFIG_LABEL] = gpu_sharing.config_name(args.pool)
    elif spec.gpu_model:
        # cluster-autoscaler treats only nodes with this label as GPU nodes (GPU-aware scale-down).
        labels["k8s.amazonaws.com/accelerator"] = spec.gpu_model
    # The fleet cannot set any of these keys (dlinfra.model.fleet.labels.OWN_LABELS); the EFA label still comes last.
    return labels | dict(args.labels) | ({EFA_LABEL: "true"} if args.efa else {})


def instance_refresh(args: NodePoolArgs) -> aws.autoscaling.GroupInstanceRefreshArgs | None:
    """CPU pools roll by themselves when their launch template changes; GPU pools never do.

    With an instance_refresh block, every change of the group's launch template version (a new AMI or user
    data) starts a refresh that terminates running nodes. For GPU pools that drains training jobs, in
    capacity blocks too, so they get no block: the group still follows the template's latest version, so new
    nodes boot the new image, and the running ones are replaced only by `dlinfra pool roll` (README).
    """
    if args.kind == "gpu":
        return None
    return aws.autoscaling.GroupInstanceRefreshArgs(
        strategy="Rolling",
        preferences=aws.autoscaling.GroupInstanceRefreshPreferencesArgs(
            # Launch a replacement before terminating (up to 110%) and keep 90% in service meanwhile.
            min_healthy_percentage=90,
            max_healthy_percentage=110,
            # Nodes already on the group's template version are not replaced again.
            skip_matching=True,
            # Scale-in protection or standby are deliberate holds by an operator: leave those nodes alone
            # (AWS's CLI default, Wait, fails the whole refresh after an hour instead).
            scale_in_protected_instances="Ignore",
            standby_instances="Ignore",
        ),
    )


def capacity_class(args: NodePoolArgs) -> str:
    """reserved, on-demand or spot: what the autoscaler's priority expander orders pools by."""
    if args.capacity_reservation_id:
        return "reserved"
    return "spot" if args.spot else "on-demand"


def gpu_expectation(args: NodePoolArgs) -> str | None:
    """What a GPU node's burn-in expects, per instance type the pool may launch (compact JSON), or None."""
    if args.kind != "gpu":
        return None
    expect = gpu_health.pool_expectations(
        args.instance_types, efa=args.efa, check=args.gpu_check, sharing=args.gpu_sharing
    )
    return json.dumps(expect, sort_keys=True, separators=(",", ":"))


def mig_layout(args: NodePoolArgs) -> str | None:
    """The MIG instances every GPU of a MIG pool's nodes gets, as `nvidia-smi mig -cgi` takes them, or None."""
    if args.gpu_sharing is None or args.gpu_sharing.mig is None:
        return None
    spec = args.primary  # one GPU product for every type (NodePoolArgs checks the layout fits each)
    return gpu_sharing.create_argument(args.gpu_sharing.mig, str(spec.gpu_model), str(spec.gpu_product))


class NodePool(pulumi.ComponentResource):
    """IAM role, security group, launch template, placement group (on-demand EFA pools) and Auto Scaling group."""

    group_name: pulumi.Output[str]
    group_arn: pulumi.Output[str]
    role_arn: pulumi.Output[str]
    role_name: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    launch_template_id: pulumi.Output[str]

    def __init__(self, name: str, args: NodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("dlinfra:compute:NodePool", name, None, opts)
        names, spec = args.names, args.primary
        child = pulumi.ResourceOptions(parent=self)
        component = f"pool-{args.pool}"
        tags = names.tags(component, extra={"dlinfra:pool": args.pool})

        role = aws.iam.Role(
            f"{name}-role",
            name=names.physical("node", args.pool, max_len=64),
            assume_role_policy=service_trust("ec2.amazonaws.com"),
            tags=tags,
            opts=child,
        )
        policies = dict(WORKER_POLICIES) | ({"cni": CNI_POLICY} if args.attach_cni_policy else {})
        for key, arn in policies.items():
            aws.iam.RolePolicyAttachment(
                f"{name}-{key}", role=role.name, policy_arn=arn, opts=pulumi.ResourceOptions(parent=role)
            )
        if args.kind == "gpu":
            # The GPU repair (dlinfra.model.gpu_health, REPAIR_*): a node the cluster approved for repair marks its own
            # instance unhealthy, and its group replaces it. Only in this pool's group (the service authorization
            # reference: SetInstanceHealth acts on an autoScalingGroup resource, whose ARN ends in its name).
            group_arn = f"arn:aws:autoscaling:*:*:autoScalingGroup:*:autoScalingGroupName/{pool_group_name(args)}"
            aws.iam.RolePolicy(
                f"{name}-gpu-repair",
                role=role.name,
                name="gpu-repair",
                policy=json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [
                            {"Effect": "Allow", "Action": "autoscaling:SetInstanceHealth", "Resource": group_arn}
                        ],
                    }
                ),
                opts=pulumi.ResourceOptions(parent=role),
            )
        profile = aws.iam.InstanceProfile(
            f"{name}-profile", name=names.physical("node", args.pool, max_len=64), role=role.name, tags=tags, opts=child
        )

        sg_name = names.physical("nodes", args.pool)
        security_group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            name=sg_name,
            description=f"Nodes of pool {args.pool}",
            vpc_id=args.vpc_id,
            tags=names.tags(component, sg_name),
            opts=child,
        )
        this_group = sg.Peer(security_group_id=security_group.id)

        def rule(
            key: str,
            direction: sg.Direction,
            peer: sg.Peer,
            description: str,
            protocol: str = "-1",
            ports: tuple[int, int] | None = None,
        ) -> None:
            sg.rule(
                f"{name}-sg-{key}", direction, group=security_group, peer=peer, description=description,
                names=names, component=component, protocol=protocol, ports=ports,
            )  # fmt: skip

        # To the internet only HTTP(S) (images, packages, model hubs); to our own networks anything.
        world = sg.Peer(cidr="0.0.0.0/0")
        rule("to-https", "egress", world, "HTTPS to the internet", protocol="tcp", ports=(443, 443))
        rule("to-http", "egress", world, "HTTP to the internet (package mirrors)", protocol="tcp", ports=(80, 80))
        for cidr in sorted(args.internal_cidrs):
            rule(f"to-{sg.cidr_key(cidr)}", "egress", sg.Peer(cidr=cidr), "VPCs and site networks of the environment")
        # Who may connect to nodes and pods is the cluster's node group; the pool's own group adds only what
        # EFA requires: all traffic to and from the group itself (EC2 guide "Get started with EFA and NCCL").
        if args.efa:
            rule("self", "ingress", this_group, "EFA needs all traffic from its own group")
            rule("self-egress", "egress", this_group, "EFA needs egress to its own group")
        # Nodes authenticate with their role: the access entry must exist before the first node joins.
        access = aws.eks.AccessEntry(
            f"{name}-access",
            cluster_name=args.cluster_name,
            principal_arn=role.arn,
            type="EC2_LINUX",
            tags=tags,
            opts=pulumi.ResourceOptions(parent=role, depends_on=list(args.join_after)),
        )

        # EFA pools on on-demand capacity launch into a cluster placement group, for the lowest latency between
        # nodes (EC2 guide "Get started with EFA and NCCL"). A pool on reserved capacity does not: a Capacity
        # Block's instances are already placed close together ("Capacity Blocks for ML"), and a reservation made
        # outside a placement group can never be in ours ("Capacity Reservations in cluster placement groups":
        # it must be created in the group). The placement constraint would then cause insufficient-capacity
        # errors while paid capacity sits free; AWS ParallelCluster refuses the combination for the same reason
        # (PlacementGroupCapacityTypeValidator, PlacementGroupCapacityReservationValidator). A reservation created
        # in a cluster placement group (AWS's way to reserve EFA capacity together) is the exception: its instances
        # launch into that group, named with the reservation ("Launch instances into an existing Capacity
        # Reservation": choose the cluster placement group and the reservation). Rule
        # `reserved-capacity-no-placement-group`.
        placement_group = None
        group_name: pulumi.Input[str] | None = args.reservation_placement_group
        reservation_group = (
            {RESERVATION_GROUP_TAG: args.reservation_placement_group} if args.reservation_placement_group else {}
        )
        if args.efa and args.capacity_reservation_id is None:
            placement_group = aws.ec2.PlacementGroup(
                f"{name}-placement",
                name=names.physical("pg", args.pool),
                strategy="cluster",
                tags=tags,
                opts=child,
            )
            group_name = placement_group.name

        user_data = render_user_data(
            pool=args.pool,
            cluster_name=args.cluster_name,
            region=names.region or "",
            labels=node_labels(args),
            taints=args.taints,
            max_pods=spec.max_pods,
            cluster_dns=args.cluster_dns,
            gpu_expectation=gpu_expectation(args),
            mig_layout=mig_layout(args),
        )
        lt_name = names.physical("lt", args.pool)
        network_interfaces = None
        groups: list[pulumi.Input[str]] = [security_group.id]
        if args.node_security_group_id is not None:
            groups.append(args.node_security_group_id)
        security_group_ids: list[pulumi.Input[str]] | None = groups
        if args.efa:
            network_interfaces = [
                aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                    network_card_index=nic.network_card_index,
                    device_index=nic.device_index,
                    interface_type=nic.interface_type,
                    security_groups=groups,
                    delete_on_termination="true",
                )
                for nic in efa_interfaces(spec.name)
            ]
            security_group_ids = None  # with explicit interfaces, groups go on the interfaces
        capacity = None
        market = None
        if args.capacity_reservation_id:
            capacity = aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
                capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                    capacity_reservation_id=args.capacity_reservation_id
                )
            )
            if args.capacity_block:
                market = aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="capacity-block")
        template = aws.ec2.LaunchTemplate(
            f"{name}-lt",
            name=lt_name,
            image_id=args.ami_id,
            instance_type=None if args.spot else spec.name,
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=profile.arn),
            vpc_security_group_ids=security_group_ids,
            network_interfaces=network_interfaces,
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled",
                http_tokens="required",
                http_put_response_hop_limit=2 if args.pod_imds_access else 1,
                instance_metadata_tags="disabled",
            ),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=ROOT_DEVICE,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=args.root_volume_gib,
                        volume_type="gp3",
                        iops=3000,
                        throughput=250,
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            placement=aws.ec2.LaunchTemplatePlacementArgs(group_name=group_name) if group_name is not None else None,
            capacity_reservation_specification=capacity,
            instance_market_options=market,
            monitoring=aws.ec2.LaunchTemplateMonitoringArgs(enabled=True),
            user_data=base64.b64encode(user_data.encode()).decode(),
            update_default_version=True,
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(
                    resource_type=kind,
                    tags=names.tags(component, names.physical("node", args.pool))
                    | ({cluster_owned_tag(args.cluster_name): "owned"} if kind == "instance" else {}),
                )
                for kind in ("instance", "volume", "network-interface")
            ],
            # The group its reservation was declared in, for the rule that admits a placement group on reserved
            # capacity only when the two match.
            tags=names.tags(component, lt_name, extra=reservation_group),
            opts=child,
        )

        # Self-managed nodes carry kubernetes.io/cluster/<name>=owned (propagated to instances at launch): the
        # in-tree cloud provider, the load balancer controller and the VPC CNI find a cluster's nodes by it.
        group_tags = (
            names.tags(component, names.physical("node", args.pool))
            | {cluster_owned_tag(args.cluster_name): "owned"}
            | autoscaler_tags(args)
            # What the termination hook must outlast, for rule `drain-outlasts-checkpoint-grace`.
            | {CHECKPOINT_GRACE_TAG: str(args.checkpoint_grace)}
            # What each GPU offers, for rule `shared-gpu-pools-advertise-shares`.
            | ({gpu_sharing.SHARES_TAG: gpu_sharing.shares_tag(args.gpu_sharing)} if args.gpu_sharing else {})
        )
        lt_spec = aws.autoscaling.GroupLaunchTemplateArgs(id=template.id, version=template.latest_version.apply(str))
        mixed = None
        if args.spot:
            mixed = aws.autoscaling.GroupMixedInstancesPolicyArgs(
                instances_distribution=aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
                    on_demand_base_capacity=args.on_demand_base,
                    on_demand_percentage_above_base_capacity=args.on_demand_percentage_above_base,
                    spot_allocation_strategy=args.spot_allocation_strategy,
                ),
                launch_template=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateArgs(
                    launch_template_specification=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecificationArgs(
                        launch_template_id=template.id, version=template.latest_version.apply(str)
                    ),
                    overrides=[
                        aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs(instance_type=t)
                        for t in args.instance_types
                    ],
                ),
            )
        # A pool on a Capacity Block is declared closed: its Capacity Block's keeper opens and closes it
        # (components/capacity_block.py), and an apply must not undo it, hence the sizes are left to the keeper.
        closed = args.capacity_block
        group = aws.autoscaling.Group(
            f"{name}-asg",
            name=pool_group_name(args),
            min_size=0 if closed else args.min_size,
            max_size=0 if closed else args.max_size,
            vpc_zone_identifiers=[args.subnet_ids[az] for az in sorted(args.subnet_ids)],
            launch_template=None if args.spot else lt_spec,
            mixed_instances_policy=mixed,
            capacity_rebalance=args.spot,
            # Training nodes must not be terminated to even out AZs; the autoscaler decides when nodes go.
            suspended_processes=["AZRebalance"],
            protect_from_scale_in=False,
            health_check_type="EC2",
            default_instance_warmup=300,
            # The hook exists before the first instance launches only when the group is created with it. Changing
            # initial_lifecycle_hooks later replaces the group (terraform-provider-aws PR 34260; the pulumi_aws
            # docstring: it applies at creation only), and a replaced group terminates every node without a
            # drain. So the group keeps the hook it was created with, and `{name}-drain-hook` below sets its
            # timeout in place (PutLifecycleHook updates a hook of the same name).
            initial_lifecycle_hooks=[
                aws.autoscaling.GroupInitialLifecycleHookArgs(
                    name=TERMINATION_HOOK,
                    lifecycle_transition=TERMINATING,
                    heartbeat_timeout=INITIAL_HOOK_TIMEOUT_SECONDS,
                    default_result="CONTINUE",
                )
            ],
            instance_refresh=instance_refresh(args),
            tags=[
                aws.autoscaling.GroupTagArgs(key=k, value=v, propagate_at_launch=not k.startswith(AUTOSCALER_PREFIX))
                for k, v in sorted(group_tags.items())
            ],
            # The autoscaler owns the desired size; an update must not reset it.
            opts=pulumi.ResourceOptions(
                parent=self,
                ignore_changes=[
                    "desiredCapacity",
                    "initialLifecycleHooks",
                    *(["minSize", "maxSize"] if closed else []),
                ],
                depends_on=[access, *args.join_after],
            ),
        )
        aws.autoscaling.LifecycleHook(
            f"{name}-drain-hook",
            name=TERMINATION_HOOK,
            autoscaling_group_name=group.name,
            lifecycle_transition=TERMINATING,
            heartbeat_timeout=termination_hook_timeout(args.checkpoint_grace),
            default_result="CONTINUE",
            opts=pulumi.ResourceOptions(parent=self),
        )

        self.group_name = group.name
        self.group_arn = group.arn
        self.role_arn = role.arn
        self.role_name = role.name
        self.security_group_id = security_group.id
        self.launch_template_id = template.id
        self.register_outputs(
            {
                "group_name": self.group_name,
                "group_arn": self.group_arn,
                "role_arn": self.role_arn,
                "role_name": self.role_name,
                "security_group_id": self.security_group_id,
                "launch_template_id": self.launch_template_id,
            }
        )
