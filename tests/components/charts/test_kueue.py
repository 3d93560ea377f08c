"""Kueue: the teams' quotas as flavors, a cohort and queues, and the controller configuration."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import yaml

from components.charts import kueue as kueue_chart
from components.charts.kueue import KUEUE_API, TEAM_LABEL, kueue_manager_config
from dlinfra.model import job_operators, kueue
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
        # dlinfra's model label, and NVIDIA's product name (Kueue ignores a selector key no flavor names, so a job that
        # selects a product must meet it here).
        assert labels["dlinfra.io/gpu-model"] == flavor.gpu_model
        assert labels["nvidia.com/gpu.product"].startswith("NVIDIA-")
        if flavor.source == "pool":
            assert labels["dlinfra.io/pool"] == flavor.source_name
            pool = fleet.environments[env].node_pools[flavor.source_name]
            reservation = pool.capacity_reservations.get(region)
            block = reservation is not None and reservation.type == "capacity_block"
            own = [{"key": t.key, "value": t.value, "effect": t.effect} for t in pool.taints]
            # A Capacity Block's flavor is created closed and its taints left to the block's keeper
            # (components/block_flavors.py); every pool's flavor may take them back (patchForce).
            closed = [{"key": "dlinfra.io/capacity-block-closed", "value": "true", "effect": "NoSchedule"}]
            assert flavors[flavor.name]["spec"].get("nodeTaints", []) == own + (closed if block else [])
            shares = {"dlinfra.io/gpu-shares-per-gpu": " ".join(f"{r}={n}" for r, n in flavor.shares)}
            assert flavors[flavor.name]["metadata"]["annotations"] == {
                "pulumi.com/patchForce": "true",
                **(shares if flavor.shares else {}),
            }
        else:
            # The site's pool label keeps a job pinned to a cloud pool off the site (nodeadm.POOL_LABEL).
            assert labels == {"dlinfra.io/site": flavor.source_name, "eks.amazonaws.com/compute-type": "hybrid",
                              "dlinfra.io/pool": flavor.name, "dlinfra.io/gpu-model": flavor.gpu_model,
                              "nvidia.com/gpu.product": labels["nvidia.com/gpu.product"]}  # fmt: skip
            # The labels and taint the site's machines register with (dlinfra/render/nodeadm.py).
            assert flavors[flavor.name]["spec"]["nodeTaints"] == [
                {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
            ]
    (cohort,) = stack.kueue("Cohort").values()
    assert cohort["metadata"]["name"] == "research"
    # A shared pool's flavor counts its shares (sorted by resource), quotas planned in GPUs times shares per GPU.
    per_gpu = {f.name: min(f.resources.items())[1] for f in planned.flavors}
    spare = nominal_gpus(cohort, per_gpu)
    queues = stack.queues()
    assert set(queues) == set(fleet.teams)
    for flavor in planned.flavors:
        nominal = sum(nominal_gpus(q, per_gpu)[flavor.name] for q in queues.values())
        assert nominal + spare[flavor.name] == flavor.gpus  # the cohort holds exactly what no team is guaranteed
    for team, queue in queues.items():
        spec = queue["spec"]
        assert spec["cohortName"] == "research"
        assert spec["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": fleet.team_namespace(team)}}
        assert spec["preemption"]["reclaimWithinCohort"] == "Any"
        # Admission order: owned sites, then reserved capacity, then on demand; whole GPUs' group before shares'.
        groups = spec["resourceGroups"]
        whole, shared = [f.name for f in planned.flavors if not f.shares], [f.name for f in planned.flavors if f.shares]
        assert [f["name"] for g in groups for f in g["flavors"]] == whole + shared
        for group in groups:
            for f in group["flavors"]:
                planned_flavor = next(x for x in planned.flavors if x.name == f["name"])
                assert group["coveredResources"] == sorted(planned_flavor.resources)
                for res in f["resources"]:  # may borrow the whole flavor, in each of its shares
                    per = planned_flavor.resources[res["name"]]
                    assert int(res["nominalQuota"]) + int(res["borrowingLimit"]) == planned_flavor.gpus * per
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


CONFIG_SCHEMA = KUEUE_SCHEMA.parent / "config.kueue.x-k8s.io-v1beta2.json"


def _declared_config(stack: Stack) -> dict[str, Any]:
    config = yaml.safe_load(stack.release("kueue")["values"]["managerConfig"]["controllerManagerConfigYaml"])
    assert isinstance(config, dict)
    return config


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label selector semantics for the operators the configuration uses (Exists, NotIn)."""
    for e in selector["matchExpressions"]:
        assert e["operator"] in ("Exists", "NotIn"), e
        if e["operator"] == "Exists" and e["key"] not in labels:
            return False
        if e["operator"] == "NotIn" and labels.get(e["key"]) in e["values"]:
            return False
    return True


@pytest.mark.parametrize("stack_name", regional_stacks())
def test_kueue_queues_every_workload_of_team_namespaces(stacks: dict[str, Stack], stack_name: str) -> None:
    """Kueue manages bare Pods, Deployments and StatefulSets as well as jobs, in team namespaces and nowhere else."""
    config = _declared_config(stacks[stack_name])
    jsonschema.Draft202012Validator(json.loads(CONFIG_SCHEMA.read_text())).validate(config)
    frameworks = config["integrations"]["frameworks"]
    assert {"batch/job", "pod", "deployment", "statefulset"} <= set(frameworks)
    # No job operator is named in the reference fleet: Kueue manages none of their kinds (a kind whose operator is
    # not trusted would have its pods refused: dlinfra.model.job_operators).
    assert not set(frameworks) & (set(job_operators.all_frameworks()) - {"batch/job"})
    assert config["manageJobsWithoutQueueName"] is True
    selector = config["managedJobsNamespaceSelector"]
    name = "kubernetes.io/metadata.name"
    assert _selects(selector, {name: "team-vision", TEAM_LABEL: "vision"})
    assert not _selects(selector, {name: "team-vision"})  # a namespace that is not a team's
    # Kueue refuses a selector that matches kube-system or its own namespace when the pod integration is on
    # (v0.19.2 pkg/config/validation.go); ours keeps every system and add-on namespace out even if labelled.
    for system in ("kube-system", "kueue-system", "default", "kube-public"):
        assert not _selects(selector, {name: system}) and not _selects(selector, {name: system, TEAM_LABEL: "x"})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"integrations": {"frameworks": ["batch/job", "pods"]}}, "'pods' is not one of"),
        ({"integrations": {"frameworks": ["pod", "pod"]}}, "has non-unique elements"),
        ({"managedJobsNamespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Present"}]}},
         "'Present' is not one of"),
        ({"manageJobsWithoutQueueName": "yes"}, "'yes' is not of type 'boolean'"),
        # v1beta1's integrations.podOptions is gone from v1beta2: managedJobsNamespaceSelector replaces it.
        ({"integrations": {"frameworks": ["pod"], "podOptions": {}}}, "Additional properties are not allowed"),
    ],
)  # fmt: skip
def test_kueue_config_schema_catches_mistakes(change: dict[str, Any], message: str) -> None:
    config = kueue_manager_config(job_operators.all_frameworks()) | change
    errors = [
        e.message for e in jsonschema.Draft202012Validator(json.loads(CONFIG_SCHEMA.read_text())).iter_errors(config)
    ]
    assert any(message in e for e in errors), errors


def test_every_job_operators_kinds_are_kueue_framework_names() -> None:
    """The names dlinfra.model.job_operators gives are the ones Kueue's configuration accepts (its schema's enum)."""
    config = kueue_manager_config(job_operators.all_frameworks())
    jsonschema.Draft202012Validator(json.loads(CONFIG_SCHEMA.read_text())).validate(config)
    assert config["integrations"]["frameworks"][: len(job_operators.all_frameworks())] == list(
        job_operators.all_frameworks()
    )


def _go_minutes(duration: str) -> float:
    """A Go duration of the forms our configuration uses ("30m", "90s", "1h") in minutes."""
    value, unit = float(duration[:-1]), duration[-1]
    return value * {"s": 1 / 60, "m": 1, "h": 60}[unit]


@pytest.mark.parametrize("stack_name", regional_stacks())
def test_gpu_queues_provision_whole(stacks: dict[str, Stack], stack_name: str) -> None:
    """Every team queue's cloud pool flavors carry the provisioning check (best-effort atomic scale-up of every GPU
    pod set), site flavors do not, and Kueue's waitForPodsReady outlasts the autoscaler's wait for a node."""
    stack = stacks[stack_name]
    flavors = stack.kueue("ResourceFlavor")
    sites = {k.rstrip("/") for k, v in flavors.items() if "dlinfra.io/site" in v["spec"].get("nodeLabels", {})}
    pools = {k.rstrip("/") for k, v in flavors.items() if "dlinfra.io/pool" in v["spec"].get("nodeLabels", {})} - sites
    assert pools  # every reference region has a cloud GPU pool
    checks = stack.kueue("AdmissionCheck")
    assert checks[f"{kueue_chart.PROVISIONING_CHECK}/"]["spec"] == {
        "controllerName": "kueue.x-k8s.io/provisioning-request",
        "parameters": {
            "apiGroup": "kueue.x-k8s.io",
            "kind": "ProvisioningRequestConfig",
            "name": kueue_chart.PROVISIONING_CHECK,
        },
    }
    config = stack.kueue("ProvisioningRequestConfig")[f"{kueue_chart.PROVISIONING_CHECK}/"]["spec"]
    assert config["provisioningClassName"] == "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    # A pod set asking only for shares of a shared pool (staging's time-sliced L4s) needs its nodes provisioned too.
    shared = ["nvidia.com/gpu.shared"] if stack_name == "staging-us-west-2" else []
    assert config["managedResources"] == ["nvidia.com/gpu", *shared]
    for team, queue in stack.queues().items():
        (rule,) = queue["spec"]["admissionChecksStrategy"]["admissionChecks"]
        assert rule["name"] == kueue_chart.PROVISIONING_CHECK, team
        assert set(rule["onFlavors"]) == pools and not set(rule["onFlavors"]) & sites, team
    kueue_release = stack.by_name["platform-kueue"]
    queue_records = [r for r in stack.of_type(f"kubernetes:{KUEUE_API}:ClusterQueue")]
    check_urn = next(
        r.urn for r in stack.of_type(f"kubernetes:{KUEUE_API}:AdmissionCheck")
        if r.inputs["metadata"]["name"] == kueue_chart.PROVISIONING_CHECK
    )  # fmt: skip
    assert all(check_urn in r.dependencies for r in queue_records if "cohortName" in r.inputs["spec"])
    # The ProvisioningRequest CRD is served before Kueue starts (it enables its provisioning controller only then)
    # and before the autoscaler that serves it: both wait for it to be Established (CrdWait), after its creation.
    (crd,) = stack.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    assert crd.inputs["metadata"]["name"] == "provisioningrequests.autoscaling.x-k8s.io"
    wait = stack.by_name["platform-provisioning-request-crd-wait"]
    assert wait.inputs["crds"] == [crd.inputs["metadata"]["name"]] and crd.urn in wait.dependencies
    assert wait.urn in kueue_release.dependencies
    assert wait.urn in stack.by_name["platform-cluster-autoscaler"].dependencies
    args = stack.release("cluster-autoscaler")["values"]["extraArgs"]
    assert args["enable-provisioning-requests"] == "true"
    wait = _declared_config(stack)["waitForPodsReady"]
    assert _go_minutes(wait["timeout"]) > _go_minutes(args["max-node-provision-time"])
    assert wait["recoveryTimeout"] == wait["timeout"]
    assert wait["blockAdmission"] is False
    assert wait["requeuingStrategy"]["backoffLimitCount"] == kueue_chart.REQUEUE_LIMIT


def test_no_provisioning_check_where_no_pool_is_autoscaled() -> None:
    """A region whose only GPUs are a site's gets no check: nothing would answer its ProvisioningRequests."""
    site = kueue.Flavor("r", "site-s", "site", "s", 64, "A100", "owned")
    quotas = kueue.RegionQuotas("r", (site,), {"a": {"site-s": 32}})
    assert "admissionChecksStrategy" not in kueue_chart.cluster_queue_spec("a", "team-a", quotas)
    pool = kueue.Flavor("r", "pool-p", "pool", "p", 64, "H100", "on-demand")
    quotas = kueue.RegionQuotas("r", (site, pool), {"a": {"site-s": 32, "pool-p": 32}})
    spec = kueue_chart.cluster_queue_spec("a", "team-a", quotas)
    assert spec["admissionChecksStrategy"] == {
        "admissionChecks": [{"name": kueue_chart.PROVISIONING_CHECK, "onFlavors": ["pool-p"]}]
    }


def test_a_flavor_selects_nvidia_s_product_only_by_nvidia_s_name() -> None:
    """With NVIDIA's name on its nodes, a flavor names it (Kueue admits a job selecting another product elsewhere);
    while an environment keeps the short name there (gpu_product_label: short), it does not, so nothing admitted
    meanwhile asks for the short name when the environment moves on."""
    flavor = kueue.Flavor(region="us-west-2", name="pool-train-h100", source="pool", source_name="train-h100",
                          gpus=64, gpu_model="H100", capacity_class="on-demand")  # fmt: skip
    nvidia = {"dlinfra.io/gpu-model": "H100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    short = {"dlinfra.io/gpu-model": "H100", "nvidia.com/gpu.product": "H100"}
    assert kueue_chart.resource_flavor_spec(flavor, (), nvidia)["nodeLabels"] == {
        "dlinfra.io/pool": "train-h100",
        **nvidia,
    }
    assert kueue_chart.resource_flavor_spec(flavor, (), short)["nodeLabels"] == {
        "dlinfra.io/pool": "train-h100", "dlinfra.io/gpu-model": "H100"
    }  # fmt: skip
