"""The role a team's people use may upload `dlinfra run` code, and nothing more: an inline policy per regional stack on
teams.<team>.role_arn lets it put objects under teams/<team>/runs/ of the region's results bucket, with the storage
key through S3 only; evaluated with tests/components/_iam_eval.py on the reference fleet's plan."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dlinfra.model import run_job
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.fleet.schema import Fleet
from tests.components import _iam_eval
from tests.components._platform import Stack, platform_stacks
from tests.conftest import REFERENCE_FLEET

ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"


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


def _policies(stack: Stack, role: str) -> list[dict[str, Any]]:
    return [json.loads(r.inputs["policy"]) for r in stack.of_type(ROLE_POLICY) if r.inputs["role"] == role]


def _may(role_arn: str, policies: list[dict[str, Any]]) -> Any:
    def may(action: str, resource: str, context: dict[str, str] | None = None) -> bool:
        request = _iam_eval.Request(role_arn, action, resource, context or {})
        return _iam_eval.allowed(request, {"Statement": []}, policies)

    return may


def test_each_team_role_may_upload_run_code_only_under_its_runs(fleet: Fleet, stack: Stack) -> None:
    results, checkpoints = _bucket_arn(stack, "results"), _bucket_arn(stack, "checkpoints")
    for team, spec in fleet.teams.items():
        assert spec.role_arn is not None
        policies = _policies(stack, spec.role_arn.rpartition("/")[2])
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


def test_every_region_names_its_own_policy(fleet: Fleet) -> None:
    """Each regional stack adds an inline policy to the same role: their names must differ, or one would overwrite
    another's bucket."""
    names = [
        (r.inputs["role"], r.inputs["name"])
        for stack in platform_stacks(fleet).values()
        for r in stack.of_type(ROLE_POLICY)
        if r.inputs["role"] == "team-vision"
    ]
    assert len(names) == len(set(names)) == len(platform_stacks(fleet)) > 1
