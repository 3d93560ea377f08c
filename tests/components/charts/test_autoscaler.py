"""cluster-autoscaler: discovery of this cluster's pools, the priority expander, its IAM policy."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from components import nodepool
from components.charts import autoscaler
from dlinfra.model import instances, kueue
from dlinfra.model.fleet.pools import MAX_CHECKPOINT_GRACE
from dlinfra.model.fleet.schema import Fleet
from tests import reference
from tests.components._platform import Stack, asg_name, regional_stacks, stack_names


@pytest.mark.parametrize("stack_name", regional_stacks())
def test_autoscaler_discovers_this_clusters_pools(stacks: dict[str, Stack], fleet: Fleet, stack_name: str) -> None:
    stack = stacks[stack_name]
    cluster = stack_names(stack).physical("eks")
    values = stack.release("cluster-autoscaler")["values"]
    assert values["autoDiscovery"]["clusterName"] == cluster
    # The discovery tags are exactly the ones NodePool puts on its groups.
    pool_args = nodepool.NodePoolArgs(
        names=stack_names(stack), pool="p", kind="cpu", cluster_name=cluster, ami_id="ami-0",
        instance_types=["m7i.4xlarge"], subnet_ids={"a": "s"}, vpc_id="vpc-0", cluster_dns=("169.254.20.10",),
    )  # fmt: skip
    pool_tags = {k for k, v in nodepool.autoscaler_tags(pool_args).items() if v in ("true", "owned")}
    assert set(values["autoDiscovery"]["tags"]) == pool_tags
    assert values["awsRegion"] == stack.role.region
    assert values["image"]["tag"].startswith(f"v{fleet.environments[stack.role.environment].kubernetes.version}.")
    args = values["extraArgs"]
    assert args["expander"].split(",")[0] == "priority"
    assert args["skip-nodes-with-local-storage"] == "false" and args["balance-similar-node-groups"] == "true"
    # Never a node where a GPU is requested: one GPU of the largest GPU count of any instance type is above it.
    most_gpus = max(t.gpus for t in instances.all_types().values())
    assert float(args["scale-down-gpu-utilization-threshold"]) < 1 / most_gpus
    # A pod it evicts gets its whole grace, up to the longest checkpoint_grace the fleet may give.
    assert int(args["max-graceful-termination-sec"]) >= MAX_CHECKPOINT_GRACE
    assert "scale-down-utilization-threshold" in args


@pytest.mark.parametrize("stack_name", regional_stacks())
def test_priority_expander_ranks_reserved_on_demand_spot(
    stacks: dict[str, Stack], fleet: Fleet, stack_name: str
) -> None:
    stack = stacks[stack_name]
    env, region = stack.role.environment, stack.role.region
    (config_map,) = [
        c
        for c in stack.of_type("kubernetes:core/v1:ConfigMap")
        if c.inputs["metadata"]["name"] == "cluster-autoscaler-priority-expander"
    ]
    assert config_map.inputs["metadata"] == {
        "name": "cluster-autoscaler-priority-expander",
        "namespace": "kube-system",
        "labels": {"app.kubernetes.io/managed-by": "pulumi-dlinfra"},
    }
    priorities = yaml.safe_load(config_map.inputs["data"]["priorities"])
    rank = {}
    for priority, patterns in priorities.items():
        for pattern in patterns:
            matched = [p for p in fleet.pools_in(env, region) if re.fullmatch(pattern, asg_name(stack, p))]
            assert len(matched) == 1, pattern  # anchored: one pattern, one group
            rank[matched[0]] = priority
    assert set(rank) == set(fleet.pools_in(env, region))
    classes = {p: kueue.capacity_class(fleet, env, region, p) for p in rank}
    order = {"reserved": 3, "on-demand": 2, "spot": 1}
    for a in rank:
        for b in rank:
            if order[classes[a]] > order[classes[b]]:
                assert rank[a] > rank[b], (a, b)
    release = stack.by_name["platform-cluster-autoscaler"]
    assert config_map.urn in release.dependencies


def test_autoscaler_policy_is_scoped_by_the_cluster_tag(stacks: dict[str, Stack]) -> None:
    stack = stacks["prod-us-west-2"]
    cluster = stack_names(stack).physical("eks")
    policy = json.loads(stack.by_name["platform-cluster-autoscaler-policy"].inputs["policy"])
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert all(a.split(":")[1].startswith(("Describe", "GetInstanceTypes")) for a in by_sid["Discover"]["Action"])
    scale = by_sid["ScaleOwnGroups"]
    assert sorted(scale["Action"]) == [
        "autoscaling:SetDesiredCapacity",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
    ]
    assert scale["Condition"]["StringEquals"] == {
        f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster}": "owned",
        "aws:ResourceTag/k8s.io/cluster-autoscaler/enabled": "true",
    }
    assert not any("*" in a for s in policy["Statement"] for a in _list(s["Action"]))


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_render_priorities_is_anchored_and_ordered() -> None:
    text = autoscaler.render_priorities({"spot": ["b.x"], "reserved": ["a"], "on-demand": []})
    assert text == "30:\n- ^a$\n10:\n- ^b\\.x$\n"
    with pytest.raises(ValueError, match="unknown capacity class"):
        autoscaler.render_priorities({"owned": ["a"]})


@pytest.mark.parametrize(("version", "json_flag"), [("1.31", True), ("1.32", True), ("1.33", False), ("1.36", False)])
def test_autoscaler_serves_provisioning_requests(version: str, json_flag: bool) -> None:
    """--enable-provisioning-requests everywhere; before 1.33 the autoscaler needs JSON to talk to the CRD (FAQ)."""
    args = autoscaler.autoscaler_args(version)
    assert args["enable-provisioning-requests"] == "true"
    assert ("kube-api-content-type" in args) is json_flag
    assert args["max-node-provision-time"] == f"{autoscaler.MAX_NODE_PROVISION_SECONDS // 60}m"


def test_provisioning_request_crd_serves_v1_with_status() -> None:
    """The CRD Kueue and the autoscaler both use: v1, namespaced, status subresource, conditions merged by type."""
    spec = autoscaler.provisioning_request_crd()
    assert f"{spec['names']['plural']}.{spec['group']}" == autoscaler.PROVREQ_CRD
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1", True, True)
    assert version["subresources"] == {"status": {}} and spec["scope"] == "Namespaced"
    schema = version["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"]["required"] == ["podSets", "provisioningClassName"]
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x_kubernetes_list_type"] == "map" and conditions["x_kubernetes_list_map_keys"] == ["type"]


def test_a_change_of_the_gpu_node_labels_restarts_the_autoscaler(stacks: dict[str, Stack]) -> None:
    """It would keep scaling a pool at zero on the template it cached from the pool's last node, without them."""
    short = {"train-h100": {"dlinfra.io/gpu-model": "H100", "nvidia.com/gpu.product": "H100"}}
    nvidia = {"train-h100": {"dlinfra.io/gpu-model": "H100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
    assert autoscaler.node_labels_digest(short) != autoscaler.node_labels_digest(nvidia)
    values = stacks["prod-us-west-2"].release("cluster-autoscaler")["values"]
    (daemon_set,) = [
        r for r in reference.runs()["prod-us-west-2-k8s"].resources
        if r.type == "kubernetes:apps/v1:DaemonSet" and r.name.endswith("gpu-burn-in")
    ]  # fmt: skip
    (env,) = [e["value"] for e in daemon_set.inputs["spec"]["template"]["spec"]["containers"][0]["env"]
              if e["name"] == "GPU_LABELS"]  # fmt: skip
    # The digest of the labels the nodes carry, as the burn-in agent keeps them.
    assert values["podAnnotations"][autoscaler.NODE_LABELS_ANNOTATION] == autoscaler.node_labels_digest(json.loads(env))
