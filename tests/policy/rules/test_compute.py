"""The compute rules: IMDSv2, GPU pools' scale-from-zero tags and no automatic refresh, cluster-owned nodes, no
placement group on reserved capacity."""

from __future__ import annotations

from typing import Any

import pytest

from policy.dlinfra_policy.rules.compute import (
    AUTOSCALER,
    GPU_TEMPLATE_TAG,
    INSTANCE,
    drain_outlasts_checkpoint_grace,
    gpu_pools_no_auto_refresh,
    gpu_pools_scale_from_zero,
    imdsv2_required,
    reserved_capacity_no_placement_group,
    shared_gpu_pools_advertise_shares,
)
from policy.dlinfra_policy.rules.core import Resource
from tests.policy.rules._resources import ASG, CTX, LT, pass_and_fail, res

GPU_TAG = GPU_TEMPLATE_TAG
CA = AUTOSCALER

GPU_TAGS = [
    {"key": f"{CA}/enabled", "value": "true", "propagateAtLaunch": False},
    {"key": f"{CA}/dlinfra-prod-usw2", "value": "owned", "propagateAtLaunch": False},
    {"key": GPU_TAG, "value": "8", "propagateAtLaunch": False},
]
LT_GPU = res(LT, "gpu-lt", id="lt-1")(instanceType="p5.48xlarge")
OWNED = "kubernetes.io/cluster/dlinfra-prod-usw2"
REFRESH = {"strategy": "Rolling", "preferences": {"minHealthyPercentage": 90.0, "skipMatching": True}}
CPU_MIX = {"launchTemplate": {"overrides": [{"instanceType": "m7i.4xlarge"}]}}
BLOCK = {
    "capacityReservationSpecification": {
        "capacityReservationTarget": {"capacityReservationId": "cr-0a1b2c3d4e5f60718"}
    },
    "instanceMarketOptions": {"marketType": "capacity-block"},
}
PLACED = {"placement": {"groupName": "dlinfra-prod-usw2-pg-train"}}
CR = "aws:ec2/capacityReservation:CapacityReservation"
# A reservation the fleet says was created in a cluster placement group, and a template that launches into it
# (EC2 guide, "Capacity Reservations in cluster placement groups"; "Launch instances into an existing Capacity
# Reservation").
IN_ITS_GROUP = {
    "capacityReservationSpecification": BLOCK["capacityReservationSpecification"],
    "placement": {"groupName": "lab-h100-cpg"},
    "tags": {"Name": "lt", "reservation-placement-group": "lab-h100-cpg"},
}

# The disruption contract: a GPU pool with a 1800 s grace, its hook, and a cluster whose handler, autoscaler and
# grace policy all outlast it.
GRACE_TAGS = [*GPU_TAGS, {"key": "dlinfra:checkpoint-grace", "value": "1800", "propagateAtLaunch": True}]
HOOK = {
    "name": "drain-before-terminate",
    "lifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
    "heartbeatTimeout": 2100.0,
    "defaultResult": "CONTINUE",
}
RELEASE = "kubernetes:helm.sh/v3:Release"
VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
VAP_BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
CAPS = {"dlinfra.io/checkpoint-grace-caps": '{"cpu": 900, "train-h100": 1800}'}


def _nth(values: dict[str, Any]) -> Resource:
    return res(RELEASE, "nth")(chart="oci://public.ecr.aws/aws-ec2/helm/aws-node-termination-handler", values=values)


def _ca(args: dict[str, str]) -> Resource:
    return res(RELEASE, "ca")(chart="cluster-autoscaler", values={"extraArgs": args})


CLUSTER = [
    res(VAP, "grace")(metadata={"name": "dlinfra-checkpoint-grace-cap", "annotations": CAPS}),
    res(VAP_BINDING, "grace-binding")(
        spec={"policyName": "dlinfra-checkpoint-grace-cap", "validationActions": ["Deny"]}
    ),
    _nth({"podTerminationGracePeriod": -1, "nodeTerminationGracePeriod": 2100}),
    _ca({"max-graceful-termination-sec": "3600", "scale-down-gpu-utilization-threshold": "0.1"}),
]

# rule -> (resources that pass, resources that fail).
# A MIG pool of p4de.24xlarge (8 A100-80GB), each GPU 4 x 1g.20gb: the group says so, and advertises 32 of them
# (dlinfra.model.gpu_sharing); a time-sliced pool of g6.xlarge (one L4), 4 replicas.
LT_A100 = res(LT, "mig-lt", id="lt-2")(instanceType="p4de.24xlarge")
# Both say nvidia.com/gpu "0" (the autoscaler would fill in the type's GPUs) and set their own scale-down threshold.
NO_WHOLE_GPU = {"key": GPU_TAG, "value": "0", "propagateAtLaunch": False}
THRESHOLD = f"{CA}/node-template/autoscaling-options/scaledownutilizationthreshold"
SHARED_SCALE_DOWN = {"key": THRESHOLD, "value": "0.000001", "propagateAtLaunch": False}
MIG_TAGS = [
    *GPU_TAGS[:2],
    {"key": "dlinfra:gpu-shares-per-gpu", "value": "nvidia.com/mig-1g.20gb=4", "propagateAtLaunch": True},
    {"key": f"{CA}/node-template/resources/nvidia.com/mig-1g.20gb", "value": "32", "propagateAtLaunch": False},
    NO_WHOLE_GPU,
    SHARED_SCALE_DOWN,
]
SLICED_TAGS = [
    *GPU_TAGS[:2],
    {"key": "dlinfra:gpu-shares-per-gpu", "value": "nvidia.com/gpu.shared=4", "propagateAtLaunch": True},
    {"key": f"{CA}/node-template/resources/nvidia.com/gpu.shared", "value": "4", "propagateAtLaunch": False},
    NO_WHOLE_GPU,
    SHARED_SCALE_DOWN,
]
L4_MIX = {"launchTemplate": {"overrides": [{"instanceType": "g6.xlarge"}]}}


def _mig_group(tags: list[dict[str, Any]], name: str = "mig") -> Resource:
    return res(ASG, name, dependencies=[LT_A100.urn])(minSize=0.0, launchTemplate={"id": "lt-2"}, tags=tags)


CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "shared-gpu-pools-advertise-shares": (
        [LT_A100, _mig_group(MIG_TAGS), res(ASG, "sliced")(mixedInstancesPolicy=L4_MIX, tags=SLICED_TAGS)],
        [
            LT_A100,
            # Whole GPUs advertised instead of the shares: the failure of aws/karpenter-provider-aws issue 3376.
            _mig_group([*MIG_TAGS[:3], {**NO_WHOLE_GPU, "value": "8"}, SHARED_SCALE_DOWN], "whole"),
            # No nvidia.com/gpu tag: the autoscaler's AWS provider fills in the p4de's 8 GPUs.
            _mig_group([*MIG_TAGS[:4], SHARED_SCALE_DOWN], "whole-by-default"),
            # The shares per GPU, not per node (8 GPUs).
            _mig_group([*MIG_TAGS[:3], {**MIG_TAGS[3], "value": "4"}, *MIG_TAGS[4:]], "per-gpu"),
            # No threshold of its own: notebooks consolidated away at the CPU nodes' 0.5.
            _mig_group(MIG_TAGS[:5], "consolidated"),
        ],
    ),
    "imdsv2-required": (
        [res(LT)(metadataOptions={"httpTokens": "required", "httpPutResponseHopLimit": 1.0})],
        [res(LT)(metadataOptions={"httpTokens": "optional"})],
    ),
    "gpu-pool-scale-from-zero": (
        [LT_GPU, res(ASG, dependencies=[LT_GPU.urn])(minSize=0.0, launchTemplate={"id": "lt-1"}, tags=GPU_TAGS)],
        [LT_GPU, res(ASG, dependencies=[LT_GPU.urn])(minSize=0.0, launchTemplate={"id": "lt-1"}, tags=GPU_TAGS[:2])],
    ),
    "gpu-pools-no-auto-refresh": (
        [
            LT_GPU,
            res(ASG, dependencies=[LT_GPU.urn])(launchTemplate={"id": "lt-1"}, suspendedProcesses=["AZRebalance"]),
            res(ASG, "cpu")(mixedInstancesPolicy=CPU_MIX, instanceRefresh=REFRESH),
        ],
        [
            LT_GPU,
            res(ASG, dependencies=[LT_GPU.urn])(
                launchTemplate={"id": "lt-1"}, suspendedProcesses=["AZRebalance"], instanceRefresh=REFRESH
            ),
        ],
    ),
    "nodes-cluster-owned-tag": (
        [res(ASG)(tags=[*GPU_TAGS, {"key": OWNED, "value": "owned", "propagateAtLaunch": True}])],
        [
            res(ASG)(tags=GPU_TAGS),
            res(ASG)(tags=[*GPU_TAGS, {"key": OWNED, "value": "owned", "propagateAtLaunch": False}]),
        ],
    ),
    "reserved-capacity-no-placement-group": (
        [res(LT, "block")(**BLOCK), res(LT, "on-demand-efa")(**PLACED), res(LT, "in-its-group")(**IN_ITS_GROUP)],
        [
            res(LT, "block")(**BLOCK, **PLACED),
            # Launching into another group than the reservation's.
            res(LT, "other-group")(**{**IN_ITS_GROUP, **PLACED}),
            # A Capacity Block takes no group, whatever the tag says.
            res(LT, "block-tagged")(**{**IN_ITS_GROUP, "instanceMarketOptions": {"marketType": "capacity-block"}}),
        ],
    ),
    "drain-outlasts-checkpoint-grace": (
        [
            LT_GPU,
            res(ASG, dependencies=[LT_GPU.urn])(
                launchTemplate={"id": "lt-1"}, tags=GRACE_TAGS, initialLifecycleHooks=[HOOK]
            ),
            *CLUSTER,
        ],
        [
            # The hook gives up before the pool's grace (the 900 s every pool had before checkpoint_grace).
            res(ASG, "short-hook")(tags=GRACE_TAGS, initialLifecycleHooks=[HOOK | {"heartbeatTimeout": 900}]),
            # A GPU pool that does not say what it must outlast.
            LT_GPU,
            res(ASG, "no-grace", dependencies=[LT_GPU.urn])(
                launchTemplate={"id": "lt-1"}, initialLifecycleHooks=[HOOK]
            ),
            # The handler's chart default drain timeout, and the autoscaler's default 600 s.
            CLUSTER[0],
            CLUSTER[1],
            res(RELEASE, "nth")(chart="oci://x/aws-node-termination-handler", values={"podTerminationGracePeriod": -1}),
            res(RELEASE, "ca")(chart="cluster-autoscaler", values={"extraArgs": {}}),
        ],
    ),
}


test_rule_passes_good_resources, test_rule_flags_bad_resources = pass_and_fail(CASES)


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ([res(ASG)(tags=GRACE_TAGS, initialLifecycleHooks=[HOOK | {"heartbeatTimeout": 2099}])], "less than"),
        ([res(ASG)(tags=GRACE_TAGS, initialLifecycleHooks=[HOOK | {"heartbeatTimeout": 7201}])], "7200"),
        ([res(ASG)(tags=GRACE_TAGS)], "no autoscaling:EC2_INSTANCE_TERMINATING lifecycle hook"),
        ([*CLUSTER[:3], _ca({"max-graceful-termination-sec": "1799"})], "max-graceful-termination-sec 1799"),
        ([*CLUSTER[:3], _ca({"max-graceful-termination-sec": "3600", "scale-down-gpu-utilization-threshold": "0.125"})],
         "one GPU of 8"),
        ([*CLUSTER[:2], _nth({"podTerminationGracePeriod": -1, "nodeTerminationGracePeriod": 1800}), CLUSTER[3]],
         "gives up first"),
        ([*CLUSTER[:2], _nth({"podTerminationGracePeriod": 60, "nodeTerminationGracePeriod": 2100}), CLUSTER[3]],
         "cuts pods' grace"),
        ([CLUSTER[0], *CLUSTER[2:]], "not bound with Deny"),
    ],
)  # fmt: skip
def test_drain_outlasts_checkpoint_grace_details(resources: list[Resource], expected: str) -> None:
    found = [v.message for v in drain_outlasts_checkpoint_grace(resources, CTX)]
    assert any(expected in m for m in found), found


def test_imdsv2_disabled_endpoint_is_fine_and_unset_is_not() -> None:
    assert imdsv2_required(res(LT)(metadataOptions={"httpEndpoint": "disabled"}), CTX) == []
    assert "unset" in imdsv2_required(res(INSTANCE)(ami="ami-1"), CTX)[0]


def test_a_shared_pool_is_judged_by_its_shares_not_as_a_whole_gpu_pool() -> None:
    shared = [LT_A100, _mig_group(MIG_TAGS)]
    assert gpu_pools_scale_from_zero(shared, CTX) == []  # no nvidia.com/gpu tag, and rightly so
    undiscoverable = shared_gpu_pools_advertise_shares([LT_A100, _mig_group(MIG_TAGS[2:])], CTX)
    assert len(undiscoverable) == 2 and "will not discover" in undiscoverable[0].message
    missing = shared_gpu_pools_advertise_shares([LT_A100, _mig_group([*MIG_TAGS[:3], *MIG_TAGS[4:]])], CTX)
    assert [v.message for v in missing] == [
        f"tag {CA}/node-template/resources/nvidia.com/mig-1g.20gb is None, but 8 GPUs of 4 each offer 32: a pending "
        "pod asking for it would not scale the pool up from zero"
    ]


@pytest.mark.parametrize(
    ("tags", "expected"),
    [
        ([*MIG_TAGS[:4], SHARED_SCALE_DOWN], f'tag {GPU_TAG} is None, not "0": the autoscaler fills in'),
        ([*MIG_TAGS[:5], {**SHARED_SCALE_DOWN, "value": "0.5"}], f"tag {THRESHOLD} is '0.5', not a number above 0"),
        ([*MIG_TAGS[:5], {**SHARED_SCALE_DOWN, "value": "0"}], "never removed by autoscalers before 1.32"),
        ([*MIG_TAGS[:5], {**SHARED_SCALE_DOWN, "value": "half"}], f"tag {THRESHOLD} is 'half'"),
        (MIG_TAGS[:5], f"tag {THRESHOLD} is None"),
    ],
)
def test_a_shared_pool_offers_no_whole_gpu_and_keeps_its_notebooks(tags: list[dict[str, Any]], expected: str) -> None:
    found = [v.message for v in shared_gpu_pools_advertise_shares([LT_A100, _mig_group(tags)], CTX)]
    assert len(found) == 1 and expected in found[0], found


def test_gpu_pool_detected_by_instance_type_and_count_checked() -> None:
    overrides = {"launchTemplate": {"overrides": [{"instanceType": "g6.xlarge"}]}}
    wrong = [*GPU_TAGS[:2], {"key": GPU_TAG, "value": "8"}]
    found = gpu_pools_scale_from_zero([res(ASG)(mixedInstancesPolicy=overrides, tags=wrong)], CTX)
    assert [v.message for v in found] == [f"tag {GPU_TAG}=8 but g6.xlarge has 1 GPUs"]
    undiscoverable = gpu_pools_scale_from_zero([res(ASG)(mixedInstancesPolicy=overrides, tags=[])], CTX)
    assert len(undiscoverable) == 3
    cpu = {"launchTemplate": {"overrides": [{"instanceType": "m7i.4xlarge"}]}}
    assert gpu_pools_scale_from_zero([res(ASG)(mixedInstancesPolicy=cpu, tags=[])], CTX) == []


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        ({"suspendedProcesses": ["AZRebalance"]}, []),
        ({"suspendedProcesses": ["AZRebalance"], "maxInstanceLifetime": 604800.0}, ["maxInstanceLifetime=604800s"]),
        ({}, ["AZRebalance is not suspended"]),
        ({"suspendedProcesses": ["AZRebalance"], "instanceRefresh": REFRESH}, ["instanceRefresh is set"]),
    ],
)
def test_gpu_pools_no_auto_refresh_details(inputs: dict[str, Any], expected: list[str]) -> None:
    # Found as a GPU pool by its scale-from-zero tag alone (a template not in the stack, e.g. during preview).
    group = res(ASG)(launchTemplate={"id": "lt-elsewhere"}, tags=GPU_TAGS, **inputs)
    found = [v.message for v in gpu_pools_no_auto_refresh([group], CTX)]
    assert len(found) == len(expected) and all(e in m for e, m in zip(expected, found, strict=True))
    # CPU pools may refresh automatically.
    cpu = res(ASG)(mixedInstancesPolicy=CPU_MIX, instanceRefresh=REFRESH, maxInstanceLifetime=604800.0)
    assert gpu_pools_no_auto_refresh([cpu], CTX) == []


def test_reserved_capacity_no_placement_group_details() -> None:
    target = {"capacityReservationSpecification": BLOCK["capacityReservationSpecification"]}
    # An ordinary reservation made elsewhere: never in our placement group.
    (found,) = reserved_capacity_no_placement_group([res(LT)(**target, **PLACED)], CTX)
    assert "targets capacity reservation cr-0a1b2c3d4e5f60718 and names placement group" in found.message
    # ...unless this stack creates the reservation in a placement group and the template launches into it.
    in_group = res(CR, id="cr-0a1b2c3d4e5f60718")(placementGroupArn="arn:aws:ec2:us-west-2:1:placement-group/pg")
    assert reserved_capacity_no_placement_group([in_group, res(LT)(**target, **PLACED)], CTX) == []
    # A Capacity Block never fits a placement group of ours, whatever the stack declares.
    assert reserved_capacity_no_placement_group([in_group, res(LT)(**BLOCK, **PLACED)], CTX)
    # Instances say it with their own inputs; a group id counts like a name.
    instance = res(INSTANCE)(**BLOCK, placementGroupId="pg-0123")
    (found,) = reserved_capacity_no_placement_group([instance], CTX)
    assert found.message.startswith("launches into Capacity Block cr-0a1b2c3d4e5f60718 and placement group pg-0123")
    assert reserved_capacity_no_placement_group([res(INSTANCE)(**BLOCK)], CTX) == []
    # A reservation declared in a group admits that group only.
    assert reserved_capacity_no_placement_group([res(LT)(**IN_ITS_GROUP)], CTX) == []
    (found,) = reserved_capacity_no_placement_group([res(LT)(**{**IN_ITS_GROUP, **PLACED})], CTX)
    assert found.message == (
        "targets capacity reservation cr-0a1b2c3d4e5f60718, created in placement group lab-h100-cpg, but names "
        "placement group dlinfra-prod-usw2-pg-train: launch into the reservation's own group"
    )
