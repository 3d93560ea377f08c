"""Kueue: the chart's values and controller configuration, and the objects that hold the teams' GPU quotas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from components.charts import pinned
from components.charts.nodes import COMPUTE_TYPE_LABEL, GPU_PRODUCT_LABEL, POOL_LABEL, SITE_LABEL, Taint
from dlinfra.model import kueue
from dlinfra.model.fleet.schema import RESERVED_NAMESPACES

TEAM_LABEL = "dlinfra.io/team"  # on team namespaces: Kueue manages every job in them (kueue_manager_config)
LOCAL_QUEUE = "default"  # Kueue sends jobs without a queue-name label to the LocalQueue named "default"
# The flavor of a region without GPU capacity: no nodes, zero GPUs. Its teams' queues must exist all the same: with
# manageJobsWithoutQueueName and the pod integration, Kueue gates every pod of a team namespace, and one whose
# workload finds no LocalQueue is never admitted (Kueue v0.19.2 pkg/controller/jobs/pod/pod_webhook.go). A
# ClusterQueue needs a resource group to cover nvidia.com/gpu at all (each group has one flavor at least: the CRD's
# minItems), and with quotaCheckStrategy IgnoreUndeclared (the QuotaCheckStrategy feature, Beta and on by default
# since Kueue v0.19.0: its release notes) the CPU-only pods it admits need nothing else.
NO_GPU_FLAVOR = "no-gpus"
KUEUE_API = "kueue.x-k8s.io/v1beta2"  # the storage version of the pinned Kueue; v1beta1 is deprecated there

# The job kinds Kueue manages (its integrations) are batch Jobs plus those of the job operators the fleet names
# (dlinfra.model.job_operators.frameworks: environments.<env>.kubernetes.job_operators), as "<API group>/<kind in
# lower case>"; MultiKueue workers grant the manager these and nothing else.
# Kueue's pod-based integrations (Kueue v0.19.2 apis/config/v1beta2 Integrations.Frameworks; docs "Run Plain Pods",
# "Run A Deployment", "Run A StatefulSet"). The frameworks list replaces Kueue's defaults, so without these a bare
# Pod, Deployment or StatefulSet in a team namespace is never queued and no quota holds it. With them Kueue's pod
# webhook gates every pod there (scheduling gate kueue.x-k8s.io/admission) until its workload is admitted; pods of a
# job kind above are left to that job's integration ("Pods that belong to other API resources managed by Kueue are
# excluded"). The chart sets the pod webhook's failurePolicy to Fail only when "pod" is listed here
# (charts/kueue/templates/webhook/manifests.yaml), so it is listed, not left implied by "deployment".
# They stay in the cluster they are submitted to: MultiKueue workers grant the manager the job kinds only.
KUEUE_POD_FRAMEWORKS = ("pod", "deployment", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset")
ADMISSION_GATE = "kueue.x-k8s.io/admission"  # the scheduling gate Kueue's pod webhook adds (pod/constants)


def framework_resources(frameworks: Sequence[str]) -> list[tuple[str, str]]:
    """(API group, resource) of job kinds as Kueue names them: "batch/job" -> ("batch", "jobs"); each of ours
    forms its plural with an "s" (pytorchjobs, rayclusters, trainjobs: the operators' CRDs)."""
    out = []
    for framework in frameworks:
        group, kind = framework.rsplit("/", 1)
        out.append((group, f"{kind}s"))
    return out


def system_namespaces() -> tuple[str, ...]:
    """Namespaces Kueue must never manage, whatever their labels: the cluster's own and every add-on's."""
    return tuple(sorted(RESERVED_NAMESPACES | {spec.namespace for spec in pinned.load_addons().values()}))


def team_namespace_selector() -> dict[str, Any]:
    """The team namespaces, and never a system one even if it were labelled by mistake: with the pod integration
    on, Kueue's pod webhook (failurePolicy Fail) would otherwise hold the system's own pods. Kueue refuses a
    managedJobsNamespaceSelector that matches kube-system or its own namespace (v0.19.2 pkg/config/validation.go)."""
    return {
        "matchExpressions": [
            {"key": TEAM_LABEL, "operator": "Exists"},
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(system_namespaces())},
        ]
    }


def kueue_manager_config(frameworks: Sequence[str]) -> dict[str, Any]:
    """Kueue's controller configuration (config.kueue.x-k8s.io/v1beta2), replacing the chart's default; `frameworks`:
    the job kinds it manages (dlinfra.model.job_operators.frameworks), before the pod-based ones."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443", "enableClusterQueueResources": True},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "clientConnection": {"qps": 300, "burst": 500},
        # Every job and pod in a team namespace is queued (the LocalQueue "default" catches unlabelled ones:
        # Kueue docs "Setup default LocalQueue", stable since v0.17), so a team cannot bypass its quota by omitting
        # the queue name; other namespaces are left alone. The chart copies this selector into its webhooks'
        # namespaceSelector, and for the pod-based integrations it is a strong exemption: nothing outside it is
        # ever managed (apis/config/v1beta2 ManagedJobsNamespaceSelector).
        "manageJobsWithoutQueueName": True,
        "managedJobsNamespaceSelector": team_namespace_selector(),
        # Quotas cover GPUs only; CPU, memory and EFA requests are not Kueue's business here.
        "resources": {"quotaCheckStrategy": "IgnoreUndeclared"},
        # A gang whose pods cannot all start (capacity shortage) gives its quota back and requeues; the timeout
        # leaves room for scaling GPU pools up from zero.
        "waitForPodsReady": {
            "timeout": "30m",
            "blockAdmission": False,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 60, "backoffMaxSeconds": 3600},
        },
        "integrations": {"frameworks": [*frameworks, *KUEUE_POD_FRAMEWORKS]},
    }


def kueue_values(frameworks: Sequence[str]) -> dict[str, Any]:
    """Kueue: two replicas (its admission webhooks fail closed), our manager configuration."""
    config = kueue_manager_config(frameworks)
    return {
        "controllerManager": {"replicas": 2, "podDisruptionBudget": {"enabled": True, "minAvailable": 1}},
        "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(config, sort_keys=False)},
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
    """A team's ClusterQueue: its nominal GPUs per flavor, borrowing up to each flavor's size, reclaim by preemption.
    In a region without GPU capacity: zero GPUs of NO_GPU_FLAVOR, no cohort (nothing to lend or borrow)."""
    if not quotas.flavors:
        return {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [gpu_group({NO_GPU_FLAVOR: (0, None)})],
        }
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
