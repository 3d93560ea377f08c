"""A Capacity Block's quota exists only inside its window, simulated on the planned configuration (issue 22, item 3).

Read from the offline plan of the reference fleet (tests/reference.py runs()): us-west-2's ResourceFlavors as
declared, the team's ClusterQueue (flavor order and limits), the flavors' keeper (its ConfigMap, whose script is run
here as shipped, its CronJob's schedule and its ClusterRole), the MultiKueue manager's worker list for the team, and
us-east-1's flavors and queue for overflow. Only the block's times come from the fleet. Simulated time, no sleeping.
Where it stands in for a controller it copies documented behaviour:

- Kueue's flavor assigner (v0.19.2 pkg/scheduler/flavorassigner/flavorassigner.go): the resource group's flavors in
  order; one with a NoSchedule or NoExecute nodeTaint the pod set does not tolerate is passed over; the pod's
  nodeSelector is compared with the flavor's nodeLabels on the flavor's own keys only (flavorSelector); the flavor
  must have room under its nominal quota plus borrowing limit. A flavor's nodeTaints changing makes Kueue retry the
  workloads it left inadmissible (pkg/controller/core/resourceflavor_controller.go, Update).
- The CronJob controller starts a Job at each schedule time ("CronJob": schedule syntax); the keeper's pod is
  assumed to have run POD_START later.
- Server-side apply: a forced apply takes a field over from its manager, an unforced one that would change another
  manager's field fails with a conflict; the keeper may write only what its ClusterRole names (Kubernetes
  "Server-Side Apply"; "Using RBAC Authorization", resourceNames). Pulumi's applies (pulumi-kubernetes
  provider/pkg/await/await.go): a field under ignoreChanges that another manager holds is left out; the
  pulumi.com/patchForce annotation forces.
- MultiKueue, all-at-once dispatcher: a job is offered to every worker of its team and runs where it is admitted
  (Kueue docs "MultiKueue").
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib.util
import json
import sys
import types
import urllib.error
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from components.block_flavors import CLOSE_LEAD, NAME
from components.capacity_block import drain_at
from components.charts.kueue import PODS_READY_TIMEOUT_SECONDS
from tests import reference

TEAM = "language"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
CLOSED = {"key": "dlinfra.io/capacity-block-closed", "value": "true", "effect": "NoSchedule"}
BLOCK_FLAVOR = "pool-train-h100"
SITE_FLAVOR = "site-sjc1"
POD_START = datetime.timedelta(seconds=30)  # schedule time -> the keeper's PATCH (image cached, one small pod)
AUTOSCALER_SCAN = datetime.timedelta(seconds=10)  # cluster-autoscaler --scan-interval default (its FAQ)
KUEUE_API = "kubernetes:kueue.x-k8s.io/v1beta2"
# The job: four 8-GPU H100 nodes of the block's pool, pinned to it, tolerating the GPU nodes' taint (docs/jobs.md).
JOB: dict[str, Any] = {
    "gpus": 32,
    "nodeSelector": {"dlinfra.io/pool": "train-h100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


@dataclass(frozen=True)
class Cluster:
    """One region's Kueue objects as planned."""

    region: str
    flavors: Mapping[str, dict[str, Any]]  # name -> declared spec
    queue: Mapping[str, Any]  # the team's ClusterQueue spec
    flavor_meta: Mapping[str, dict[str, Any]] = field(default_factory=dict)  # name -> metadata
    flavor_ignored: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # name -> ignoreChanges
    keeper_script: str | None = None
    keeper_config: str | None = None
    keeper_schedule: str | None = None
    keeper_may_patch: frozenset[str] = frozenset()


def _flavor_records(stack: str) -> dict[str, Any]:
    return {
        r.inputs["metadata"]["name"]: r
        for r in reference.runs()[stack].resources
        if r.type == f"{KUEUE_API}:ResourceFlavor"
    }


def _kueue(stack: str, kind: str) -> dict[str, dict[str, Any]]:
    return {
        r.inputs["metadata"]["name"]: r.inputs["spec"]
        for r in reference.runs()[stack].resources
        if r.type == f"{KUEUE_API}:{kind}"
    }


@functools.cache
def cluster(region: str) -> Cluster:
    stack = f"prod-{region}-k8s"
    result = reference.runs()[stack]
    found: dict[str, Any] = {}
    for r in result.resources:
        if r.type == "kubernetes:core/v1:ConfigMap" and r.inputs["metadata"]["name"] == NAME:
            found["keeper_script"] = r.inputs["data"]["components.scripts.capacity_block_flavor.py"]
            found["keeper_config"] = r.inputs["data"]["config.json"]
        elif r.type == "kubernetes:batch/v1:CronJob" and r.inputs["metadata"]["name"] == NAME:
            found["keeper_schedule"] = r.inputs["spec"]["schedule"]
        elif r.type == "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole" and r.inputs["metadata"]["name"] == NAME:
            found["keeper_may_patch"] = frozenset(
                n for rule in r.inputs["rules"] if "patch" in rule["verbs"] for n in rule["resourceNames"]
            )
    records = _flavor_records(stack)
    return Cluster(
        region,
        _kueue(stack, "ResourceFlavor"),
        _kueue(stack, "ClusterQueue")[TEAM],
        flavor_meta={name: r.inputs["metadata"] for name, r in records.items()},
        flavor_ignored={name: tuple(r.ignore_changes) for name, r in records.items()},
        **found,
    )


def workers() -> list[str]:
    """The regions the MultiKueue manager offers the team's overflow jobs to."""
    (config,) = [spec for name, spec in _kueue("prod-us-west-2-k8s", "MultiKueueConfig").items() if name.endswith(TEAM)]
    return [c.removeprefix("multikueue-") for c in config["clusters"]]


def block() -> tuple[datetime.datetime, datetime.datetime, int]:
    pool = reference.fleet().environments["prod"].node_pools["train-h100"]
    cr = pool.capacity_reservations["us-west-2"]
    assert cr.start is not None and cr.end is not None
    return cr.start, cr.end, pool.checkpoint_grace


# The keeper, as shipped ------------------------------------------------------------------------------------


def keeper_module(source: str) -> types.ModuleType:
    """The script from the ConfigMap, loaded as the pod's python3 would run it."""
    spec = importlib.util.spec_from_loader("shipped_capacity_block_flavor", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    exec(compile(source, "capacity_block_flavor.py", "exec"), module.__dict__)
    return module


class ConflictError(Exception):
    """The API server refused an unforced apply: another manager holds the field."""


@dataclass
class ApiServer:
    """One cluster's flavors as the API server holds them: each spec.nodeTaints and the manager that owns it."""

    cluster: Cluster
    taints: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)  # flavor -> "pulumi" or "keeper"

    def __post_init__(self) -> None:
        for name in self.cluster.flavors:  # created by the program's first apply
            self.pulumi_apply(name, self.cluster.flavors[name])

    def pulumi_apply(self, name: str, spec: Mapping[str, Any]) -> None:
        """The program's apply of a flavor (pulumi-kubernetes: unforced unless annotated patchForce)."""
        meta = self.cluster.flavor_meta.get(name, {})
        force = (meta.get("annotations") or {}).get("pulumi.com/patchForce") == "true"
        if "spec.nodeTaints" in self.cluster.flavor_ignored.get(name, ()) and self.owner.get(name) == "keeper":
            return  # handleSSAIgnoreFields: left out of the apply
        wanted = list(spec.get("nodeTaints", []))
        if self.owner.get(name, "pulumi") != "pulumi" and wanted != self.taints.get(name) and not force:
            raise ConflictError(f"conflict with {self.owner[name]}: .spec.nodeTaints of {name}")
        self.taints[name], self.owner[name] = wanted, "pulumi"

    def apply(self, name: str, body: Mapping[str, Any]) -> None:
        """The keeper's apply: forced, and only where its ClusterRole lets it."""
        if name not in self.cluster.keeper_may_patch or name not in self.cluster.flavors:
            raise urllib.error.URLError(f"403 resourceflavors {name!r} is forbidden")
        assert body["kind"] == "ResourceFlavor" and set(body["spec"]) == {"nodeTaints"}  # the keeper's one field
        self.taints[name], self.owner[name] = list(body["spec"]["nodeTaints"]), "keeper"

    def live(self, name: str) -> dict[str, Any]:
        return {**self.cluster.flavors[name], "nodeTaints": self.taints[name]}


def live_flavors(c: Cluster, now: datetime.datetime, keeper: bool = True) -> dict[str, dict[str, Any]]:
    """The flavors at `now`: the keeper's last run before it has applied (every minute, POD_START after)."""
    api = ApiServer(c)
    if keeper and c.keeper_script is not None:
        assert c.keeper_schedule == "* * * * *" and c.keeper_config is not None
        module = keeper_module(c.keeper_script)
        last_run = (now - POD_START).replace(second=0, microsecond=0)
        module.run(module.load(c.keeper_config), api, last_run)
    return {name: api.live(name) for name in c.flavors}


# Kueue's flavor assigner -----------------------------------------------------------------------------------


def tolerated(taint: Mapping[str, str], tolerations: Sequence[Mapping[str, str]]) -> bool:
    if taint["effect"] not in ("NoSchedule", "NoExecute"):
        return True
    for t in tolerations:
        if t.get("effect") not in (None, "", taint["effect"]):
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, "", taint["key"]):
            return True
        if t.get("key") == taint["key"] and t.get("value") == taint.get("value"):
            return True
    return False


def assign(c: Cluster, flavors: Mapping[str, Mapping[str, Any]], job: Mapping[str, Any],
           busy: frozenset[str] = frozenset()) -> tuple[str | None, list[str]]:  # fmt: skip
    """The flavor Kueue gives the job in the team's queue (None: inadmissible here), and why each was passed over.
    `busy`: flavors whose quota other jobs hold."""
    why = []
    for f in c.queue["resourceGroups"][0]["flavors"]:
        name, spec = f["name"], flavors[f["name"]]
        untolerated = [t for t in spec.get("nodeTaints", []) if not tolerated(t, job["tolerations"])]
        if untolerated:
            why.append(f"untolerated taint {untolerated[0]['key']} in flavor {name}")
            continue
        labels = spec.get("nodeLabels", {})
        if any(labels[k] != v for k, v in job["nodeSelector"].items() if k in labels):
            why.append(f"flavor {name} doesn't match node affinity")
            continue
        (resource,) = f["resources"]
        room = 0 if name in busy else int(resource["nominalQuota"]) + int(resource.get("borrowingLimit", 0))
        if room < job["gpus"]:
            why.append(f"insufficient quota in flavor {name}")
            continue
        return name, why
    return None, why


def where_it_runs(now: datetime.datetime, keeper: bool = True) -> set[tuple[str, str]]:
    """Where the job is admitted at `now`, as (region, flavor): us-west-2's own queue, or else every overflow worker
    that admits it (all at once: it runs in the first). The site's GPUs are taken by other work throughout."""
    home = cluster("us-west-2")
    flavor, _ = assign(home, live_flavors(home, now, keeper), JOB, busy=frozenset({SITE_FLAVOR}))
    if flavor is not None:
        return {("us-west-2", flavor)}
    admitted = set()
    for region in workers():
        worker = cluster(region)
        flavor, _ = assign(worker, live_flavors(worker, now, keeper), JOB)
        if flavor is not None:
            admitted.add((region, flavor))
    return admitted


# The scenarios ---------------------------------------------------------------------------------------------


def test_the_planned_configuration_is_what_the_scenarios_read() -> None:
    home = cluster("us-west-2")
    order = [f["name"] for f in home.queue["resourceGroups"][0]["flavors"]]
    assert order.index(SITE_FLAVOR) < order.index(BLOCK_FLAVOR)
    # Created closed, the field left to the keeper once it has run.
    assert {"key": "dlinfra.io/capacity-block-closed", "value": "true", "effect": "NoSchedule"} in home.flavors[
        BLOCK_FLAVOR
    ]["nodeTaints"]
    assert home.flavor_ignored[BLOCK_FLAVOR] == ("spec.nodeTaints",)
    assert home.keeper_may_patch == {BLOCK_FLAVOR}
    assert sorted(workers()) == ["eu-west-1", "us-east-1"]
    assert cluster("us-east-1").keeper_script is None  # no block there


def test_before_the_window_the_job_runs_on_other_capacity_instead_of_waiting() -> None:
    start, _, _ = block()
    home = cluster("us-west-2")
    flavor, why = assign(home, live_flavors(home, start - datetime.timedelta(hours=1)), JOB, frozenset({SITE_FLAVOR}))
    assert flavor is None
    assert f"untolerated taint dlinfra.io/capacity-block-closed in flavor {BLOCK_FLAVOR}" in why
    assert where_it_runs(start - datetime.timedelta(hours=1)) == {("us-east-1", "pool-train-h100")}


def test_inside_the_window_the_block_takes_it_within_a_minute_of_the_start() -> None:
    start, _, _ = block()
    assert where_it_runs(start + datetime.timedelta(seconds=1)) != {("us-west-2", BLOCK_FLAVOR)}  # the keeper's tick
    assert where_it_runs(start + datetime.timedelta(minutes=1) + POD_START) == {("us-west-2", BLOCK_FLAVOR)}
    assert where_it_runs(start + datetime.timedelta(days=3)) == {("us-west-2", BLOCK_FLAVOR)}


def test_after_the_drain_a_requeued_job_runs_elsewhere_and_never_on_the_ended_block() -> None:
    _, end, grace = block()
    group_closes = drain_at(end, grace)
    # The job is drained at the group's close and requeued (test_capacity_block_end.py); from then on, and for
    # as long as the block stays in the fleet, the block's flavor is closed.
    for after in (datetime.timedelta(0), datetime.timedelta(minutes=40), datetime.timedelta(days=30)):
        assert where_it_runs(group_closes + after) == {("us-east-1", "pool-train-h100")}


def test_the_last_job_given_the_block_has_its_nodes_and_pods_before_the_group_closes() -> None:
    _, end, grace = block()
    group_closes = drain_at(end, grace)
    step = datetime.timedelta(seconds=10)
    moments = [group_closes - CLOSE_LEAD - datetime.timedelta(minutes=3) + k * step for k in range(60)]
    last_on_block = max(t for t in moments if where_it_runs(t) == {("us-west-2", BLOCK_FLAVOR)})
    # Its nodes may take the autoscaler's max-node-provision-time and its pods their start (Kueue's
    # waitForPodsReady timeout covers both), all while the group is still open, and it trains a while before the drain.
    assert group_closes - last_on_block >= datetime.timedelta(seconds=PODS_READY_TIMEOUT_SECONDS + 25 * 60)


def test_without_the_keeper_the_block_stays_closed_and_nothing_waits_for_it() -> None:
    """The flavor is created closed: a keeper that never runs wastes the block, but no job waits on it."""
    start, _, _ = block()
    assert where_it_runs(start + datetime.timedelta(days=3), keeper=False) == {("us-east-1", "pool-train-h100")}


def test_a_flavor_declared_open_would_keep_jobs_waiting_for_a_block_that_has_not_begun_or_has_ended() -> None:
    """What the closed taint prevents: the flavor as declared before this change, the pool's taints alone."""
    start, end, grace = block()
    home = cluster("us-west-2")
    opened = dict(home.flavors)
    opened[BLOCK_FLAVOR] = {**opened[BLOCK_FLAVOR], "nodeTaints": [GPU_TAINT]}
    # Nothing in the flavor follows the clock then: before the block and after its drain alike, Kueue gives it.
    assert start < drain_at(end, grace)
    assert assign(home, opened, JOB, frozenset({SITE_FLAVOR}))[0] == BLOCK_FLAVOR


def test_applies_and_the_keeper_never_fight_and_a_removed_block_gives_the_field_back() -> None:
    start, _, _ = block()
    home = cluster("us-west-2")
    api = ApiServer(home)
    assert home.keeper_script is not None and home.keeper_config is not None
    module = keeper_module(home.keeper_script)
    module.run(module.load(home.keeper_config), api, start + datetime.timedelta(hours=1))
    assert api.owner[BLOCK_FLAVOR] == "keeper" and api.taints[BLOCK_FLAVOR] == [GPU_TAINT]  # open now
    api.pulumi_apply(BLOCK_FLAVOR, home.flavors[BLOCK_FLAVOR])  # a later apply of the program: left alone
    assert api.owner[BLOCK_FLAVOR] == "keeper" and api.taints[BLOCK_FLAVOR] == [GPU_TAINT]
    # The block leaves the fleet: the pool's flavor is declared with the pool's taints and no ignoreChanges.
    removed = dataclasses.replace(home, flavor_ignored={**home.flavor_ignored, BLOCK_FLAVOR: ()})
    after = ApiServer(removed)
    after.taints[BLOCK_FLAVOR], after.owner[BLOCK_FLAVOR] = [GPU_TAINT, CLOSED], "keeper"
    after.pulumi_apply(BLOCK_FLAVOR, {**home.flavors[BLOCK_FLAVOR], "nodeTaints": [GPU_TAINT]})
    assert after.owner[BLOCK_FLAVOR] == "pulumi" and after.taints[BLOCK_FLAVOR] == [GPU_TAINT]
    # Without the patchForce annotation that apply would fail on the keeper's field.
    unforced = dataclasses.replace(removed, flavor_meta={BLOCK_FLAVOR: {"name": BLOCK_FLAVOR}})
    stuck = ApiServer(unforced)
    stuck.taints[BLOCK_FLAVOR], stuck.owner[BLOCK_FLAVOR] = [GPU_TAINT, CLOSED], "keeper"
    with pytest.raises(ConflictError):
        stuck.pulumi_apply(BLOCK_FLAVOR, {**home.flavors[BLOCK_FLAVOR], "nodeTaints": [GPU_TAINT]})


def test_a_job_pinned_to_the_block_pool_is_never_given_the_site() -> None:
    """The site's flavor names its own pool (dlinfra/render/nodeadm.py POOL_LABEL), so the pin excludes it; without
    that key Kueue would give the site's H100s to a job pinned to train-h100, whose pods then fit no node."""
    start, _, _ = block()
    home = cluster("us-west-2")
    assert home.flavors[SITE_FLAVOR]["nodeLabels"]["dlinfra.io/pool"] == SITE_FLAVOR
    flavor, why = assign(home, live_flavors(home, start + datetime.timedelta(hours=1)), JOB)  # the site is free
    assert flavor == BLOCK_FLAVOR
    assert f"flavor {SITE_FLAVOR} doesn't match node affinity" in why
    unpinned = {**JOB, "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
    assert assign(home, live_flavors(home, start + datetime.timedelta(hours=1)), unpinned)[0] == SITE_FLAVOR
    # A job written for NVIDIA's stack asking for another product gets no H100 flavor: the flavors name the product
    # (Kueue ignores a selector key no flavor names, and would have admitted it to H100s it cannot run on).
    other = {**JOB, "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}
    assert assign(home, live_flavors(home, start + datetime.timedelta(hours=1)), other)[0] is None


def test_a_job_that_tolerates_every_taint_is_not_kept_off_the_closed_block() -> None:
    """What the keeper cannot do (docs/jobs.md says so): an `operator: Exists` toleration without a key."""
    start, _, _ = block()
    home = cluster("us-west-2")
    everything = {**JOB, "tolerations": [{"operator": "Exists"}]}
    flavors = live_flavors(home, start - datetime.timedelta(hours=1))
    assert assign(home, flavors, everything, frozenset({SITE_FLAVOR}))[0] == BLOCK_FLAVOR


@pytest.mark.parametrize("region", ["us-west-2"])
def test_the_keeper_cannot_touch_other_flavors(region: str) -> None:
    c = cluster(region)
    api = ApiServer(c)
    assert c.keeper_script is not None
    module = keeper_module(c.keeper_script)
    start, _, _ = block()
    stray = module.FlavorWindow("pool-interactive", start, start + datetime.timedelta(days=1), ())
    with pytest.raises(module.KeeperError, match="forbidden"):
        module.run([stray], api, start)
    assert all(owner == "pulumi" for owner in api.owner.values())
    assert json.loads(c.keeper_config or "{}")["flavors"][0]["flavor"] == BLOCK_FLAVOR
