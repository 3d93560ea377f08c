"""MultiKueue: the manager dispatches overflowing jobs; each worker trusts it with the least it needs."""

from __future__ import annotations

import yaml

from components.charts import kueue as kueue_chart
from components.charts import multikueue
from dlinfra.model import job_operators, kueue
from dlinfra.model.fleet.schema import Fleet
from dlinfra.offline import plan_export, schema
from tests.components._platform import Stack, nominal_gpus


def test_multikueue_overflow(stacks: dict[str, Stack], fleet: Fleet) -> None:
    """Prod's manager (us-west-2) dispatches language's overflow to us-east-1 and eu-west-1, vision's to us-east-1;
    robotics stays local. Each worker trusts the manager with the least it needs."""
    quotas = kueue.plan(fleet, "prod", "guaranteed")
    plan = kueue.overflow(fleet, quotas)
    assert plan.manager == "us-west-2" and plan.workers == ("eu-west-1", "us-east-1")
    manager = stacks["prod-us-west-2"]
    clusters = {k.rstrip("/"): v["spec"] for k, v in manager.kueue("MultiKueueCluster").items()}
    assert clusters == {r: multikueue.multikueue_cluster_spec(r) for r in ("eu-west-1", "us-east-1")}
    secrets = {r.inputs["metadata"]["name"]: r for r in manager.of_type("kubernetes:core/v1:Secret")}
    for region in plan.workers:
        kubeconfig = yaml.safe_load(
            plan_export.unwrap(secrets[f"multikueue-{region}"].inputs["stringData"])[0]["kubeconfig"]
        )
        assert schema.is_secret(secrets[f"multikueue-{region}"].inputs["stringData"])  # never in plain text
        # A static token for the worker's EKS endpoint: MultiKueue refuses exec plugins and file paths.
        (user,) = kubeconfig["users"]
        assert set(user["user"]) == {"token"} and user["user"]["token"].startswith("fake-token-")
        (cluster,) = kubeconfig["clusters"]
        assert cluster["cluster"]["server"] == stacks[f"prod-{region}"].outputs["cluster_endpoint"]
    configs = {k.rstrip("/"): v["spec"] for k, v in manager.kueue("MultiKueueConfig").items()}
    assert configs == {
        "overflow-language": {"clusters": ["eu-west-1", "us-east-1"]},
        "overflow-vision": {"clusters": ["us-east-1"]},
    }
    queues = {k.rstrip("/"): v["spec"] for k, v in manager.kueue("ClusterQueue").items()}
    for team, regions in (("language", ("eu-west-1", "us-east-1")), ("vision", ("us-east-1",))):
        overflow = queues[f"{team}-overflow"]
        assert overflow["admissionChecksStrategy"] == {"admissionChecks": [{"name": f"overflow-{team}"}]}
        assert "cohortName" not in overflow  # remote GPUs are not lent to local queues
        # The manager's quota for a team's overflow is what the team holds in those regions.
        assert nominal_gpus({"spec": overflow}) == {
            "multikueue": sum(quotas.region(r).team_total(team) for r in regions)
        }
    assert "robotics-overflow" not in queues
    local = manager.kueue("LocalQueue")
    assert local["overflow/team-language"]["spec"] == {"clusterQueue": "language-overflow"}
    assert "overflow/team-robotics" not in local
    for region, teams in (("us-east-1", {"language", "vision"}), ("eu-west-1", {"language"})):
        worker = stacks[f"prod-{region}"]
        assert not worker.kueue("MultiKueueCluster")
        # A worker's only check is its own provisioning check: the manager keeps the worker whose copy passed it.
        assert set(worker.kueue("AdmissionCheck")) == {f"{kueue_chart.PROVISIONING_CHECK}/"}
        # Jobs arrive with the queue name they were submitted with: `overflow` feeds the team's own queue.
        overflow_queues = {k: v["spec"] for k, v in worker.kueue("LocalQueue").items() if k.startswith("overflow/")}
        assert overflow_queues == {f"overflow/team-{t}": {"clusterQueue": t} for t in teams}
        bindings = {
            r.inputs["metadata"]["namespace"]: r.inputs
            for r in worker.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
            if r.inputs["metadata"]["name"] == multikueue.MULTIKUEUE_WRITE_ROLE
        }
        assert set(bindings) == {f"team-{t}" for t in teams}  # writes only where its teams' jobs land
        roles = {
            r.inputs["metadata"]["name"]: r.inputs["rules"]
            for r in worker.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
        }
        writes = {v for rule in roles[multikueue.MULTIKUEUE_WRITE_ROLE] for v in rule["verbs"]}
        reads = {v for rule in roles[multikueue.MULTIKUEUE_READ_ROLE] for v in rule["verbs"]}
        assert reads == {"get", "list", "watch"} and "*" not in writes
        # The job kinds Kueue manages there and nothing else: batch Jobs, no job operator being named in prod.
        frameworks = job_operators.frameworks(fleet.environments["prod"].kubernetes.job_operators)
        assert frameworks == ("batch/job",)
        assert {g for rule in roles[multikueue.MULTIKUEUE_WRITE_ROLE] for g in rule["apiGroups"]} == {
            "batch",
            "kueue.x-k8s.io",
        }
        assert not any(
            "secrets" in rule["resources"] or "pods" in rule["resources"]
            for rule in roles[multikueue.MULTIKUEUE_WRITE_ROLE] + roles[multikueue.MULTIKUEUE_READ_ROLE]
        )
    staging = stacks["staging-us-west-2"]
    assert not staging.kueue("MultiKueueCluster")
    assert all(
        c["spec"]["controllerName"] != multikueue.MULTIKUEUE_CONTROLLER
        for c in staging.kueue("AdmissionCheck").values()
    )


def test_the_manager_is_granted_each_operators_kinds_only_when_named() -> None:
    groups = {g for rule in multikueue.multikueue_write_rules(("batch/job",)) for g in rule["apiGroups"]}
    assert groups == {"batch", "kueue.x-k8s.io"}  # no RayCluster updates without KubeRay
    with_ray = multikueue.multikueue_write_rules(job_operators.frameworks({"kuberay": "ray-system"}))
    assert {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["update", "patch"]} in with_ray
    reads = multikueue.multikueue_read_rules(job_operators.frameworks({"jobset": "jobset-system"}))
    assert {(g, r) for rule in reads for g in rule["apiGroups"] for r in rule["resources"]} >= {
        ("jobset.x-k8s.io", "jobsets"),
        ("jobset.x-k8s.io", "jobsets/status"),
    }
