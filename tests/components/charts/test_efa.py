"""The EFA device plugin: on the nodes of EFA pools, with the region's own image."""

from __future__ import annotations

import re

import pytest
import yaml

from components import nodepool
from components.charts import efa, pinned
from dlinfra.errors import DlinfraError
from dlinfra.model.fleet.schema import Fleet
from tests.components._platform import Stack, regional_stacks, stack_names
from tests.conftest import ROOT


@pytest.mark.parametrize("stack_name", regional_stacks())
def test_efa_device_plugin_runs_on_efa_pools(stacks: dict[str, Stack], fleet: Fleet, stack_name: str) -> None:
    stack = stacks[stack_name]
    env, region = stack.role.environment, stack.role.region
    efa_pools = {n: p for n, p in fleet.pools_in(env, region).items() if p.efa}
    if not efa_pools:
        assert "platform-aws-efa-k8s-device-plugin" not in stack.by_name
        return
    release = stack.release("aws-efa-k8s-device-plugin")
    assert release["namespace"] == "kube-system"
    values = release["values"]
    # It runs where the EFA pools' nodes are: a label every one of their nodes carries (and its scale-from-zero
    # template), on exactly the pools' instance types, tolerating their taints (the GPU taint included).
    (selector,) = values["nodeSelector"].items()
    for name, pool in efa_pools.items():
        args = nodepool.NodePoolArgs(
            names=stack_names(stack), pool=name, kind=pool.kind, cluster_name="c", ami_id="ami-0",
            instance_types=pool.instance_types, subnet_ids={"a": "s"}, vpc_id="vpc-0", efa=True,
            taints=[(t.key, t.value, t.effect) for t in pool.taints], cluster_dns=("169.254.20.10",),
        )  # fmt: skip
        assert selector in nodepool.node_labels(args).items()
        assert f"k8s.io/cluster-autoscaler/node-template/label/{selector[0]}" in nodepool.autoscaler_tags(args)
        # ... which also promise the EFA resource the plugin advertises.
        assert f"k8s.io/cluster-autoscaler/node-template/resources/{efa.EFA_RESOURCE}" in nodepool.autoscaler_tags(args)
        for taint in pool.taints:
            assert {"key": taint.key, "operator": "Exists", "effect": taint.effect} in values["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]
    assert values["supportedInstanceLabels"] == {
        "keys": ["node.kubernetes.io/instance-type"],
        "values": sorted({p.instance_types[0] for p in efa_pools.values()}),
    }
    # The region's own copy of the image, through the VPC's ECR endpoint.
    assert re.fullmatch(
        rf"\d{{12}}\.dkr\.ecr\.{region}\.amazonaws\.com/eks/aws-efa-k8s-device-plugin", values["image"]["repository"]
    )


def test_efa_image_registry_for_every_known_region() -> None:
    regions = yaml.safe_load((ROOT / "dlinfra" / "data" / "regions.yaml").read_text())
    for region in regions:
        assert pinned.image_registry("aws-efa-k8s-device-plugin", region).endswith(f".dkr.ecr.{region}.amazonaws.com")
    with pytest.raises(DlinfraError, match=r"aws-efa-k8s-device-plugin\.image_registries: no image registry pinned"):
        pinned.image_registry("aws-efa-k8s-device-plugin", "mars-north-1")
    with pytest.raises(ValueError, match="instance_types"):
        efa.efa_device_plugin_values("us-west-2", [])
