"""Platform and PlatformAws under the mock engine, for every regional stack of the reference fleet.

Every Kubernetes object we write (not the Helm charts) is validated strictly against the cluster's version:
core kinds with kubernetes-validate, Kueue kinds with tests/fixtures/k8s/kueue.x-k8s.io-v1beta2.json. What each
chart's values and objects say is tested in tests/components/charts/.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from components.charts import kueue as kueue_chart
from components.cluster import team_group
from components.platform import PlatformArgs, PoolView, SiteView, TeamView
from dlinfra.model import kueue, team_storage
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.naming import Names
from dlinfra.offline import plan_export
from tests.components._platform import (
    AP_ID,
    CILIUM_SCHEMA,
    FS_ID,
    KUEUE_SCHEMA,
    RELEASE,
    Stack,
    platform_stacks,
    regional_stacks,
    stack_names,
)
from tests.conftest import REFERENCE_FLEET


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return load_fleet(REFERENCE_FLEET).fleet


@pytest.fixture(scope="module")
def stacks(fleet: Fleet) -> dict[str, Stack]:
    """Every region's platform, from the shared offline run of the reference fleet."""
    return platform_stacks(fleet)


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


def test_efs_storage_class_and_team_volumes(stacks: dict[str, Stack], fleet: Fleet) -> None:
    """Every planned volume is a static PV onto its access point, mounted with IAM, reserved for its team's claim."""
    stack = stacks["prod-us-west-2"]
    # The file system and access points are the regional stack's, read through StackReference.
    fs_id, points = stack.outputs["efs_id"], stack.outputs["efs_access_points"]
    (storage_class,) = stack.of_type("kubernetes:storage.k8s.io/v1:StorageClass")
    assert storage_class.inputs["provisioner"] == "efs.csi.aws.com"
    assert storage_class.inputs["mountOptions"] == ["iam"]
    parameters = storage_class.inputs["parameters"]
    assert parameters["provisioningMode"] == "efs-ap" and parameters["fileSystemId"] == fs_id
    assert parameters["directoryPerms"] == "700"
    # Dynamic access points take ids below every team's and person's (dlinfra.model.team_storage).
    assert int(parameters["gidRangeEnd"]) < min(team_storage.ID_BASES.values())
    volumes = {
        r.inputs["metadata"]["name"]: r.inputs["spec"] for r in stack.of_type("kubernetes:core/v1:PersistentVolume")
    }
    claims = {
        (r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"]): r.inputs["spec"]
        for r in stack.of_type("kubernetes:core/v1:PersistentVolumeClaim")
    }
    expected = {
        (fleet.team_namespace(t), claim)
        for t, team in fleet.teams.items()
        for claim in ("datasets", "team", *(f"home-{p}" for p in team.members))
    }
    assert set(claims) == expected
    assert ("team-vision", "home-alice") in claims and ("team-language", "home-alice") not in claims
    plan = team_storage.plan(fleet, "prod")
    access_point = {(fleet.team_namespace(v.team), v.claim): v.access_point for v in plan.volumes}
    for (namespace, name), claim in claims.items():
        volume = volumes[claim["volumeName"]]
        key = access_point[(namespace, name)]
        read_only = key == "datasets"
        assert volume["csi"]["driver"] == "efs.csi.aws.com"
        assert volume["csi"]["volumeHandle"] == f"{fs_id}::{points[key]}"
        assert volume["csi"].get("readOnly", False) is read_only
        assert volume["mountOptions"] == ["iam"]
        mode = ["ReadOnlyMany"] if read_only else ["ReadWriteMany"]
        assert volume["accessModes"] == claim["accessModes"] == mode
        assert volume["claimRef"] == {"namespace": namespace, "name": name}
        assert volume["storageClassName"] == claim["storageClassName"] == ""
        assert volume["persistentVolumeReclaimPolicy"] == "Retain"


@pytest.mark.parametrize("addon", ["cluster-autoscaler", "node-termination-handler"])
def test_pod_identity_for_the_chart_service_account(stacks: dict[str, Stack], addon: str) -> None:
    stack = stacks["prod-us-west-2"]
    cluster = stack_names(stack).physical("eks")
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


@pytest.mark.parametrize("stack_name", regional_stacks())
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


def _api_names(value: Any) -> Any:
    """pulumi-kubernetes spells a CRD schema's x-kubernetes-* extensions x_kubernetes_*; its provider sends them with
    hyphens (provider/pkg/provider/provider.go)."""
    if isinstance(value, dict):
        return {(k.replace("_", "-") if k.startswith("x_kubernetes_") else k): _api_names(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_api_names(v) for v in value]
    return value


def _manifests(stack: Stack) -> list[dict[str, Any]]:
    """The stack's Kubernetes objects as the API server gets them: secret values unwrapped."""
    return [
        _api_names(plan_export.unwrap(r.inputs)[0])
        for r in stack.resources
        if r.type.startswith("kubernetes:") and r.type != RELEASE
    ]


@pytest.mark.parametrize("stack_name", regional_stacks())
def test_every_manifest_validates_strictly(stacks: dict[str, Stack], fleet: Fleet, stack_name: str) -> None:
    stack = stacks[stack_name]
    version = fleet.environments[stack.role.environment].kubernetes.version
    kueue_validator = jsonschema.Draft202012Validator(json.loads(KUEUE_SCHEMA.read_text()))
    cilium_validator = jsonschema.Draft202012Validator(json.loads(CILIUM_SCHEMA.read_text()))
    manifests = _manifests(stack)
    assert len(manifests) > 20
    for manifest in manifests:
        if manifest["apiVersion"] == kueue_chart.KUEUE_API:
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
        "efs_access_point_ids": {"datasets": AP_ID},
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
        # Cilium's objects wait for the CRDs its operator registers (components/crd_wait.py), through it.
        ({"sites": {"s": SiteView(gpu_nodes=0, gpus_per_node=8, gpu_model="H100", pod_cidr="10.9.1.0/24", asn=65000,
                                  gateway_ip="10.9.0.1")}}, "kubeconfig: sites are homed here"),
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


def test_a_region_without_gpus_still_queues_its_teams(write_fleet: Any) -> None:
    """prod's eu-west-1 without GPUs (its pools elsewhere, its site's machines gone, nobody overflowing to it): no
    flavor, but every team namespace gets its ClusterQueue (zero GPUs) and its `default` LocalQueue, or Kueue would
    gate every pod there forever (kueue_chart.NO_GPU_FLAVOR)."""
    from dlinfra.model import stackroles
    from dlinfra.offline import engine
    from policy.dlinfra_policy.rules.core import Resource
    from policy.dlinfra_policy.rules.platform import gpu_pods_queued, team_namespaces_have_local_queue
    from tests.conftest import ROOT
    from tests.policy.rules._resources import CTX

    def change(data: dict[str, Any]) -> None:
        pools = data["environments"]["prod"]["node_pools"]
        pools["train-a100"]["regions"] = ["us-east-1"]
        pools["interactive"]["regions"] = ["us-west-2", "us-east-1"]
        data["sites"]["ams1"]["gpu_nodes"] = 0
        data["teams"]["language"]["overflow"] = ["us-east-1"]

    path = write_fleet(change)
    loaded = load_fleet(path).fleet
    assert not kueue.plan(loaded, "prod").region("eu-west-1").flavors
    config = {"dlinfra:fleet": str(path), "dlinfra:lock": str(path.parent / "cidr-lock.yaml")}
    roles = [r for r in stackroles.roles(loaded) if r.name in ("prod-eu-west-1", "prod-eu-west-1-k8s")]
    results = {r.role.name: r for r in engine.run_all(ROOT, roles, project="dlinfra", config=config)}
    stack = Stack(results["prod-eu-west-1"], results["prod-eu-west-1-k8s"])
    assert set(stack.kueue("ResourceFlavor")) == {f"{kueue_chart.NO_GPU_FLAVOR}/"}
    assert not stack.kueue("Cohort")
    queues = stack.queues()
    assert set(queues) == set(loaded.teams)
    for team, queue in queues.items():
        assert "cohortName" not in queue["spec"]
        (group,) = queue["spec"]["resourceGroups"]
        assert group == {
            "coveredResources": [kueue.GPU_RESOURCE],
            "flavors": [{"name": kueue_chart.NO_GPU_FLAVOR, "resources": [{"name": kueue.GPU_RESOURCE,
                                                                          "nominalQuota": "0"}]}],
        }  # fmt: skip
        local = stack.kueue("LocalQueue")[f"{kueue_chart.LOCAL_QUEUE}/{loaded.team_namespace(team)}"]
        assert local["spec"] == {"clusterQueue": team}
    kueue_validator = jsonschema.Draft202012Validator(json.loads(KUEUE_SCHEMA.read_text()))
    for manifest in _manifests(stack):
        if manifest["apiVersion"] == kueue_chart.KUEUE_API:
            kueue_validator.validate(manifest)
            _kueue_cel_rules(manifest)
    declared = [Resource(urn=r.urn, type=r.type, name=r.name, inputs=r.inputs) for r in stack.resources]
    assert team_namespaces_have_local_queue(declared, CTX) == [] and gpu_pods_queued(declared, CTX) == []
