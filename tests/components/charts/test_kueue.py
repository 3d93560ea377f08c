"""Kueue: the teams' quotas as flavors, a cohort and queues, and the controller configuration."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import yaml

from components.charts.kueue import KUEUE_API
from dlinfra.model import kueue
from dlinfra.model.fleet.schema import Fleet
from tests.components._platform import KUEUE_SCHEMA, Stack, nominal_gpus, regional_stacks


def test_kueue_quotas_equal_the_fleets(stacks: dict[str, Stack], fleet: Fleet) -> None:
    totals = dict.fromkeys(fleet.teams, 0)
    for name, stack in stacks.items():
        if not name.startswith("prod-"):
            continue
        for team, queue in stack.queues().items():
            assert queue["spec"]["resourceGroups"][0]["coveredResources"] == ["nvidia.com/gpu"]
            totals[team] += sum(nominal_gpus(queue).values())
    assert totals == {team: spec.gpu_quota for team, spec in fleet.teams.items()}


@pytest.mark.parametrize("stack_name", regional_stacks())
def test_kueue_flavors_cohort_and_queues(stacks: dict[str, Stack], fleet: Fleet, stack_name: str) -> None:
    stack = stacks[stack_name]
    env, region = stack.role.environment, stack.role.region
    policy = "scaled" if env == "staging" else "guaranteed"
    planned = kueue.plan(fleet, env, policy).region(region)
    flavors = {key.rstrip("/"): value for key, value in stack.kueue("ResourceFlavor").items()}
    manager = kueue.overflow(fleet, kueue.plan(fleet, env, policy)).manager == region and fleet.multikueue_workers(env)
    assert sorted(flavors) == sorted([f.name for f in planned.flavors] + (["multikueue"] if manager else []))
    for flavor in planned.flavors:
        labels = flavors[flavor.name]["spec"]["nodeLabels"]
        assert labels["nvidia.com/gpu.product"] == flavor.gpu_model
        if flavor.source == "pool":
            assert labels["dlinfra.io/pool"] == flavor.source_name
            taints = fleet.environments[env].node_pools[flavor.source_name].taints
            assert flavors[flavor.name]["spec"].get("nodeTaints", []) == [
                {"key": t.key, "value": t.value, "effect": t.effect} for t in taints
            ]
        else:
            assert labels == {"dlinfra.io/site": flavor.source_name, "eks.amazonaws.com/compute-type": "hybrid",
                              "nvidia.com/gpu.product": flavor.gpu_model}  # fmt: skip
            # The labels and taint the site's machines register with (dlinfra/render/nodeadm.py).
            assert flavors[flavor.name]["spec"]["nodeTaints"] == [
                {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
            ]
    (cohort,) = stack.kueue("Cohort").values()
    assert cohort["metadata"]["name"] == "research"
    spare = nominal_gpus(cohort)
    queues = stack.queues()
    assert set(queues) == set(fleet.teams)
    for flavor in planned.flavors:
        nominal = sum(nominal_gpus(q)[flavor.name] for q in queues.values())
        assert nominal + spare[flavor.name] == flavor.gpus  # the cohort holds exactly what no team is guaranteed
    for team, queue in queues.items():
        spec = queue["spec"]
        assert spec["cohortName"] == "research"
        assert spec["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": fleet.team_namespace(team)}}
        assert spec["preemption"]["reclaimWithinCohort"] == "Any"
        # Admission order: owned sites, then reserved capacity, then on demand.
        assert [f["name"] for f in spec["resourceGroups"][0]["flavors"]] == [f.name for f in planned.flavors]
        for f in spec["resourceGroups"][0]["flavors"]:
            (res,) = f["resources"]
            capacity = next(x.gpus for x in planned.flavors if x.name == f["name"])
            assert int(res["nominalQuota"]) + int(res["borrowingLimit"]) == capacity  # may borrow the whole flavor
    local = {k: v for k, v in stack.kueue("LocalQueue").items() if k.startswith("default/")}
    assert set(local) == {f"default/{fleet.team_namespace(t)}" for t in fleet.teams}
    for team in fleet.teams:
        assert local[f"default/{fleet.team_namespace(team)}"]["spec"] == {"clusterQueue": team}


def test_kueue_objects_wait_for_the_kueue_chart(stacks: dict[str, Stack]) -> None:
    stack = stacks["prod-us-west-2"]
    release = stack.by_name["platform-kueue"].urn
    for record in stack.of_type(f"kubernetes:{KUEUE_API}:ResourceFlavor"):
        assert release in record.dependencies
    config = yaml.safe_load(stack.release("kueue")["values"]["managerConfig"]["controllerManagerConfigYaml"])
    assert config["resources"] == {"quotaCheckStrategy": "IgnoreUndeclared"}
    assert config["managedJobsNamespaceSelector"]["matchExpressions"][0]["key"] == "dlinfra.io/team"


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"kind": "ClusterQueue", "apiVersion": KUEUE_API, "metadata": {"name": "a"}, "spec": {"cohort": "x"}},
         "'cohort' was unexpected"),
        ({"kind": "LocalQueue", "apiVersion": KUEUE_API, "metadata": {"name": "a"}, "spec": {"clusterQueue": "a"}},
         "'namespace' is a required property"),
        ({"kind": "ResourceFlavor", "apiVersion": "kueue.x-k8s.io/v1beta1", "metadata": {"name": "a"}},
         "'kueue.x-k8s.io/v1beta2' was expected"),
        ({"kind": "ClusterQueue", "apiVersion": KUEUE_API, "metadata": {"name": "a"}, "spec": {"resourceGroups": [
            {"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "f", "resources": [
                {"name": "nvidia.com/gpu", "nominalQuota": "eight"}]}]}]}},
         "is not valid under any of the given schemas"),
    ],
)  # fmt: skip
def test_kueue_schema_catches_mistakes(manifest: dict[str, Any], message: str) -> None:
    validator = jsonschema.Draft202012Validator(json.loads(KUEUE_SCHEMA.read_text()))
    errors = [e.message for e in validator.iter_errors(manifest)]
    assert any(message in e for e in errors), errors
