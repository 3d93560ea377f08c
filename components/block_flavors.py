"""The Capacity Blocks' Kueue flavors admit work only inside their windows, declared as children of the Platform
(not a component of its own).

Kueue has no time-boxed quota. What stands in for it is a keeper in the cluster (components/scripts/
capacity_block_flavor.py), run every minute by a CronJob, that owns each block flavor's spec.nodeTaints: the pool's
own taints inside the window, and a taint no job tolerates outside it, which makes Kueue's flavor assigner pass the
flavor over for the next one. The window is the block's start up to a little before its drain time, when the block's
group closes (components/capacity_block.py; CLOSE_LEAD says why earlier), so a job requeued from the block's drain is
offered another flavor, or another region, and never the ended block.

Who owns spec.nodeTaints (Kubernetes "Server-Side Apply", field management; pulumi-kubernetes
provider/pkg/await/await.go, handleSSAIgnoreFields and patchForce):
- The program creates a block's flavor closed (the pool's taints and CLOSED_TAINT), so it admits nothing until the
  keeper has run, and tells Pulumi to ignore later changes to the field (KEEPER_FIELDS). The keeper's forced apply
  takes the field over, and from then on Pulumi leaves out of its applies a field another manager holds.
- Every pool's flavor carries Pulumi's patchForce annotation (FLAVOR_ANNOTATIONS): once a block leaves the fleet its
  pool's flavor is declared with the pool's taints again, and that apply must take the field back from the keeper
  rather than fail on the conflict.
The keeper may patch these flavors and nothing else, and cannot create one.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from components import pod_scripts
from components.capacity_block import drain_at
from components.charts.kueue import PODS_READY_TIMEOUT_SECONDS
from components.charts.nodes import CLOUD_NODE_AFFINITY, Taint
from components.scripts import capacity_block_flavor as keeper
from components.scripts import kube_api

Options = Callable[..., pulumi.ResourceOptions]
Meta = Callable[..., k8s.meta.v1.ObjectMetaArgs]

NAME = "capacity-block-flavors"  # the keeper's ServiceAccount, ClusterRole, binding, ConfigMap and CronJob
FILES = pod_scripts.script_files(kube_api, keeper)  # the keeper's code, shipped in its ConfigMap
CONFIG = "config.json"  # beside it: the flavors and their windows (keeper_config)
SCHEDULE = "* * * * *"  # every minute: the flavor follows the clock within a minute, as the group's keeper does
# A run that has not finished in this long is stopped, so the next minute's starts (concurrencyPolicy Forbid would
# otherwise skip it); its one PATCH per flavor times out after keeper.TIMEOUT_SECONDS.
ACTIVE_DEADLINE_SECONDS = 50
KEEPER_FIELDS = ("spec.nodeTaints",)  # what Pulumi leaves to the keeper once it has run (ignoreChanges)
FLAVOR_ANNOTATIONS = {"pulumi.com/patchForce": "true"}  # a pool's flavor takes its taints back from a removed keeper
TOKEN_SECONDS = 600  # the shortest a projected service account token may live (TokenRequest); a run takes seconds
# The flavor closes this long before the block's group does (its drain time), so a job Kueue gives the block in the
# flavor's last minute still gets its nodes and starts while the group is open: the autoscaler marks its
# ProvisioningRequest provisioned once it has asked for the scale-up, not when the nodes arrive (best-effort-atomic
# provisioning_class.go), and nodes and pods may take up to Kueue's waitForPodsReady timeout (the autoscaler's
# max-node-provision-time plus the pods' start); then half an hour of training at least, so the checkpoint written at
# the drain is worth the start. A job still waiting when the group closes would only be evicted by that timeout.
MIN_RUN = datetime.timedelta(minutes=30)
CLOSE_LEAD = datetime.timedelta(seconds=PODS_READY_TIMEOUT_SECONDS) + MIN_RUN


def flavor_window(
    start: datetime.datetime, end: datetime.datetime, checkpoint_grace: int
) -> tuple[datetime.datetime, datetime.datetime]:
    """When a block's flavor admits work: from the block's start to CLOSE_LEAD before its group's drain time."""
    return start, drain_at(end, checkpoint_grace) - CLOSE_LEAD


@dataclass(frozen=True, kw_only=True)
class BlockFlavor:
    """A Capacity Block pool's flavor and its window."""

    flavor: str  # the ResourceFlavor's name (the pool's flavor: dlinfra.model.kueue)
    opens_at: datetime.datetime  # the block's start (aware, UTC)
    closes_at: datetime.datetime  # CLOSE_LEAD before the block's drain time (flavor_window)
    taints: Sequence[Taint] = ()  # the pool's own node taints, which the flavor always carries

    def created_taints(self) -> list[Taint]:
        """What the program creates the flavor with: closed, until the keeper has run."""
        closed = keeper.CLOSED_TAINT
        return [*self.taints, (closed["key"], closed["value"], closed["effect"])]

    def __post_init__(self) -> None:
        for field in ("opens_at", "closes_at"):
            if getattr(self, field).utcoffset() is None:
                raise ValueError(f"{self.flavor}: {field}: give an aware UTC datetime")
        if self.closes_at <= self.opens_at:
            raise ValueError(f"{self.flavor}: closes_at: the window closes before it opens")


def keeper_config(blocks: Sequence[BlockFlavor]) -> dict[str, Any]:
    """What the keeper reads (capacity_block_flavor.load), sorted by flavor so a reordered fleet changes nothing."""
    return {
        "flavors": [
            {
                "flavor": b.flavor,
                "opens_at": b.opens_at.astimezone(datetime.UTC).strftime(keeper.TIME_FORMAT),
                "closes_at": b.closes_at.astimezone(datetime.UTC).strftime(keeper.TIME_FORMAT),
                "taints": [{"key": k, "value": v, "effect": e} for k, v, e in b.taints],
            }
            for b in sorted(blocks, key=lambda b: b.flavor)
        ]
    }


def cluster_role_rules(blocks: Sequence[BlockFlavor]) -> list[dict[str, Any]]:
    """Patch these flavors only: no create (an apply to a missing flavor fails), no other object."""
    return [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["resourceflavors"],
            "resourceNames": sorted(b.flavor for b in blocks),
            "verbs": ["get", "patch"],
        }
    ]


def cron_job_spec() -> dict[str, Any]:
    """Every minute, one short Job: the keeper's script and configuration from its ConfigMap, as nobody."""
    container = pod_scripts.python_container("keeper", keeper, f"{pod_scripts.SCRIPTS_MOUNT}/{CONFIG}", mounts=[])
    pod = {
        "serviceAccountName": NAME,
        "restartPolicy": "Never",
        # It needs the API server only; cloud nodes reach it whatever a site's VPN does.
        "affinity": CLOUD_NODE_AFFINITY,
        "securityContext": pod_scripts.pod_security(),
        "containers": [container],
        "automountServiceAccountToken": False,
        "volumes": pod_scripts.pod_volumes(NAME, FILES, TOKEN_SECONDS, CONFIG),
    }
    return {
        "schedule": SCHEDULE,
        "timeZone": "Etc/UTC",
        "concurrencyPolicy": "Forbid",
        # A run that could not start within the minute is skipped, not queued; the next one does the same work.
        "startingDeadlineSeconds": 60,
        "successfulJobsHistoryLimit": 1,
        "failedJobsHistoryLimit": 3,
        "jobTemplate": {
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": ACTIVE_DEADLINE_SECONDS,
                "ttlSecondsAfterFinished": 3600,
                "template": {"metadata": {"labels": {"app.kubernetes.io/name": NAME}}, "spec": pod},
            }
        },
    }


def declare(
    name: str,
    blocks: Sequence[BlockFlavor],
    *,
    namespace: str,
    depends_on: Sequence[pulumi.Resource],
    opts: Options,
    meta: Meta,
) -> None:
    """The keeper's service account, its right to patch the block flavors, its configuration and its CronJob, in
    `namespace` (Kueue's); `depends_on`: the release that makes the namespace and the flavors it keeps."""
    if not blocks:
        return
    rbac = k8s.rbac.v1
    account = k8s.core.v1.ServiceAccount(
        f"{name}-{NAME}", metadata=meta(NAME, namespace), opts=opts(depends_on=depends_on)
    )
    role = rbac.ClusterRole(
        f"{name}-{NAME}-role",
        metadata=meta(NAME),
        rules=cast("list[k8s.rbac.v1.PolicyRuleArgsDict]", cluster_role_rules(blocks)),
        opts=opts(),
    )
    binding = rbac.ClusterRoleBinding(
        f"{name}-{NAME}-binding",
        metadata=meta(NAME),
        role_ref=rbac.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=NAME),
        subjects=[rbac.SubjectArgs(kind="ServiceAccount", name=NAME, namespace=namespace)],
        opts=opts(depends_on=[role, account]),
    )
    config = k8s.core.v1.ConfigMap(
        f"{name}-{NAME}-config",
        metadata=meta(NAME, namespace),
        data=FILES | {CONFIG: json.dumps(keeper_config(blocks), indent=2) + "\n"},
        opts=opts(depends_on=depends_on),
    )
    k8s.batch.v1.CronJob(
        f"{name}-{NAME}",
        metadata=meta(NAME, namespace),
        spec=cast("k8s.batch.v1.CronJobSpecArgsDict", cron_job_spec()),
        opts=opts(depends_on=[binding, config]),
    )
