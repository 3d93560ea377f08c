"""The fleet model: the reference fleet loads; each bad input gets one message naming file and key."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlinfra.errors import FleetError
from dlinfra.model.fleet.load import load_fleet
from tests.conftest import REFERENCE_FLEET


def test_reference_fleet_loads() -> None:
    fleet = load_fleet(REFERENCE_FLEET).fleet
    assert fleet.primary_region == "us-west-2"
    assert set(fleet.environments) == {"prod", "staging"}
    assert len(fleet.regions) == 3 and len(fleet.sites) == 2
    assert {p.kind for p in fleet.environments["prod"].node_pools.values()} == {"gpu", "cpu"}
    assert fleet.pool_zones("prod", "us-west-2", "train-h100") == ("us-west-2a",)  # the reservation's usw2-az2
    assert fleet.pool_zones("prod", "eu-west-1", "train-a100") == ("eu-west-1a",)  # EFA: one AZ
    assert fleet.pool_zones("prod", "us-west-2", "cpu") == ("us-west-2a", "us-west-2b", "us-west-2c")


def test_a_pool_runs_on_its_first_type_sold_in_each_region() -> None:
    fleet = load_fleet(REFERENCE_FLEET).fleet
    # g6 is not sold in eu-west-1 (instance_types.yaml offered_in): the interactive pool falls back to g5 there.
    assert fleet.pool_types("prod", "us-west-2", "interactive") == ("g6.12xlarge", "g5.12xlarge")
    assert fleet.pool_types("prod", "eu-west-1", "interactive") == ("g5.12xlarge",)
    # A reservation is capacity that exists whatever the on-demand lists say.
    assert fleet.pool_types("prod", "us-west-2", "train-h100") == ("p5.48xlarge",)


def test_models_are_frozen() -> None:
    fleet = load_fleet(REFERENCE_FLEET).fleet
    with pytest.raises(Exception, match="frozen"):
        fleet.project = "other"  # type: ignore[misc]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[last] = value

    return change


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        del node[last]

    return change


OPERATORS = "environments.prod.kubernetes.job_operators"
BAD = [
    pytest.param(_set("regions.us-west-2.zones", 3), "regions.us-west-2.zones", "unknown key", id="unknown-key"),
    pytest.param(
        _set("environments.prod.node_pools.cpu.instance_type", "m7i.large"),
        "environments.prod.node_pools.cpu.instance_type",
        "unknown key",
        id="unknown-nested-key",
    ),
    pytest.param(_set("regions.us-west-9", {"azs": 2}), "regions.us-west-9", "unknown region", id="unknown-region"),
    pytest.param(_set("regions.eu-west-1.azs", 4), "regions.eu-west-1.azs", "eu-west-1 has 3", id="too-many-azs"),
    pytest.param(
        _set("address_space.supernet", "100.64.0.0/10"),
        "address_space.supernet",
        "RFC 1918",
        id="public-supernet",
    ),
    pytest.param(_set("sites.sjc1.lan", "100.64.0.0/20"), "sites.sjc1.lan", "RFC 1918", id="site-lan-not-private"),
    pytest.param(
        _set("environments.prod.regions.us-east-1.vpc_cidr", "10.0.0.0/15"),
        "environments.prod.regions.us-east-1.vpc_cidr",
        "/16 to /28",
        id="vpc-too-large",
    ),
    pytest.param(
        _set("environments.prod.regions.us-east-1.vpc_cidr", "10.9.0.0/29"),
        "environments.prod.regions.us-east-1.vpc_cidr",
        "/16 to /28",
        id="vpc-too-small",
    ),
    pytest.param(
        _set("environments.staging.vpc_prefix", 15),
        "environments.staging.vpc_prefix",
        "greater than",
        id="vpc-prefix",
    ),
    pytest.param(
        _set("environments.prod.node_pools.train-h100.checkpoint_grace", 7200),
        "environments.prod.node_pools.train-h100.checkpoint_grace",
        "7200 s is outside 30..3600",
        id="checkpoint-grace-too-long",
    ),
    pytest.param(
        _set("environments.prod.node_pools.interactive.checkpoint_grace", 10),
        "environments.prod.node_pools.interactive.checkpoint_grace",
        "10 s is outside 30..3600",
        id="checkpoint-grace-too-short",
    ),
    pytest.param(
        _set("environments.prod.node_pools.interactive.checkpoint_grace", "15m"),
        "environments.prod.node_pools.interactive.checkpoint_grace",
        "integer",
        id="checkpoint-grace-not-seconds",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.min_size", 50),
        "environments.prod.node_pools.cpu",
        "min_size 50 is greater than max_size 40",
        id="min-gt-max",
    ),
    pytest.param(
        _set("regions.us-east-1.primary", True),
        "regions",
        "exactly one region must be primary",
        id="two-primaries",
    ),
    pytest.param(
        _set("sites.sjc1.region", "ap-south-1"),
        "sites.sjc1.region",
        "not a region of environment",
        id="site-region",
    ),
    pytest.param(
        _set("sites.sjc1.public_ip", "10.1.2.3"),
        "sites.sjc1.public_ip",
        "not a public address",
        id="cgw-private",
    ),
    pytest.param(
        _set("sites.sjc1.public_ip", "203.0.113.9"),
        "sites.sjc1.public_ip",
        "not a public address",
        id="cgw-reserved",
    ),
    pytest.param(_set("sites.sjc1.public_ip", "64.62.140"), "sites.sjc1.public_ip", "IPv4", id="cgw-malformed"),
    pytest.param(
        _set("sites.ams1.asn", 9059),
        "sites.ams1.asn",
        "reserved by AWS in eu-west-1",
        id="asn-reserved-region",
    ),
    pytest.param(_set("sites.ams1.asn", 64514), "sites.ams1.asn", "transit gateway's own ASN", id="asn-tgw"),
    pytest.param(_set("sites.ams1.asn", 23456), "sites.ams1.asn", "reserved ASN", id="asn-as-trans"),
    pytest.param(
        _set("sites.ams1.tunnel_mode", "vti"), "sites.ams1.tunnel_mode", "'route' or 'policy'", id="tunnel-mode"
    ),
    pytest.param(_set("sites.ams1.asn", 4294967296), "sites.ams1.asn", "out of range", id="asn-range"),
    pytest.param(_set("sites.Bad_Name", {}), "sites.Bad_Name", "names are", id="bad-name"),
    pytest.param(_set("tags.managed-by", "me"), "tags", "set by dlinfra", id="reserved-tag"),
    pytest.param(
        _set("environments.prod.kubernetes.admin_role_arns", ["arn:aws:iam::12:role/x"]),
        "environments.prod.kubernetes.admin_role_arns",
        "not an IAM role ARN",
        id="bad-arn",
    ),
    pytest.param(
        _set("environments.prod.kubernetes.version", "1.19"),
        "environments.prod.kubernetes.version",
        "EKS does not offer Kubernetes 1.19",
        id="k8s-version-not-offered",
    ),
    pytest.param(
        _set("environments.staging.kubernetes.version", "1.30"),
        "environments.staging.kubernetes.version",
        "no pinned add-on versions for Kubernetes 1.30",
        id="k8s-version-not-pinned",
    ),
    pytest.param(_set("sites.ams1.pod_cidr", "100.64.0.0/18"), "sites.ams1.pod_cidr", "RFC 1918", id="pod-cidr-public"),
    pytest.param(
        _set("environments.prod.storage.fsx.storage_capacity_gib", 3600),
        "environments.prod.storage.fsx.storage_capacity_gib",
        "3600 GiB is not valid for PERSISTENT_2: use 1200 or a multiple of 2400",
        id="fsx-increment",
    ),
    pytest.param(
        _delete("environments.prod.node_pools.cpu.max_size"),
        "environments.prod.node_pools.cpu.max_size",
        "required",
        id="missing-key",
    ),
    pytest.param(
        _set("environments.prod.node_pools.interactive.instance_types", ["g6.12xlarge", "m7i.4xlarge"]),
        "environments.prod.node_pools.interactive.instance_types[1]",
        "m7i.4xlarge has no GPU; a GPU pool takes GPU instance types only",
        id="cpu-type-in-gpu-pool",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.instance_types", ["g5.xlarge"]),
        "environments.prod.node_pools.cpu.instance_types[0]",
        "g5.xlarge is a GPU type",
        id="gpu-type-in-cpu-pool",
    ),
    pytest.param(
        _set("environments.prod.node_pools.train-a100.instance_types", ["g6.xlarge"]),
        "environments.prod.node_pools.train-a100.instance_types[0]",
        "g6.xlarge does not support EFA",
        id="efa-unsupported",
    ),
    pytest.param(
        _set("environments.prod.node_pools.interactive.instance_types", ["p5.48xlarg"]),
        "environments.prod.node_pools.interactive.instance_types[0]",
        "unknown instance type 'p5.48xlarg'; did you mean p5.48xlarge",
        id="unknown-instance-type",
    ),
    pytest.param(
        _set("environments.prod.node_pools.train-a100.zones", {"eu-west-1": ["eu-west-1a", "eu-west-1b"]}),
        "environments.prod.node_pools.train-a100.zones.eu-west-1",
        "one AZ",
        id="efa-multi-az",
    ),
    pytest.param(
        _set("environments.prod.node_pools.train-h100.zones", {"us-west-2": ["us-west-2b"]}),
        "environments.prod.node_pools.train-h100.capacity_reservations.us-west-2.zone_id",
        "reservation cr-0a1b2c3d4e5f60718 is in usw2-az2 (us-west-2a) but the pool runs in us-west-2b",
        id="reservation-other-az",
    ),
    pytest.param(
        _set(
            "environments.prod.node_pools.train-h100.capacity_reservations.us-west-2",
            {"id": "cr-0a1b2c3d4e5f60718", "az": "us-west-2a"},
        ),
        "environments.prod.node_pools.train-h100.capacity_reservations.us-west-2",
        "az: give the reservation's zone by its zone id (zone_id: e.g. usw2-az2",
        id="reservation-by-az-name",
    ),
    pytest.param(
        _set("environments.prod.node_pools.train-h100.capacity_reservations.us-west-2.placement_group", "pg-h100"),
        "environments.prod.node_pools.train-h100.capacity_reservations.us-west-2.placement_group",
        "a capacity_block takes no placement group (got 'pg-h100')",
        id="capacity-block-in-a-placement-group",
    ),
    pytest.param(
        _set("environments.prod.node_pools.train-h100.capacity_reservations.us-west-2.placement_group", "my group"),
        "environments.prod.node_pools.train-h100.capacity_reservations.us-west-2.placement_group",
        "String should match pattern",
        id="placement-group-name-with-a-space",
    ),
    pytest.param(
        _set("environments.prod.node_pools.train-h100.capacity_reservations.us-west-2.zone_id", "use1-az1"),
        "environments.prod.node_pools.train-h100.capacity_reservations.us-west-2.zone_id",
        "reservation cr-0a1b2c3d4e5f60718: use1-az1 is not a zone of us-west-2: it is a zone of us-east-1",
        id="reservation-zone-in-another-region",
    ),
    pytest.param(
        _set("environments.prod.node_pools.train-h100.capacity_reservations.us-west-2.zone_id", "usw2-az4"),
        "environments.prod.node_pools.train-h100.capacity_reservations.us-west-2.zone_id",
        "is in usw2-az4, not among the zones the fleet uses in us-west-2: us-west-2a (usw2-az2), us-west-2b (usw2-az1)",
        id="reservation-zone-the-fleet-does-not-use",
    ),
    pytest.param(
        _set("environments.prod.node_pools.train-h100.capacity_reservations.us-west-2.zone_id", "us-west-2a"),
        "environments.prod.node_pools.train-h100.capacity_reservations.us-west-2.zone_id",
        "String should match pattern",
        id="reservation-zone-id-malformed",
    ),
    pytest.param(
        _set("regions.us-east-1.azs", 5),
        "regions.us-east-1.azs",
        "the first 5 AZs of us-east-1 include us-east-1e, zone use1-az3, where EKS cannot place a cluster's subnets",
        id="eks-unsupported-zone",
    ),
    pytest.param(
        _set("environments.prod.ci.apply_role_arn", "arn:aws:iam::1111:role/apply"),
        "environments.prod.ci.apply_role_arn",
        "is not an IAM role ARN",
        id="ci-bad-role",
    ),
    pytest.param(
        _set("environments.staging.ci.repository", "git@github.com:lab/dlinfra.git"),
        "environments.staging.ci.repository",
        "is not a GitHub repository URL",
        id="ci-bad-repository",
    ),
    pytest.param(
        _set("environments.prod.ci.connection_arn", "arn:aws:codecommit:us-west-2:111122223333:repo"),
        "environments.prod.ci.connection_arn",
        "is not a CodeConnections ARN",
        id="ci-bad-connection",
    ),
    pytest.param(
        _delete("environments.prod.ci.preview_role_arn"),
        "environments.prod.ci.preview_role_arn",
        "",
        id="ci-missing-preview-role",
    ),
    pytest.param(
        _set("environments.prod.ci.runner_actor_ids", [583231, 9919, 583231]),
        "environments.prod.ci.runner_actor_ids",
        "[583231] listed twice",
        id="ci-actor-listed-twice",
    ),
    pytest.param(
        _delete("environments.prod.ci.runner_actor_ids"),
        "environments.prod.ci.runner_actor_ids",
        "Field required",
        id="ci-runner-without-actors",
    ),
    pytest.param(
        _set("environments.staging.ci.runner_actor_ids", []),
        "environments.staging.ci.runner_actor_ids",
        "needs at least one GitHub account id",
        id="ci-runner-with-no-actors",
    ),
    pytest.param(
        _set("environments.prod.ci.runner_actor_ids", ["octocat"]),
        "environments.prod.ci.runner_actor_ids.0",
        "Input should be a valid integer",
        id="ci-actor-is-a-login",
    ),
    pytest.param(
        _set("teams.vision.overflow", ["ap-south-1"]),
        "teams.vision.overflow",
        "not a region of the fleet",
        id="overflow-to-an-unknown-region",
    ),
    pytest.param(
        _set("teams.vision.overflow", ["us-west-2"]),
        "teams.vision.overflow",
        "the primary region",
        id="overflow-to-the-manager",
    ),
    pytest.param(
        _set("teams.vision.overflow", ["us-east-1", "us-east-1"]),
        "teams.vision.overflow",
        "lists a region twice: us-east-1",
        id="overflow-twice",
    ),
    pytest.param(
        _set("teams.audio-overflow", {"gpu_quota": 0}),
        "teams.audio-overflow",
        "may not end in -overflow",
        id="team-named-like-an-overflow-queue",
    ),
    pytest.param(
        _set("environments.prod.node_pools.interactive.instance_types", ["g6.12xlarge"]),
        "environments.prod.node_pools.interactive.instance_types",
        "none of g6.12xlarge is sold in eu-west-1",
        id="type-not-sold-in-a-region-of-the-pool",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.taints", [{"key": "aws-node-termination-handler/spot-itn"}]),
        "environments.prod.node_pools.cpu.taints.0.key",
        "would then start on nodes about to go into maintenance",
        id="pool-taint-is-the-maintenance-taint",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.taints", [{"key": "node.kubernetes.io/unschedulable"}]),
        "environments.prod.node_pools.cpu.taints.0.key",
        "the cordon's taint",
        id="pool-taint-is-the-cordon",
    ),
    pytest.param(
        _set("environments.prod.node_pools.train-h100.taints", [{"key": "dlinfra.io/gpu-burn-in"}]),
        "environments.prod.node_pools.train-h100.taints.0.key",
        "would then start on GPUs that have not passed",
        id="pool-taint-is-the-burn-in-taint",
    ),
    pytest.param(
        _set("environments.prod.node_pools.train-h100.gpu_check", {"dcgm_level": 3}),
        "environments.prod.node_pools.train-h100.gpu_check.dcgm_level",
        "less than or equal to 2",
        id="burn-in-dcgm-level-too-long-for-the-autoscaler",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.gpu_check", {"dcgm_level": 1}),
        "environments.prod.node_pools.cpu",
        "the GPU burn-in is for GPU pools",
        id="burn-in-on-a-cpu-pool",
    ),
    pytest.param(
        _set("sites.sjc1.gpu_model", "V100"),
        "sites.sjc1.gpu_model",
        "'V100' is not a GPU model dlinfra can check",
        id="site-gpu-model-the-burn-in-cannot-check",
    ),
    pytest.param(
        _delete("sites.ams1.gpu_product"),
        "sites.ams1.gpu_product",
        "A100 comes as 'NVIDIA A100-SXM4-40GB', 'NVIDIA A100-SXM4-80GB'",
        id="site-gpu-product-of-a-model-sold-in-two-sizes",
    ),
    pytest.param(
        _set("sites.sjc1.gpu_product", "NVIDIA H200"),
        "sites.sjc1.gpu_product",
        "'NVIDIA H200' is not a product of H100",
        id="site-gpu-product-of-another-model",
    ),
]


# What components and stacks refused during a preview (after other stacks' plans were written, naming no file), and
# what `site add` refuses: the fleet refuses each first, so validate, cidr --update and preview share them.
REFUSED_BEFORE_PREVIEW = [
    pytest.param(
        _set("regions.us-west-2.azs", 1),
        "regions.us-west-2.azs",
        "1: every region runs an EKS cluster, and EKS needs subnets in at least two AZs",
        id="eks-needs-two-azs",
    ),
    pytest.param(
        _set("teams.vision.namespace", "kube-system"),
        "teams.vision.namespace",
        "namespace 'kube-system' belongs to the cluster",
        id="reserved-namespace",
    ),
    pytest.param(
        _set("environments.prod.ci.apply_role_arn", "arn:aws:iam::111122223333:role/infra-admin"),
        "environments.prod.ci.apply_role_arn",
        "arn:aws:iam::111122223333:role/infra-admin is also in kubernetes.admin_role_arns",
        id="ci-role-is-an-admin-role",
    ),
    pytest.param(
        _set("environments.prod.ci.preview_role_arn", "arn:aws:iam::111122223333:role/dlinfra-apply-prod"),
        "environments.prod.ci",
        "preview_role_arn is the apply role (arn:aws:iam::111122223333:role/dlinfra-apply-prod)",
        id="ci-preview-is-the-apply-role",
    ),
    pytest.param(
        _set("teams.language.gpu_quota", 5000),
        "teams",
        "team GPU quotas add up to 5256",
        id="quotas-do-not-fit",
    ),
    pytest.param(
        _set("sites.ams1.pod_cidr", "10.250.0.0/26"),
        "sites.ams1.pod_cidr",
        "a /26 pod range is smaller than one hybrid node's /25 pod block",
        id="site-pod-cidr-below-a-node-block",
    ),
    pytest.param(
        _set("sites.sjc1.pod_cidr", "10.250.0.0/22"),
        "sites.sjc1.pod_cidr",
        "a /22 pod range holds 8 nodes' /25 pod blocks, but site sjc1 has gpu_nodes: 16",
        id="site-pod-cidr-too-small-for-its-nodes",
    ),
    pytest.param(
        _set("address_space.hybrid_pod_prefix", 26),
        "address_space.hybrid_pod_prefix",
        "less than or equal to 25 (got 26)",
        id="hybrid-pod-prefix-below-a-node-block",
    ),
    pytest.param(
        _set("sites.sjc1.gpu_nodes", 1001),
        "sites.sjc1.gpu_nodes",
        "less than or equal to 1000 (got 1001)",
        id="site-beyond-one-activation",
    ),
    pytest.param(
        _set("sites.ams1.public_ip", "64.62.140.17"),
        "sites.ams1.public_ip",
        "64.62.140.17 is already the gateway of site 'sjc1'",
        id="duplicate-public-ip",
    ),
    pytest.param(
        _set("sites.ams1.asn", 65101),
        "sites.ams1.asn",
        "ASN 65101 is already used by site 'sjc1' in environment 'prod'",
        id="duplicate-asn",
    ),
    pytest.param(
        _set("sites.ams1.asn", 64512),
        "sites.ams1.asn",
        "ASN 64512 is the transit gateway ASN of prod/us-west-2",
        id="asn-of-another-transit-gateway",
    ),
]

NAMES_AND_LABELS = [
    pytest.param(
        _set("environments.prod.node_pools.GPU_pool", {"kind": "cpu", "instance_types": ["m7i.large"], "max_size": 1}),
        "environments.prod.node_pools.GPU_pool",
        "not a valid name",
        id="pool-name",
    ),
    pytest.param(
        _set("environments.prod.node_pools.site-cpu", {"kind": "cpu", "instance_types": ["m7i.large"], "max_size": 1}),
        "environments.prod.node_pools.site-cpu",
        "pool names beginning 'site-' are the sites'",
        id="pool-name-of-a-site",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.labels", {"team name": "x"}),
        "environments.prod.node_pools.cpu.labels",
        "node label 'team name': the name (after any '/') must be 1-63",
        id="label-key-charset",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.labels", {"Lab.Example/tier": "x"}),
        "environments.prod.node_pools.cpu.labels",
        "'Lab.Example/tier': the prefix before '/' must be a lower-case DNS subdomain",
        id="label-key-prefix",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.labels", {"x" * 64: "x"}),
        "environments.prod.node_pools.cpu.labels",
        "must be 1-63",
        id="label-key-too-long",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.labels", {"kubernetes.io/role": "gpu"}),
        "environments.prod.node_pools.cpu.labels",
        "the kubelet only registers labels of kubernetes.io under",
        id="label-key-kubelet-namespace",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.labels", {"dlinfra.io/pool": "gpu"}),
        "environments.prod.node_pools.cpu.labels",
        "'dlinfra.io/pool' is set by dlinfra from the pool's name",
        id="label-key-dlinfra-own",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.labels", {"nvidia.com/gpu.product": "NVIDIA-H100"}),
        "environments.prod.node_pools.cpu.labels",
        "'nvidia.com/gpu.product' is set by dlinfra",
        id="label-key-gpu-product",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.labels", {"tier": "v" * 64}),
        "environments.prod.node_pools.cpu.labels",
        "is not a Kubernetes label value",
        id="label-value-too-long",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.labels", {"tier": "-gold"}),
        "environments.prod.node_pools.cpu.labels",
        "'-gold' is not a Kubernetes label value",
        id="label-value-charset",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.taints", [{"key": "dedicated/", "value": "x"}]),
        "environments.prod.node_pools.cpu.taints.0.key",
        "not a Kubernetes taint key",
        id="taint-key",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.taints", [{"key": "dedicated", "value": "a b"}]),
        "environments.prod.node_pools.cpu.taints.0.value",
        "'a b' is not a Kubernetes taint value",
        id="taint-value",
    ),
    pytest.param(
        _set("environments.prod.node_pools.cpu.taints", [{"key": "dedicated", "effect": "NoRun"}]),
        "environments.prod.node_pools.cpu.taints.0.effect",
        "(got 'NoRun')",
        id="taint-effect",
    ),
    pytest.param(
        _set("sites.sjc1.gpu_model", "H100 SXM"),
        "sites.sjc1.gpu_model",
        "'H100 SXM' is not a Kubernetes label value",
        id="site-gpu-model-is-a-label-value",
    ),
    pytest.param(
        _set("regions.us-west-2.azs", "three"),
        "regions.us-west-2.azs",
        "(got 'three')",
        id="schema-error-echoes-the-value",
    ),
    pytest.param(
        _set("sites.sjc1.public_ip", "x" * 200),
        "sites.sjc1.public_ip",
        f"(got '{'x' * 56}...)",
        id="echo-is-truncated",
    ),
    # Job operators the lab installs: known ones, each in a namespace of its own (dlinfra.model.job_operators).
    pytest.param(
        _set(f"{OPERATORS}", {"argo": "argo"}),
        OPERATORS,
        "unknown job operator 'argo'; known: jobset, kubeflow-trainer",
        id="job-operator-unknown",
    ),
    pytest.param(
        _set(f"{OPERATORS}", {"kuberay": "Ray_System"}),
        OPERATORS,
        "kuberay: 'Ray_System' is not a namespace name",
        id="job-operator-namespace-not-a-name",
    ),
    pytest.param(
        _set(f"{OPERATORS}", {"kuberay": "default"}),
        OPERATORS,
        "kuberay: 'default' is no operator's own namespace",
        id="job-operator-in-the-default-namespace",
    ),
    pytest.param(
        _set(f"{OPERATORS}", {"kubeflow-trainer": "kubeflow-system"}),
        OPERATORS,
        "kubeflow-trainer creates the kinds of jobset: name that operator too",
        id="job-operator-without-the-one-it-needs",
    ),
]


@pytest.mark.parametrize(("change", "key", "message"), BAD + REFUSED_BEFORE_PREVIEW + NAMES_AND_LABELS)
def test_bad_fleet(write_fleet: Callable[..., Path], change: Any, key: str, message: str) -> None:
    path = write_fleet(change)
    with pytest.raises(FleetError) as info:
        load_fleet(path)
    text = str(info.value)
    assert str(path) in text
    assert key in text
    assert message in text
    assert "Traceback" not in text


def _reserved_in_a_group(zones: list[str] | None) -> Callable[[dict[str, Any]], None]:
    """The interactive pool (no EFA) on a reservation made in a cluster placement group, in `zones` of us-west-2."""

    def change(data: dict[str, Any]) -> None:
        pool = data["environments"]["prod"]["node_pools"]["interactive"]
        pool["capacity_reservations"] = {
            "us-west-2": {"id": "cr-0123456789abcdef0", "zone_id": "usw2-az2", "placement_group": "pg-l4"}
        }
        if zones is not None:
            pool["zones"] = {"us-west-2": zones}

    return change


@pytest.mark.parametrize("zones", [None, ["us-west-2a"]], ids=["zone-of-the-reservation", "one-zone"])
def test_a_pool_in_its_reservations_placement_group_runs_in_one_zone(
    write_fleet: Callable[..., Path], zones: list[str] | None
) -> None:
    fleet = load_fleet(write_fleet(_reserved_in_a_group(zones))).fleet
    assert fleet.pool_zones("prod", "us-west-2", "interactive") == ("us-west-2a",)


def test_a_pool_in_its_reservations_placement_group_cannot_span_zones(write_fleet: Callable[..., Path]) -> None:
    # A cluster placement group lies in one AZ, and an Auto Scaling group cannot name several AZs and a cluster
    # placement group (EC2 guide, "Placement groups"; Auto Scaling API reference, CreateAutoScalingGroup): refused
    # like an EFA pool over several zones, even without EFA.
    path = write_fleet(_reserved_in_a_group(["us-west-2a", "us-west-2b"]))
    with pytest.raises(FleetError) as info:
        load_fleet(path)
    text = str(info.value)
    assert re.match(rf"{re.escape(str(path))}:\d+: ", text), text  # file and line
    assert text.split(": ", 1)[1] == (
        "environments.prod.node_pools.interactive.zones.us-west-2: reservation cr-0123456789abcdef0 was made in "
        "cluster placement group 'pg-l4', which lies in one AZ; the pool launches into it, so it takes one zone, "
        "got 2: us-west-2a, us-west-2b"
    )


def test_duplicate_names_are_rejected(write_fleet: Callable[..., Path]) -> None:
    text = REFERENCE_FLEET.read_text().replace("  ams1:", "  sjc1:", 1)
    path = write_fleet(text=text)
    with pytest.raises(FleetError, match=r"duplicate key.*sjc1"):
        load_fleet(path)


def test_malformed_yaml_names_the_line(write_fleet: Callable[..., Path]) -> None:
    path = write_fleet(text="project: dlinfra\nregions: [us-west-2\n")
    with pytest.raises(FleetError, match=r"fleet.yaml: malformed YAML at line \d+"):
        load_fleet(path)


def test_error_names_the_line(write_fleet: Callable[..., Path]) -> None:
    text = REFERENCE_FLEET.read_text().replace("    azs: 3\n  eu-west-1:", "    azz: 3\n  eu-west-1:")
    path = write_fleet(text=text)
    expected_line = text.splitlines().index("    azz: 3") + 1
    with pytest.raises(FleetError, match=rf"fleet.yaml:{expected_line}: regions.us-east-1.azz: unknown key"):
        load_fleet(path)


def test_missing_file() -> None:
    with pytest.raises(FleetError, match=r"nope\.yaml: cannot read"):
        load_fleet("nope.yaml")


def test_set_like_lists_load_in_one_order(write_fleet: Callable[..., Path]) -> None:
    # Lists that are sets come out sorted, so their order in the file changes nothing declared;
    # instance_types is a preference and keeps the file's order.
    def shuffle(d: dict[str, Any]) -> None:
        prod = d["environments"]["prod"]
        prod["kubernetes"]["admin_role_arns"] = ["arn:aws:iam::111122223333:role/b", "arn:aws:iam::111122223333:role/a"]
        prod["kubernetes"]["public_access_cidrs"] = ["203.0.113.0/24", "192.0.2.0/25"]
        pool = prod["node_pools"]["interactive"]
        pool["regions"] = ["us-west-2", "eu-west-1"]
        pool["zones"] = {"us-west-2": ["us-west-2c", "us-west-2a"]}
        pool["taints"] = [{"key": "z"}, {"key": "a", "value": "2"}, {"key": "a", "value": "1"}]
        d["sites"]["sjc1"]["nfs"] = [
            {"server": "10.200.0.10", "export": "/b", "mount_point": "/mnt/b"},
            {"server": "10.200.0.10", "export": "/a", "mount_point": "/mnt/a"},
        ]

    fleet = load_fleet(write_fleet(shuffle)).fleet
    prod = fleet.environments["prod"]
    assert [a.rsplit("/", 1)[1] for a in prod.kubernetes.admin_role_arns] == ["a", "b"]
    assert [str(c) for c in prod.kubernetes.public_access_cidrs] == ["192.0.2.0/25", "203.0.113.0/24"]
    pool = prod.node_pools["interactive"]
    assert pool.regions == ("eu-west-1", "us-west-2")
    assert pool.zones["us-west-2"] == ("us-west-2a", "us-west-2c")
    assert [(t.key, t.value) for t in pool.taints] == [("a", "1"), ("a", "2"), ("z", "")]
    assert [m.mount_point for m in fleet.sites["sjc1"].nfs] == ["/mnt/a", "/mnt/b"]
    assert pool.instance_types == ("g6.12xlarge", "g5.12xlarge")  # preference: as written


def test_the_repositorys_own_fleet_validates() -> None:
    # Every other test reads the frozen fixture; this one follows whatever fleet.yaml the lab keeps, so an edit
    # that breaks it fails here, and only here.
    from dlinfra.model import planner
    from tests.conftest import ROOT

    loaded = load_fleet(ROOT / "fleet.yaml")
    plan = planner.plan(loaded, planner.load_lock(ROOT / "cidr-lock.yaml"))
    assert loaded.fleet.environments and plan.allocations


@pytest.mark.parametrize(("change", "key", "message"), BAD + REFUSED_BEFORE_PREVIEW + NAMES_AND_LABELS)
def test_validate_and_cidr_update_refuse_and_write_nothing(
    write_fleet: Callable[..., Path], capsys: pytest.CaptureFixture[str], change: Any, key: str, message: str
) -> None:
    from dlinfra.cli import main as cli

    path = write_fleet(change, lock=False)  # no lock: `cidr --update` would write one if it got that far
    before = sorted(p.name for p in path.parent.iterdir())
    for argv in (["validate"], ["cidr", "--update"]):
        code = cli.main([*argv, "--fleet", str(path)])
        err = capsys.readouterr().err
        assert code == cli.EXIT_BAD_INPUT, argv
        assert err.count("error:") == 1 and str(path) in err and key in err and message in err
        assert "Traceback" not in err
    assert sorted(p.name for p in path.parent.iterdir()) == before


def test_user_text_is_never_terminal_markup(
    write_fleet: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from dlinfra.cli import main as cli

    path = write_fleet(_set("environments.prod.node_pools.cpu.labels", {"[bold]tier[/bold]": "x"}))
    assert cli.main(["validate", "--fleet", str(path)]) == cli.EXIT_BAD_INPUT
    assert "'[bold]tier[/bold]'" in capsys.readouterr().err


def test_a_fleet_file_is_validated_once_per_text(write_fleet: Callable[..., Path]) -> None:
    # A preview of every stack loads the fleet once per stack program; the same text gives the same frozen models,
    # a changed file is read again, and a bad one is never remembered.
    path = write_fleet()
    first = load_fleet(path)
    assert load_fleet(path).fleet is first.fleet
    path.write_text(path.read_text().replace("project:", "project: renamed\nx_project:", 1))
    with pytest.raises(FleetError):
        load_fleet(path)
    with pytest.raises(FleetError):
        load_fleet(path)
    path.write_text(REFERENCE_FLEET.read_text().replace("\nproject: ", "\nproject: other-", 1))
    changed = load_fleet(path)
    assert changed.fleet is not first.fleet and changed.fleet.project.startswith("other-")


def test_every_label_dlinfra_sets_is_refused_in_the_fleet() -> None:
    # Every key the components and renderers set must be in OWN_LABELS, or a fleet label could override it: the
    # named constants, and every literal key in node_labels().
    import inspect
    import re

    from components import nodepool
    from components.charts.kueue import TEAM_LABEL
    from components.charts.nodes import GPU_PRODUCT_LABEL, POOL_LABEL
    from dlinfra.model.fleet.labels import OWN_LABELS
    from dlinfra.render import nodeadm

    literal_keys = set(re.findall(r'"([a-z0-9.-]+\.[a-z]+/[a-z0-9.-]+)"', inspect.getsource(nodepool.node_labels)))
    assert {"dlinfra.io/pool", "k8s.amazonaws.com/accelerator"} <= literal_keys  # the scan sees them
    named = {POOL_LABEL, TEAM_LABEL, GPU_PRODUCT_LABEL, nodeadm.SITE_LABEL, nodepool.EFA_LABEL}
    assert named | literal_keys <= OWN_LABELS
