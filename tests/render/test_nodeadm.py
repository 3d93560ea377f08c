"""The hybrid nodes' nodeadm NodeConfig: golden file, secret handling, bad input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from dlinfra.render.nodeadm import NODE_CONFIG_API, HybridNodeView, render_node_config

GOLDEN = Path(__file__).parent / "golden"
VIEW = HybridNodeView(
    site="sjc1",
    cluster_name="dlinfra-prod-usw2-eks",
    region="us-west-2",
    activation_id="2b6c5d0e-1f3a-4b7c-9d8e-0a1b2c3d4e5f",
    activation_code="golden.activation.code",
    gpu_labels={"dlinfra.io/gpu-model": "H100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    cluster_dns=("169.254.20.10", "172.20.0.10"),
)


def test_golden() -> None:
    rendered = render_node_config(VIEW)
    golden = GOLDEN / "nodeadm_gpu.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert rendered == golden.read_text()


def test_structure() -> None:
    config = yaml.safe_load(render_node_config(VIEW))
    assert config["apiVersion"] == NODE_CONFIG_API and config["kind"] == "NodeConfig"
    spec = config["spec"]
    assert spec["cluster"] == {"name": "dlinfra-prod-usw2-eks", "region": "us-west-2"}
    assert spec["hybrid"]["ssm"]["activationId"] == VIEW.activation_id
    assert (
        "--node-labels=dlinfra.io/gpu-model=H100,dlinfra.io/pool=site-sjc1,dlinfra.io/site=sjc1,"
        "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" in spec["kubelet"]["flags"]
    )
    # GPU machines join with the GPU taint and the burn-in taint, which the burn-in agent removes once their check
    # has passed (dlinfra.model.gpu_health).
    assert (
        "--register-with-taints=nvidia.com/gpu=true:NoSchedule,dlinfra.io/gpu-burn-in-site=pending:NoSchedule"
        in spec["kubelet"]["flags"]
    )
    assert 'default_runtime_name = "nvidia"' in spec["containerd"]["config"]
    # Pods ask the node's NodeLocal DNS cache first, kube-dns while it restarts.
    # And stop their pods with their grace when the machine reboots (the GPU repair reboots a site machine).
    assert spec["kubelet"]["config"] == {
        "clusterDNS": ["169.254.20.10", "172.20.0.10"],
        "shutdownGracePeriod": "3630s",
        "shutdownGracePeriodCriticalPods": "30s",
    }


def test_cpu_machines_get_no_gpu_runtime_or_taint() -> None:
    view = HybridNodeView(
        site="s",
        cluster_name="c",
        region="us-west-2",
        activation_id="abcdefgh-1",
        activation_code="x",
        cluster_dns=("169.254.20.10",),
    )
    spec = yaml.safe_load(render_node_config(view))["spec"]
    assert "containerd" not in spec
    assert not any(f.startswith("--register-with-taints") for f in spec["kubelet"]["flags"])


def test_activation_code_never_in_repr() -> None:
    assert "golden.activation.code" not in repr(VIEW)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"activation_code": "[secret]"}, "activation_code: missing or masked"),
        ({"activation_code": ""}, "activation_code: missing or masked"),
        ({"activation_id": "x"}, "activation_id: 'x' does not look like an SSM activation id"),
        ({"cluster_dns": ()}, "cluster_dns: at least one address"),
        ({"cluster_dns": ("169.254.20.10", "kube-dns")}, "cluster_dns: 'kube-dns' is not an IPv4 address"),
    ],
)
def test_bad_input(overrides: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {
        "site": "s", "cluster_name": "c", "region": "us-west-2", "activation_id": "abcdefgh-1", "activation_code": "x",
        "cluster_dns": ("169.254.20.10",),
    } | overrides  # fmt: skip
    with pytest.raises(ValueError, match=message):
        HybridNodeView(**fields)
