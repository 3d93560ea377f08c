"""`dlinfra reach`, reachability inside `dlinfra check`, the diff's reachability section, and `dlinfra access`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dlinfra.checks import report, runner
from dlinfra.checks.reach import check
from dlinfra.checks.reach.check import summary_json
from dlinfra.cli import main as cli
from dlinfra.review.diff import render
from dlinfra.review.diff.changes import Diff
from dlinfra.review.diff.plans import Topology
from tests import reference
from tests.checks.reach.test_reference import plans, without
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("reach") / "plans"
    folder.mkdir()
    for plan in plans():
        (folder / f"{plan['stack']}.json").write_text(json.dumps({**plan, "provenance": reference.provenance()}))
    return folder


def reach(plan_dir: Path, *extra: str) -> int:
    return cli.main(
        ["reach", "--fleet", str(REFERENCE_FLEET), "--lock", str(REFERENCE_LOCK), "--plans", str(plan_dir), *extra]
    )


def test_reach_proves_every_flow_and_exits_0(plan_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert reach(plan_dir) == 0
    out = capsys.readouterr().out
    assert "Reachability over the plans" in out and "dns" in out
    assert "as expected, 0 failing flows, 0 refused" in out and "FAIL" not in out
    assert "packets: 100% as expected" in out


def test_reach_json_names_the_hop_of_a_failing_flow(
    plan_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "plans"
    broken.mkdir()
    mutated = plans()
    without("prod-us-west-2", "cluster-nodes-self")(mutated)
    for plan in mutated:
        (broken / f"{plan['stack']}.json").write_text(json.dumps({**plan, "provenance": reference.provenance()}))
    assert reach(broken, "--json") == 1
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert result["failed_intents"] > 0 and result["families"]["dns"]["failed_intents"] == 2
    dns = next(f for f in result["failures"] if f["intent"] == "dns/prod-us-west-2/udp")
    assert dns["denied_at"] == "security group pool-cpu-sg, cluster-nodes-sg"
    assert dns["protocol"] == "udp" and dns["port"] == 53 and dns["resource"].endswith("::pool-cpu-sg")
    assert dns["hops"] and dns["requirement"].startswith("Kubernetes DNS")
    assert result["schema"] == "dlinfra.reach/v2"
    # A packet that shows it, inside the source's and destination's subnets, and how much of the space it is.
    assert dns["packet"]["destination_port"] == 53 and 32768 <= dns["packet"]["source_port"] <= 60999
    assert dns["source_address"].startswith("10.2.") and dns["share"] > 0
    assert (
        result["coverage"]["dns/prod-us-west-2/udp"]["share"]
        < 1
        < result["coverage"]["dns/prod-us-west-2/udp"]["packets"]
    )


def test_check_reports_reachability_as_blocking_findings_in_json_and_sarif() -> None:
    mutated = plans()
    # us-west-2b's private subnet: the nodes there lose EFS (us-west-2a's would take alice's dev box home too).
    without("prod-us-west-2", "storage-efs-from-10-2-64-0-18")(mutated)
    summary = summary_json(check.analyse(REFERENCE_FLEET, REFERENCE_LOCK, mutated))
    findings = runner.reach_findings(summary)
    assert [f.rule for f in findings] == ["reach-storage"]
    (finding,) = findings
    assert finding.blocking and finding.stack == "prod-us-west-2"
    assert "denied at security group storage-efs-sg: no ingress rule admits from 10.2.64." in finding.message
    run = runner.CheckRun(stacks=["prod-us-west-2"], rules=[], findings=findings, reach=summary)
    assert run.exit_code == 1
    assert report.to_json(run)["reach"]["failed_intents"] == 1
    sarif = report.to_sarif(run)
    (reach_run,) = [r for r in sarif["runs"] if r["tool"]["driver"]["name"] == "dlinfra-reach"]
    assert [r["ruleId"] for r in reach_run["results"]] == ["reach-storage"]


def test_the_diff_shows_what_a_change_breaks() -> None:
    base = summary_json(check.analyse(REFERENCE_FLEET, REFERENCE_LOCK, plans()))
    mutated = plans()
    without("prod-us-west-2", "cluster-nodes-from-laptops")(mutated)
    head = summary_json(check.analyse(REFERENCE_FLEET, REFERENCE_LOCK, mutated))
    result = Diff(
        base="main",
        head="pr",
        changes=(),
        stacks_added=(),
        stacks_removed=(),
        lock=(),
        base_topology=Topology(),
        head_topology=Topology(),
        base_reach=base,
        head_reach=head,
    )
    text = render.render_markdown(result)
    assert "### Reachability" in text
    assert "| laptop | " in text and "| 0 → " in text
    assert "**This change breaks:**" in text
    assert "cluster-nodes-sg: no ingress rule admits from 10.2." in text


def test_access_lists_only_networks_the_model_proves() -> None:
    from dlinfra.checks.plans import Plan
    from dlinfra.review import access
    from dlinfra.review.principals import model_reach

    mutated = plans()
    # The us-west-2 endpoint's interfaces may send nothing: its security group loses every egress rule.
    regional = next(p for p in mutated if p["stack"] == "prod-us-west-2")
    group = next(r for r in regional["resources"] if r["name"] == "client-vpn-sg")
    group["inputs"]["egress"] = []
    regional["resources"] = [
        r
        for r in regional["resources"]
        if not (
            r["type"].endswith(("SecurityGroupEgressRule", "securityGroupRule:SecurityGroupRule"))
            and r["inputs"].get("securityGroupId") == group["id"]
            and r["inputs"].get("type", "egress") == "egress"
        )
    ]
    loaded, address_plan, topo = check.model(REFERENCE_FLEET, REFERENCE_LOCK, mutated)
    wrapped = [Plan(Path(f"{p['stack']}.json"), p["stack"], p) for p in mutated if p["stack"].startswith("prod")]
    by_rules = access.build_report(wrapped, loaded.fleet)
    by_model = access.build_report(wrapped, loaded.fleet, reach=model_reach(topo, loaded.fleet, address_plan))

    def vision(report: access.Report) -> set[tuple[str, str]]:
        (p,) = [p for p in report.principals if p.kind == "vpn-group" and p.name == "vision"]
        return {(n.via, n.network) for n in p.networks}

    # The authorization rules still name every network, but nothing leaves that endpoint's interfaces.
    assert ("client-vpn us-west-2", "vpc-us-west-2") in vision(by_rules)
    assert not {n for via, n in vision(by_model) if via == "client-vpn us-west-2"}
    assert ("client-vpn eu-west-1", "vpc-us-west-2") in vision(by_model)
    assert ("client-vpn eu-west-1", "pods-sjc1") in vision(by_model)
