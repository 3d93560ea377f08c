"""Capacity arrives whole: a 16-node job (8 GPUs a node) when EC2 can give only 10 nodes, simulated in minutes.

The simulation reads the rendered configuration: the team's ClusterQueue (is its pool flavor behind the
provisioning check?), the AdmissionCheck's controller, Kueue's waitForPodsReady, the autoscaler's flags
(enable-provisioning-requests, max-node-provision-time, scale-down timings) and, for overflow, the manager's
MultiKueueConfig. The local scenario takes them from the offline plan of the reference fleet (prod-us-east-1-k8s);
the overflow scenario from the same pure functions the plan calls, on the reference fleet with eu-west-1's train-a100
pool grown to 16 nodes, so that the language team's second worker could hold the job at all (a job that asks for
nvidia.com/gpu without naming a model runs on either flavor).

Where it stands in for a controller it copies its documented behaviour:
- Kueue v0.19.2: quota reserved, then the ProvisioningRequest check; admitted when every check is Ready (docs
  "ProvisioningRequest"); waitForPodsReady evicts an admitted workload whose pods are not all ready `timeout` after
  admission and requeues it after backoffBaseSeconds * 2^(n-1), deactivating it past backoffLimitCount
  (pkg/controller/core/workload_controller.go admittedNotReadyWorkload; apis/config/v1beta2 RequeuingStrategy).
  Eviction suspends the job and its pods are deleted with their own grace.
- MultiKueue (v0.19.2 pkg/controller/admissionchecks/multikueue/workload.go reconcileGroup): the all-at-once
  dispatcher offers the job to every worker; the manager keeps the first whose copy is Admitted and deletes the
  others; when that worker evicts it the manager dispatches again.
- cluster-autoscaler (FAQ "ProvisioningRequest", provisioningrequest/besteffortatomic/provisioning_class.go):
  best-effort-atomic marks a request Provisioned once one node group can take all its pods and the scale-up call
  succeeded, else CapacityIsNotFound and it retries (provisioning-request-initial-backoff-time 1m, doubling to 10m).
  A node group whose launches fail is backed off (initial-node-group-backoff-duration 5m, doubling up to
  max-node-group-backoff-duration 30m: config/flags/flags.go) and skipped by scale-ups meanwhile. On AWS the scale-up
  is IncreaseSize (AtomicIncreaseSize is not implemented), so EC2 may give part. An empty node is removed after
  scale-down-unneeded-time, and not within scale-down-delay-after-add of the last scale-up.
What the simulation assumes of EC2 and the job (not configuration): a node is Ready NODE_BOOT minutes after the
scale-up call and its GPUs pass their burn-in BURN_IN minutes later (DCGM's level 2 diagnostic takes about two
minutes, the throughput tests seconds: docs/gpu-health.md), a failed launch shows ICE_SEEN minutes after the call,
pods run POD_START minutes after their node has passed,
and a pod that never started training exits at once on SIGTERM (POD_EXIT). Ties between workers go to the region
that cannot deliver: the worst case.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.charts import autoscaler, multikueue
from components.charts import kueue as kueue_chart
from dlinfra.model import kueue
from dlinfra.model.fleet.load import parse_yaml, validate_data
from tests import reference
from tests.conftest import REFERENCE_FLEET

JOB_NODES, GPUS_PER_NODE = 16, 8
NODE_BOOT, BURN_IN, ICE_SEEN, POD_START, POD_EXIT = 10.0, 4.0, 2.0, 3.0, 1.0  # minutes (assumptions: docstring)
USABLE = NODE_BOOT + BURN_IN  # from the scale-up call to a node that takes work
HORIZON = 24 * 60.0  # a day of simulated time
CA_GROUP_BACKOFF, CA_GROUP_BACKOFF_MAX = 5.0, 30.0  # cluster-autoscaler flag defaults, minutes
PROVREQ_RETRY, PROVREQ_RETRY_MAX = 1.0, 10.0  # provisioning-request-{initial,max}-backoff-time defaults
SCAN = 10 / 60  # the autoscaler's scan interval (10 s): the short region answers this much earlier in a tie
FLAVORS = {"us-east-1": kueue.pool_flavor("train-h100"), "eu-west-1": kueue.pool_flavor("train-a100")}


def minutes(duration: str) -> float:
    """A Go duration as our configuration writes it ("30m", "90s", "1h") in minutes."""
    return float(duration[:-1]) * {"s": 1 / 60, "m": 1.0, "h": 60.0}[duration[-1]]


@dataclass(frozen=True)
class Rendered:
    """What one worker region's rendered configuration says, as far as the scenario depends on it."""

    region: str
    checked: bool  # the flavor carries an AdmissionCheck of Kueue's provisioning controller
    provreq: bool  # the autoscaler serves ProvisioningRequests
    group_nodes: int  # the flavor's node group maximum (nominal + borrowing limit, in nodes)
    timeout: float | None  # waitForPodsReady.timeout, minutes; None: no eviction
    requeue_base: float
    requeue_max: float
    requeue_limit: int | None
    unneeded: float  # scale-down-unneeded-time
    delay_after_add: float  # scale-down-delay-after-add

    @classmethod
    def of(
        cls, region: str, queue: Mapping[str, Any], checks: Mapping[str, Mapping[str, Any]],
        kueue_config: Mapping[str, Any], ca_args: Mapping[str, str],
    ) -> Rendered:  # fmt: skip
        """From a ClusterQueue spec, the AdmissionChecks by name, Kueue's configuration and the autoscaler's flags."""
        flavor = FLAVORS[region]
        rules = queue.get("admissionChecksStrategy", {}).get("admissionChecks", [])
        checked = any(
            checks.get(r["name"], {}).get("controllerName") == kueue_chart.PROVISIONING_CONTROLLER
            and (not r.get("onFlavors") or flavor in r["onFlavors"])
            for r in rules
        )
        (resource,) = next(f for f in queue["resourceGroups"][0]["flavors"] if f["name"] == flavor)["resources"]
        gpus = int(resource["nominalQuota"]) + int(resource.get("borrowingLimit", 0))
        wait = kueue_config.get("waitForPodsReady")
        requeue = (wait or {}).get("requeuingStrategy", {})
        return cls(
            region=region,
            checked=checked,
            provreq=ca_args.get("enable-provisioning-requests") == "true",
            group_nodes=gpus // GPUS_PER_NODE,
            timeout=minutes(wait["timeout"]) if wait else None,
            requeue_base=requeue.get("backoffBaseSeconds", 60) / 60,
            requeue_max=requeue.get("backoffMaxSeconds", 3600) / 60,
            requeue_limit=requeue.get("backoffLimitCount"),
            unneeded=minutes(ca_args.get("scale-down-unneeded-time", "10m")),
            delay_after_add=minutes(ca_args.get("scale-down-delay-after-add", "10m")),
        )


@dataclass
class Region:
    """One worker cluster's moving parts: its configuration, what EC2 can give, the node group's state."""

    config: Rendered
    ec2_nodes: int  # nodes of the pool EC2 can launch in this region
    backoff_until: float = 0.0  # the autoscaler skips the group until then
    failures: int = 0  # consecutive failed launches (the group's backoff doubles)
    idle: float = 0.0  # GPU-minutes of nodes obtained but not training
    partial: float = 0.0  # the longest time some of the job's pods ran while others waited, minutes
    evictions: int = 0

    def accepts(self, t: float) -> float | None:
        """When Kueue admits the job here if its quota is reserved at `t`; None when not within the horizon."""
        c = self.config
        if not c.checked:
            return t  # admitted on quota alone
        if not c.provreq or c.group_nodes < JOB_NODES:
            return None  # nothing answers the request, or no group can take it: Pending for good
        retry = PROVREQ_RETRY
        while t < self.backoff_until:
            t += retry
            retry = min(2 * retry, PROVREQ_RETRY_MAX)
        return t if t < HORIZON else None

    def attempt(self, admitted: float) -> float | None:
        """Run the job from its admission; the time it is evicted and requeued, or None when it ran whole."""
        c = self.config
        got = min(JOB_NODES, self.ec2_nodes)
        ready = admitted + USABLE
        if got == JOB_NODES and (c.timeout is None or c.timeout >= USABLE + POD_START):
            self.failures = 0
            return None
        # EC2 falls short: the group is backed off, and retried for the pending pods each time the backoff ends.
        t_fail, last_scale_up = admitted + ICE_SEEN, admitted
        end = HORIZON if c.timeout is None else admitted + c.timeout
        while t_fail < end:
            self.failures += 1
            backoff = min(CA_GROUP_BACKOFF * 2 ** (self.failures - 1), CA_GROUP_BACKOFF_MAX)
            self.backoff_until = t_fail + backoff
            last_scale_up = self.backoff_until
            t_fail = self.backoff_until + ICE_SEEN
        last_scale_up = min(last_scale_up, end)
        self.partial = max(self.partial, end - (ready + POD_START))
        if c.timeout is None:
            self.idle += got * GPUS_PER_NODE * (HORIZON - ready)
            return None  # the job holds its nodes, some pods waiting, until someone notices
        self.evictions += 1
        removed = max(end + POD_EXIT + c.unneeded, last_scale_up + c.delay_after_add)
        self.idle += got * GPUS_PER_NODE * (removed - ready)
        return end


@dataclass
class Outcome:
    ran_whole_in: str | None = None  # the region where the job finally ran on all its nodes
    started: float | None = None
    deactivated: bool = False
    regions: dict[str, Region] = field(default_factory=dict)

    @property
    def idle_gpu_hours(self) -> float:
        return sum(r.idle for r in self.regions.values()) / 60

    @property
    def partial(self) -> float:
        return max(r.partial for r in self.regions.values())

    @property
    def evictions(self) -> int:
        return sum(r.evictions for r in self.regions.values())


def run(regions: Sequence[Region]) -> Outcome:
    """Submit the job at t=0 to the given workers (one: a local queue) and follow it for HORIZON minutes."""
    out = Outcome(regions={r.config.region: r for r in regions})
    t, requeues = 0.0, 0
    while t < HORIZON:
        offers = [(when, r.ec2_nodes, r) for r in regions if (when := r.accepts(t)) is not None]
        if not offers:
            return out  # Pending everywhere: never admitted
        # The first Admitted copy wins; the short region's autoscaler answers first in a tie.
        when, _, chosen = min(offers, key=lambda o: (o[0] - (SCAN if o[1] < JOB_NODES else 0), o[1]))
        evicted = chosen.attempt(when)
        if evicted is None:
            if chosen.config.timeout is not None or chosen.ec2_nodes >= JOB_NODES:
                out.ran_whole_in, out.started = chosen.config.region, when
            return out
        requeues += 1
        limit = chosen.config.requeue_limit
        if len(regions) == 1 and limit is not None and requeues > limit:
            out.deactivated = True  # RequeuingLimitExceeded: .spec.active=false
            return out
        if len(regions) == 1:  # requeued in the same ClusterQueue after its backoff
            t = evicted + min(chosen.config.requeue_base * 2 ** (requeues - 1), chosen.config.requeue_max)
        else:  # the manager dispatches again as soon as the worker evicts it
            t = evicted
    return out


# The rendered configuration --------------------------------------------------------------------------------


def _from_plan(stack: str, team: str) -> Rendered:
    """One region's configuration from the offline plan of the reference fleet."""
    records = reference.runs()[stack].resources
    kinds: dict[str, dict[str, dict[str, Any]]] = {}
    for r in records:
        if r.type.startswith(f"kubernetes:{kueue_chart.KUEUE_API}:"):
            kinds.setdefault(r.type.rsplit(":", 1)[1], {})[r.inputs["metadata"]["name"]] = r.inputs["spec"]
    releases = {r.inputs["name"]: r.inputs["values"] for r in records if r.type == "kubernetes:helm.sh/v3:Release"}
    config = yaml.safe_load(releases["kueue"]["managerConfig"]["controllerManagerConfigYaml"])
    return Rendered.of(
        stack.removeprefix("prod-").removesuffix("-k8s"),
        kinds["ClusterQueue"][team],
        kinds["AdmissionCheck"],
        config,
        releases["cluster-autoscaler"]["extraArgs"],
    )


def _sixteen_a100_nodes() -> tuple[kueue.QuotaPlan, kueue.OverflowPlan, str]:
    """The reference fleet with 16 train-a100 nodes in eu-west-1: its quota and overflow plans, its k8s version."""
    data = copy.deepcopy(parse_yaml(REFERENCE_FLEET))
    data["environments"]["prod"]["node_pools"]["train-a100"]["max_size"] = JOB_NODES
    fleet = validate_data(data, Path(REFERENCE_FLEET))
    quotas = kueue.plan(fleet, "prod")
    return quotas, kueue.overflow(fleet, quotas), fleet.environments["prod"].kubernetes.version


def _overflow_workers(team: str) -> list[Rendered]:
    """The workers the manager's MultiKueueConfig names for the team, each configured by the pure functions."""
    quotas, plan, version = _sixteen_a100_nodes()
    clusters = multikueue.multikueue_config_spec(plan.teams[team].regions)["clusters"]
    config = kueue_chart.kueue_manager_config(("batch/job",))
    assert config["multiKueue"]["dispatcherName"] == kueue_chart.MULTIKUEUE_DISPATCHER  # all at once
    checks = {kueue_chart.PROVISIONING_CHECK: kueue_chart.provisioning_admission_check_spec()}
    return [
        Rendered.of(
            region,
            kueue_chart.cluster_queue_spec(team, f"team-{team}", quotas.region(region)),
            checks,
            config,
            autoscaler.autoscaler_args(version),
        )
        for region in clusters
    ]


# The scenarios ---------------------------------------------------------------------------------------------


def _local(config: Rendered) -> Outcome:
    return run([Region(config, ec2_nodes=10)])


def _overflow(workers: Sequence[Rendered]) -> Outcome:
    capacity = {"us-east-1": 10, "eu-west-1": JOB_NODES}
    return run([Region(w, ec2_nodes=capacity[w.region]) for w in workers])


def test_rendered_configuration_is_what_the_scenarios_read() -> None:
    local = _from_plan("prod-us-east-1-k8s", "vision")
    assert local.checked and local.provreq and local.group_nodes == JOB_NODES
    assert local.timeout == minutes(kueue_chart.duration(kueue_chart.PODS_READY_TIMEOUT_SECONDS))
    assert local.timeout > autoscaler.MAX_NODE_PROVISION_SECONDS / 60
    assert [w.region for w in _overflow_workers("language")] == ["eu-west-1", "us-east-1"]


def test_sixteen_nodes_when_ten_can_be_had_never_run_in_part() -> None:
    """No pod trains while others wait beyond the bound: every failed attempt is evicted whole at the timeout and
    requeued, and after the requeue limit the job is deactivated instead of burning GPUs forever."""
    config = _from_plan("prod-us-east-1-k8s", "vision")
    out = _local(config)
    assert out.ran_whole_in is None and out.deactivated
    assert config.timeout is not None
    assert out.partial <= config.timeout - USABLE - POD_START  # the bound: pods ready-but-waiting, then evicted
    assert out.evictions == (config.requeue_limit or 0) + 1
    per_attempt = out.idle_gpu_hours / out.evictions
    print(
        f"\nwhole-capacity: a failed attempt holds 10 nodes x {GPUS_PER_NODE} GPUs idle for "
        f"{per_attempt * 60 / (10 * GPUS_PER_NODE):.0f} min = {per_attempt:.1f} GPU-hours; "
        f"{out.evictions} attempts before deactivation: {out.idle_gpu_hours:.0f} GPU-hours"
    )
    # timeout (40) + pod exit (1) + scale-down-unneeded-time (10) - node boot and burn-in (14) = 37 minutes of 80 GPUs.
    assert per_attempt == pytest.approx(80 * (config.timeout + POD_EXIT + config.unneeded - USABLE) / 60)


def test_overflow_runs_where_the_capacity_is() -> None:
    """Offered to us-east-1 (10 nodes to be had) and eu-west-1 (16): at worst one failed attempt in us-east-1, then
    its autoscaler, backing off the group whose launches failed, cannot take the request, and eu-west-1's copy is
    the one Admitted."""
    out = _overflow(_overflow_workers("language"))
    assert out.ran_whole_in == "eu-west-1"
    assert out.evictions <= 1 and out.started is not None and out.started < 60
    print(
        f"\nwhole-capacity overflow: ran in eu-west-1 at t={out.started:.0f} min, "
        f"{out.idle_gpu_hours:.1f} GPU-hours idle"
    )


def _without(config: Rendered, **change: Any) -> Rendered:
    return replace(config, **change)


def test_without_waitforpodsready_the_job_runs_in_part() -> None:
    """waitForPodsReady removed from Kueue's configuration: 10 nodes hold the job's pods while 6 wait, all day."""
    config = _from_plan("prod-us-east-1-k8s", "vision")
    out = _local(_without(config, timeout=None))
    assert out.ran_whole_in is None and not out.deactivated and out.evictions == 0
    assert out.partial > 12 * 60 and out.idle_gpu_hours > 10 * 80


def test_without_the_provisioning_check_overflow_keeps_landing_where_capacity_is_short() -> None:
    """The check dropped from the workers' ClusterQueues: every worker admits on quota alone, so the manager keeps
    choosing us-east-1, where the job is evicted again and again and never runs whole."""
    out = _overflow([replace(w, checked=False) for w in _overflow_workers("language")])
    assert out.ran_whole_in is None and out.evictions > 10


def test_without_the_autoscaler_flag_nothing_is_admitted() -> None:
    """enable-provisioning-requests removed: the check stays Pending, the job waits forever in every region."""
    out = _overflow([replace(w, provreq=False) for w in _overflow_workers("language")])
    assert out.ran_whole_in is None and out.evictions == 0 and out.idle_gpu_hours == 0


def test_without_the_check_on_the_flavor_the_rendered_queue_says_so() -> None:
    """Removing the check from the rendered ClusterQueue is what the scenarios' `checked` reads."""
    quotas, _, _ = _sixteen_a100_nodes()
    queue = kueue_chart.cluster_queue_spec("language", "team-language", quotas.region("us-east-1"))
    checks = {kueue_chart.PROVISIONING_CHECK: kueue_chart.provisioning_admission_check_spec()}
    assert Rendered.of("us-east-1", queue, checks, {}, {}).checked
    stripped = {k: v for k, v in queue.items() if k != "admissionChecksStrategy"}
    assert not Rendered.of("us-east-1", stripped, checks, {}, {}).checked
    assert not Rendered.of("us-east-1", queue, {}, {}, {}).checked  # the AdmissionCheck gone
    assert math.isfinite(Rendered.of("us-east-1", queue, checks, {}, {}).group_nodes)
