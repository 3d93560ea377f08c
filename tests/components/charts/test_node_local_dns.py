"""NodeLocal DNSCache: on every node, answering on the kube-dns address."""

from __future__ import annotations

import pytest

from components.charts.nodes import GPU_TAINT_KEY, SITE_GPU_TAINT
from dlinfra.model import dns, planner
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet
from tests.components._platform import Stack, regional_stacks
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK


def _tolerates(tolerations: list[dict[str, str]], key: str, value: str, effect: str) -> bool:
    """Kubernetes' toleration matching: an empty key with Exists matches every taint; an empty effect every effect."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != effect:
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == key):
            return True
        if t.get("key") == key and t.get("value", "") == value:
            return True
    return False


@pytest.mark.parametrize("stack_name", regional_stacks())
def test_node_local_dns_on_every_node(stacks: dict[str, Stack], fleet: Fleet, stack_name: str) -> None:
    stack = stacks[stack_name]
    env, region = stack.role.environment, stack.role.region
    plan = planner.plan(load_fleet(REFERENCE_FLEET), planner.load_lock(REFERENCE_LOCK))
    kube_dns = dns.kube_dns_ip(str(plan.cidr(f"service/{env}/{region}")))
    release = stack.release("node-local-dns")
    assert release["namespace"] == "kube-system"
    values = release["values"]
    config = values["config"]
    # The link-local address kubelets list first, and the kube-dns address it intercepts (iptables mode).
    assert config["localDns"] == dns.NODE_LOCAL_DNS == "169.254.20.10"
    assert config["dnsServer"] == kube_dns
    assert config["setupIptables"] is True and config["setupInterface"] is True and config["bindIp"] is True
    # It tears its rules down when it stops, so kube-dns queries reach CoreDNS while it restarts.
    assert config["skipTeardown"] is False
    # Everything goes to CoreDNS through the chart's upstream service (another address than kube-dns, which
    # the cache itself answers on), never back into the cache.
    assert config["upstreamServers"] == "__PILLAR__CLUSTER__DNS__"
    assert "customUpstreamsvc" not in config
    # On every node: every pool's taints, the GPU taint, the sites' taints; no affinity or selector narrows it.
    assert "affinity" not in values and "nodeSelector" not in values
    taints = [t for p in fleet.pools_in(env, region).values() for t in ((x.key, x.value, x.effect) for x in p.taints)]
    taints += [
        SITE_GPU_TAINT,
        (GPU_TAINT_KEY, "true", "NoSchedule"),
        ("node.kubernetes.io/unreachable", "", "NoExecute"),
    ]
    for key, value, effect in taints:
        assert _tolerates(values["tolerations"], key, value, effect), (key, effect)
    # The kubelets of the same region point at it, cloud (user data) and hybrid (the exported NodeConfig setting).
    assert stack.outputs["cluster_dns"] == [dns.NODE_LOCAL_DNS, kube_dns]


def test_toleration_matching_is_not_vacuous() -> None:
    assert not _tolerates([{"key": "a", "operator": "Exists", "effect": "NoSchedule"}], "b", "", "NoSchedule")
    assert not _tolerates([{"key": "a", "operator": "Exists", "effect": "NoSchedule"}], "a", "", "NoExecute")
    assert _tolerates([{"operator": "Exists"}], "nvidia.com/gpu", "true", "NoSchedule")
