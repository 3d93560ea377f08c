"""Whole-program tests: each stack role of the reference fleet under the offline engine."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from dlinfra import planner, stackroles
from dlinfra.fleet import load_fleet
from dlinfra.offline import engine
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

CONFIG = {"dlinfra:fleet": str(REFERENCE_FLEET), "dlinfra:lock": str(REFERENCE_LOCK)}


@pytest.fixture(scope="module")
def results() -> dict[str, engine.StackResult]:
    fleet = load_fleet(REFERENCE_FLEET).fleet
    runs = engine.run_all(ROOT, stackroles.roles(fleet), project=fleet.project, config=CONFIG)
    return {r.role.name: r for r in runs}


@pytest.fixture(scope="module")
def plan() -> planner.Plan:
    return planner.plan(load_fleet(REFERENCE_FLEET), planner.load_lock(REFERENCE_LOCK))


def _of_type(result: engine.StackResult, type_: str) -> list[engine.ResourceRecord]:
    return [r for r in result.resources if r.type == type_]


def test_every_stack_runs(results: dict[str, engine.StackResult]) -> None:
    assert set(results) == {
        "prod-us-west-2",
        "prod-us-east-1",
        "prod-eu-west-1",
        "staging-us-west-2",
        "prod-global",
    }


@pytest.mark.parametrize("stack", ["prod-us-west-2", "prod-us-east-1", "prod-eu-west-1", "staging-us-west-2"])
def test_regional_stack_declares_planned_network(
    results: dict[str, engine.StackResult], plan: planner.Plan, stack: str
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


def test_global_stack_reads_regional_exports(results: dict[str, engine.StackResult]) -> None:
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


def test_plan_export_schema(results: dict[str, engine.StackResult], tmp_path: Path) -> None:
    path = engine.write_plan(results["prod-us-west-2"], "dlinfra", tmp_path)
    import json

    plan: dict[str, Any] = json.loads(path.read_text())
    assert plan["schema"] == engine.PLAN_SCHEMA and plan["stack"] == "prod-us-west-2"
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
