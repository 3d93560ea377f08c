"""CiRunner: the CodeBuild-hosted GitHub Actions runner each regional stack declares inside its VPC."""

from __future__ import annotations

import json

import pytest

from components.ci_runner import CiRunnerArgs
from dlinfra.model import stackroles
from dlinfra.model.naming import Names
from tests.reference import REGIONAL, env_region, fleet, named, of_type, runs

PROJECT = "aws:codebuild/project:Project"


@pytest.mark.parametrize("stack", REGIONAL)
def test_runner_runs_in_the_private_subnets_and_takes_queued_jobs(stack: str) -> None:
    result = runs()[stack]
    env, region = env_region(stack)
    ci = fleet().environments[env].ci
    assert ci is not None
    (project,) = of_type(result, PROJECT)
    inputs = project.inputs
    # The name apply.yml's runs-on label is built from (dlinfra stacks --json).
    role = stackroles.StackRole("k8s", env, region)
    assert f"codebuild-{inputs['name']}" == stackroles.runs_on(fleet(), role) == result.outputs["ci_runner_label"]
    private = result.outputs["private_subnet_ids"]  # AZ -> subnet id
    assert inputs["vpcConfig"]["subnets"] == [private[az] for az in sorted(private)]
    (group,) = [g for g in of_type(result, "aws:ec2/securityGroup:SecurityGroup") if g.name == "ci-runner-sg"]
    assert inputs["vpcConfig"]["securityGroupIds"] == [group.id]
    assert inputs["environment"]["privilegedMode"] is False
    assert inputs["source"] == {
        "type": "GITHUB",
        "location": ci.repository,
        "auth": {"type": "CODECONNECTIONS", "resource": ci.connection_arn},
    }
    (webhook,) = of_type(result, "aws:codebuild/webhook:Webhook")
    assert webhook.inputs["filterGroups"] == [{"filters": [{"type": "EVENT", "pattern": "WORKFLOW_JOB_QUEUED"}]}]
    # HTTPS out only: to the internet through NAT, and to the VPC (the private EKS endpoint).
    egress = [
        r for r in of_type(result, "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule") if r.parent == group.urn
    ]
    assert {(r.inputs["cidrIpv4"], r.inputs["fromPort"]) for r in egress} == {
        ("0.0.0.0/0", 443.0),
        (result.outputs["vpc_cidr"], 443.0),
    }
    assert not [
        r for r in of_type(result, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule") if r.parent == group.urn
    ]


def test_runner_role_is_minimal_and_trusts_only_its_project() -> None:
    result = runs()["prod-us-west-2"]
    role = named(result, "ci-runner-role")
    (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert statement["Principal"] == {"Service": "codebuild.amazonaws.com"}
    assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": "123456789012"}
    assert statement["Condition"]["ArnLike"]["aws:SourceArn"].endswith(":project/dlinfra-prod-usw2-ci-runner")
    policy = json.loads(named(result, "ci-runner-policy").inputs["policy"])
    actions = [a for s in policy["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
    # The jobs get their identity by OIDC; the runner itself can change nothing in the account.
    assert not [a for a in actions if a.split(":")[0] in ("iam", "eks", "sts", "s3") or a.split(":")[1] == "*"]
    star = [s for s in policy["Statement"] if s["Resource"] == "*"]
    assert [a for s in star for a in s["Action"] if not a.split(":")[1].startswith("Describe")] == []
    (attach,) = [s for s in policy["Statement"] if s["Sid"] == "AttachInPrivateSubnets"]
    assert attach["Condition"]["StringEquals"] == {"ec2:AuthorizedService": "codebuild.amazonaws.com"}
    assert len(attach["Condition"]["ArnEquals"]["ec2:Subnet"]) == 3


BASE = {
    "names": Names("dlinfra", "prod", "us-west-2"),
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
    ],
)
def test_bad_args_name_the_field(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CiRunnerArgs(**(BASE | change))  # type: ignore[arg-type]
