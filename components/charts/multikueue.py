"""MultiKueue (Kueue docs, "MultiKueue" and "Setup a MultiKueue environment", v0.19): the manager's objects,
what a worker grants the manager, and the kubeconfig the manager reaches a worker with."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from components.charts.kueue import framework_resources, gpu_group
from dlinfra.model import kueue

MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"  # AdmissionCheck controllerName of MultiKueue
MULTIKUEUE_NAMESPACE = "kueue-system"  # kubeconfig Secrets live where the Kueue controller runs (addons.yaml)
MULTIKUEUE_SA = "multikueue"  # the manager's identity in each worker cluster
MULTIKUEUE_READ_ROLE = "dlinfra-multikueue-read"
MULTIKUEUE_WRITE_ROLE = "dlinfra-multikueue-write"
MULTIKUEUE_TOKEN_SECRET = "multikueue-token"
KUBECONFIG_KEY = "kubeconfig"  # the key MultiKueue reads a Secret's kubeconfig from


def multikueue_cluster_name(region: str) -> str:
    """The MultiKueueCluster (and its kubeconfig Secret's suffix) of a worker region."""
    return region


def multikueue_secret_name(region: str) -> str:
    return f"multikueue-{region}"


def overflow_check_name(team: str) -> str:
    """A team's AdmissionCheck and MultiKueueConfig: its overflowing jobs go to its worker regions."""
    return f"overflow-{team}"


def overflow_cluster_queue_name(team: str) -> str:
    return f"{team}-{kueue.OVERFLOW_QUEUE}"


def multikueue_cluster_spec(region: str) -> dict[str, Any]:
    """A worker cluster, reached with the kubeconfig in a Secret next to the Kueue controller."""
    return {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": multikueue_secret_name(region)}}}


def multikueue_config_spec(regions: Sequence[str]) -> dict[str, Any]:
    """The worker clusters a team's overflowing jobs are offered to (all at once: the first to admit runs it)."""
    return {"clusters": [multikueue_cluster_name(r) for r in sorted(regions)]}


def overflow_admission_check_spec(team: str) -> dict[str, Any]:
    return {
        "controllerName": MULTIKUEUE_CONTROLLER,
        "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": overflow_check_name(team)},
    }


def overflow_cluster_queue_spec(team: str, namespace: str, gpus: int) -> dict[str, Any]:
    """The manager's queue for a team's overflowing jobs: the team's GPUs in its worker regions, dispatched there.

    The MultiKueue check applies to the whole queue: Kueue deactivates a ClusterQueue whose MultiKueue check is
    limited to some flavors (pkg/cache/scheduler/clusterqueue.go, "Cannot specify MultiKueue AdmissionCheck per
    flavor"), which is why overflow is a queue of its own and not a last flavor of the team's queue. No cohort:
    remote GPUs are not lent to local queues.
    """
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [gpu_group({kueue.OVERFLOW_FLAVOR: (gpus, None)})],
        "admissionChecksStrategy": {"admissionChecks": [{"name": overflow_check_name(team)}]},
    }


def overflow_local_queue_spec(cluster_queue: str) -> dict[str, Any]:
    return {"clusterQueue": cluster_queue}


def multikueue_read_rules(frameworks: Sequence[str]) -> list[dict[str, Any]]:
    """Cluster-wide reads the manager needs in a worker: it watches its remote workloads and jobs (of the kinds
    `frameworks` names) everywhere."""
    jobs = framework_resources(frameworks)
    rules = [
        {"apiGroups": [group], "resources": [resource], "verbs": ["get", "list", "watch"]} for group, resource in jobs
    ]
    rules += [{"apiGroups": [group], "resources": [f"{resource}/status"], "verbs": ["get"]} for group, resource in jobs]
    rules.append({"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch"]})
    rules.append(
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["clusterqueues", "localqueues"],
            "verbs": ["get", "list", "watch"],
        }
    )
    return rules


def multikueue_write_rules(frameworks: Sequence[str]) -> list[dict[str, Any]]:
    """Writes the manager needs, granted only in the namespaces of teams that overflow to the worker: it creates
    and deletes copies of jobs (of the kinds `frameworks` names) and their workloads and keeps the workloads' status
    in sync."""
    rules = [
        {"apiGroups": [group], "resources": [resource], "verbs": ["create", "delete"]}
        for group, resource in framework_resources(frameworks)
    ]
    if "ray.io/raycluster" in frameworks:
        # Kueue's own example role also lets the manager update RayClusters (create-multikueue-kubeconfig.sh).
        rules.append({"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["update", "patch"]})
    rules.append(
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["create", "delete", "update", "patch"]}
    )
    rules.append({"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"], "verbs": ["update", "patch"]})
    return rules


def multikueue_kubeconfig(cluster_name: str, endpoint: str, ca_data: str, token: str) -> str:
    """The kubeconfig a manager uses for a worker: its service account's token, no exec plugin and no file paths,
    which MultiKueue refuses (Kueue docs, "Security Notice")."""
    user = f"{MULTIKUEUE_SA}@{cluster_name}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": user}}],
        "current-context": cluster_name,
    }
    return yaml.safe_dump(config, sort_keys=False)
