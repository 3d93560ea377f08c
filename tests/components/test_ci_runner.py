"""CiRunner: the CodeBuild-hosted GitHub Actions runner each regional stack declares inside its VPC."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from components.ci_runner import CiRunnerArgs
from dlinfra.model import ci, stackroles
from dlinfra.model.naming import Names
from dlinfra.offline import plan_export
from dlinfra.review.diff.compare import compare, touched
from dlinfra.review.diff.plans import PlanSet
from tests.conftest import ROOT
from tests.reference import REGIONAL, env_region, fleet, named, of_type, runs

PROJECT = "aws:codebuild/project:Project"
WEBHOOK = "aws:codebuild/webhook:Webhook"


def _runner(result: plan_export.StackResult, purpose: ci.Purpose) -> plan_export.ResourceRecord:
    return named(result, f"{stackroles.RUNNER_COMPONENTS[purpose]}-project")


def _groups(result: plan_export.StackResult, purpose: ci.Purpose) -> list[list[ci.WebhookFilter]]:
    """The filter groups of a runner's webhook as the plan declares them."""
    hook = named(result, f"{stackroles.RUNNER_COMPONENTS[purpose]}-webhook")
    assert hook.inputs["projectName"] == _runner(result, purpose).inputs["name"]
    return [
        [ci.WebhookFilter(f["type"], f["pattern"], f["excludeMatchedPattern"]) for f in group["filters"]]
        for group in hook.inputs["filterGroups"]
    ]


@pytest.mark.parametrize("stack", REGIONAL)
def test_runners_run_in_the_private_subnets_under_the_labels_the_workflows_use(stack: str) -> None:
    result = runs()[stack]
    env, region = env_region(stack)
    ci_spec = fleet().environments[env].ci
    assert ci_spec is not None
    # A preview runner only where pull requests get real previews (staging): prod runs no pull-request code.
    purposes = ("apply", "preview") if ci_spec.pull_request_preview else ("apply",)
    assert len(of_type(result, PROJECT)) == len(of_type(result, WEBHOOK)) == len(purposes)
    role = stackroles.StackRole("k8s", env, region)
    for purpose in purposes:
        inputs = _runner(result, purpose).inputs
        # The names the workflows' runs-on labels are built from: `dlinfra stacks --json` (apply.yml's k8s job)
        # and `dlinfra diff --touched` (preview.yml's preview-in-vpc job).
        label = f"codebuild-{inputs['name']}"
        assert label == stackroles.runs_on(fleet(), role, purpose) == result.outputs["ci_runner_labels"][purpose]
        assert inputs["name"] == result.outputs["ci_runner_projects"][purpose]
        private = result.outputs["private_subnet_ids"]  # AZ -> subnet id
        assert inputs["vpcConfig"]["subnets"] == [private[az] for az in sorted(private)]
        group = named(result, f"{stackroles.RUNNER_COMPONENTS[purpose]}-sg")
        assert inputs["vpcConfig"]["securityGroupIds"] == [group.id]
        assert inputs["environment"]["privilegedMode"] is False
        # No project limit: with one, a build past it is refused instead of queued (CodeBuild user guide, "Builds in
        # AWS CodeBuild"), and the GitHub job it was for waits for a runner that never comes; without one, builds
        # queue against the account's concurrent builds quota.
        assert "concurrentBuildLimit" not in inputs
        assert inputs["source"] == {
            "type": "GITHUB",
            "location": ci_spec.repository,
            "auth": {"type": "CODECONNECTIONS", "resource": ci_spec.connection_arn},
        }
        # HTTPS out only: to the internet through NAT, and to the VPC (the private EKS endpoint).
        egress = [
            r
            for r in of_type(result, "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")
            if r.parent == group.urn
        ]
        assert {(r.inputs["cidrIpv4"], r.inputs["fromPort"]) for r in egress} == {
            ("0.0.0.0/0", 443.0),
            (result.outputs["vpc_cidr"], 443.0),
        }
        ingress = of_type(result, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        assert not [r for r in ingress if r.parent == group.urn]


def test_the_workflows_are_the_ones_the_filters_name() -> None:
    apply = yaml.safe_load((ROOT / ".github/workflows/apply.yml").read_text())
    preview = yaml.safe_load((ROOT / ".github/workflows/preview.yml").read_text())
    assert apply["name"] == ci.WORKFLOWS["apply"] and preview["name"] == ci.WORKFLOWS["preview"]
    # YAML reads `on:` as True. apply.yml runs from the default branch only; preview.yml from pull requests.
    assert apply[True]["push"]["branches"] == [ci.DEFAULT_BRANCH] and set(apply[True]) == {"push", "workflow_dispatch"}
    assert list(preview[True]) == ["pull_request"]
    # One stack at a time per run: apply.yml applies in order, and builds past the account's concurrent builds quota
    # queue, at most five times the quota (CodeBuild user guide, "Builds in AWS CodeBuild").
    assert (
        apply["jobs"]["k8s"]["strategy"]["max-parallel"]
        == preview["jobs"]["preview-in-vpc"]["strategy"]["max-parallel"]
        == 1
    )


# What a fork's pull request can make GitHub queue: any workflow name (it may edit the workflows), from a head branch
# its author names, `main` included; its sender is the fork's author, on no list.
FORK = 4242
PULL_REQUEST_JOBS = [
    ci.WorkflowJob(workflow, ref, actor_id=FORK)
    for workflow in ("preview", "apply", "offline", "anything")
    for ref in ("refs/heads/add-pool", "refs/heads/main")
]


def _codebuild_admits(groups: list[list[ci.WebhookFilter]], job: ci.WorkflowJob, *, strict: bool = False) -> bool:
    """CodeBuild's documented evaluation of a queued workflow job (API reference, "WebhookFilter"): EVENT,
    WORKFLOW_NAME and ACTOR_ACCOUNT_ID are read; HEAD_REF works with push and pull-request events only. What CodeBuild
    does with it on a workflow job is not documented: either it is not evaluated (keeps nothing out) or, `strict`,
    it never passes (keeps everything out)."""
    values = {"WORKFLOW_NAME": job.workflow, "ACTOR_ACCOUNT_ID": str(job.actor_id)}
    for group in groups:
        passed = []
        for f in group:
            if f.type == "EVENT":
                passed.append(job.event in [e.strip() for e in f.pattern.split(",")])
            elif f.type in values:
                passed.append((re.search(f.pattern, values[f.type]) is not None) != f.exclude)
            elif strict:
                passed.append(False)
        if any(f.type == "EVENT" for f in group) and all(passed):
            return True
    return False


@pytest.mark.parametrize("stack", ["prod-us-west-2", "staging-us-west-2"])
def test_no_pull_request_job_reaches_the_apply_runner(stack: str) -> None:
    groups = _groups(runs()[stack], "apply")
    env, _ = env_region(stack)
    ci_spec = fleet().environments[env].ci
    assert ci_spec is not None
    assert groups == [list(ci.webhook_filters("apply", actor_ids=ci_spec.runner_actor_ids))]
    # A fork's pull request from its own `main`, with a workflow renamed `apply`, is among these.
    assert ci.WorkflowJob("apply", "refs/heads/main", FORK) in PULL_REQUEST_JOBS
    for job in PULL_REQUEST_JOBS:
        assert not _codebuild_admits(groups, job), job
        assert not ci.admits(groups, job), job
    member = ci_spec.runner_actor_ids[0]
    # apply's own jobs, pushed to main by a member, start the runner whichever way CodeBuild treats a filter it does
    # not document for workflow jobs: so none may be there (a HEAD_REF would either guard nothing or stop every apply).
    push = ci.WorkflowJob("apply", "refs/heads/main", member)
    assert _codebuild_admits(groups, push) and _codebuild_admits(groups, push, strict=True)
    # A workflow that merely calls itself after apply does not.
    assert not _codebuild_admits(groups, ci.WorkflowJob("apply-copy", "refs/heads/main", member))
    # What the filters cannot tell apart (README, "Only trusted workflows get the in-VPC runners"): a listed
    # account's own pull request that names a workflow `apply` reaches the runner; a runner group restricted to
    # selected workflows closes that in an organization.
    assert _codebuild_admits(groups, ci.WorkflowJob("apply", "refs/heads/add-pool", member))


def test_the_preview_runner_takes_previews_only() -> None:
    groups = _groups(runs()["staging-us-west-2"], "preview")
    member = fleet().environments["staging"].ci.runner_actor_ids[0]  # type: ignore[union-attr]
    job = ci.WorkflowJob("preview", "refs/heads/add-pool", member)
    assert _codebuild_admits(groups, job) and _codebuild_admits(groups, job, strict=True)
    assert not _codebuild_admits(groups, ci.WorkflowJob("preview", "refs/heads/main", FORK))
    assert not _codebuild_admits(groups, ci.WorkflowJob("apply", "refs/heads/add-pool", member))
    assert not _codebuild_admits(groups, ci.WorkflowJob("offline", "refs/heads/add-pool", member))


def test_an_in_cluster_preview_runs_on_the_preview_runner() -> None:
    plans = {name: r.plan("dlinfra") for name, r in runs().items()}
    stack = "staging-us-west-2-k8s"
    changed = compare(PlanSet("a", plans, configs={stack: "config: {}"}), PlanSet("b", plans, configs={stack: "x"}))
    (row,) = touched(changed, fleet())
    assert row["runs_on"] == f"codebuild-{_runner(runs()['staging-us-west-2'], 'preview').inputs['name']}"
    assert row["preview"] == "real"


def test_each_runner_has_its_own_minimal_role_trusting_only_its_project() -> None:
    result = runs()["staging-us-west-2"]
    arns = set()
    for purpose in ci.PURPOSES:
        component = stackroles.RUNNER_COMPONENTS[purpose]
        role = named(result, f"{component}-role")
        assert _runner(result, purpose).inputs["serviceRole"] == role.outputs["arn"]
        arns.add(role.outputs["arn"])
        (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
        assert statement["Principal"] == {"Service": "codebuild.amazonaws.com"}
        assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": "123456789012"}
        assert statement["Condition"]["ArnLike"]["aws:SourceArn"].endswith(f":project/dlinfra-staging-usw2-{component}")
        policy = json.loads(named(result, f"{component}-policy").inputs["policy"])
        actions = [
            a for s in policy["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
        ]
        # The jobs get their identity by OIDC; the runner itself can change nothing in the account.
        assert not [a for a in actions if a.split(":")[0] in ("iam", "eks", "sts", "s3") or a.split(":")[1] == "*"]
        star = [s for s in policy["Statement"] if s["Resource"] == "*"]
        assert [a for s in star for a in s["Action"] if not a.split(":")[1].startswith("Describe")] == []
        (attach,) = [s for s in policy["Statement"] if s["Sid"] == "AttachInPrivateSubnets"]
        assert attach["Condition"]["StringEquals"] == {"ec2:AuthorizedService": "codebuild.amazonaws.com"}
        # Its own log group and security group, none of the other runner's.
        (logs,) = [s for s in policy["Statement"] if s["Sid"] == "Logs"]
        assert logs["Resource"][0] == named(result, f"{component}-logs").outputs["arn"]
        (interfaces,) = [s for s in policy["Statement"] if s["Sid"] == "BuildInterfaces"]
        assert named(result, f"{component}-sg").outputs["arn"] in interfaces["Resource"]
        other = stackroles.RUNNER_COMPONENTS["preview" if purpose == "apply" else "apply"]
        assert f"-{other}" not in json.dumps(policy)
    assert len(arns) == 2


BASE = {
    "names": Names("dlinfra", "prod", "us-west-2"),
    "purpose": "apply",
    "filters": ci.webhook_filters("apply", actor_ids=(9919,)),
    "vpc_id": "vpc-1",
    "vpc_cidr": "10.2.0.0/16",
    "subnet_ids": {"us-west-2a": "subnet-a"},
    "repository": "https://github.com/lab/dlinfra",
    "connection_arn": "arn:aws:codeconnections:us-west-2:111122223333:connection/x",
    "log_kms_key_arn": "arn:aws:kms:us-west-2:111122223333:key/k",
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"subnet_ids": {}}, "subnet_ids: the runner needs at least one private subnet"),
        ({"repository": "github.com/lab/dlinfra"}, "repository: 'github.com/lab/dlinfra' is not"),
        ({"timeout_minutes": 3000}, "timeout_minutes: 3000 is outside CodeBuild's 5..2160"),
        ({"concurrent_build_limit": 0}, "concurrent_build_limit: must be at least 1"),
        ({"log_retention_days": 4}, "log_retention_days: 4 is not a CloudWatch Logs retention"),
        (
            {"image": "aws/codebuild/amazonlinux-x86_64-standard:5.0"},
            "image: 'aws/codebuild/amazonlinux-x86_64-standard:5.0' is amazonlinux 2023 x64, where "
            "actions/setup-python has no Python builds",
        ),
        ({"image": "ubuntu:22.04"}, "image: 'ubuntu:22.04' is not a curated image in dlinfra/data/codebuild_images"),
        ({"filters": ci.webhook_filters("apply", actor_ids=(9919,))[:2]}, "filters: need EVENT WORKFLOW_JOB_QUEUED, a"),
        (
            {
                "filters": (
                    *ci.webhook_filters("apply", actor_ids=(9919,)),
                    ci.WebhookFilter("HEAD_REF", "^refs/heads/main$"),
                )
            },
            r"filters: \['HEAD_REF'\] do not apply to workflow jobs",
        ),
    ],
)
def test_bad_args_name_the_field(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CiRunnerArgs(**(BASE | change))  # type: ignore[arg-type]
