"""Rules for nodes: launch templates and instances (IMDSv2, reserved capacity outside placement groups), and the
Auto Scaling groups of node pools."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dlinfra.model import gpu_sharing, instances
from dlinfra.model.fleet.pools import (
    CHECKPOINT_GRACE_ANNOTATION,
    CHECKPOINT_GRACE_TAG,
    DRAIN_MARGIN_SECONDS,
    RESERVATION_GROUP_TAG,
)

from .core import (
    TERMINATING,
    VAP,
    Context,
    Resource,
    Violation,
    as_int,
    as_list,
    as_object,
    as_objects,
    deny_bound_policies,
    has_key,
    is_true,
    tags_of,
    termination_hooks,
)

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
AUTOSCALING_GROUP = "aws:autoscaling/group:Group"

AUTOSCALER = "k8s.io/cluster-autoscaler"
GPU_TEMPLATE_TAG = f"{AUTOSCALER}/node-template/resources/nvidia.com/gpu"


def imdsv2_required(resource: Resource, ctx: Context) -> list[str]:
    """Launch templates and instances require IMDSv2 session tokens (or turn the metadata service off)."""
    if resource.type not in (LAUNCH_TEMPLATE, INSTANCE):
        return []
    options = as_object(resource.inputs.get("metadataOptions"))
    if options.get("httpEndpoint") == "disabled":
        return []
    tokens = options.get("httpTokens")
    if tokens == "required":
        return []
    state = "unset, so IMDSv1 stays on" if tokens is None else f"{tokens!r}"
    return [f'metadataOptions.httpTokens is {state}: set httpTokens="required" (IMDSv2 only)']


def _group_instance_types(group: Resource, templates: Sequence[Resource]) -> list[str]:
    """Instance types an Auto Scaling group may launch: its overrides, else its launch template's type."""
    policy = as_object(group.inputs.get("mixedInstancesPolicy"))
    spec = as_object(policy.get("launchTemplate"))
    types = [str(o["instanceType"]) for o in as_objects(spec.get("overrides")) if o.get("instanceType")]
    if types:
        return types
    # By dependency first: during a real preview a new template's id is unknown, and reading it would raise.
    used = [t for t in templates if t.urn in group.dependencies]
    if not used:
        ids = {
            as_object(group.inputs.get("launchTemplate")).get("id"),
            as_object(spec.get("launchTemplateSpecification")).get("launchTemplateId"),
        } - {None, ""}
        used = [t for t in templates if t.id and t.id in ids]
    return [str(t.inputs["instanceType"]) for t in used if t.inputs.get("instanceType")]


def _discovery_problems(tags: dict[str, str]) -> list[str]:
    """What keeps the cluster-autoscaler from finding a group (its AWS provider's README, "Auto-Discovery Setup")."""
    problems = []
    if tags.get(f"{AUTOSCALER}/enabled") != "true":
        problems.append(f'tag {AUTOSCALER}/enabled="true" is missing: the autoscaler will not discover the pool')
    if not any(k.startswith(f"{AUTOSCALER}/") and v == "owned" for k, v in tags.items()):
        problems.append(f'no {AUTOSCALER}/<cluster>="owned" tag: the autoscaler will not discover the pool')
    return problems


def gpu_pools_scale_from_zero(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """GPU Auto Scaling groups carry cluster-autoscaler's discovery tags and a correct GPU node template (a shared
    pool's template is judged by shared_gpu_pools_advertise_shares)."""
    templates = [r for r in resources if r.type == LAUNCH_TEMPLATE]
    out: list[Violation] = []
    for group in (r for r in resources if r.type == AUTOSCALING_GROUP):
        tags = tags_of(group)
        types = _group_instance_types(group, templates)
        counts = {t: ctx.gpu_count(t) for t in types}
        if gpu_sharing.SHARES_TAG in tags or (GPU_TEMPLATE_TAG not in tags and not any(counts.values())):
            continue  # a shared pool, or not a GPU pool
        problems = _discovery_problems(tags)
        declared = as_int(tags.get(GPU_TEMPLATE_TAG))
        known = {c for c in counts.values() if c}
        if declared is None or declared <= 0:
            problems.append(
                f"tag {GPU_TEMPLATE_TAG} must give the GPUs per node: without it the autoscaler cannot "
                "scale the pool up from zero for GPU pods"
            )
        elif len(known) > 1:
            problems.append(f"instance types with different GPU counts ({counts}) cannot share one node template")
        elif known and declared not in known:
            problems.append(f"tag {GPU_TEMPLATE_TAG}={declared} but {', '.join(types)} has {known.pop()} GPUs")
        out += [Violation(group.urn, p) for p in problems]
    return out


def shared_gpu_pools_advertise_shares(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """A shared GPU pool's Auto Scaling group (one that says what its GPUs offer: gpu_sharing.SHARES_TAG) has the
    autoscaler's discovery tags, a node template that advertises exactly its shares, each GPU's count times the
    GPUs of its instance types, and nvidia.com/gpu "0", and its own scale-down threshold.

    The cluster-autoscaler builds a node of a group scaled to zero from these tags (its AWS provider's README,
    "Scaling a node group to 0": k8s.io/cluster-autoscaler/node-template/resources/<resource>); a pending pod asking
    for nvidia.com/mig-1g.10gb or nvidia.com/gpu.shared fits only a template that offers it, so without them a pool
    of shares never scales out from zero, the failure Karpenter users have reported since 2023
    (aws/karpenter-provider-aws issue 3376, kubernetes-sigs/karpenter issue 729). A template offering nvidia.com/gpu
    would do the opposite: scale the pool out for a whole-GPU pod its nodes never offer, and so does a template
    without the tag, since the AWS provider fills in the instance type's GPUs (gpu_sharing.AUTOSCALER_RESOURCE_TAG).
    Without its own threshold a shared node, which has no accelerator label, is consolidated below half its CPU and
    memory, running notebooks and all (gpu_sharing.SCALE_DOWN_THRESHOLD_TAG)."""
    templates = [r for r in resources if r.type == LAUNCH_TEMPLATE]
    out: list[Violation] = []
    prefix = f"{AUTOSCALER}/node-template/resources/"
    for group in (r for r in resources if r.type == AUTOSCALING_GROUP):
        tags = tags_of(group)
        if gpu_sharing.SHARES_TAG not in tags:
            continue
        problems = _discovery_problems(tags)
        try:
            per_gpu = gpu_sharing.parse_shares_tag(tags[gpu_sharing.SHARES_TAG])
        except ValueError as exc:
            out.append(Violation(group.urn, f"tag {gpu_sharing.SHARES_TAG}: {exc}"))
            continue
        types = _group_instance_types(group, templates)
        counts = {t: ctx.gpu_count(t) for t in types}
        known = {c for c in counts.values() if c}
        if len(known) != 1:
            problems.append(f"a shared pool's instance types need one GPU count for one node template, got {counts}")
        else:
            gpus = known.pop()
            advertised = {k.removeprefix(prefix): v for k, v in tags.items() if k.startswith(prefix)}
            for resource, count in sorted(per_gpu.items()):
                if as_int(advertised.get(resource)) != count * gpus:
                    problems.append(
                        f"tag {prefix}{resource} is {advertised.get(resource)!r}, but {gpus} GPUs of {count} each "
                        f"offer {count * gpus}: a pending pod asking for it would not scale the pool up from zero"
                    )
            if as_int(advertised.get(gpu_sharing.WHOLE_GPU)) != 0:
                problems.append(
                    f'tag {prefix}{gpu_sharing.WHOLE_GPU} is {advertised.get(gpu_sharing.WHOLE_GPU)!r}, not "0": the '
                    "autoscaler fills in the instance type's GPUs, and a shared node offers no whole GPU, so a "
                    "whole-GPU pod would scale the pool up and never fit"
                )
        problems += _shared_scale_down_problems(tags.get(gpu_sharing.SCALE_DOWN_THRESHOLD_TAG))
        out += [Violation(group.urn, p) for p in problems]
    return out


def _shared_scale_down_problems(value: str | None) -> list[str]:
    """Why a shared pool's per-group scale-down threshold would let the autoscaler remove a node with work on it, or
    keep an empty one forever (gpu_sharing.SHARED_SCALE_DOWN_THRESHOLD says why its bounds are what they are)."""
    tag, most = gpu_sharing.SCALE_DOWN_THRESHOLD_TAG, gpu_sharing.SHARED_SCALE_DOWN_THRESHOLD
    try:
        threshold = float(value) if value is not None else None
    except ValueError:
        threshold = None
    if threshold is None or not 0 < threshold <= most:
        return [
            f"tag {tag} is {value!r}, not a number above 0 and at most {most:f}: without it a shared node is "
            "consolidated below half its CPU and memory, its notebooks evicted; at 0 an empty one is never removed "
            "by autoscalers before 1.32"
        ]
    return []


def _is_gpu_group(group: Resource, templates: Sequence[Resource], ctx: Context) -> bool:
    """True when the group launches GPU instance types, or declares GPUs in its scale-from-zero template."""
    if GPU_TEMPLATE_TAG in tags_of(group):
        return True
    return any(ctx.gpu_count(t) for t in _group_instance_types(group, templates))


def gpu_pools_no_auto_refresh(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """GPU Auto Scaling groups never replace running instances by themselves (that drains training jobs).

    Sources: pulumi-aws autoscaling.Group `instance_refresh` ("A refresh is started when any of ...
    launch_template, mixed_instances_policy change", so a new AMI or user data starts one); AWS EC2 Auto
    Scaling user guide, "Replace Auto Scaling instances based on maximum instance lifetime" and "Suspend and
    resume Amazon EC2 Auto Scaling processes" (AZRebalance terminates instances to even out AZs). GPU pools
    are rolled on purpose with `dlinfra pool roll`.
    """
    templates = [r for r in resources if r.type == LAUNCH_TEMPLATE]
    out: list[Violation] = []
    for group in (r for r in resources if r.type == AUTOSCALING_GROUP):
        if not _is_gpu_group(group, templates, ctx):
            continue
        inputs = group.inputs
        if as_object(inputs.get("instanceRefresh")):
            out.append(
                Violation(
                    group.urn,
                    "instanceRefresh is set: every new launch template version (AMI, user data) would terminate "
                    "running GPU nodes; remove it and roll the pool with `dlinfra pool roll`",
                )
            )
        lifetime = as_int(inputs.get("maxInstanceLifetime"))
        if lifetime:
            out.append(
                Violation(
                    group.urn,
                    f"maxInstanceLifetime={lifetime}s replaces GPU nodes when they reach that age, jobs or not: "
                    "leave it unset",
                )
            )
        if "AZRebalance" not in [str(p) for p in as_list(inputs.get("suspendedProcesses"))]:
            out.append(
                Violation(
                    group.urn,
                    "AZRebalance is not suspended: Auto Scaling terminates GPU nodes to even out AZs; add it to "
                    "suspendedProcesses",
                )
            )
    return out


def nodes_cluster_owned(resource: Resource, ctx: Context) -> list[str]:
    """Node groups tag their instances `kubernetes.io/cluster/<cluster>=owned`, propagated at launch.

    Self-managed nodes without it are not recognised as the cluster's by the AWS cloud provider and the load
    balancer controller. Source: Amazon EKS user guide, "Create self-managed Amazon Linux nodes" (the
    CloudFormation template's ASG tag); cluster-autoscaler AWS docs (auto-discovery tags).
    """
    if resource.type != AUTOSCALING_GROUP:
        return []
    tags = {str(t.get("key")): t for t in as_objects(resource.inputs.get("tags"))}
    clusters = [
        key.removeprefix(f"{AUTOSCALER}/")
        for key, tag in tags.items()
        if key.startswith(f"{AUTOSCALER}/") and key != f"{AUTOSCALER}/enabled" and tag.get("value") == "owned"
    ]
    out = []
    for cluster in clusters:
        tag = tags.get(f"kubernetes.io/cluster/{cluster}")
        if tag is None or tag.get("value") != "owned" or not is_true(tag.get("propagateAtLaunch")):
            out.append(f"nodes of cluster {cluster} lack kubernetes.io/cluster/{cluster}=owned propagated at launch")
    return out


CAPACITY_RESERVATION = "aws:ec2/capacityReservation:CapacityReservation"


def _reserved_capacity(resource: Resource) -> tuple[str, str]:
    """(capacity block id or "", reservation id or "") a launch template or instance launches into."""
    spec = as_object(resource.inputs.get("capacityReservationSpecification"))
    target = as_object(spec.get("capacityReservationTarget"))
    reservation = str(target.get("capacityReservationId") or "")
    if as_object(resource.inputs.get("instanceMarketOptions")).get("marketType") == "capacity-block":
        return reservation or "(no reservation id)", reservation
    return "", reservation


def _placement_group(resource: Resource) -> str:
    """The placement group a launch template or instance names, or "" (its name may be unknown in preview)."""
    if resource.type == LAUNCH_TEMPLATE:
        placement = as_object(resource.inputs.get("placement"))
        keys = ("groupName", "groupId")
    else:
        placement, keys = resource.inputs, ("placementGroup", "placementGroupId")
    for key in keys:
        if has_key(placement, key):
            value = placement[key]
            return value if isinstance(value, str) and value else "(a placement group)"
    return ""


def reserved_capacity_no_placement_group(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Nothing that launches into a Capacity Block names a placement group, and nothing that targets a reservation
    names one but the group the reservation was created in.

    A Capacity Block's instances are placed close together already, and a placement constraint outside the
    reservation can fail with insufficient capacity while paid capacity sits free (EC2 guide "Capacity Blocks
    for ML"; AWS ParallelCluster PlacementGroupCapacityTypeValidator). A reservation joins a placement group
    only when it is created in it (EC2 guide "Capacity Reservations in cluster placement groups";
    PlacementGroupCapacityReservationValidator), and its instances must then launch into that group ("Launch
    instances into an existing Capacity Reservation"). So a target is fine with a reservation of this stack made
    in a placement group, or with the group the fleet declares its reservation was created in (the launch
    template's `reservation-placement-group` tag, dlinfra.model.fleet.pools).
    """
    in_groups = [r for r in resources if r.type == CAPACITY_RESERVATION and has_key(r.inputs, "placementGroupArn")]
    out: list[Violation] = []
    for resource in (r for r in resources if r.type in (LAUNCH_TEMPLATE, INSTANCE)):
        group = _placement_group(resource)
        if not group:
            continue
        block, reservation = _reserved_capacity(resource)
        declared = tags_of(resource).get(RESERVATION_GROUP_TAG)
        if block:
            out.append(
                Violation(
                    resource.urn,
                    f"launches into Capacity Block {block} and placement group {group}: a Capacity Block's "
                    "instances are placed together already, and the extra constraint can fail with insufficient "
                    "capacity while the block sits free; drop the placement group",
                )
            )
        elif reservation and declared:
            if declared != group:
                out.append(
                    Violation(
                        resource.urn,
                        f"targets capacity reservation {reservation}, created in placement group {declared}, but "
                        f"names placement group {group}: launch into the reservation's own group",
                    )
                )
        elif reservation and not any(
            c.urn in resource.dependencies or (c.id and c.id == reservation) for c in in_groups
        ):
            out.append(
                Violation(
                    resource.urn,
                    f"targets capacity reservation {reservation} and names placement group {group}: a reservation "
                    "made outside the group never fits in it, so launches can fail while reserved capacity sits "
                    "free; drop the placement group (or declare the group the reservation was created in: "
                    "capacity_reservations.<region>.placement_group)",
                )
            )
    return out


# --- the disruption contract ----------------------------------------------------------------------------------
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
HOOK_MAX_SECONDS = 7200  # PutLifecycleHook HeartbeatTimeout: 30 to 7200 seconds
CA_DEFAULT_MAX_GRACEFUL = 600  # cluster-autoscaler v1.33.6 config/flags/flags.go max-graceful-termination-sec
CA_DEFAULT_GPU_THRESHOLD = 0.5  # v1.33.6 config/const.go DefaultScaleDownGpuUtilizationThreshold
NTH_DEFAULT_DRAIN_TIMEOUT = 120  # NTH chart 0.27.6 values.yaml nodeTerminationGracePeriod


def _hook_problems(group: Resource, resources: Sequence[Resource], grace: int) -> list[str]:
    hooks = termination_hooks(group, resources)
    if not hooks:
        return [f"no {TERMINATING} lifecycle hook: a scale-in or `pool roll` terminates the node without a drain"]
    out = []
    for hook in hooks:
        timeout = as_int(hook.get("heartbeatTimeout"))
        timeout = 3600 if timeout is None else timeout  # AWS's default (PutLifecycleHook)
        if timeout < grace + DRAIN_MARGIN_SECONDS:
            out.append(
                f"termination hook {hook.get('name')} holds a node {timeout} s, less than the pool's checkpoint "
                f"grace {grace} s plus the {DRAIN_MARGIN_SECONDS} s drain margin: the node goes mid-checkpoint"
            )
        if timeout > HOOK_MAX_SECONDS:
            out.append(f"termination hook {hook.get('name')}: heartbeatTimeout {timeout} s is above AWS's 7200 s")
        if hook.get("defaultResult") not in (None, "CONTINUE"):
            out.append(f"termination hook {hook.get('name')}: defaultResult must be CONTINUE, or a slow drain leaks")
    return out


def _release(resources: Sequence[Resource], chart: str) -> list[Resource]:
    return [r for r in resources if r.type == HELM_RELEASE and str(r.inputs.get("chart", "")).endswith(chart)]


def _float(value: Any, default: float) -> float:
    try:
        return float(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def drain_outlasts_checkpoint_grace(resources: Sequence[Resource], ctx: Context) -> list[Violation]:
    """Every voluntary disruption waits for a job's checkpoint grace (fleet `checkpoint_grace`, per pool).

    - Regional stacks: a GPU Auto Scaling group records its pool's grace (tag dlinfra:checkpoint-grace), and its
      termination lifecycle hook holds a terminating node at least that long plus DRAIN_MARGIN_SECONDS and at most
      AWS's 7200 s (EC2 Auto Scaling user guide "Amazon EC2 Auto Scaling lifecycle hooks"; API PutLifecycleHook).
    - In-cluster stacks, from the caps the grace admission policy records (dlinfra.io/checkpoint-grace-caps): the
      policy is bound with Deny; the termination handler evicts with each pod's own grace
      (podTerminationGracePeriod -1) and its drain timeout (nodeTerminationGracePeriod, NTH v1.25.6
      pkg/node/node.go getDrainHelper) is at least the largest grace plus the margin; the cluster-autoscaler gives
      an evicted pod at least the largest grace (max-graceful-termination-sec, v1.33.6 scaledown/actuation/drain.go
      evictPod caps the pod's grace by it) and never takes a node with a GPU requested
      (scale-down-gpu-utilization-threshold below 1 / the most GPUs an instance type has; eligibility.go).
    """
    out: list[Violation] = []
    templates = [r for r in resources if r.type == LAUNCH_TEMPLATE]
    for group in (r for r in resources if r.type == AUTOSCALING_GROUP):
        grace = as_int(tags_of(group).get(CHECKPOINT_GRACE_TAG))
        if grace is None:
            if _is_gpu_group(group, templates, ctx):
                out.append(Violation(group.urn, f"GPU pool without a {CHECKPOINT_GRACE_TAG} tag: its grace is unknown"))
            continue
        out += [Violation(group.urn, p) for p in _hook_problems(group, resources, grace)]
    caps_by_policy = [
        (r, json.loads(str(annotations[CHECKPOINT_GRACE_ANNOTATION])))
        for r in resources
        if r.type == VAP
        for annotations in [as_object(as_object(r.inputs.get("metadata")).get("annotations"))]
        if CHECKPOINT_GRACE_ANNOTATION in annotations
    ]
    if not caps_by_policy:
        return out
    bound = deny_bound_policies(resources)
    largest = 0
    for policy, caps in caps_by_policy:
        largest = max([largest, *(int(v) for v in caps.values())])
        if str(as_object(policy.inputs.get("metadata")).get("name")) not in bound:
            out.append(
                Violation(policy.urn, "the checkpoint grace policy is not bound with Deny: nothing caps a grace")
            )
    anchor = caps_by_policy[0][0].urn
    handlers = _release(resources, "aws-node-termination-handler")
    if not handlers:
        out.append(Violation(anchor, "no aws-node-termination-handler release: nothing drains before a node goes"))
    for release in handlers:
        values = as_object(release.inputs.get("values"))
        pod_grace = as_int(values.get("podTerminationGracePeriod"))
        if pod_grace is not None and 0 <= pod_grace < largest:
            out.append(Violation(release.urn, f"podTerminationGracePeriod {pod_grace} cuts pods' grace: use -1"))
        timeout = as_int(values.get("nodeTerminationGracePeriod"))
        timeout = NTH_DEFAULT_DRAIN_TIMEOUT if timeout is None else timeout
        if timeout < largest + DRAIN_MARGIN_SECONDS:
            out.append(
                Violation(
                    release.urn,
                    f"nodeTerminationGracePeriod {timeout} s (the drain timeout) is below the largest checkpoint "
                    f"grace {largest} s plus the {DRAIN_MARGIN_SECONDS} s margin: the drain gives up first",
                )
            )
    most_gpus = max((t.gpus for t in instances.all_types().values()), default=1)
    for release in _release(resources, "cluster-autoscaler"):
        args = as_object(as_object(release.inputs.get("values")).get("extraArgs"))
        graceful = as_int(args.get("max-graceful-termination-sec"))
        graceful = CA_DEFAULT_MAX_GRACEFUL if graceful is None else graceful
        if graceful < largest:
            out.append(
                Violation(
                    release.urn,
                    f"max-graceful-termination-sec {graceful} s is below the largest checkpoint grace {largest} s: "
                    "scale-down would kill a pod mid-checkpoint",
                )
            )
        threshold = _float(args.get("scale-down-gpu-utilization-threshold"), CA_DEFAULT_GPU_THRESHOLD)
        if threshold * most_gpus >= 1:
            out.append(
                Violation(
                    release.urn,
                    f"scale-down-gpu-utilization-threshold {threshold} lets scale-down take a node where one GPU "
                    f"of {most_gpus} is requested (1/{most_gpus} is not above it): keep it below {1 / most_gpus:.3f}",
                )
            )
    return out
