"""The role a team's people use may upload `dlinfra run` code, and nothing more: a customer managed policy per team and
regional stack, attached to teams.<team>.role_arn, lets it put objects under teams/<team>/runs/ of the region's results
bucket, with the storage key through S3 only; evaluated with tests/components/_iam_eval.py on the reference fleet's
plan. A role IAM Identity Center manages, or one of another account, gets no attachment (IAM would refuse it, or
attach to another role of the same name): the policy is declared and exported for the lab's permission set."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from components.platform_aws import run_policy_attachable
from dlinfra.model import run_job, stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet
from dlinfra.offline import engine, plan_export
from tests.components import _iam_eval
from tests.components._platform import Stack, platform_stacks
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

POLICY = "aws:iam/policy:Policy"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
INLINE = "aws:iam/rolePolicy:RolePolicy"
SSO_ROLE = (
    "arn:aws:iam::111122223333:role/aws-reserved/sso.amazonaws.com/eu-west-1/AWSReservedSSO_vision_0123456789abcdef"
)


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return load_fleet(REFERENCE_FLEET).fleet


@pytest.fixture(scope="module")
def stack(fleet: Fleet) -> Stack:
    return platform_stacks(fleet)["prod-us-west-2"]


def _bucket_arn(stack: Stack, purpose: str) -> str:
    (bucket,) = [
        r
        for r in stack.of_type("aws:s3/bucket:Bucket")
        if str(r.inputs["bucket"]).startswith(f"dlinfra-prod-usw2-{purpose}-")
    ]
    return str(bucket.outputs["arn"])


def _policies(resources: list[plan_export.ResourceRecord], role: str) -> list[dict[str, Any]]:
    """The documents of the policies attached to the role (by name), and no inline policy on it."""
    assert not [r for r in resources if r.type == INLINE and r.inputs["role"] == role]
    arns = {r.inputs["policyArn"] for r in resources if r.type == ATTACHMENT and r.inputs["role"] == role}
    return [json.loads(r.inputs["policy"]) for r in resources if r.type == POLICY and r.outputs["arn"] in arns]


def _may(role_arn: str, policies: list[dict[str, Any]]) -> Any:
    def may(action: str, resource: str, context: dict[str, str] | None = None) -> bool:
        request = _iam_eval.Request(role_arn, action, resource, context or {})
        return _iam_eval.allowed(request, {"Statement": []}, policies)

    return may


def test_each_team_role_may_upload_run_code_only_under_its_runs(fleet: Fleet, stack: Stack) -> None:
    results, checkpoints = _bucket_arn(stack, "results"), _bucket_arn(stack, "checkpoints")
    for team, spec in fleet.teams.items():
        assert spec.role_arn is not None
        policies = _policies(stack.resources, spec.role_arn.rpartition("/")[2])
        assert len(policies) == 1, (team, policies)
        key = run_job.CODE_KEY.format(team=team, run="my-idea-20261129-101500")
        may = _may(spec.role_arn, policies)

        assert may("s3:PutObject", f"{results}/{key}")
        other = next(t for t in fleet.teams if t != team)
        assert not may("s3:PutObject", f"{results}/{run_job.CODE_KEY.format(team=other, run='x')}")
        assert not may("s3:PutObject", f"{results}/teams/{team}/results.csv")
        assert not may("s3:PutObject", f"{checkpoints}/{key}")
        assert not may("s3:GetObject", f"{results}/{key}")
        key_arn = policies[0]["Statement"][1]["Resource"]
        assert may("kms:GenerateDataKey", key_arn, {"kms:ViaService": "s3.us-west-2.amazonaws.com"})
        assert not may("kms:GenerateDataKey", key_arn)
        assert not may("kms:Decrypt", key_arn, {"kms:ViaService": "s3.us-west-2.amazonaws.com"})


def test_every_region_and_team_names_its_own_policy_and_exports_it(fleet: Fleet) -> None:
    """Each regional stack declares a policy for each team in the same account: their names must differ, or one would
    replace another's; an Identity Center permission set finds each by that name."""
    stacks = platform_stacks(fleet)
    names = [r.inputs["name"] for stack in stacks.values() for r in stack.of_type(POLICY)]
    assert len(names) == len(set(names)) == len(stacks) * len(fleet.teams) > 1
    for stack in stacks.values():
        exported = stack.outputs["team_run_policy_arns"]
        assert exported == {r.name.split("-")[2]: r.outputs["arn"] for r in stack.of_type(POLICY)}, stack.role.name


@pytest.mark.parametrize(
    ("role_arn", "account", "attachable"),
    [
        ("arn:aws:iam::111122223333:role/team-vision", "111122223333", True),
        ("arn:aws:iam::111122223333:role/lab/team-vision", "111122223333", True),
        # Another account's role: when the fleet names no account, the stack's own (its caller's) is the one to
        # compare with, never "unknown, so attach": the attachment would name some other role or none.
        ("arn:aws:iam::444455556666:role/team-vision", "111122223333", False),
        (SSO_ROLE, "111122223333", False),
    ],
)
def test_which_roles_the_stack_may_attach_to(role_arn: str, account: str, attachable: bool) -> None:
    assert run_policy_attachable(role_arn, account) is attachable


PROGRAM = """
import pulumi
from components.platform_aws import PlatformAws, PlatformAwsArgs
from dlinfra.model.naming import Names
from stacks.context import aws_provider

teams = {{"vision": {vision!r}, "language": {language!r}, "robotics": {robotics!r}}}
PlatformAws(
    "platform",
    PlatformAwsArgs(
        names=Names(project="dlinfra", environment="prod", region="us-west-2"),
        cluster_name="dlinfra-prod-usw2-eks",
        pools={{}},
        team_namespaces={{t: "team-" + t for t in teams}},
        team_prefixes={{t: "teams/" + t + "/" for t in teams}},
        bucket_arns={{p: "arn:aws:s3:::dlinfra-prod-usw2-" + p for p in ("datasets", "checkpoints", "results")}},
        storage_key_arn="arn:aws:kms:us-west-2:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        team_role_arns=teams,
        account="111122223333",
    ),
    opts=pulumi.ResourceOptions(providers=[aws_provider("us-west-2")]),
)
"""


def test_no_policy_goes_on_an_identity_center_role_or_another_accounts(tmp_path: Path) -> None:
    roles = {
        "vision": SSO_ROLE,
        "language": "arn:aws:iam::444455556666:role/team-language",
        "robotics": "arn:aws:iam::111122223333:role/team-robotics",
    }
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(PROGRAM.format(**roles)))
    (role,) = [r for r in stackroles.roles(load_fleet(REFERENCE_FLEET).fleet) if r.name == "prod-us-west-2"]
    config = {"dlinfra:fleet": str(REFERENCE_FLEET), "dlinfra:lock": str(REFERENCE_LOCK)}
    result = engine.run_stack(ROOT, role, project="dlinfra", config=config, stack_exports={}, program=program)
    policies = {r.name: r for r in result.resources if r.type == POLICY}
    assert set(policies) == {f"platform-team-{t}-runs" for t in roles}  # declared for every team
    attachments = [r.inputs["role"] for r in result.resources if r.type == ATTACHMENT]
    assert attachments == ["team-robotics"]
    names = {arn.rpartition("/")[2] for arn in roles.values()}
    assert not [r for r in result.resources if r.type == INLINE and r.inputs["role"] in names]


def test_the_stack_compares_team_roles_with_its_own_account(fleet: Fleet) -> None:
    """The fleet's account, else CI's apply role's (it is a role of the account it applies to); never "unknown"."""
    from stacks.regional import _stack_account

    prod = fleet.environments["prod"]
    assert prod.account is None and prod.ci is not None
    assert _stack_account(prod, provider=None) == "111122223333"  # the provider is not asked
    assert _stack_account(prod.model_copy(update={"account": "444455556666"}), provider=None) == "444455556666"
