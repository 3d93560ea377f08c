"""Kueue: the chart's values and controller configuration, and the objects that hold the teams' GPU quotas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from components.charts.nodes import COMPUTE_TYPE_LABEL, GPU_PRODUCT_LABEL, POOL_LABEL, SITE_LABEL, Taint
from dlinfra.model import kueue

TEAM_LABEL = "dlinfra.io/team"  # on team namespaces: Kueue manages every job in them (kueue_manager_config)
LOCAL_QUEUE = "default"  # Kueue sends jobs without a queue-name label to the LocalQueue named "default"
KUEUE_API = "kueue.x-k8s.io/v1beta2"  # the storage version of the pinned Kueue; v1beta1 is deprecated there

# The job kinds Kueue manages (its integrations), as "<API group>/<kind in lower case>"; MultiKueue workers grant
# the manager these and nothing else.
KUEUE_FRAMEWORKS = (
    "batch/job",
    "jobset.x-k8s.io/jobset",
    "kubeflow.org/pytorchjob",
    "kubeflow.org/mpijob",
    "trainer.kubeflow.org/trainjob",
    "ray.io/rayjob",
    "ray.io/raycluster",
)


def kueue_manager_config() -> dict[str, Any]:
    """Kueue's controller configuration (config.kueue.x-k8s.io/v1beta2), replacing the chart's default."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443", "enableClusterQueueResources": True},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "clientConnection": {"qps": 300, "burst": 500},
        # Every job in a team namespace is queued (the LocalQueue "default" catches unlabelled ones), so a
        # team cannot bypass its quota by omitting the queue name; other namespaces are left alone.
        "manageJobsWithoutQueueName": True,
        "managedJobsNamespaceSelector": {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]},
        # Quotas cover GPUs only; CPU, memory and EFA requests are not Kueue's business here.
        "resources": {"quotaCheckStrategy": "IgnoreUndeclared"},
        # A gang whose pods cannot all start (capacity shortage) gives its quota back and requeues; the timeout
        # leaves room for scaling GPU pools up from zero.
        "waitForPodsReady": {
            "timeout": "30m",
            "blockAdmission": False,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 60, "backoffMaxSeconds": 3600},
        },
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
    }


def kueue_values() -> dict[str, Any]:
    """Kueue: two replicas (its admission webhooks fail closed), our manager configuration."""
    return {
        "controllerManager": {"replicas": 2, "podDisruptionBudget": {"enabled": True, "minAvailable": 1}},
        "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(kueue_manager_config(), sort_keys=False)},
    }


def resource_flavor_spec(flavor: kueue.Flavor, taints: Sequence[Taint] = ()) -> dict[str, Any]:
    """A flavor's node labels (so Kueue pins admitted pods to its nodes) and the taints jobs must tolerate."""
    labels = {GPU_PRODUCT_LABEL: flavor.gpu_model}
    if flavor.source == "pool":
        labels[POOL_LABEL] = flavor.source_name
    else:
        labels |= {SITE_LABEL: flavor.source_name, COMPUTE_TYPE_LABEL: "hybrid"}
    spec: dict[str, Any] = {"nodeLabels": dict(sorted(labels.items()))}
    if taints:
        spec["nodeTaints"] = [{"key": k, "value": v, "effect": e} for k, v, e in taints]
    return spec


def gpu_group(quotas: Mapping[str, tuple[int, int | None]]) -> dict[str, Any]:
    """One resource group over nvidia.com/gpu: flavor -> (nominal, borrowing limit or None)."""
    flavors = []
    for name, (nominal, borrowing) in quotas.items():
        resource: dict[str, str] = {"name": kueue.GPU_RESOURCE, "nominalQuota": str(nominal)}
        if borrowing is not None:
            resource["borrowingLimit"] = str(borrowing)
        flavors.append({"name": name, "resources": [resource]})
    return {"coveredResources": [kueue.GPU_RESOURCE], "flavors": flavors}


def cluster_queue_spec(team: str, namespace: str, quotas: kueue.RegionQuotas) -> dict[str, Any]:
    """A team's ClusterQueue: its nominal GPUs per flavor, borrowing up to each flavor's size, reclaim by preemption."""
    group = gpu_group(
        {f.name: (quotas.nominal[team][f.name], f.gpus - quotas.nominal[team][f.name]) for f in quotas.flavors}
    )
    return {
        "cohortName": kueue.COHORT,
        # Only the team's own namespace may point a LocalQueue at this queue.
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [group],
        # Try every flavor before borrowing or preempting in the first one that would fit.
        "flavorFungibility": {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "TryNextFlavor"},
        # Guarantees hold: a team within its quota takes lent GPUs back; borrowers never preempt owners.
        "preemption": {
            "reclaimWithinCohort": "Any",
            "borrowWithinCohort": {"policy": "Never"},
            "withinClusterQueue": "LowerPriority",
        },
    }


def cohort_spec(quotas: kueue.RegionQuotas) -> dict[str, Any]:
    """The cohort's own quota: the GPUs no team is guaranteed, which any team may borrow."""
    return {"resourceGroups": [gpu_group({f.name: (quotas.spare(f.name), None) for f in quotas.flavors})]}


def local_queue_spec(team: str) -> dict[str, Any]:
    """The team namespace's LocalQueue, feeding the team's ClusterQueue."""
    return {"clusterQueue": team}
