"""`dlinfra access`: concrete answers on the reference fleet's plans, one hand-written plan, and the CLI."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from dlinfra.checks.plans import Plan
from dlinfra.cli import main as cli
from dlinfra.model.fleet.schema import Fleet
from dlinfra.review import access
from tests.conftest import REFERENCE_FLEET, ROOT

PROD_CLUSTERS = {"dlinfra-prod-usw2-eks", "dlinfra-prod-use1-eks", "dlinfra-prod-euw1-eks"}


@pytest.fixture(scope="session")
def plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Plans of every reference stack, from the one shared offline run (no preview per test)."""
    from dlinfra.offline import plan_export
    from tests import reference

    out = tmp_path_factory.mktemp("access") / "plans"
    for result in reference.runs().values():
        plan_export.write_plan(result, reference.fleet().project, out, reference.provenance())
    return out


@pytest.fixture(scope="session")
def fleet() -> Fleet:
    from tests import reference

    return reference.fleet()


@pytest.fixture(scope="session")
def report(plan_dir: Path, fleet: Fleet) -> access.Report:
    stacks = sorted(p.stem for p in plan_dir.glob("*.json"))
    return access.build_report(access.load_plans(plan_dir, stacks), fleet)


def one(report: access.Report, env: str, kind: str, name: str) -> access.Principal:
    (match,) = [p for p in report.principals if (p.environment, p.kind, p.name) == (env, kind, name)]
    return match


def test_prod_apply_role_is_cluster_admin_in_every_prod_cluster(report: access.Report, fleet: Fleet) -> None:
    ci = fleet.environments["prod"].ci
    assert ci is not None
    apply = one(report, "prod", "ci-apply", "dlinfra-apply-prod")
    assert apply.arn == ci.apply_role_arn
    assert {(g.cluster, g.access, g.scope) for g in apply.clusters} == {
        (c, "cluster-admin", "cluster") for c in PROD_CLUSTERS
    }
    assert {g.region for g in apply.clusters} == set(fleet.environments["prod"].regions)
    assert apply.also == ()  # the plans name the apply role nowhere but its access entries


def test_preview_role_can_only_view(report: access.Report) -> None:
    preview = one(report, "prod", "ci-preview", "dlinfra-preview")
    assert {g.access for g in preview.clusters} == {"view"}
    assert {g.cluster for g in preview.clusters} == PROD_CLUSTERS
    assert all(g.source == "access policy AmazonEKSViewPolicy" for g in preview.clusters)


def test_team_roles_edit_their_namespace_only(report: access.Report, fleet: Fleet) -> None:
    for team in fleet.teams:
        role = one(report, "prod", "team-role", team)
        assert role.team == team and role.arn == fleet.teams[team].role_arn
        assert {g.scope for g in role.clusters} == {fleet.team_namespace(team)}
        assert {g.access for g in role.clusters} == {"edit", "kueue-batch-user-role"}
        assert {g.cluster for g in role.clusters} == PROD_CLUSTERS
        assert all(g.source.startswith(f"group team:{team}: RoleBinding") for g in role.clusters)


def test_vpn_groups_reach_site_pods_as_the_fleet_says(report: access.Report, fleet: Fleet) -> None:
    prod_regions = set(fleet.environments["prod"].regions)
    for team, spec in fleet.teams.items():
        group = one(report, "prod", "vpn-group", team)
        assert group.group == spec.vpn_group and group.team == team
        # The fleet gives every team with a vpn_group every prod network, on every regional endpoint.
        for site in fleet.sites_of("prod"):
            vias = {n.via for n in group.networks if n.network == f"pods-{site}"}
            assert vias == {f"client-vpn {r}" for r in prod_regions}
        assert all(n.routed for n in group.networks)
    admins = one(report, "prod", "vpn-group", "admins")
    assert admins.team is None and admins.group == fleet.environments["prod"].client_vpn.saml.admin_group  # type: ignore[union-attr]


def test_staging_principals_have_nothing_in_prod(report: access.Report) -> None:
    staging = [p for p in report.principals if p.environment == "staging"]
    assert staging
    for p in staging:
        assert not any(g.cluster in PROD_CLUSTERS for g in p.clusters), p
    users = one(report, "staging", "vpn-users", "certificate-users")
    assert users.members == ("alice", "bob")
    assert [n.network for n in users.networks] == ["vpc-us-west-2"]
    # No site joins staging, so nothing there reaches a site's LAN or pods.
    assert not [n for p in staging for n in p.networks if n.network.startswith(("lan-", "pods-"))]
    assert users.networks[0].cidr != one(report, "prod", "vpn-group", "admins").networks[0].cidr
    prod_arns = {p.arn for p in report.principals if p.environment == "prod"}
    assert "arn:aws:iam::111122223333:role/dlinfra-apply-staging" not in prod_arns


def test_sites_reach_the_other_networks_and_join_as_hybrid_nodes(report: access.Report) -> None:
    sjc1 = one(report, "prod", "site", "sjc1")
    assert sjc1.region == "us-west-2"
    reached = {n.network for n in sjc1.networks}
    assert reached == {"vpc-us-west-2", "vpc-us-east-1", "vpc-eu-west-1", "lan-ams1", "pods-ams1"}
    assert [(g.cluster, g.access, g.source) for g in sjc1.clusters] == [
        ("dlinfra-prod-usw2-eks", "node", "access entry HYBRID_LINUX")
    ]
    assert sjc1.arn is not None and sjc1.arn.endswith("/dlinfra-prod-usw2-hybrid-nodes")
    ams1 = one(report, "prod", "site", "ams1")
    assert {n.network for n in ams1.networks} >= {"lan-sjc1", "pods-sjc1", "vpc-eu-west-1"}
    assert not [p for p in report.principals if p.environment == "staging" and p.kind == "site"]


def test_pod_identities_name_service_account_role_and_actions(report: access.Report) -> None:
    nth = one(report, "prod", "pod-identity", "kube-system/aws-node-termination-handler@us-west-2")
    assert nth.arn is not None and nth.arn.endswith("/dlinfra-prod-usw2-node-termination-handler")
    assert {"sqs:ReceiveMessage", "sqs:DeleteMessage"} <= set(nth.actions)
    cni = one(report, "prod", "pod-identity", "kube-system/aws-node@us-west-2")
    assert cni.managed_policies == ("AmazonEKS_CNI_Policy",)
    assert access.summarise_actions(["sqs:A", "sqs:B", "ec2:C"], limit=1) == "ec2: C; sqs: A, +1"


def test_the_multikueue_manager_writes_only_where_its_teams_jobs_land(report: access.Report) -> None:
    worker = one(report, "prod", "service-account", "kueue-system/multikueue@us-east-1")
    grants = {(g.access, g.scope) for g in worker.clusters}
    assert grants == {
        ("dlinfra-multikueue-read", "cluster"),
        ("dlinfra-multikueue-write", "team-language"),
        ("dlinfra-multikueue-write", "team-vision"),
    }
    eu = one(report, "prod", "service-account", "kueue-system/multikueue@eu-west-1")
    assert {g.scope for g in eu.clusters if g.access == "dlinfra-multikueue-write"} == {"team-language"}


# --- a hand-written plan ------------------------------------------------------------------------------
def _resource(type_: str, name: str, inputs: dict[str, Any], rid: str = "", outputs: Any = None) -> dict[str, Any]:
    return {"urn": f"urn:pulumi:x::dlinfra::{type_}::{name}", "type": type_, "name": name, "custom": True,
            "id": rid, "dependencies": [], "protect": False, "inputs": inputs, "outputs": outputs or {}}  # fmt: skip


def _plan(stack: str, kind: str, *resources: dict[str, Any]) -> Plan:
    role = {"kind": kind, "environment": "lab", "region": "us-west-2"}
    data = {
        "schema": "dlinfra.plan/v1",
        "project": "dlinfra",
        "stack": stack,
        "role": role,
        "resources": list(resources),
    }
    return Plan(path=Path(f"{stack}.json"), stack=stack, data=data)


def test_hand_written_plan_without_a_fleet() -> None:
    arn = "arn:aws:iam::111122223333:role/someone"
    regional = _plan(
        "lab-us-west-2",
        "regional",
        _resource(access.CLUSTER, "eks", {"name": "c1"}),
        _resource(access.VPC, "vpc", {"cidrBlock": "10.9.0.0/16"}, rid="vpc-1"),
        _resource(access.ACCESS_ENTRY, "e", {"clusterName": "c1", "principalArn": arn, "kubernetesGroups": ["g"]}),
        _resource(
            access.ACCESS_POLICY,
            "p",
            {
                "clusterName": "c1",
                "principalArn": arn,
                "accessScope": {"type": "namespace", "namespaces": ["a", "b"]},
                "policyArn": "arn:aws:eks::aws:cluster-access-policy/AmazonEKSEditPolicy",
            },
        ),
        _resource(
            access.AUTH_RULE,
            "r1",
            {
                "accessGroupId": "grp",
                "clientVpnEndpointId": "cvpn-1",
                "description": "x to vpc",
                "targetNetworkCidr": "10.9.0.0/16",
            },
        ),
        _resource(
            access.AUTH_RULE,
            "r2",
            {
                "accessGroupId": "grp",
                "clientVpnEndpointId": "cvpn-1",
                "description": "x to lan-far",
                "targetNetworkCidr": "10.50.0.0/20",
            },
        ),
    )
    k8s = _plan(
        "lab-us-west-2-k8s",
        "k8s",
        _resource(
            access.CLUSTER_ROLE_BINDING,
            "crb",
            {
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "readers"},
                "roleRef": {"kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "Group", "name": "g"}],
            },
        ),
    )
    report = access.build_report([regional, k8s])
    someone = one(report, "lab", "role", "someone")
    assert {(g.access, g.scope) for g in someone.clusters} == {("edit", "a,b"), ("view", "cluster")}
    group = one(report, "lab", "vpn-group", "grp")
    assert [(n.network, n.routed) for n in group.networks] == [("lan-far", False), ("vpc-us-west-2", True)]
    # The seam: another reachability model replaces the networks, nothing else.
    seen: list[str] = []

    def reach(p: access.Principal) -> list[access.NetworkAccess]:
        seen.append(p.name)
        return [access.NetworkAccess("everything", "0.0.0.0/0", "model")] if p.kind == "vpn-group" else []

    swapped = access.build_report([regional, k8s], reach=reach)
    assert one(swapped, "lab", "vpn-group", "grp").networks == (
        access.NetworkAccess("everything", "0.0.0.0/0", "model"),
    )
    assert one(swapped, "lab", "role", "someone").clusters == someone.clusters
    assert sorted(seen) == ["grp", "someone"]


# --- the command --------------------------------------------------------------------------------------
def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["access", "--fleet", str(REFERENCE_FLEET), *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_round_trips_to_the_documented_schema(plan_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--plans", str(plan_dir), "--env", "prod", "--json")
    assert code == 0
    data = json.loads(out)
    assert access.from_json(data).to_json() == data
    assert data["schema"] == access.SCHEMA and {p["environment"] for p in data["principals"]} == {"prod"}
    assert not any(s.startswith("staging") for s in data["stacks"])
    # The documented sample is real output, in the same schema.
    doc = (ROOT / "docs" / "access.md").read_text()
    sample = json.loads(re.search(r"```json\n(.*?)\n```", doc, re.S)[1])  # type: ignore[index]
    assert access.from_json(sample).to_json() == sample
    documented = set(re.findall(r"^\s*\"(\w+)\":", doc, re.M))
    assert set(data["principals"][0]) | set(data["principals"][0]["clusters"][0]) <= documented


def test_team_filter_and_table(plan_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--plans", str(plan_dir), "--team", "vision", "--json")
    assert code == 0
    assert {(p["kind"], p["team"]) for p in json.loads(out)["principals"]} == {
        ("team-role", "vision"),
        ("team-data", "vision"),
        ("vpn-group", "vision"),
    }
    code, out, _ = run(capsys, "--plans", str(plan_dir), "--env", "prod")
    assert code == 0
    assert "Access in prod" in out and "cluster-admin" in out and "Access in staging" not in out
    assert "Team data: EFS paths and S3 prefixes" in out


def test_missing_plans_exit_2_naming_the_path_and_the_command(
    tmp_path: Path, plan_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--plans", str(tmp_path / "nowhere"))
    assert code == 2 and out == ""
    assert f"{tmp_path / 'nowhere'}: no plan folder" in err and "dlinfra preview --all" in err
    partial = tmp_path / "partial"
    shutil.copytree(plan_dir, partial)
    (partial / "prod-us-west-2-k8s.json").unlink()
    code, out, err = run(capsys, "--plans", str(partial), "--env", "prod")
    assert code == 2 and out == ""
    assert f"{partial}: no plan export prod-us-west-2-k8s.json; run `dlinfra preview --all`" in err


def test_unknown_environment_exits_2(plan_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--plans", str(plan_dir), "--env", "qa")
    assert code == 2 and "unknown environment 'qa'" in err


def _grants(report: access.Report, env: str, team: str) -> set[tuple[str, str, str, str]]:
    """(region, store, location, access) of everything a team's pods may use."""
    return {(g.region, g.store, g.location, g.access) for g in one(report, env, "team-data", team).data}


def test_each_team_reads_and_writes_its_own_efs_paths_and_reads_the_datasets(report: access.Report) -> None:
    efs = {(r, loc, a) for r, store, loc, a in _grants(report, "staging", "vision") if store == "efs"}
    assert efs == {
        ("us-west-2", "/datasets", "read"),
        ("us-west-2", "/teams/vision", "read-write"),
        ("us-west-2", "/home/alice", "read-write"),  # alice is a member of vision
        ("us-west-2", "/dynamic/<a new directory per claim>", "read-write"),
    }
    robotics = {loc for _, store, loc, _ in _grants(report, "prod", "robotics") if store == "efs"}
    assert robotics == {"/datasets", "/teams/robotics", "/dynamic/<a new directory per claim>"}
    (home,) = [g for g in one(report, "staging", "team-data", "vision").data if g.location == "/home/alice"]
    assert home.via == "claim home-alice in team-vision" and home.identity.isdigit()


def test_each_team_writes_only_its_own_s3_prefix(report: access.Report, fleet: Fleet) -> None:
    for env in ("prod", "staging"):
        for team in fleet.teams:
            s3 = {(loc, a) for _, store, loc, a in _grants(report, env, team) if store == "s3"}
            written = {loc for loc, a in s3 if a == "read-write"}
            assert written and all(loc.endswith(f"/teams/{team}/") for loc in written), (env, team, written)
            read = {loc for loc, a in s3 if a == "read"}
            assert read and all("-datasets-" in loc and loc.endswith("-123456789012/") for loc in read)
            buckets = {loc.split("/")[2].rsplit("-", 2)[1] for loc in written}  # <prefix>-<purpose>-<account>
            assert buckets == {"checkpoints", "datasets", "results"}, written


def test_no_team_reaches_another_teams_directory_or_prefix(report: access.Report, fleet: Fleet) -> None:
    for env in ("prod", "staging"):
        for team in fleet.teams:
            others = [t for t in fleet.teams if t != team]
            members = set(fleet.teams[team].members)
            for _, _, location, _ in _grants(report, env, team):
                assert not any(f"/teams/{o}" in location for o in others), (team, location)
                if location.startswith("/home/"):
                    assert location.removeprefix("/home/") in members, (team, location)


def test_a_v1_report_still_reads() -> None:
    old = {"schema": "dlinfra.access/v1", "stacks": [], "principals": []}
    assert access.from_json(old).principals == ()


def test_a_dev_box_is_reached_by_its_persons_group_alone(report: access.Report) -> None:
    vision = one(report, "prod", "vpn-group", "vision")
    (box,) = [n for n in vision.networks if n.network == "devbox-alice"]  # her /32 rule, named by its box
    assert box.cidr.endswith("/32") and box.routed and box.via == "client-vpn us-west-2"
    for other in ("language", "robotics", "admins"):
        assert not [n for n in one(report, "prod", "vpn-group", other).networks if n.network.startswith("devbox-")]
