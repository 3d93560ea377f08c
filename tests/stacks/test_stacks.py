"""Whole-program tests: each stack role of the reference fleet under the offline engine."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from dlinfra.model import planner, stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.offline import engine, plan_export
from dlinfra.review.diff.compare import compare_stack
from tests import reference
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

CONFIG = {"dlinfra:fleet": str(REFERENCE_FLEET), "dlinfra:lock": str(REFERENCE_LOCK)}


@pytest.fixture(scope="module")
def results() -> dict[str, plan_export.StackResult]:
    # One offline run of the reference fleet per test session, shared with tests/components.
    return reference.runs()


@pytest.fixture(scope="module")
def plan() -> planner.Plan:
    return planner.plan(load_fleet(REFERENCE_FLEET), planner.load_lock(REFERENCE_LOCK))


def _of_type(result: plan_export.StackResult, type_: str) -> list[plan_export.ResourceRecord]:
    return [r for r in result.resources if r.type == type_]


REGIONAL = ("prod-us-west-2", "prod-us-east-1", "prod-eu-west-1", "staging-us-west-2")
CILIUM_POOL = "kubernetes:cilium.io/v2alpha1:CiliumPodIPPool"  # declared where sites are homed


def test_every_stack_runs_in_dependency_order(results: dict[str, plan_export.StackResult]) -> None:
    # Regional stacks first, then the in-cluster stacks that read them (prod's MultiKueue manager, us-west-2,
    # after its workers, whose kubeconfigs it reads), then the global stack.
    in_cluster = ["prod-us-east-1-k8s", "prod-eu-west-1-k8s", "staging-us-west-2-k8s", "prod-us-west-2-k8s"]
    assert list(results) == [*REGIONAL, *in_cluster, "prod-global"]
    fleet = load_fleet(REFERENCE_FLEET).fleet
    manager = stackroles.parse(fleet, "prod-us-west-2-k8s")
    assert [r.name for r in stackroles.dependencies(fleet, manager)] == [
        "prod-us-west-2", "prod-eu-west-1-k8s", "prod-us-east-1-k8s"
    ]  # fmt: skip


def test_stack_names_parse_to_their_roles() -> None:
    fleet = load_fleet(REFERENCE_FLEET).fleet
    role = stackroles.parse(fleet, "prod-eu-west-1-k8s")
    assert (role.kind, role.environment, role.region, role.runs_in_vpc) == ("k8s", "prod", "eu-west-1", True)
    assert stackroles.dependencies(fleet, role) == [stackroles.StackRole("regional", "prod", "eu-west-1")]
    assert not stackroles.parse(fleet, "prod-eu-west-1").runs_in_vpc
    # Applied from the region's CodeBuild-hosted runner: the label prefix workflows put in runs-on.
    assert stackroles.runs_on(fleet, role) == "codebuild-dlinfra-prod-euw1-ci-apply"
    # Previewed for real on the preview runner, declared only where the environment allows real previews.
    assert stackroles.runs_on(fleet, role, "preview") == "codebuild-dlinfra-prod-euw1-ci-preview"
    assert not stackroles.has_preview_runner(fleet, "prod") and stackroles.has_preview_runner(fleet, "staging")
    assert stackroles.runs_on(fleet, stackroles.parse(fleet, "prod-global")) == "github-hosted"
    with pytest.raises(Exception, match="'ap-south-1' is not a region of environment 'prod'"):
        stackroles.parse(fleet, "prod-ap-south-1-k8s")


def _provider_regions(result: plan_export.StackResult) -> dict[str, str]:
    return {f"{p.urn}::{p.id}": p.inputs["region"] for p in _of_type(result, "pulumi:providers:aws")}


@pytest.mark.parametrize("stack", REGIONAL)
def test_every_aws_resource_goes_through_the_stack_regions_provider(
    results: dict[str, plan_export.StackResult], stack: str
) -> None:
    result = results[stack]
    region = stack.split("-", 1)[1]
    providers = _provider_regions(result)
    assert set(providers.values()) == {region}
    aws_resources = [r for r in result.resources if r.custom and r.type.startswith("aws:")]
    assert len(aws_resources) > 100
    for r in aws_resources:
        assert r.provider in providers, f"{r.name} ({r.type}) uses no explicit provider"


@pytest.mark.parametrize("stack", [f"{s}-k8s" for s in REGIONAL])
def test_in_cluster_stack_reads_its_region_and_declares_only_kubernetes_objects(
    results: dict[str, plan_export.StackResult], stack: str
) -> None:
    result = results[stack]
    regional = stack.removesuffix("-k8s")
    refs = sorted(ref.inputs["name"] for ref in _of_type(result, "pulumi:pulumi:StackReference"))
    # The MultiKueue manager also reads its workers' in-cluster stacks; every other one reads its region only.
    workers = ["prod-eu-west-1-k8s", "prod-us-east-1-k8s"] if stack == "prod-us-west-2-k8s" else []
    assert refs == sorted(f"organization/dlinfra/{s}" for s in [regional, *workers])
    (k8s_provider,) = _of_type(result, "pulumi:providers:kubernetes")
    kubeconfig = __import__("json").loads(k8s_provider.inputs["kubeconfig"])
    assert kubeconfig["clusters"][0]["cluster"]["server"] == results[regional].outputs["cluster_endpoint"]
    assert kubeconfig["users"][0]["user"]["exec"]["args"][-1] == regional.split("-", 1)[1]
    # The other custom resources: the waits for the ProvisioningRequest CRD (before Kueue starts) and for Cilium's
    # CRDs where sites are homed, through the same kubeconfig.
    waits = [r for r in result.resources if r.type == "pulumi-python:dynamic:Resource"]
    cilium = ["platform-cilium-crds"] if _of_type(result, CILIUM_POOL) else []
    assert sorted(r.name for r in waits) == sorted(["platform-provisioning-request-crd-wait", *cilium])
    (kueue,) = [r for r in result.resources if r.name == "platform-kueue"]
    assert any(w.urn in kueue.dependencies for w in waits if w.name.startswith("platform-provisioning"))
    assert all(r.inputs["kubeconfig"] == k8s_provider.inputs["kubeconfig"] for r in waits)
    custom = [r for r in result.resources if r.custom and not r.type.startswith("pulumi:") and r not in waits]
    assert custom and all(r.type.startswith("kubernetes:") for r in custom)
    for r in custom:
        assert r.provider == f"{k8s_provider.urn}::{k8s_provider.id}", r.name
    # Nothing Kubernetes is left in the regional stack, which GitHub-hosted runners apply.
    assert not [r for r in results[regional].resources if r.type.startswith(("kubernetes:", "pulumi:providers:kub"))]


def test_a_stack_whose_aws_region_config_disagrees_with_its_name_is_refused() -> None:
    role = stackroles.StackRole("regional", "prod", "eu-west-1")
    config = {**CONFIG, "aws:region": "us-west-2"}
    with pytest.raises(engine.EngineError) as info:
        engine.run_stack(ROOT, role, project="dlinfra", config=config, stack_exports={})
    message = str(info.value)
    assert "stacks/Pulumi.prod-eu-west-1.yaml: config.aws:region:" in message
    assert "in eu-west-1 by its name, but its config sets aws:region to 'us-west-2'" in message


def test_a_matching_aws_region_config_is_accepted() -> None:
    role = stackroles.StackRole("regional", "staging", "us-west-2")
    result = engine.run_stack(
        ROOT, role, project="dlinfra", config={**CONFIG, "aws:region": "us-west-2"}, stack_exports={}
    )
    assert set(_provider_regions(result).values()) == {"us-west-2"}


PROGRAM_WITHOUT_PROVIDER = """
import pulumi_aws as aws

aws.s3.BucketV2("stray")
"""


def test_a_resource_without_an_explicit_provider_fails_like_pulumi_would(tmp_path: Path) -> None:
    # Pulumi.yaml disables the default aws and kubernetes providers; the offline engine enforces it.
    assert {"aws", "kubernetes"} <= engine.disabled_default_providers(ROOT)
    program = tmp_path / "program.py"
    program.write_text(PROGRAM_WITHOUT_PROVIDER)
    role = stackroles.StackRole("regional", "staging", "us-west-2")
    with pytest.raises(engine.EngineError, match=r"stray: aws:s3/bucketV2:BucketV2 has no explicit provider"):
        engine.run_stack(ROOT, role, project="dlinfra", config=CONFIG, stack_exports={}, program=program)
    program.write_text("import pulumi_aws as aws\n\naws.get_caller_identity()\n")
    with pytest.raises(
        engine.EngineError, match=r"invoke aws:index/getCallerIdentity:getCallerIdentity has no explicit"
    ):
        engine.run_stack(ROOT, role, project="dlinfra", config=CONFIG, stack_exports={}, program=program)


@pytest.mark.parametrize("stack", ["prod-us-west-2", "prod-us-east-1", "prod-eu-west-1", "staging-us-west-2"])
def test_regional_stack_declares_planned_network(
    results: dict[str, plan_export.StackResult], plan: planner.Plan, stack: str
) -> None:
    env, region = stack.split("-", 1)
    result = results[stack]
    (vpc,) = _of_type(result, "aws:ec2/vpc:Vpc")
    assert vpc.inputs["cidrBlock"] == str(plan.vpc(env, region))
    subnets = _of_type(result, "aws:ec2/subnet:Subnet")
    planned = {str(n) for tier in planner.SUBNET_TIERS for n in plan.subnets(env, region, tier).values()}
    assert {s.inputs["cidrBlock"] for s in subnets} == planned
    for s in subnets:
        assert ipaddress.ip_network(s.inputs["cidrBlock"]).subnet_of(ipaddress.ip_network(vpc.inputs["cidrBlock"]))
        assert s.inputs["tags"]["environment"] == env and s.inputs["tags"]["region"] == region
        assert s.inputs["tags"]["cost-centre"] == "ml-research"
    assert result.outputs["vpc_cidr"] == str(plan.vpc(env, region))
    assert result.outputs["vpc_id"] == vpc.id


def test_global_stack_reads_regional_exports(results: dict[str, plan_export.StackResult]) -> None:
    result = results["prod-global"]
    refs = _of_type(result, "pulumi:pulumi:StackReference")
    assert sorted(r.inputs["name"] for r in refs) == [
        "organization/dlinfra/prod-eu-west-1",
        "organization/dlinfra/prod-us-east-1",
        "organization/dlinfra/prod-us-west-2",
    ]
    for region in ("us-west-2", "us-east-1", "eu-west-1"):
        regional = results[f"prod-{region}"].outputs
        assert result.outputs["vpc_cidrs"][region] == regional["vpc_cidr"]
        assert result.outputs["vpc_ids"][region] == regional["vpc_id"]


def test_plan_export_schema(results: dict[str, plan_export.StackResult], tmp_path: Path) -> None:
    path = plan_export.write_plan(results["prod-us-west-2"], "dlinfra", tmp_path)
    import json

    plan: dict[str, Any] = json.loads(path.read_text())
    assert plan["schema"] == plan_export.PLAN_SCHEMA and plan["stack"] == "prod-us-west-2"
    assert plan["role"] == {"kind": "regional", "environment": "prod", "region": "us-west-2"}
    keys = {
        "urn",
        "type",
        "name",
        "custom",
        "id",
        "parent",
        "provider",
        "dependencies",
        "protect",
        "retain_on_delete",
        "delete_before_replace",
        "replace_on_changes",
        "ignore_changes",
        "aliases",
        "inputs",
        "outputs",
    }
    for resource in plan["resources"]:
        assert set(resource) == keys
    assert plan["summary"]["resources"] == len(plan["resources"])


def test_unknown_stack_name_is_refused() -> None:
    role = stackroles.StackRole("regional", "prod", "ap-south-1")
    with pytest.raises(
        engine.EngineError,
        match=r"stack 'prod-ap-south-1': 'ap-south-1' is not a region of environment 'prod'",
    ):
        engine.run_stack(ROOT, role, project="dlinfra", config=CONFIG, stack_exports={})


def test_single_region_environment_has_no_global_stack() -> None:
    fleet = load_fleet(REFERENCE_FLEET).fleet
    with pytest.raises(Exception, match="environment 'staging' has one region, so it has no global stack"):
        stackroles.parse(fleet, "staging-global")


# --- network reachability across stacks -----------------------------------------------------------------
def _tgw_routes(result: plan_export.StackResult) -> dict[str, dict[str, str]]:
    """TGW route table id -> destination CIDR -> attachment id, for the stack's static TGW routes."""
    out: dict[str, dict[str, str]] = {}
    for r in _of_type(result, "aws:ec2transitgateway/route:Route"):
        table = out.setdefault(r.inputs["transitGatewayRouteTableId"], {})
        table[r.inputs["destinationCidrBlock"]] = r.inputs["transitGatewayAttachmentId"]
    return out


def _peer_regions(result: plan_export.StackResult) -> dict[str, frozenset[str]]:
    """Peering attachment id -> the two regions it joins."""
    region_of = {f"{p.urn}::{p.id}": p.inputs["region"] for p in _of_type(result, "pulumi:providers:aws")}
    return {
        a.id: frozenset((region_of[a.provider or ""], a.inputs["peerRegion"]))
        for a in _of_type(result, "aws:ec2transitgateway/peeringAttachment:PeeringAttachment")
    }


def test_every_site_network_is_routed_from_every_region_of_its_environment(
    results: dict[str, plan_export.StackResult], plan: planner.Plan
) -> None:
    fleet = load_fleet(REFERENCE_FLEET).fleet
    peerings = _peer_regions(results["prod-global"])
    global_routes = _tgw_routes(results["prod-global"])
    checked = 0
    for site, spec in fleet.sites.items():
        home = results[f"{spec.environment}-{spec.region}"]
        vpns = _of_type(home, "aws:ec2/vpnConnection:VpnConnection")
        (vpn,) = [r for r in vpns if r.name == f"site-{site}-vpn"]
        vpn_attachment = vpn.outputs["transitGatewayAttachmentId"]
        for network in (plan.cidr(f"site-lan/{site}"), plan.cidr(f"hybrid-pods/{site}")):
            cidr = str(network)
            for region in fleet.environments[spec.environment].regions:
                stack = results[f"{spec.environment}-{region}"]
                tgw, table = stack.outputs["transit_gateway_id"], stack.outputs["transit_route_table_id"]
                # 1. every private route table of the VPC sends the site's networks to the region's TGW
                private = {
                    r.inputs["routeTableId"]
                    for r in _of_type(stack, "aws:ec2/route:Route")
                    if r.inputs["destinationCidrBlock"] == cidr and r.inputs.get("transitGatewayId") == tgw
                }
                assert private == set(stack.outputs["route_table_ids"]["private"].values()), (site, region)
                # 2. the region's TGW route table knows where the site is
                if region == spec.region and spec.routing == "static":
                    assert _tgw_routes(stack)[table][cidr] == vpn_attachment
                elif region == spec.region:
                    propagations = _of_type(stack, "aws:ec2transitgateway/routeTablePropagation:RouteTablePropagation")
                    assert any(
                        p.inputs["transitGatewayAttachmentId"] == vpn_attachment
                        and p.inputs["transitGatewayRouteTableId"] == table
                        for p in propagations
                    )
                else:
                    attachment = global_routes[table][cidr]
                    assert peerings[attachment] == {region, spec.region}
                checked += 1
    assert checked == 2 * 2 * 3  # two sites, LAN and pods, three prod regions


def test_no_secret_reaches_a_plan_export(results: dict[str, plan_export.StackResult], tmp_path: Path) -> None:
    secrets: list[str] = []
    for result in results.values():
        for conn in (result.outputs.get("site_vpns") or {}).values():
            secrets += [t["preshared_key"] for t in conn["tunnels"]]
        for person in (result.outputs.get("client_vpn_users") or {}).values():
            secrets.append(person["key_pem"])
    assert len(secrets) == 4 + 2  # two sites x two tunnels, staging's two people (prod signs in through SAML)
    for result in results.values():
        text = plan_export.write_plan(result, "dlinfra", tmp_path).read_text()
        assert "PRIVATE KEY" not in text, result.role.name
        leaked = [s[:4] + "..." for s in secrets if s in text]
        assert not leaked, f"{result.role.name}: {leaked}"


def test_removing_a_team_an_admin_and_a_sites_machines_deletes_nothing_protected(
    results: dict[str, plan_export.StackResult], write_fleet: Any
) -> None:
    """Access entries, add-on roles and the like are removable: only what holds data is protected."""

    def change(data: dict[str, Any]) -> None:
        del data["teams"]["robotics"]
        data["environments"]["prod"]["kubernetes"]["admin_role_arns"] = []
        data["sites"]["sjc1"]["gpu_nodes"] = 0  # the site's machines leave: hybrid role, activation, entry go

    path = write_fleet(change)
    config = {"dlinfra:fleet": str(path), "dlinfra:lock": str(path.parent / "cidr-lock.yaml")}
    role = stackroles.StackRole("regional", "prod", "us-west-2")
    after = engine.run_stack(ROOT, role, project="dlinfra", config=config, stack_exports={})
    before = results["prod-us-west-2"]
    kept = {r.urn for r in after.resources} | {a for r in after.resources for a in r.aliases}
    deleted = [r for r in before.resources if r.urn not in kept]
    deleted_types = {r.type for r in deleted}
    assert {"aws:eks/accessEntry:AccessEntry", "aws:ssm/activation:Activation"} <= deleted_types
    assert len([r for r in deleted if r.type == "aws:eks/accessEntry:AccessEntry"]) == 3  # team, admin, hybrid
    assert [r.name for r in deleted if r.protect] == []
    # As `dlinfra diff` reports it: deletions that `pulumi up` can carry out (none refused as protected), and no
    # replacement (the entries that stay keep their URNs).
    changes = compare_stack(role.name, before.plan("dlinfra"), after.plan("dlinfra"))
    deletes = [c for c in changes if c.action == "delete"]
    assert {c.type for c in deletes} >= {"aws:eks/accessEntry:AccessEntry", "aws:ssm/activation:Activation"}
    assert [c.name for c in deletes if c.note] == []
    assert [c.name for c in changes if c.action == "replace"] == []
    # What holds data stays protected.
    (cluster,) = _of_type(after, "aws:eks/cluster:Cluster")
    assert cluster.protect and all(k.protect for k in _of_type(after, "aws:kms/key:Key"))
    cluster_entries = [r for r in _of_type(after, "aws:eks/accessEntry:AccessEntry") if r.name.startswith("cluster-")]
    assert cluster_entries
    for r in cluster_entries:
        assert not r.protect and r.aliases, r.name  # moved from under the cluster, with an alias
