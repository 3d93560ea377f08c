"""Platform under the mock engine, for every regional stack of the reference fleet.

Until stacks/regional.py declares it, a small program builds it from the fleet with fake node pool outputs.
Every Kubernetes object we write (not the Helm charts) is validated strictly against the cluster's version:
core kinds with kubernetes-validate, Kueue kinds with tests/fixtures/k8s/kueue.x-k8s.io-v1beta2.json.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from components import nodepool
from components import platform_values as pv
from components.platform import (
    SITE_GPU_TAINT,
    PlatformArgs,
    PoolView,
    SiteView,
    TeamView,
    platform_args_from_fleet,
    team_group,
)
from dlinfra.errors import DlinfraError
from dlinfra.model import dns, hybrid_routing, kueue, planner, sites, stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.naming import Names
from dlinfra.offline import plan_export, schema
from dlinfra.render import nodeadm
from tests import reference
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

CONFIG = {"dlinfra:fleet": str(REFERENCE_FLEET), "dlinfra:lock": str(REFERENCE_LOCK)}
KUEUE_SCHEMA = Path(__file__).parent.parent / "fixtures" / "k8s" / "kueue.x-k8s.io-v1beta2.json"
CILIUM_SCHEMA = Path(__file__).parent.parent / "fixtures" / "k8s" / "cilium.io.json"
RELEASE = "kubernetes:helm.sh/v3:Release"
FS_ID, AP_ID = "fs-0123456789abcdef0", "fsap-0123456789abcdef0"
ACCOUNT = "123456789012"


class Stack:
    """One region's platform records, indexed for the tests: the AWS side from the regional stack, the
    Kubernetes objects from its in-cluster stack."""

    def __init__(self, regional: plan_export.StackResult, in_cluster: plan_export.StackResult) -> None:
        self.role = regional.role
        self.outputs = regional.outputs
        self.resources = regional.resources + in_cluster.resources
        self.by_name = {r.name: r for r in self.resources if r.type != "pulumi:pulumi:StackReference"}

    def of_type(self, type_token: str) -> list[plan_export.ResourceRecord]:
        return [r for r in self.resources if r.type == type_token]

    def release(self, addon: str) -> dict[str, Any]:
        return self.by_name[f"platform-{addon}"].inputs

    def kueue(self, kind: str) -> dict[str, dict[str, Any]]:
        return {
            r.inputs["metadata"]["name"] + "/" + r.inputs["metadata"].get("namespace", ""): r.inputs
            for r in self.of_type(f"kubernetes:{pv.KUEUE_API}:{kind}")
        }

    def queues(self) -> dict[str, dict[str, Any]]:
        """Every team's own ClusterQueue (in the cohort), by team; overflow queues are not teams'."""
        return {
            key.split("/")[0]: value
            for key, value in self.kueue("ClusterQueue").items()
            if "admissionChecksStrategy" not in value["spec"]
        }


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return load_fleet(REFERENCE_FLEET).fleet


@pytest.fixture(scope="module")
def stacks(fleet: Fleet) -> dict[str, Stack]:
    """Every region's platform, from the shared offline run of the reference fleet."""
    runs = reference.runs()
    return {
        role.name: Stack(runs[role.name], runs[f"{role.name}-k8s"])
        for role in stackroles.roles(fleet)
        if role.kind == "regional"
    }


def _regional() -> list[str]:
    fleet = load_fleet(REFERENCE_FLEET).fleet
    return [r.name for r in stackroles.roles(fleet) if r.kind == "regional"]


def _names(stack: Stack) -> Names:
    return Names("dlinfra", stack.role.environment, stack.role.region)


def _asg(stack: Stack, pool: str) -> str:
    return _names(stack).physical("pool", pool, max_len=255)


# Add-ons -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stack_name", _regional())
def test_every_addon_is_a_pinned_release(stacks: dict[str, Stack], fleet: Fleet, stack_name: str) -> None:
    stack = stacks[stack_name]
    expected = set(pv.ADDONS)
    if not fleet.sites_of(stack.role.environment, stack.role.region):
        expected.remove("cilium")  # hybrid nodes need a CNI only where sites join
    if not any(p.efa for p in fleet.pools_in(stack.role.environment, stack.role.region).values()):
        expected.remove("aws-efa-k8s-device-plugin")  # only where EFA pools run
    releases = {r.inputs["name"]: r for r in stack.of_type(RELEASE)}
    assert set(releases) == expected
    for addon, record in releases.items():
        spec = pv.load_addons()[addon]
        inputs = record.inputs
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", inputs["version"]) and inputs["version"] == spec.version
        assert inputs["chart"] == spec.chart and inputs["namespace"] == spec.namespace
        if spec.repository:
            assert inputs["repositoryOpts"] == {"repo": spec.repository}
        else:
            assert inputs["chart"].startswith("oci://") and "repositoryOpts" not in inputs
        assert inputs["atomic"] is True


def test_addons_file_pins_exact_versions_from_https_or_oci() -> None:
    for addon, spec in pv.load_addons().items():
        assert spec.chart.startswith("oci://") or (spec.repository or "").startswith("https://"), addon
        assert spec.verified


def test_gpu_addons_run_only_on_gpu_nodes(stacks: dict[str, Stack]) -> None:
    stack = stacks["prod-us-west-2"]
    for addon in ("nvidia-device-plugin", "dcgm-exporter"):
        values = stack.release(addon)["values"]
        terms = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        keys = {e["key"] for term in terms for e in term["matchExpressions"]}
        assert keys == {"nvidia.com/gpu.product", "nvidia.com/gpu.present"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]
    assert stack.release("nvidia-device-plugin")["values"]["gfd"] == {"enabled": False}
    # /dev/infiniband belongs to the EFA device plugin: the NVIDIA plugin must not hand it to GPU containers.
    assert stack.release("nvidia-device-plugin")["values"]["mofedEnabled"] is False
    assert stack.release("dcgm-exporter")["values"]["serviceMonitor"] == {"enabled": False}


@pytest.mark.parametrize("stack_name", _regional())
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
            names=_names(stack), pool=name, kind=pool.kind, cluster_name="c", ami_id="ami-0",
            instance_types=pool.instance_types, subnet_ids={"a": "s"}, vpc_id="vpc-0", efa=True,
            taints=[(t.key, t.value, t.effect) for t in pool.taints], cluster_dns=("169.254.20.10",),
        )  # fmt: skip
        assert selector in nodepool.node_labels(args).items()
        assert f"k8s.io/cluster-autoscaler/node-template/label/{selector[0]}" in nodepool.autoscaler_tags(args)
        # ... which also promise the EFA resource the plugin advertises.
        assert f"k8s.io/cluster-autoscaler/node-template/resources/{pv.EFA_RESOURCE}" in nodepool.autoscaler_tags(args)
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
        assert pv.image_registry("aws-efa-k8s-device-plugin", region).endswith(f".dkr.ecr.{region}.amazonaws.com")
    with pytest.raises(DlinfraError, match=r"aws-efa-k8s-device-plugin\.image_registries: no image registry pinned"):
        pv.image_registry("aws-efa-k8s-device-plugin", "mars-north-1")
    with pytest.raises(ValueError, match="instance_types"):
        pv.efa_device_plugin_values("us-west-2", [])


# NodeLocal DNSCache ------------------------------------------------------------------------------------


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


@pytest.mark.parametrize("stack_name", _regional())
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
        (pv.GPU_TAINT_KEY, "true", "NoSchedule"),
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


# cluster-autoscaler ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stack_name", _regional())
def test_autoscaler_discovers_this_clusters_pools(stacks: dict[str, Stack], fleet: Fleet, stack_name: str) -> None:
    stack = stacks[stack_name]
    cluster = _names(stack).physical("eks")
    values = stack.release("cluster-autoscaler")["values"]
    assert values["autoDiscovery"]["clusterName"] == cluster
    # The discovery tags are exactly the ones NodePool puts on its groups.
    pool_args = nodepool.NodePoolArgs(
        names=_names(stack), pool="p", kind="cpu", cluster_name=cluster, ami_id="ami-0", instance_types=["m7i.4xlarge"],
        subnet_ids={"a": "s"}, vpc_id="vpc-0", cluster_dns=("169.254.20.10",),
    )  # fmt: skip
    pool_tags = {k for k, v in nodepool.autoscaler_tags(pool_args).items() if v in ("true", "owned")}
    assert set(values["autoDiscovery"]["tags"]) == pool_tags
    assert values["awsRegion"] == stack.role.region
    assert values["image"]["tag"].startswith(f"v{fleet.environments[stack.role.environment].kubernetes.version}.")
    args = values["extraArgs"]
    assert args["expander"].split(",")[0] == "priority"
    assert args["skip-nodes-with-local-storage"] == "false" and args["balance-similar-node-groups"] == "true"
    assert float(args["scale-down-gpu-utilization-threshold"]) < 1 / 8  # never evicts a running GPU job
    assert "scale-down-utilization-threshold" in args


@pytest.mark.parametrize("stack_name", _regional())
def test_priority_expander_ranks_reserved_on_demand_spot(
    stacks: dict[str, Stack], fleet: Fleet, stack_name: str
) -> None:
    stack = stacks[stack_name]
    env, region = stack.role.environment, stack.role.region
    (config_map,) = stack.of_type("kubernetes:core/v1:ConfigMap")
    assert config_map.inputs["metadata"] == {
        "name": "cluster-autoscaler-priority-expander",
        "namespace": "kube-system",
        "labels": {"app.kubernetes.io/managed-by": "pulumi-dlinfra"},
    }
    priorities = yaml.safe_load(config_map.inputs["data"]["priorities"])
    rank = {}
    for priority, patterns in priorities.items():
        for pattern in patterns:
            matched = [p for p in fleet.pools_in(env, region) if re.fullmatch(pattern, _asg(stack, p))]
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


@pytest.mark.parametrize("addon", ["cluster-autoscaler", "node-termination-handler"])
def test_pod_identity_for_the_chart_service_account(stacks: dict[str, Stack], addon: str) -> None:
    stack = stacks["prod-us-west-2"]
    cluster = _names(stack).physical("eks")
    role = stack.by_name[f"platform-{addon}-role"]
    association = stack.by_name[f"platform-{addon}-identity"]
    release = stack.by_name[
        "platform-cluster-autoscaler" if addon == "cluster-autoscaler" else "platform-aws-node-termination-handler"
    ]
    values = release.inputs["values"]
    service_account = values["rbac"]["serviceAccount"] if addon == "cluster-autoscaler" else values["serviceAccount"]
    assert association.inputs == {
        "clusterName": cluster,
        "namespace": release.inputs["namespace"],
        "serviceAccount": service_account["name"],
        "roleArn": role.outputs["arn"],
        "tags": association.inputs["tags"],
    }
    # The role and association are AWS resources of the regional stack; the release that uses them is in the
    # in-cluster stack, applied after it.
    assert association.urn.startswith(f"urn:pulumi:{stack.role.name}::")
    assert release.urn.startswith(f"urn:pulumi:{stack.role.name}-k8s::")
    trust = json.loads(role.inputs["assumeRolePolicy"])
    (statement,) = trust["Statement"]
    assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert statement["Condition"]["StringEquals"] == {
        "aws:RequestTag/eks-cluster-name": cluster,
        "aws:RequestTag/kubernetes-namespace": "kube-system",
        "aws:RequestTag/kubernetes-service-account": service_account["name"],
    }
    # No IRSA anywhere: no OIDC principal, no role annotation on the service account.
    assert "annotations" not in service_account and "Federated" not in role.inputs["assumeRolePolicy"]


def test_autoscaler_policy_is_scoped_by_the_cluster_tag(stacks: dict[str, Stack]) -> None:
    stack = stacks["prod-us-west-2"]
    cluster = _names(stack).physical("eks")
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


# Termination handler -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stack_name", _regional())
def test_termination_handler_queue_rules_and_values(stacks: dict[str, Stack], fleet: Fleet, stack_name: str) -> None:
    stack = stacks[stack_name]
    env, region = stack.role.environment, stack.role.region
    (queue,) = stack.of_type("aws:sqs/queue:Queue")
    assert queue.inputs["sqsManagedSseEnabled"] is True
    queue_arn, queue_url = queue.outputs["arn"], queue.outputs["url"]
    rules = {r.name.removeprefix("platform-nth-"): r for r in stack.of_type("aws:cloudwatch/eventRule:EventRule")}
    patterns = {key: json.loads(rule.inputs["eventPattern"]) for key, rule in rules.items()}
    assert patterns["scheduled-change"] == {
        "source": ["aws.health"],
        "detail-type": ["AWS Health Event"],
        "detail": {
            "service": ["EC2"],
            "eventTypeCategory": ["scheduledChange"],
            "$or": [{"statusCode": ["upcoming", "open"]}, {"statusCode": [{"exists": False}]}],
        },
    }  # which events it routes: tests/components/test_maintenance.py
    assert patterns["spot-interruption"]["detail-type"] == ["EC2 Spot Instance Interruption Warning"]
    assert patterns["rebalance"]["detail-type"] == ["EC2 Instance Rebalance Recommendation"]
    assert patterns["state-change"]["detail-type"] == ["EC2 Instance State-change Notification"]
    assert patterns["asg-lifecycle"] == {
        "source": ["aws.autoscaling"],
        "detail-type": ["EC2 Instance-terminate Lifecycle Action"],
        # In pool-name order, so reordering the fleet's pools changes no pattern.
        "detail": {"AutoScalingGroupName": [_asg(stack, p) for p in sorted(fleet.pools_in(env, region))]},
    }
    targets = stack.of_type("aws:cloudwatch/eventTarget:EventTarget")
    assert sorted(t.inputs["rule"] for t in targets) == sorted(r.inputs["name"] for r in rules.values())
    assert {t.inputs["arn"] for t in targets} == {queue_arn}
    (queue_policy,) = stack.of_type("aws:sqs/queuePolicy:QueuePolicy")
    assert queue_policy.inputs["queueUrl"] == queue_url
    allow, deny = json.loads(queue_policy.inputs["policy"])["Statement"]
    assert allow["Principal"] == {"Service": "events.amazonaws.com"} and allow["Action"] == "sqs:SendMessage"
    assert allow["Resource"] == queue_arn
    assert sorted(allow["Condition"]["ArnEquals"]["aws:SourceArn"]) == sorted(r.outputs["arn"] for r in rules.values())
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    values = stack.release("aws-node-termination-handler")["values"]
    assert values["enableSqsTerminationDraining"] is True and values["queueURL"] == queue_url
    assert values["cordonOnly"] is False and values["taintNode"] is True  # cordon, taint and drain
    assert values["awsRegion"] == region


def test_termination_handler_least_privilege(stacks: dict[str, Stack], fleet: Fleet) -> None:
    stack = stacks["prod-eu-west-1"]
    (queue,) = stack.of_type("aws:sqs/queue:Queue")
    policy = json.loads(stack.by_name["platform-node-termination-handler-policy"].inputs["policy"])
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert by_sid["ConsumeQueue"]["Action"] == ["sqs:ReceiveMessage", "sqs:DeleteMessage"]
    assert by_sid["ConsumeQueue"]["Resource"] == queue.outputs["arn"]
    assert by_sid["DescribeInstances"]["Action"] == "ec2:DescribeInstances"
    lifecycle = by_sid["CompleteLifecycle"]
    assert lifecycle["Action"] == "autoscaling:CompleteLifecycleAction"
    pools = sorted(fleet.pools_in("prod", "eu-west-1"))
    assert lifecycle["Resource"] == [stack.by_name[f"pool-{p}-asg"].outputs["arn"] for p in pools]
    assert set(by_sid) == {"ConsumeQueue", "DescribeInstances", "CompleteLifecycle"}


# Teams, Kueue --------------------------------------------------------------------------------------------


def test_team_namespaces_and_rbac(stacks: dict[str, Stack], fleet: Fleet) -> None:
    stack = stacks["prod-us-east-1"]
    namespaces = {r.inputs["metadata"]["name"]: r for r in stack.of_type("kubernetes:core/v1:Namespace")}
    assert set(namespaces) == {fleet.team_namespace(t) for t in fleet.teams}
    assert all(r.retain_on_delete for r in namespaces.values())
    bindings = stack.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    edit = {b.inputs["metadata"]["namespace"]: b.inputs for b in bindings if b.inputs["roleRef"]["name"] == "edit"}
    for team in fleet.teams:
        binding = edit[fleet.team_namespace(team)]
        assert binding["roleRef"]["kind"] == "ClusterRole"
        assert binding["subjects"] == [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": f"team:{team}"}
        ]
        assert team_group(team) == f"team:{team}"
        assert namespaces[fleet.team_namespace(team)].inputs["metadata"]["labels"]["dlinfra.io/team"] == team


def test_kueue_quotas_equal_the_fleets(stacks: dict[str, Stack], fleet: Fleet) -> None:
    totals = dict.fromkeys(fleet.teams, 0)
    for name, stack in stacks.items():
        if not name.startswith("prod-"):
            continue
        for team, queue in stack.queues().items():
            assert queue["spec"]["resourceGroups"][0]["coveredResources"] == ["nvidia.com/gpu"]
            totals[team] += sum(_nominal(queue).values())
    assert totals == {team: spec.gpu_quota for team, spec in fleet.teams.items()}


@pytest.mark.parametrize("stack_name", _regional())
def test_kueue_flavors_cohort_and_queues(stacks: dict[str, Stack], fleet: Fleet, stack_name: str) -> None:
    stack = stacks[stack_name]
    env, region = stack.role.environment, stack.role.region
    policy = "scaled" if env == "staging" else "guaranteed"
    planned = kueue.plan(fleet, env, policy).region(region)
    flavors = {key.rstrip("/"): value for key, value in stack.kueue("ResourceFlavor").items()}
    manager = kueue.overflow(fleet, kueue.plan(fleet, env, policy)).manager == region and fleet.multikueue_workers(env)
    assert sorted(flavors) == sorted([f.name for f in planned.flavors] + (["multikueue"] if manager else []))
    for flavor in planned.flavors:
        labels = flavors[flavor.name]["spec"]["nodeLabels"]
        assert labels["nvidia.com/gpu.product"] == flavor.gpu_model
        if flavor.source == "pool":
            assert labels["dlinfra.io/pool"] == flavor.source_name
            taints = fleet.environments[env].node_pools[flavor.source_name].taints
            assert flavors[flavor.name]["spec"].get("nodeTaints", []) == [
                {"key": t.key, "value": t.value, "effect": t.effect} for t in taints
            ]
        else:
            assert labels == {"dlinfra.io/site": flavor.source_name, "eks.amazonaws.com/compute-type": "hybrid",
                              "nvidia.com/gpu.product": flavor.gpu_model}  # fmt: skip
            # The labels and taint the site's machines register with (dlinfra/render/nodeadm.py).
            assert flavors[flavor.name]["spec"]["nodeTaints"] == [
                {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
            ]
    (cohort,) = stack.kueue("Cohort").values()
    assert cohort["metadata"]["name"] == "research"
    spare = _nominal(cohort)
    queues = stack.queues()
    assert set(queues) == set(fleet.teams)
    for flavor in planned.flavors:
        nominal = sum(_nominal(q)[flavor.name] for q in queues.values())
        assert nominal + spare[flavor.name] == flavor.gpus  # the cohort holds exactly what no team is guaranteed
    for team, queue in queues.items():
        spec = queue["spec"]
        assert spec["cohortName"] == "research"
        assert spec["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": fleet.team_namespace(team)}}
        assert spec["preemption"]["reclaimWithinCohort"] == "Any"
        # Admission order: owned sites, then reserved capacity, then on demand.
        assert [f["name"] for f in spec["resourceGroups"][0]["flavors"]] == [f.name for f in planned.flavors]
        for f in spec["resourceGroups"][0]["flavors"]:
            (res,) = f["resources"]
            capacity = next(x.gpus for x in planned.flavors if x.name == f["name"])
            assert int(res["nominalQuota"]) + int(res["borrowingLimit"]) == capacity  # may borrow the whole flavor
    local = {k: v for k, v in stack.kueue("LocalQueue").items() if k.startswith("default/")}
    assert set(local) == {f"default/{fleet.team_namespace(t)}" for t in fleet.teams}
    for team in fleet.teams:
        assert local[f"default/{fleet.team_namespace(team)}"]["spec"] == {"clusterQueue": team}


def test_multikueue_overflow(stacks: dict[str, Stack], fleet: Fleet) -> None:
    """Prod's manager (us-west-2) dispatches language's overflow to us-east-1 and eu-west-1, vision's to us-east-1;
    robotics stays local. Each worker trusts the manager with the least it needs."""
    quotas = kueue.plan(fleet, "prod", "guaranteed")
    plan = kueue.overflow(fleet, quotas)
    assert plan.manager == "us-west-2" and plan.workers == ("eu-west-1", "us-east-1")
    manager = stacks["prod-us-west-2"]
    clusters = {k.rstrip("/"): v["spec"] for k, v in manager.kueue("MultiKueueCluster").items()}
    assert clusters == {r: pv.multikueue_cluster_spec(r) for r in ("eu-west-1", "us-east-1")}
    secrets = {r.inputs["metadata"]["name"]: r for r in manager.of_type("kubernetes:core/v1:Secret")}
    for region in plan.workers:
        kubeconfig = yaml.safe_load(
            plan_export.unwrap(secrets[f"multikueue-{region}"].inputs["stringData"])[0]["kubeconfig"]
        )
        assert schema.is_secret(secrets[f"multikueue-{region}"].inputs["stringData"])  # never in plain text
        # A static token for the worker's EKS endpoint: MultiKueue refuses exec plugins and file paths.
        (user,) = kubeconfig["users"]
        assert set(user["user"]) == {"token"} and user["user"]["token"].startswith("fake-token-")
        (cluster,) = kubeconfig["clusters"]
        assert cluster["cluster"]["server"] == stacks[f"prod-{region}"].outputs["cluster_endpoint"]
    configs = {k.rstrip("/"): v["spec"] for k, v in manager.kueue("MultiKueueConfig").items()}
    assert configs == {
        "overflow-language": {"clusters": ["eu-west-1", "us-east-1"]},
        "overflow-vision": {"clusters": ["us-east-1"]},
    }
    queues = {k.rstrip("/"): v["spec"] for k, v in manager.kueue("ClusterQueue").items()}
    for team, regions in (("language", ("eu-west-1", "us-east-1")), ("vision", ("us-east-1",))):
        overflow = queues[f"{team}-overflow"]
        assert overflow["admissionChecksStrategy"] == {"admissionChecks": [{"name": f"overflow-{team}"}]}
        assert "cohortName" not in overflow  # remote GPUs are not lent to local queues
        # The manager's quota for a team's overflow is what the team holds in those regions.
        assert _nominal({"spec": overflow}) == {"multikueue": sum(quotas.region(r).team_total(team) for r in regions)}
    assert "robotics-overflow" not in queues
    local = manager.kueue("LocalQueue")
    assert local["overflow/team-language"]["spec"] == {"clusterQueue": "language-overflow"}
    assert "overflow/team-robotics" not in local
    for region, teams in (("us-east-1", {"language", "vision"}), ("eu-west-1", {"language"})):
        worker = stacks[f"prod-{region}"]
        assert not worker.kueue("MultiKueueCluster") and not worker.kueue("AdmissionCheck")
        # Jobs arrive with the queue name they were submitted with: `overflow` feeds the team's own queue.
        overflow_queues = {k: v["spec"] for k, v in worker.kueue("LocalQueue").items() if k.startswith("overflow/")}
        assert overflow_queues == {f"overflow/team-{t}": {"clusterQueue": t} for t in teams}
        bindings = {
            r.inputs["metadata"]["namespace"]: r.inputs
            for r in worker.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
            if r.inputs["metadata"]["name"] == pv.MULTIKUEUE_WRITE_ROLE
        }
        assert set(bindings) == {f"team-{t}" for t in teams}  # writes only where its teams' jobs land
        roles = {
            r.inputs["metadata"]["name"]: r.inputs["rules"]
            for r in worker.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
        }
        writes = {v for rule in roles[pv.MULTIKUEUE_WRITE_ROLE] for v in rule["verbs"]}
        reads = {v for rule in roles[pv.MULTIKUEUE_READ_ROLE] for v in rule["verbs"]}
        assert reads == {"get", "list", "watch"} and "*" not in writes
        assert {g for rule in roles[pv.MULTIKUEUE_WRITE_ROLE] for g in rule["apiGroups"]} <= {
            f.rsplit("/", 1)[0] for f in pv.KUEUE_FRAMEWORKS
        } | {"kueue.x-k8s.io"}
        assert not any(
            "secrets" in rule["resources"] or "pods" in rule["resources"]
            for rule in roles[pv.MULTIKUEUE_WRITE_ROLE] + roles[pv.MULTIKUEUE_READ_ROLE]
        )
    staging = stacks["staging-us-west-2"]
    assert not staging.kueue("MultiKueueCluster") and not staging.kueue("AdmissionCheck")


def _nominal(queue_or_cohort: Mapping[str, Any]) -> dict[str, int]:
    """Flavor -> nominal GPUs of a ClusterQueue or Cohort manifest."""
    (group,) = queue_or_cohort["spec"]["resourceGroups"]
    return {f["name"]: int(f["resources"][0]["nominalQuota"]) for f in group["flavors"]}


def test_kueue_objects_wait_for_the_kueue_chart(stacks: dict[str, Stack]) -> None:
    stack = stacks["prod-us-west-2"]
    release = stack.by_name["platform-kueue"].urn
    for record in stack.of_type(f"kubernetes:{pv.KUEUE_API}:ResourceFlavor"):
        assert release in record.dependencies
    config = yaml.safe_load(stack.release("kueue")["values"]["managerConfig"]["controllerManagerConfigYaml"])
    assert config["resources"] == {"quotaCheckStrategy": "IgnoreUndeclared"}
    assert config["managedJobsNamespaceSelector"]["matchExpressions"][0]["key"] == "dlinfra.io/team"


# Storage, Cilium ----------------------------------------------------------------------------------------


def test_efs_storage_class_and_datasets(stacks: dict[str, Stack], fleet: Fleet) -> None:
    stack = stacks["prod-us-west-2"]
    # The file system and access point are the regional stack's, read through StackReference.
    fs_id, ap_id = stack.outputs["efs_id"], stack.outputs["efs_access_points"]["datasets"]
    (storage_class,) = stack.of_type("kubernetes:storage.k8s.io/v1:StorageClass")
    assert storage_class.inputs["provisioner"] == "efs.csi.aws.com"
    assert storage_class.inputs["parameters"]["provisioningMode"] == "efs-ap"
    assert storage_class.inputs["parameters"]["fileSystemId"] == fs_id
    assert storage_class.inputs["parameters"]["directoryPerms"] == "700"
    volumes = {
        r.inputs["metadata"]["name"]: r.inputs["spec"] for r in stack.of_type("kubernetes:core/v1:PersistentVolume")
    }
    claims = {
        r.inputs["metadata"]["namespace"]: r.inputs["spec"]
        for r in stack.of_type("kubernetes:core/v1:PersistentVolumeClaim")
    }
    assert set(claims) == {fleet.team_namespace(t) for t in fleet.teams}
    for namespace, claim in claims.items():
        volume = volumes[claim["volumeName"]]
        assert volume["csi"] == {"driver": "efs.csi.aws.com", "volumeHandle": f"{fs_id}::{ap_id}", "readOnly": True}
        assert volume["accessModes"] == claim["accessModes"] == ["ReadOnlyMany"]
        assert volume["claimRef"] == {"namespace": namespace, "name": "datasets"}
        assert volume["storageClassName"] == claim["storageClassName"] == ""
        assert volume["persistentVolumeReclaimPolicy"] == "Retain"


def test_cilium_only_on_hybrid_nodes_with_multi_pool_ipam(stacks: dict[str, Stack], fleet: Fleet) -> None:
    for name, stack in stacks.items():
        env, region = stack.role.environment, stack.role.region
        if not fleet.sites_of(env, region):
            assert "platform-cilium" not in stack.by_name, name
            assert not stack.of_type(f"kubernetes:{pv.CILIUM_POOL_API}:CiliumPodIPPool"), name
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
        assert not stack.of_type(f"kubernetes:{pv.CILIUM_API}:CiliumLocalRedirectPolicy")


def _cilium(stack: Stack, kind: str) -> dict[str, dict[str, Any]]:
    api = pv.CILIUM_POOL_API if kind == "CiliumPodIPPool" else pv.CILIUM_API
    return {r.inputs["metadata"]["name"]: r.inputs for r in stack.of_type(f"kubernetes:{api}:{kind}")}


@pytest.mark.parametrize("stack_name", _regional())
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
        assert pool["metadata"]["labels"][pv.SITE_LABEL] == site


@pytest.mark.parametrize("stack_name", _regional())
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
        assert node_config["metadata"]["namespace"] == pv.load_addons()["cilium"].namespace
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
        assert family["advertisements"] == {"matchLabels": {pv.SITE_LABEL: site}}
        assert adverts[name]["metadata"]["labels"][pv.SITE_LABEL] == site
        (advert,) = adverts[name]["spec"]["advertisements"]
        assert advert == {"advertisementType": "CiliumPodIPPool", "selector": {"matchLabels": {pv.SITE_LABEL: site}}}
        assert peers[name]["spec"]["timers"]["holdTimeSeconds"] == hybrid_routing.BGP_HOLD_SECONDS
        assert peers[name]["spec"]["gracefulRestart"]["enabled"] is True
    assert len(set(selectors)) == len(selectors)


def test_two_sites_in_one_region_get_disjoint_pools_and_distinct_selectors() -> None:
    """The reference fleet homes one site per region; the specs for two sites of one region, side by side."""
    cidrs = {"sjc1": "10.202.0.0/18", "sjc2": "10.202.64.0/18"}
    pools = {s: pv.cilium_pool_spec(c)["ipv4"]["cidrs"] for s, c in cidrs.items()}
    assert pools == {s: [c] for s, c in cidrs.items()}
    configs = {s: pv.cilium_node_config_spec(s) for s in cidrs}
    assert configs["sjc1"]["nodeSelector"] != configs["sjc2"]["nodeSelector"]
    assert configs["sjc1"]["defaults"]["ipam-default-ip-pool"] == "site-sjc1"
    assert configs["sjc2"]["defaults"]["ipam-multi-pool-pre-allocation"] == "site-sjc2=8"
    adverts = {s: pv.cilium_bgp_advertisement_spec(s)["advertisements"][0]["selector"] for s in cidrs}
    assert adverts["sjc1"] != adverts["sjc2"]


# Structure and validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("stack_name", _regional())
def test_children_have_the_platform_as_parent_and_kubernetes_the_cluster_provider(
    stacks: dict[str, Stack], stack_name: str
) -> None:
    stack = stacks[stack_name]
    (component,) = stack.of_type("dlinfra:platform:Platform")
    (aws_component,) = stack.of_type("dlinfra:platform:PlatformAws")
    (provider,) = stack.of_type("pulumi:providers:kubernetes")
    parents = {r.urn: r.parent for r in stack.resources}
    platform_aws = 0
    for record in stack.resources:
        if record.type.startswith("kubernetes:"):
            assert record.parent == component.urn, record.name
            assert record.provider == f"{provider.urn}::{provider.id}", record.name
        elif record.type.startswith("aws:") and record.name.startswith("platform-"):
            ancestor = record.parent
            while ancestor not in (aws_component.urn, None):
                ancestor = parents.get(ancestor)
            assert ancestor == aws_component.urn, record.name  # directly, or under the role or rule it belongs to
            platform_aws += 1
    assert platform_aws >= 10


def _manifests(stack: Stack) -> list[dict[str, Any]]:
    """The stack's Kubernetes objects as the API server gets them: secret values unwrapped."""
    return [
        plan_export.unwrap(r.inputs)[0]
        for r in stack.resources
        if r.type.startswith("kubernetes:") and r.type != RELEASE
    ]


@pytest.mark.parametrize("stack_name", _regional())
def test_every_manifest_validates_strictly(stacks: dict[str, Stack], fleet: Fleet, stack_name: str) -> None:
    stack = stacks[stack_name]
    version = fleet.environments[stack.role.environment].kubernetes.version
    kueue_validator = jsonschema.Draft202012Validator(json.loads(KUEUE_SCHEMA.read_text()))
    cilium_validator = jsonschema.Draft202012Validator(json.loads(CILIUM_SCHEMA.read_text()))
    manifests = _manifests(stack)
    assert len(manifests) > 20
    for manifest in manifests:
        if manifest["apiVersion"] == pv.KUEUE_API:
            kueue_validator.validate(manifest)
            _kueue_cel_rules(manifest)
        elif manifest["apiVersion"].startswith("cilium.io/"):
            cilium_validator.validate(manifest)
            _cilium_cel_rules(manifest)
        else:
            kubernetes_validate.validate(manifest, version, strict=True)


def _cilium_cel_rules(manifest: Mapping[str, Any]) -> None:
    """The rule the CiliumBGPAdvertisement CRD states in CEL: PodCIDR advertisements take no selector."""
    for advert in manifest.get("spec", {}).get("advertisements", []):
        assert advert["advertisementType"] != "PodCIDR" or "selector" not in advert


def _kueue_cel_rules(manifest: Mapping[str, Any]) -> None:
    """The rules the Kueue CRD states in CEL, which JSON schema cannot."""
    spec = manifest.get("spec", {})
    for group in spec.get("resourceGroups", []):
        for flavor in group["flavors"]:
            assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]
    if manifest["kind"] == "ClusterQueue" and "cohortName" not in spec:
        assert not any(
            "borrowingLimit" in r for g in spec["resourceGroups"] for f in g["flavors"] for r in f["resources"]
        )


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"kind": "ClusterQueue", "apiVersion": pv.KUEUE_API, "metadata": {"name": "a"}, "spec": {"cohort": "x"}},
         "'cohort' was unexpected"),
        ({"kind": "LocalQueue", "apiVersion": pv.KUEUE_API, "metadata": {"name": "a"}, "spec": {"clusterQueue": "a"}},
         "'namespace' is a required property"),
        ({"kind": "ResourceFlavor", "apiVersion": "kueue.x-k8s.io/v1beta1", "metadata": {"name": "a"}},
         "'kueue.x-k8s.io/v1beta2' was expected"),
        ({"kind": "ClusterQueue", "apiVersion": pv.KUEUE_API, "metadata": {"name": "a"}, "spec": {"resourceGroups": [
            {"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "f", "resources": [
                {"name": "nvidia.com/gpu", "nominalQuota": "eight"}]}]}]}},
         "is not valid under any of the given schemas"),
    ],
)  # fmt: skip
def test_kueue_schema_catches_mistakes(manifest: dict[str, Any], message: str) -> None:
    validator = jsonschema.Draft202012Validator(json.loads(KUEUE_SCHEMA.read_text()))
    errors = [e.message for e in validator.iter_errors(manifest)]
    assert any(message in e for e in errors), errors


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"kind": "CiliumPodIPPool", "apiVersion": pv.CILIUM_API, "metadata": {"name": "a"},
          "spec": {"ipv4": {"cidrs": ["10.0.0.0/16"], "maskSize": 25}}}, "'cilium.io/v2alpha1' was expected"),
        ({"kind": "CiliumNodeConfig", "apiVersion": pv.CILIUM_API, "metadata": {"name": "a"},
          "spec": {"nodeSelector": {}, "defaults": {}}}, "'namespace' is a required property"),
        ({"kind": "CiliumBGPAdvertisement", "apiVersion": pv.CILIUM_API, "metadata": {"name": "a"},
          "spec": {"advertisements": [{"advertisementType": "PodCidr"}]}}, "is not one of"),
        ({"kind": "CiliumBGPPeerConfig", "apiVersion": pv.CILIUM_API, "metadata": {"name": "a"},
          "spec": {"timers": {"holdTime": 9}}}, "'holdTime' was unexpected"),
    ],
)  # fmt: skip
def test_cilium_schema_catches_mistakes(manifest: dict[str, Any], message: str) -> None:
    validator = jsonschema.Draft202012Validator(json.loads(CILIUM_SCHEMA.read_text()))
    errors = [e.message for e in validator.iter_errors(manifest)]
    assert any(message in e for e in errors), errors


# Arguments ----------------------------------------------------------------------------------------------


def _args(fleet: Fleet, **overrides: Any) -> PlatformArgs:
    import pulumi

    quotas = kueue.plan(fleet, "prod").region("us-east-1")
    pool = PoolView(
        kind="gpu", instance_type="p5.48xlarge", gpus_per_node=8, gpu_model="H100", efa=True,
        capacity_class="on-demand", max_size=16, asg_name="asg",
    )  # fmt: skip
    small = PoolView(
        kind="gpu", instance_type="g6.12xlarge", gpus_per_node=4, gpu_model="L4", efa=False,
        capacity_class="on-demand", max_size=12, asg_name="asg2",
    )  # fmt: skip
    base: dict[str, Any] = {
        "names": Names("dlinfra", "prod", "us-east-1"),
        "region": "us-east-1",
        "cluster_name": "c",
        "kubernetes_version": "1.33",
        "provider": pulumi.ProviderResource.__new__(pulumi.ProviderResource),
        "pools": {"train-h100": pool, "interactive": small},
        "teams": {t: TeamView(namespace=f"team-{t}", group=team_group(t)) for t in fleet.teams},
        "quotas": quotas,
        "efs_file_system_id": FS_ID,
        "efs_datasets_access_point_id": AP_ID,
        "termination_queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/q",
        "kube_dns_ip": "172.20.0.10",
    }
    return PlatformArgs(**(base | overrides))


def test_args_from_the_fleet_are_accepted(fleet: Fleet) -> None:
    assert _args(fleet).quotas.region == "us-east-1"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kubernetes_version": "1.33.2"}, "expected a minor version like '1.33'"),
        ({"kubernetes_version": "1.29"}, "no cluster-autoscaler image pinned for Kubernetes 1.29"),
        ({"region": "eu-west-1"}, "planned for us-east-1"),
        ({"kube_dns_ip": "kube-dns"}, "kube_dns_ip: 'kube-dns' is not an IPv4 address"),
        ({"teams": {}}, "do not match teams"),
        ({"pools": {}}, "no GPU pool 'interactive' in pools"),
        ({"teams": {"vision": TeamView(namespace="x", group="g"), "language": TeamView(namespace="x", group="g"),
                    "robotics": TeamView(namespace="y", group="g")}}, "share a namespace"),
        ({"teams": {"vision": TeamView(namespace="kube-system", group="g"),
                    "language": TeamView(namespace="x", group="g"), "robotics": TeamView(namespace="y", group="g")}},
         "teams.vision.namespace: 'kube-system' belongs"),
    ],
)  # fmt: skip
def test_bad_args(fleet: Fleet, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=message):
        _args(fleet, **overrides)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "gpu", "gpus_per_node": 0, "gpu_model": None}, "needs gpus_per_node > 0"),
        ({"kind": "cpu", "gpus_per_node": 8, "gpu_model": "H100"}, "a CPU pool has no GPUs"),
        ({"max_size": -1}, "max_size"),
        ({"capacity_class": "owned"}, "capacity_class"),
    ],
)
def test_bad_pool_views(fields: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {
        "kind": "gpu", "instance_type": "p5.48xlarge", "gpus_per_node": 8, "gpu_model": "H100", "efa": True,
        "capacity_class": "on-demand", "max_size": 4, "asg_name": "a",
    }  # fmt: skip
    with pytest.raises(ValueError, match=message):
        PoolView(**(base | fields))


@pytest.mark.parametrize(
    ("cidr", "message"),
    [
        ("10.0.0.0/33", "not an IPv4 network"),
        ("10.0.0.0/26", "smaller than one node's /25"),
        ("10.9.0.0/16", "gateway_ip: 10.9.0.1 lies in the pod range"),
    ],
)
def test_bad_site_views(cidr: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SiteView(gpu_nodes=1, gpus_per_node=8, gpu_model="H100", pod_cidr=cidr, asn=65000, gateway_ip="10.9.0.1")


def test_args_from_fleet_need_every_pool(fleet: Fleet) -> None:
    plan = planner.plan(load_fleet(REFERENCE_FLEET), planner.load_lock(REFERENCE_LOCK))
    with pytest.raises(ValueError, match="pools cpu, interactive, train-h100 of prod/us-west-2 were not passed"):
        platform_args_from_fleet(
            fleet, plan, names=Names("dlinfra", "prod", "us-west-2"), provider=None,  # type: ignore[arg-type]
            cluster_name="c", node_pools={}, efs_file_system_id=FS_ID, efs_datasets_access_point_id=AP_ID,
            termination_queue_url="q", quota_policy="guaranteed",
        )  # fmt: skip


def test_render_priorities_is_anchored_and_ordered() -> None:
    text = pv.render_priorities({"spot": ["b.x"], "reserved": ["a"], "on-demand": []})
    assert text == "30:\n- ^a$\n10:\n- ^b\\.x$\n"
    with pytest.raises(ValueError, match="unknown capacity class"):
        pv.render_priorities({"owned": ["a"]})
