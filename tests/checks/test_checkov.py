"""`dlinfra check` end to end with the real checkov: one run over the reference plans, a deliberately bad
fixture plan and a bad manifest (module-scoped: checkov takes seconds)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from dlinfra.checks import checkov, plans, report, runner, skips
from dlinfra.offline import plan_export
from policy.dlinfra_policy import context
from tests import reference
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

pytestmark = pytest.mark.checkov

HERE = Path(__file__).parent
FIXTURE_STACK = "test-us-west-2"
SKIPS = """\
version: 1
skips:
  - id: CKV2_AWS_19
    reason: the fixture's peer EIP is allocated for a site gateway that lives outside AWS
    resources: [aws_eip.peer-eip]
    frameworks: [terraform_plan]
  - id: CKV_AWS_999
    reason: a skip that matches nothing, so the run reports it as stale
"""


@pytest.fixture(scope="module")
def checkov_path() -> Path:
    path = checkov.executable(ROOT)
    if not path.is_file():
        message = f"checkov is not installed at {path} (run .ci/setup)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: in CI a check that cannot run is a failure")
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def run(checkov_path: Path, tmp_path_factory: pytest.TempPathFactory) -> runner.CheckRun:
    work = tmp_path_factory.mktemp("check")
    plan_dir = work / "plans"
    for result in reference.runs().values():
        plan_export.write_plan(result, reference.fleet().project, plan_dir, reference.provenance())
    shutil.copy(HERE / "fixtures" / f"{FIXTURE_STACK}.json", plan_dir)
    (work / "skips.yaml").write_text(SKIPS)
    selected, _ = plans.load_plans(plan_dir, None)
    return runner.run_checks(
        runner.CheckOptions(
            root=ROOT,
            plans=selected,
            context=context.build_context(REFERENCE_FLEET, REFERENCE_LOCK),
            skips=skips.load_skips(work / "skips.yaml"),
            manifests=HERE / "fixtures" / "manifests",
            export_dir=work / "checkov",
            checkov=checkov_path,
        )
    )


def _failed(run: runner.CheckRun, stack: str, check_id: str) -> list[runner.Finding]:
    return [f for f in run.findings if f.tool == "checkov" and f.stack == stack and f.rule == check_id]


def test_checkov_flags_the_bad_fixture(run: runner.CheckRun) -> None:
    (efs,) = _failed(run, FIXTURE_STACK, "CKV_AWS_42")  # EFS not encrypted
    assert efs.level == "failed" and efs.resource.endswith("::scratch-efs") and efs.blocking
    (ssh,) = _failed(run, FIXTURE_STACK, "CKV_AWS_24")  # SSH from 0.0.0.0/0
    assert ssh.label == "aws_security_group.bastion-sg" and ssh.resource.startswith("urn:pulumi:")
    assert run.exit_code == 1


def test_checkov_scanned_every_reference_plan(run: runner.CheckRun) -> None:
    (tf,) = [s for s in run.checkov if s.framework == "terraform_plan"]
    assert tf.resources > 0 and tf.passed + tf.failed > 0 and tf.checks > 10
    for stack in reference.runs():
        if stack.endswith("-k8s"):
            # In-cluster stacks declare only Kubernetes objects: checkov scans them as rendered manifests.
            assert stack not in run.checked, stack
        else:
            assert run.checked.get(stack, 0) > 0, f"checkov checked nothing in {stack}"


def test_skips_apply_with_their_reason_and_stale_ones_are_reported(run: runner.CheckRun) -> None:
    (eip,) = _failed(run, FIXTURE_STACK, "CKV2_AWS_19")
    assert eip.level == "skipped" and not eip.blocking and "site gateway" in eip.reason
    assert any("CKV_AWS_999 matched nothing" in note for note in run.notes)
    (tf,) = [s for s in run.checkov if s.framework == "terraform_plan"]
    assert tf.skipped == 1


def test_kubernetes_manifests_are_scanned(run: runner.CheckRun) -> None:
    (k8s,) = [s for s in run.checkov if s.framework == "kubernetes"]
    assert k8s.resources > 0 and k8s.failed > 0
    (privileged,) = [f for f in run.findings if f.rule == "CKV_K8S_16"]
    assert privileged.location == ("tests/checks/fixtures/manifests/bad-deployment.yaml", 2)
    assert privileged.label == "Deployment.team-vision.bad-debug"


def test_crossguard_rules_ran_on_the_fixture_too(run: runner.CheckRun) -> None:
    rules_hit = {f.rule for f in run.findings if f.tool == "crossguard" and f.stack == FIXTURE_STACK}
    assert {"efs-encrypted", "no-world-ingress", "vpc-cidr-planned"} <= rules_hit


def test_sarif_for_code_scanning(run: runner.CheckRun) -> None:
    sarif = json.loads(json.dumps(report.to_sarif(run)))
    assert sarif["version"] == "2.1.0" and [r["tool"]["driver"]["name"] for r in sarif["runs"]] == [
        "dlinfra-crossguard",
        "checkov",
    ]
    for sarif_run in sarif["runs"]:
        ids = [rule["id"] for rule in sarif_run["tool"]["driver"]["rules"]]
        for result in sarif_run["results"]:
            assert ids[result["ruleIndex"]] == result["ruleId"]
            location = result["locations"][0]["physicalLocation"]
            assert (ROOT / location["artifactLocation"]["uri"]).is_file() and location["region"]["startLine"] >= 1
            assert result["partialFingerprints"]["dlinfraFinding/v1"]
    suppressed = [r for r in sarif["runs"][1]["results"] if r.get("suppressions")]
    assert [r["ruleId"] for r in suppressed] == ["CKV2_AWS_19"]
    assert suppressed[0]["suppressions"][0]["justification"].startswith("the fixture's peer EIP")


def test_json_report(run: runner.CheckRun) -> None:
    data = report.to_json(run)
    assert data["exit_code"] == 1 and FIXTURE_STACK in data["stacks"]
    assert {s["framework"] for s in data["checkov"]} == {"terraform_plan", "kubernetes"}
    assert all({"rule", "level", "blocking", "resource", "message"} <= set(f) for f in data["findings"])
