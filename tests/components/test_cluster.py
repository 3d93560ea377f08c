"""Cluster and hybrid nodes under the mock engine for every regional stack of the reference fleet."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from components.cluster import ClusterArgs
from dlinfra.errors import FleetError
from dlinfra.model import dns, eks, instances, planner, stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.naming import Names
from dlinfra.offline import engine, plan_export
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

CONFIG = {"dlinfra:fleet": str(REFERENCE_FLEET), "dlinfra:lock": str(REFERENCE_LOCK)}
PROGRAM = """
from pathlib import Path
import pulumi
from stacks.context import aws_provider, load_context
from stacks.compute import declare_pools
from stacks.cluster import declare_cluster
ctx = load_context(Path({root!r}))
subnets = {{az: "subnet-" + az for az in ctx.fleet.azs(ctx.role.region)}}
provider = aws_provider(ctx.role.region)
parts = declare_cluster(ctx, vpc_id="vpc-0test", private_subnet_ids=subnets, provider=provider)
declare_pools(ctx, vpc_id="vpc-0test", private_subnet_ids=subnets, cluster=parts.cluster, provider=provider)
if parts.hybrid:
    pulumi.export("activations", parts.hybrid.activations)
"""
FLEET = load_fleet(REFERENCE_FLEET).fleet
PLAN = planner.plan(load_fleet(REFERENCE_FLEET), planner.load_lock(REFERENCE_LOCK))
REGIONAL = [r.name for r in stackroles.roles(FLEET) if r.kind == "regional"]
COREDNS_SCHEMA = Path(__file__).parent.parent / "fixtures" / "k8s" / "eks-coredns-configuration.schema.json"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, plan_export.StackResult]:
    program = tmp_path_factory.mktemp("prog") / "program.py"
    program.write_text(textwrap.dedent(PROGRAM.format(root=str(ROOT))))
    return {
        role.name: engine.run_stack(ROOT, role, project="dlinfra", config=CONFIG, stack_exports={}, program=program)
        for role in stackroles.roles(FLEET)
        if role.kind == "regional"
    }


def _of(result: plan_export.StackResult, type_: str) -> list[plan_export.ResourceRecord]:
    return [r for r in result.resources if r.type == type_]


@pytest.mark.parametrize("stack", REGIONAL)
def test_control_plane(results: dict, stack: str) -> None:
    env, region = stack.split("-", 1)
    (cluster,) = _of(results[stack], "aws:eks/cluster:Cluster")
    i = cluster.inputs
    assert i["version"] == FLEET.environments[env].kubernetes.version
    assert i["accessConfig"] == {"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": False}
    assert i["vpcConfig"]["endpointPrivateAccess"] is True and i["vpcConfig"]["endpointPublicAccess"] is False
    assert sorted(i["enabledClusterLogTypes"]) == sorted(
        ["api", "audit", "authenticator", "controllerManager", "scheduler"]
    )
    (key,) = [k for k in _of(results[stack], "aws:kms/key:Key") if "secrets" in k.name]
    assert i["encryptionConfig"] == {"provider": {"keyArn": key.outputs["arn"]}, "resources": ["secrets"]}
    assert key.protect and key.retain_on_delete
    assert i["kubernetesNetworkConfig"]["serviceIpv4Cidr"] == str(PLAN.cidr(f"service/{env}/{region}"))


@pytest.mark.parametrize("stack", REGIONAL)
def test_remote_networks_match_the_plan(results: dict, stack: str) -> None:
    env, region = stack.split("-", 1)
    (cluster,) = _of(results[stack], "aws:eks/cluster:Cluster")
    sites = sorted(FLEET.sites_of(env, region))
    remote = cluster.inputs.get("remoteNetworkConfig")
    if not sites:
        assert remote is None
        return
    assert remote["remoteNodeNetworks"]["cidrs"] == [str(PLAN.cidr(f"site-lan/{s}")) for s in sites]
    assert remote["remotePodNetworks"]["cidrs"] == [str(PLAN.cidr(f"hybrid-pods/{s}")) for s in sites]


@pytest.mark.parametrize("stack", REGIONAL)
def test_access_entries(results: dict, stack: str) -> None:
    env, region = stack.split("-", 1)
    entries = {e.inputs["principalArn"]: e.inputs for e in _of(results[stack], "aws:eks/accessEntry:AccessEntry")}
    admins = FLEET.environments[env].kubernetes.admin_role_arns
    for arn in admins:
        assert entries[arn]["type"] == "STANDARD"
    policies = {
        p.inputs["principalArn"]: p.inputs["policyArn"].rsplit("/", 1)[1]
        for p in _of(results[stack], "aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    }
    ci = FLEET.environments[env].ci
    assert ci is not None
    # Admins and the CI apply role administer the cluster (apply.yml applies the in-cluster stack); the preview
    # role only views, without Secrets.
    assert policies == {
        **dict.fromkeys(admins, "AmazonEKSClusterAdminPolicy"),
        ci.apply_role_arn: "AmazonEKSClusterAdminPolicy",
        ci.preview_role_arn: "AmazonEKSViewPolicy",
    }
    roles = {r.urn: r for r in _of(results[stack], "aws:iam/role:Role")}
    node_roles = [r for r in roles.values() if "NodePool" in r.urn]
    node_entries = [e for e in entries.values() if e["type"] == "EC2_LINUX"]
    assert len(node_entries) == len(node_roles) == len(FLEET.pools_in(env, region))
    assert {e["principalArn"] for e in node_entries} == {r.outputs["arn"] for r in node_roles}
    hybrid = [e for e in entries.values() if e["type"] == "HYBRID_LINUX"]
    assert len(hybrid) == (1 if FLEET.sites_of(env, region) else 0)
    for team, spec in FLEET.teams.items():
        assert entries[spec.role_arn]["kubernetesGroups"] == [f"team:{team}"]


@pytest.mark.parametrize("stack", REGIONAL)
def test_coredns_scales_with_the_region_and_spreads_over_zones(results: dict, stack: str) -> None:
    env, region = stack.split("-", 1)
    addons = {a.inputs["addonName"]: a.inputs for a in _of(results[stack], "aws:eks/addon:Addon")}
    assert all("configurationValues" not in addons[a] for a in addons if a != "coredns")
    config = json.loads(addons["coredns"]["configurationValues"])
    jsonschema.Draft202012Validator(json.loads(COREDNS_SCHEMA.read_text())).validate(config)
    # EKS's autoscaler (nodes and cores), bounded by what the region can grow to.
    pools = FLEET.pools_in(env, region)
    nodes = sum(p.max_size for p in pools.values()) + sum(s.gpu_nodes for s in FLEET.sites_of(env, region).values())
    cores = sum(p.max_size * instances.lookup(FLEET.pool_types(env, region, n)[0]).vcpus for n, p in pools.items())
    scaling = config["autoScaling"]
    assert scaling["enabled"] is True and scaling["minReplicas"] >= 3
    assert scaling["maxReplicas"] == max(scaling["minReplicas"], -(-nodes // 16), -(-cores // 256))
    # Spread over AZs and hosts, as a preference that never leaves a replica pending.
    (spread,) = config["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone" and spread["maxSkew"] == 1
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    # Off hybrid nodes (and Fargate), still Linux on the add-on's architectures.
    (term,) = config["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["hybrid", "fargate"]} in term[
        "matchExpressions"
    ]
    assert {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]} in term["matchExpressions"]
    # The Kubernetes parts are real Kubernetes objects: check them inside a pod spec.
    version = FLEET.environments[env].kubernetes.version
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "coredns"},
        "spec": {
            "containers": [{"name": "coredns", "image": "coredns"}],
            "affinity": config["affinity"],
            "topologySpreadConstraints": config["topologySpreadConstraints"],
        },
    }
    kubernetes_validate.validate(pod, version, strict=True)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"autoScaling": {"enabled": True, "minReplica": 2}}, "Additional properties"),
        ({"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "z", "whenUnsatisfiable": "ScheduleAnyway"}]},
         "less than the minimum"),
        ({"autoscaling": {"enabled": True}}, "Additional properties"),
    ],
)  # fmt: skip
def test_coredns_schema_catches_mistakes(config: dict[str, Any], message: str) -> None:
    with pytest.raises(jsonschema.ValidationError, match=message):
        jsonschema.Draft202012Validator(json.loads(COREDNS_SCHEMA.read_text())).validate(config)


def test_coredns_replicas_follow_the_eks_formula() -> None:
    assert dns.coredns_max_replicas(0, 0) == dns.MIN_COREDNS_REPLICAS
    assert dns.coredns_max_replicas(160, 0) == 10  # one per 16 nodes
    assert dns.coredns_max_replicas(10, 192 * 20) == 15  # one per 256 cores, when cores need more
    with pytest.raises(ValueError, match="max_nodes/max_cores"):
        dns.coredns_max_replicas(-1, 0)


@pytest.mark.parametrize("stack", REGIONAL)
def test_addons_pinned_with_pod_identity(results: dict, stack: str) -> None:
    env = stack.split("-", 1)[0]
    addons = {a.inputs["addonName"]: a.inputs for a in _of(results[stack], "aws:eks/addon:Addon")}
    assert addons.keys() == set(eks.ADDONS)
    pins = eks.addon_versions(FLEET.environments[env].kubernetes.version)
    for name, inputs in addons.items():
        assert inputs["addonVersion"] == pins[name]
    assert addons["vpc-cni"]["podIdentityAssociations"][0]["serviceAccount"] == "aws-node"
    assert addons["aws-efs-csi-driver"]["podIdentityAssociations"][0]["serviceAccount"] == "efs-csi-controller-sa"
    for name in ("coredns", "kube-proxy", "eks-pod-identity-agent"):
        assert "podIdentityAssociations" not in addons[name]
    roles = {r.outputs["arn"]: r for r in _of(results[stack], "aws:iam/role:Role")}
    for name, account in (("vpc-cni", "aws-node"), ("aws-efs-csi-driver", "efs-csi-controller-sa")):
        role = roles[addons[name]["podIdentityAssociations"][0]["roleArn"]]
        (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
        assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
        tags = statement["Condition"]["StringEquals"]
        assert tags["aws:RequestTag/kubernetes-service-account"] == account
        assert tags["aws:RequestTag/kubernetes-namespace"] == "kube-system"


def test_hybrid_activation_per_site_and_secret(results: dict) -> None:
    stack = results["prod-us-west-2"]
    (activation,) = _of(stack, "aws:ssm/activation:Activation")
    assert activation.inputs["registrationLimit"] == FLEET.sites["sjc1"].gpu_nodes
    assert "activationCode" in activation.additional_secret_outputs
    assert "expirationDate" not in activation.inputs  # no expiry in the fleet: AWS's 24 hours
    role = next(r for r in _of(stack, "aws:iam/role:Role") if "hybrid" in r.name)
    (trust,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust["Principal"] == {"Service": "ssm.amazonaws.com"}
    # Only SSM acting for this account's activations in this region (EKS: "Prepare credentials for hybrid nodes").
    assert trust["Condition"] == {
        "StringEquals": {"aws:SourceAccount": "123456789012"},
        "ArnLike": {"aws:SourceArn": "arn:aws:ssm:us-west-2:123456789012:*"},
    }
    policy = json.loads(
        next(p for p in _of(stack, "aws:iam/rolePolicy:RolePolicy") if p.name == "hybrid-describe-cluster").inputs[
            "policy"
        ]
    )
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    # What `nodeadm uninstall` needs to deregister a machine that leaves.
    assert by_sid["UninstallDeregister"]["Action"] == "ssm:DeregisterManagedInstance"
    assert by_sid["UninstallDeregister"]["Resource"] == "arn:aws:ssm:us-west-2:123456789012:managed-instance/*"
    cluster_arn = "arn:aws:eks:us-west-2:123456789012:cluster/dlinfra-prod-usw2-eks"
    assert by_sid["UninstallDeregister"]["Condition"] == {
        "StringEquals": {"ssm:resourceTag/EKSClusterARN": cluster_arn}
    }
    assert activation.inputs["tags"]["EKSClusterARN"] == cluster_arn
    assert by_sid["UninstallDescribe"]["Action"] == "ssm:DescribeInstanceInformation"
    code = stack.outputs["activations"]["sjc1"]["code"]
    assert "activations" in stack.secret_outputs
    assert code not in json.dumps(stack.plan("dlinfra"))
    assert not _of(results["prod-us-east-1"], "aws:ssm/activation:Activation")  # no site homed there


def test_no_kubernetes_provider_in_the_regional_stack(results: dict) -> None:
    # The in-cluster stack builds it from StackReference outputs (tests/stacks/test_stacks.py).
    assert not _of(results["prod-us-west-2"], "pulumi:providers:kubernetes")


def test_kubeconfig_authenticates_with_eks_get_token() -> None:
    from components.cluster import kubeconfig_json

    config = json.loads(kubeconfig_json("c", "https://x.eks.amazonaws.com", "Q0E=", "eu-west-1"))
    assert config["clusters"][0]["cluster"] == {
        "server": "https://x.eks.amazonaws.com",
        "certificate-authority-data": "Q0E=",
    }
    assert config["users"][0]["user"]["exec"]["args"] == [
        "eks",
        "get-token",
        "--cluster-name",
        "c",
        "--region",
        "eu-west-1",
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"version": "1.19"}, r"version: EKS does not offer Kubernetes 1.19"),
        ({"version": "1.29"}, r"version: dlinfra has no pinned add-on versions for Kubernetes 1.29"),
        ({"subnet_ids": {"a": "s"}}, r"at least two AZs"),
        ({"remote_node_cidrs": ["10.200.0.0/20"]}, r"give both"),
        (
            {"ci_apply_role_arn": "arn:aws:iam::1:role/a", "ci_preview_role_arn": "arn:aws:iam::1:role/a"},
            r"must not use",
        ),
        (
            {"admin_role_arns": ["arn:aws:iam::1:role/a"], "ci_apply_role_arn": "arn:aws:iam::1:role/a"},
            r"one access entry",
        ),
    ],
)
def test_bad_args(overrides: dict, message: str) -> None:
    base = {
        "names": Names("dlinfra", "prod", "us-west-2"),
        "version": "1.33",
        "upgrade_policy": "extended",
        "vpc_id": "vpc-1",
        "subnet_ids": {"a": "s-a", "b": "s-b"},
        "service_cidr": "10.3.224.0/20",
        "api_client_cidrs": ["10.2.0.0/16"],
    }
    with pytest.raises(ValueError, match=message):
        ClusterArgs(**(base | overrides))


@pytest.mark.parametrize("stack", REGIONAL)
def test_nodes_launch_only_once_they_can_join(results: dict, stack: str) -> None:
    """Every Auto Scaling group waits for the cluster, its node add-ons and its own access entry."""
    result = results[stack]
    (cluster,) = _of(result, "aws:eks/cluster:Cluster")
    addons = {a.inputs["addonName"]: a.urn for a in _of(result, "aws:eks/addon:Addon")}
    entries = {e.urn for e in _of(result, "aws:eks/accessEntry:AccessEntry") if e.inputs["type"] == "EC2_LINUX"}
    groups = _of(result, "aws:autoscaling/group:Group")
    assert groups
    for group in groups:
        deps = set(group.dependencies)
        assert cluster.urn in deps
        assert {addons["vpc-cni"], addons["kube-proxy"], addons["eks-pod-identity-agent"]} <= deps
        assert addons["coredns"] not in deps  # CoreDNS only becomes ready once nodes exist
        assert deps & entries


def test_activation_expiry_comes_from_the_fleet(write_fleet: Any) -> None:
    path = write_fleet(lambda data: data["sites"]["sjc1"].update(activation_expiry="2026-12-20T00:00:00Z"))
    config = {"dlinfra:fleet": str(path), "dlinfra:lock": str(path.parent / "cidr-lock.yaml")}
    program = path.parent / "program.py"
    program.write_text(textwrap.dedent(PROGRAM.format(root=str(ROOT))))
    role = stackroles.StackRole("regional", "prod", "us-west-2")
    result = engine.run_stack(ROOT, role, project="dlinfra", config=config, stack_exports={}, program=program)
    (activation,) = _of(result, "aws:ssm/activation:Activation")
    assert activation.inputs["expirationDate"] == "2026-12-20T00:00:00Z"


def test_activation_expiry_needs_a_time_zone(write_fleet: Any) -> None:
    path = write_fleet(lambda data: data["sites"]["sjc1"].update(activation_expiry="2026-12-20T00:00:00"))
    with pytest.raises(FleetError, match=r"sites.sjc1.activation_expiry.*has no time zone"):
        load_fleet(path)


def test_the_stack_never_picks_an_upgrade_policy() -> None:
    """A fleet built without validation (model_construct, model_copy) and no policy is refused, not defaulted."""
    from dlinfra.errors import DlinfraError
    from stacks.cluster import declare_cluster
    from stacks.context import StackContext

    staging = FLEET.environments["staging"]
    unset = staging.model_copy(update={"kubernetes": staging.kubernetes.model_copy(update={"upgrade_policy": None})})
    fleet = FLEET.model_copy(update={"environments": {**FLEET.environments, "staging": unset}})
    role = stackroles.StackRole("regional", "staging", "us-west-2")
    ctx = StackContext(root=ROOT, fleet=fleet, plan=PLAN, role=role, names=Names("dlinfra", "staging", "us-west-2"))
    with pytest.raises(DlinfraError, match=r"environments\.staging\.kubernetes\.upgrade_policy: required"):
        declare_cluster(ctx, vpc_id="vpc-1", private_subnet_ids={}, provider=None)  # type: ignore[arg-type]
