"""Cilium for hybrid nodes: multi-pool IPAM with one pod pool per site, BGP with the site gateway."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import jsonschema
import pytest

from components.charts import cilium, nodes, pinned
from dlinfra.model import hybrid_routing, planner, sites
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet
from dlinfra.render import nodeadm
from tests.components._platform import CILIUM_SCHEMA, Stack, regional_stacks
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK


def test_cilium_only_on_hybrid_nodes_with_multi_pool_ipam(stacks: dict[str, Stack], fleet: Fleet) -> None:
    for name, stack in stacks.items():
        env, region = stack.role.environment, stack.role.region
        if not fleet.sites_of(env, region):
            assert "platform-cilium" not in stack.by_name, name
            assert not stack.of_type(f"kubernetes:{cilium.CILIUM_POOL_API}:CiliumPodIPPool"), name
            continue
        values = stack.release("cilium")["values"]
        terms = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert terms == [
            {"matchExpressions": [{"key": "eks.amazonaws.com/compute-type", "operator": "In", "values": ["hybrid"]}]}
        ]
        # The pools are objects now (one per site); no cluster-wide CIDR list is left in the values.
        assert values["ipam"] == {"mode": "multi-pool"}
        assert values["routingMode"] == "native" and values["endpointRoutes"] == {"enabled": True}
        assert values["enableIPv4Masquerade"] is False
        assert values["bgpControlPlane"] == {"enabled": True}
        assert values["operator"] == {"unmanagedPodWatcher": {"restart": False}}
        # Services stay with kube-proxy, so NodeLocal DNSCache's iptables interception holds on hybrid nodes; with
        # the replacement on it would need a CiliumLocalRedirectPolicy instead.
        assert values["kubeProxyReplacement"] == "false"
        assert not stack.of_type(f"kubernetes:{cilium.CILIUM_API}:CiliumLocalRedirectPolicy")


def _cilium(stack: Stack, kind: str) -> dict[str, dict[str, Any]]:
    api = cilium.CILIUM_POOL_API if kind == "CiliumPodIPPool" else cilium.CILIUM_API
    return {r.inputs["metadata"]["name"]: r.inputs for r in stack.of_type(f"kubernetes:{api}:{kind}")}


@pytest.mark.parametrize("stack_name", regional_stacks())
def test_one_pod_pool_per_site_equal_to_the_clusters_remote_pod_networks(
    stacks: dict[str, Stack], fleet: Fleet, stack_name: str
) -> None:
    stack = stacks[stack_name]
    homed = sorted(fleet.sites_of(stack.role.environment, stack.role.region))
    pools = _cilium(stack, "CiliumPodIPPool")
    assert sorted(pools) == [f"site-{s}" for s in homed]
    (cluster,) = stack.of_type("aws:eks/cluster:Cluster") or [None]
    remote = (cluster.inputs.get("remoteNetworkConfig") if cluster else None) or {}
    declared = [c for s in homed for c in pools[f"site-{s}"]["spec"]["ipv4"]["cidrs"]]
    assert declared == remote.get("remotePodNetworks", {}).get("cidrs", [])
    nets = [ipaddress.IPv4Network(c) for c in declared]
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1 :])
    for site in homed:
        pool = pools[f"site-{site}"]
        assert pool["spec"]["ipv4"]["maskSize"] == 25
        assert pool["metadata"]["labels"][nodes.SITE_LABEL] == site


@pytest.mark.parametrize("stack_name", regional_stacks())
def test_each_sites_nodes_take_pods_only_from_their_pool_and_peer_with_their_gateway(
    stacks: dict[str, Stack], fleet: Fleet, stack_name: str
) -> None:
    stack = stacks[stack_name]
    homed = fleet.sites_of(stack.role.environment, stack.role.region)
    plan = planner.plan(load_fleet(REFERENCE_FLEET), planner.load_lock(REFERENCE_LOCK))
    configs, clusters = _cilium(stack, "CiliumNodeConfig"), _cilium(stack, "CiliumBGPClusterConfig")
    peers, adverts = _cilium(stack, "CiliumBGPPeerConfig"), _cilium(stack, "CiliumBGPAdvertisement")
    assert set(configs) == set(clusters) == set(peers) == set(adverts) == {f"site-{s}" for s in homed}
    selectors = []
    for site, spec in homed.items():
        name = f"site-{site}"
        node_config = configs[name]
        # Cilium reads node configs from its own namespace; the selector is the label nodeadm registers with.
        assert node_config["metadata"]["namespace"] == pinned.load_addons()["cilium"].namespace
        assert node_config["spec"]["nodeSelector"] == {"matchLabels": {nodeadm.SITE_LABEL: site}}
        assert node_config["spec"]["defaults"] == {
            "ipam-default-ip-pool": name,
            "ipam-multi-pool-pre-allocation": f"{name}=8",
        }
        selectors.append(json.dumps(node_config["spec"]["nodeSelector"], sort_keys=True))
        cluster = clusters[name]["spec"]
        assert cluster["nodeSelector"] == node_config["spec"]["nodeSelector"]
        (instance,) = cluster["bgpInstances"]
        (peer,) = instance["peers"]
        lan = sites.site_lan(plan, site)
        # iBGP in the site's ASN with the gateway's LAN address (its first host, as the gateway is set up).
        assert instance["localASN"] == peer["peerASN"] == spec.asn
        assert peer["peerAddress"] == str(lan[1])
        assert peer["peerConfigRef"] == {"name": name}
        (family,) = peers[name]["spec"]["families"]
        assert family["advertisements"] == {"matchLabels": {nodes.SITE_LABEL: site}}
        assert adverts[name]["metadata"]["labels"][nodes.SITE_LABEL] == site
        (advert,) = adverts[name]["spec"]["advertisements"]
        assert advert == {"advertisementType": "CiliumPodIPPool", "selector": {"matchLabels": {nodes.SITE_LABEL: site}}}
        assert peers[name]["spec"]["timers"]["holdTimeSeconds"] == hybrid_routing.BGP_HOLD_SECONDS
        assert peers[name]["spec"]["gracefulRestart"]["enabled"] is True
    assert len(set(selectors)) == len(selectors)


def test_two_sites_in_one_region_get_disjoint_pools_and_distinct_selectors() -> None:
    """The reference fleet homes one site per region; the specs for two sites of one region, side by side."""
    cidrs = {"sjc1": "10.202.0.0/18", "sjc2": "10.202.64.0/18"}
    pools = {s: cilium.cilium_pool_spec(c)["ipv4"]["cidrs"] for s, c in cidrs.items()}
    assert pools == {s: [c] for s, c in cidrs.items()}
    configs = {s: cilium.cilium_node_config_spec(s) for s in cidrs}
    assert configs["sjc1"]["nodeSelector"] != configs["sjc2"]["nodeSelector"]
    assert configs["sjc1"]["defaults"]["ipam-default-ip-pool"] == "site-sjc1"
    assert configs["sjc2"]["defaults"]["ipam-multi-pool-pre-allocation"] == "site-sjc2=8"
    adverts = {s: cilium.cilium_bgp_advertisement_spec(s)["advertisements"][0]["selector"] for s in cidrs}
    assert adverts["sjc1"] != adverts["sjc2"]


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"kind": "CiliumPodIPPool", "apiVersion": cilium.CILIUM_API, "metadata": {"name": "a"},
          "spec": {"ipv4": {"cidrs": ["10.0.0.0/16"], "maskSize": 25}}}, "'cilium.io/v2alpha1' was expected"),
        ({"kind": "CiliumNodeConfig", "apiVersion": cilium.CILIUM_API, "metadata": {"name": "a"},
          "spec": {"nodeSelector": {}, "defaults": {}}}, "'namespace' is a required property"),
        ({"kind": "CiliumBGPAdvertisement", "apiVersion": cilium.CILIUM_API, "metadata": {"name": "a"},
          "spec": {"advertisements": [{"advertisementType": "PodCidr"}]}}, "is not one of"),
        ({"kind": "CiliumBGPPeerConfig", "apiVersion": cilium.CILIUM_API, "metadata": {"name": "a"},
          "spec": {"timers": {"holdTime": 9}}}, "'holdTime' was unexpected"),
    ],
)  # fmt: skip
def test_cilium_schema_catches_mistakes(manifest: dict[str, Any], message: str) -> None:
    validator = jsonschema.Draft202012Validator(json.loads(CILIUM_SCHEMA.read_text()))
    errors = [e.message for e in validator.iter_errors(manifest)]
    assert any(message in e for e in errors), errors


def test_cilium_objects_wait_for_the_crds_its_operator_registers(stacks: dict[str, Stack]) -> None:
    """The chart ships no CRDs (Cilium 1.18.12: no crds/ folder, operator.skipCRDCreation false, the operator's
    ClusterRole may create CRDs): every cilium.io object waits for a CrdWait on its kind's CRD, after the release."""
    for name, stack in stacks.items():
        objects = [r for r in stack.resources if r.type.startswith("kubernetes:cilium.io/")]
        waits = [r for r in stack.resources if r.type == "pulumi-python:dynamic:Resource" and r.name.endswith("-crds")]
        if not objects:
            assert not waits, name
            continue
        (wait,) = waits
        assert stack.by_name["platform-cilium"].urn in wait.dependencies
        crds = wait.inputs["crds"]
        for record in objects:
            assert wait.urn in record.dependencies, record.name
            assert cilium.crd_name(record.type.rsplit(":", 1)[1]) in crds, record.name
        assert sorted({r.type.rsplit(":", 1)[1] for r in objects}) == sorted(cilium.CILIUM_KINDS)
        # The kubeconfig the stack's Kubernetes provider uses: exec authentication, no credentials in it.
        (provider,) = stack.of_type("pulumi:providers:kubernetes")
        assert wait.inputs["kubeconfig"] == provider.inputs["kubeconfig"]


def test_crd_names_are_the_operators() -> None:
    """As the pinned chart's operator ClusterRole names them (cilium 1.18.12, cilium-operator/clusterrole.yaml)."""
    assert [cilium.crd_name(k) for k in cilium.CILIUM_KINDS] == [
        "ciliumpodippools.cilium.io",
        "ciliumnodeconfigs.cilium.io",
        "ciliumbgpclusterconfigs.cilium.io",
        "ciliumbgppeerconfigs.cilium.io",
        "ciliumbgpadvertisements.cilium.io",
    ]
