"""Kueue: the chart's values and controller configuration, and the objects that hold the teams' GPU quotas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from components.charts import autoscaler, pinned
from components.charts.nodes import (
    COMPUTE_TYPE_LABEL,
    GPU_MODEL_LABEL,
    GPU_PRODUCT_LABEL,
    POOL_LABEL,
    SITE_LABEL,
    Taint,
)
from dlinfra.model import gpu_health, gpu_sharing, kueue
from dlinfra.model.fleet.schema import RESERVED_NAMESPACES
from dlinfra.render.nodeadm import site_pool

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

# Capacity arrives whole. A GPU job in a team queue is admitted (its pods created) only once the cluster-autoscaler
# has taken a ProvisioningRequest for all its nodes (Kueue docs "ProvisioningRequest", v0.19.2: the check is GA
# since v0.14 and always on, no feature gate). On cloud pools the autoscaler then asks EC2 for every node in one
# call, which EC2 may fill only in part (autoscaler.PROVISIONING_CLASS says why); what makes it all-or-nothing is
# waitForPodsReady below: a job whose pods are not all ready in time is evicted whole, its pods deleted with their
# own terminationGracePeriodSeconds, and requeued, and the autoscaler scales the obtained nodes down again.
# Reserved pools and Capacity Blocks launch into capacity EC2 already holds, so their scale-up does not fall short.
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"  # apis/kueue/v1beta2 ProvisioningRequestControllerName
PROVISIONING_CHECK = "gpu-nodes-whole"  # the AdmissionCheck and its ProvisioningRequestConfig (cluster scoped)
# Time from the last node's registration to every pod ready: image pull, EFA and NCCL set-up, the job's own start.
POD_START_SECONDS = 5 * 60
# waitForPodsReady: the timeout counts from admission, which the provisioning check holds back until the autoscaler
# has asked for the nodes (pkg/controller/core/workload_controller.go admittedNotReadyWorkload, v0.19.2); it outlasts
# the autoscaler's own wait for a node (max-node-provision-time) and then the node's GPU burn-in, which keeps pods off
# it until its GPUs pass (dlinfra.model.gpu_health.BURN_IN_SECONDS), so a job is never evicted while its nodes may
# still come, and by no more than the pods' start, so GPUs obtained for a job that cannot be whole are freed soon.
PODS_READY_TIMEOUT_SECONDS = autoscaler.MAX_NODE_PROVISION_SECONDS + gpu_health.BURN_IN_SECONDS + POD_START_SECONDS
# A job evicted this many times in a row for pods not ready is deactivated (.spec.active=false, reason
# RequeuingLimitExceeded: apis/config/v1beta2 RequeuingStrategy.BackoffLimitCount; unset means requeue forever). Each
# failed attempt holds the nodes EC2 did give for up to the timeout plus the scale-down delay (the simulation in
# tests/simulation/test_whole_capacity.py measures it), so a job that keeps failing stops after six attempts, about
# three and a half hours (6 x 30 min plus 1+2+4+8+16 min of backoff), and its owner reactivates it, or sends it to
# `overflow`. Jobs waiting for the autoscaler to take their request are not counted: they are not admitted yet.
REQUEUE_LIMIT = 5
MULTIKUEUE_DISPATCHER = "kueue.x-k8s.io/multikueue-dispatcher-all-at-once"  # apis/config/v1beta2, the default


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
        "waitForPodsReady": wait_for_pods_ready(),
        "integrations": {"frameworks": [*frameworks, *KUEUE_POD_FRAMEWORKS]},
        # On a MultiKueue manager, offer a job to every worker at once (the default dispatcher, stated so a change
        # is reviewed: apis/config/v1beta2 MultiKueue.DispatcherName). The manager keeps the worker whose copy is
        # Admitted, that is quota reserved AND every check Ready, the worker's provisioning check included, and
        # deletes the others (pkg/controller/admissionchecks/multikueue/workload.go reconcileGroup, step 6: the
        # MultiKueueWaitForWorkloadAdmitted gate is GA and locked on since v0.18); when that worker later evicts it
        # (pods not ready), the manager dispatches it again (MultiKueueRedoAdmissionOnEvictionInWorker, GA, locked).
        "multiKueue": {"dispatcherName": MULTIKUEUE_DISPATCHER},
    }


def duration(seconds: int) -> str:
    """A Go duration as Kueue's configuration reads it: whole minutes where it can."""
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def wait_for_pods_ready() -> dict[str, Any]:
    """Kueue's waitForPodsReady (apis/config/v1beta2 WaitForPodsReady, v0.19.2): a job whose pods are not all ready
    in time is evicted whole and requeued (docs "Setup All-or-nothing with ready Pods")."""
    timeout = duration(PODS_READY_TIMEOUT_SECONDS)
    return {
        "timeout": timeout,
        # A failed pod's replacement may need a new node too, so a running job waits as long for it; after that
        # the whole job is evicted rather than held half-running (the default is the timeout: stated on purpose).
        "recoveryTimeout": timeout,
        # false: other jobs keep being admitted while one waits for its pods. Blocking was Kueue's guard against
        # two gangs each holding half the nodes; the provisioning check guards against that now, since the
        # autoscaler books the nodes it scaled up for one request for 10 minutes (its FAQ, best-effort-atomic).
        "blockAdmission": False,
        "requeuingStrategy": {
            # Requeued behind the jobs that were waiting when it was evicted, not ahead of them.
            "timestamp": "Eviction",
            "backoffLimitCount": REQUEUE_LIMIT,
            "backoffBaseSeconds": 60,
            "backoffMaxSeconds": 3600,
        },
    }


def provisioning_admission_check_spec() -> dict[str, Any]:
    """The AdmissionCheck that asks the cluster-autoscaler for a job's nodes before the job is admitted."""
    return {
        "controllerName": PROVISIONING_CONTROLLER,
        "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": PROVISIONING_CHECK},
    }


def provisioning_request_config_spec(shared: Sequence[str] = ()) -> dict[str, Any]:
    """The ProvisioningRequests Kueue creates (apis/kueue/v1beta2 ProvisioningRequestConfigSpec, v0.19.2). `shared`:
    the shared resources this cluster's queues count (kueue.shared_resources), whose pod sets need nodes too."""
    return {
        "provisioningClassName": autoscaler.PROVISIONING_CLASS,
        # Only the pod sets that ask for GPUs are provisioned; a CPU launcher pod set rides on existing nodes (and
        # a workload with no GPU pod set passes the check at once).
        "managedResources": [kueue.GPU_RESOURCE, *sorted(shared)],
        # Pod sets that schedule alike (requests, node selector, tolerations...) become one PodTemplate: a request
        # holds at most 32 pod sets (the ProvisioningRequest CRD's maxItems).
        "podSetMergePolicy": "IdenticalWorkloadSchedulingRequirements",
        # A request the autoscaler marks Failed (best-effort-atomic: not provisioned within 7 days, processors/provreq/
        # processor.go) or whose 10-minute booking expired before admission is retried 3 times with backoff, then
        # the check is Rejected and Kueue deactivates the job (reconcileCheckBasedEviction). The CRD's defaults,
        # stated so a change is reviewed.
        "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 60, "backoffMaxSeconds": 1800},
    }


def provisioned_flavors(quotas: kueue.RegionQuotas) -> list[str]:
    """Flavors whose nodes the autoscaler adds, so their jobs pass the provisioning check; not sites'."""
    return [f.name for f in quotas.flavors if f.autoscaled]


def provisioning_checks_strategy(flavors: Sequence[str]) -> dict[str, Any]:
    """A ClusterQueue's admissionChecksStrategy: the provisioning check on these flavors only (onFlavors:
    apis/kueue/v1beta2 AdmissionCheckStrategyRule; a job admitted on a site's flavor passes without one)."""
    return {"admissionChecks": [{"name": PROVISIONING_CHECK, "onFlavors": sorted(flavors)}]}


def kueue_values(frameworks: Sequence[str]) -> dict[str, Any]:
    """Kueue: two replicas (its admission webhooks fail closed), our manager configuration."""
    config = kueue_manager_config(frameworks)
    return {
        "controllerManager": {"replicas": 2, "podDisruptionBudget": {"enabled": True, "minAvailable": 1}},
        "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(config, sort_keys=False)},
    }


def resource_flavor_spec(
    flavor: kueue.Flavor, taints: Sequence[Taint] = (), gpu_labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A flavor's node labels (so Kueue pins admitted pods to its nodes) and the taints jobs must tolerate.
    `gpu_labels`: the model labels its nodes carry (dlinfra.model.gpu_health.gpu_labels)."""
    labels = {GPU_MODEL_LABEL: flavor.gpu_model}
    # NVIDIA's product label too, so a job that selects a product (as jobs written for NVIDIA's stack do) is admitted
    # only to a flavor of that product: Kueue ignores a selector key no flavor names (its flavor assigner's
    # flavorSelector). Not while it holds the short name (gpu_product_label: short): admitted pods keep the selector
    # for life, and would be stranded when the environment moves to NVIDIA's names.
    product = (gpu_labels or {}).get(GPU_PRODUCT_LABEL)
    if product and product != flavor.gpu_model:
        labels[GPU_PRODUCT_LABEL] = product
    if flavor.source == "pool":
        labels[POOL_LABEL] = flavor.source_name
    else:
        # The site's machines carry a pool label too (dlinfra/render/nodeadm.py POOL_LABEL says why).
        labels |= {
            SITE_LABEL: flavor.source_name,
            COMPUTE_TYPE_LABEL: "hybrid",
            POOL_LABEL: site_pool(flavor.source_name),
        }
    spec: dict[str, Any] = {"nodeLabels": dict(sorted(labels.items()))}
    if taints:
        spec["nodeTaints"] = [{"key": k, "value": v, "effect": e} for k, v, e in taints]
    return spec


def shares_annotation(flavor: kueue.Flavor) -> dict[str, str]:
    """A shared pool's flavor says what one of its GPUs counts as, so its queues' shares read back as GPUs."""
    if not flavor.shares:
        return {}
    return {gpu_sharing.SHARES_ANNOTATION: gpu_sharing.shares_text(flavor.shares)}


def gpu_group(quotas: Mapping[str, tuple[int, int | None]]) -> dict[str, Any]:
    """One resource group over nvidia.com/gpu: flavor -> (nominal, borrowing limit or None)."""
    flavors = []
    for name, (nominal, borrowing) in quotas.items():
        resource: dict[str, str] = {"name": kueue.GPU_RESOURCE, "nominalQuota": str(nominal)}
        if borrowing is not None:
            resource["borrowingLimit"] = str(borrowing)
        flavors.append({"name": name, "resources": [resource]})
    return {"coveredResources": [kueue.GPU_RESOURCE], "flavors": flavors}


def resource_groups(
    flavors: Sequence[kueue.Flavor], quotas: Mapping[str, tuple[int, int | None]]
) -> list[dict[str, Any]]:
    """The resource groups of a queue: whole GPUs (nvidia.com/gpu) first, then each kind of share a shared pool
    offers; each flavor's quota, planned in GPUs (flavor -> nominal, borrowing limit or None), times what one of its
    GPUs counts as (kueue.Flavor.resources). Kueue counts a resource in one group only, whose flavors all cover the
    same resources (API reference, ClusterQueueSpec resourceGroups): validation keeps shared pools to that."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for flavor in flavors:
        nominal, borrowing = quotas[flavor.name]
        resources = []
        for resource, per_gpu in sorted(flavor.resources.items()):
            entry = {"name": resource, "nominalQuota": str(nominal * per_gpu)}
            if borrowing is not None:
                entry["borrowingLimit"] = str(borrowing * per_gpu)
            resources.append(entry)
        groups.setdefault(tuple(sorted(flavor.resources)), []).append({"name": flavor.name, "resources": resources})
    order = sorted(groups, key=lambda covered: (covered != (kueue.GPU_RESOURCE,), covered))
    return [{"coveredResources": list(covered), "flavors": groups[covered]} for covered in order]


def cluster_queue_spec(team: str, namespace: str, quotas: kueue.RegionQuotas) -> dict[str, Any]:
    """A team's ClusterQueue: its nominal GPUs per flavor, borrowing up to each flavor's size, reclaim by preemption,
    and the provisioning check on its cloud pools' flavors. In a region without GPU capacity: zero GPUs of
    NO_GPU_FLAVOR, no cohort (nothing to lend or borrow)."""
    if not quotas.flavors:
        return {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [gpu_group({NO_GPU_FLAVOR: (0, None)})],
        }
    groups = resource_groups(
        quotas.flavors,
        {f.name: (quotas.nominal[team][f.name], quotas.borrowing_limit(team, f.name)) for f in quotas.flavors},
    )
    provisioned = provisioned_flavors(quotas)
    checks = {"admissionChecksStrategy": provisioning_checks_strategy(provisioned)} if provisioned else {}
    return {
        "cohortName": kueue.COHORT,
        # Only the team's own namespace may point a LocalQueue at this queue.
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": groups,
        # Try every flavor before borrowing or preempting in the first one that would fit.
        "flavorFungibility": {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "TryNextFlavor"},
        # Guarantees hold: a team within its quota takes lent GPUs back; borrowers never preempt owners.
        # Preemption, like a waitForPodsReady eviction, evicts the workload and suspends its job (Kueue docs
        # "Preemption"; a suspended batch Job's pods are deleted the ordinary way, SIGTERM then their own
        # terminationGracePeriodSeconds: Kubernetes docs "Jobs", "Suspending a Job"), so a preempted job gets the
        # checkpoint grace of the disruption contract.
        "preemption": {
            "reclaimWithinCohort": "Any",
            "borrowWithinCohort": {"policy": "Never"},
            "withinClusterQueue": "LowerPriority",
        },
        **checks,
    }


def cohort_spec(quotas: kueue.RegionQuotas) -> dict[str, Any]:
    """The cohort's own quota: the GPUs no team is guaranteed, which any team may borrow."""
    return {
        "resourceGroups": resource_groups(
            quotas.flavors, {f.name: (quotas.spare(f.name), None) for f in quotas.flavors}
        )
    }


def local_queue_spec(team: str) -> dict[str, Any]:
    """The team namespace's LocalQueue, feeding the team's ClusterQueue."""
    return {"clusterQueue": team}
