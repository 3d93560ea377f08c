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
- Server-side apply: the live object is the declared fields plus the keeper's; the keeper may write only what its
  ClusterRole names (Kubernetes "Server-Side Apply"; "Using RBAC Authorization", resourceNames).
- MultiKueue, all-at-once dispatcher: a job is offered to every worker of its team and runs where it is admitted
  (Kueue docs "MultiKueue").
"""

from __future__ import annotations

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
from tests import reference

TEAM = "language"
BLOCK_FLAVOR = "pool-train-h100"
SITE_FLAVOR = "site-sjc1"
POD_START = datetime.timedelta(seconds=30)  # schedule time -> the keeper's PATCH (image cached, one small pod)
AUTOSCALER_SCAN = datetime.timedelta(seconds=10)  # cluster-autoscaler --scan-interval default (its FAQ)
KUEUE_API = "kubernetes:kueue.x-k8s.io/v1beta2"
# The job: four 8-GPU H100 nodes of the block's pool, pinned to it, tolerating the GPU nodes' taint (docs/jobs.md).
JOB: dict[str, Any] = {
    "gpus": 32,
    "nodeSelector": {"dlinfra.io/pool": "train-h100", "nvidia.com/gpu.product": "H100"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


@dataclass(frozen=True)
class Cluster:
    """One region's Kueue objects as planned."""

    region: str
    flavors: Mapping[str, dict[str, Any]]  # name -> declared spec
    queue: Mapping[str, Any]  # the team's ClusterQueue spec
    keeper_script: str | None = None
    keeper_config: str | None = None
    keeper_schedule: str | None = None
    keeper_may_patch: frozenset[str] = frozenset()


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
            found["keeper_script"] = r.inputs["data"]["capacity_block_flavor.py"]
            found["keeper_config"] = r.inputs["data"]["config.json"]
        elif r.type == "kubernetes:batch/v1:CronJob" and r.inputs["metadata"]["name"] == NAME:
            found["keeper_schedule"] = r.inputs["spec"]["schedule"]
        elif r.type == "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole" and r.inputs["metadata"]["name"] == NAME:
            found["keeper_may_patch"] = frozenset(
                n for rule in r.inputs["rules"] if "patch" in rule["verbs"] for n in rule["resourceNames"]
            )
    return Cluster(region, _kueue(stack, "ResourceFlavor"), _kueue(stack, "ClusterQueue")[TEAM], **found)


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


@dataclass
class ApiServer:
    """The flavors as the API server holds them: declared fields, plus the keeper's taints where RBAC lets it."""

    declared: Mapping[str, dict[str, Any]]
    may_patch: frozenset[str]
    applied: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def apply(self, name: str, body: Mapping[str, Any]) -> None:
        if name not in self.may_patch or name not in self.declared:
            raise urllib.error.URLError(f"403 resourceflavors {name!r} is forbidden")
        assert body["kind"] == "ResourceFlavor" and set(body["spec"]) == {"nodeTaints"}  # the keeper's one field
        assert "nodeTaints" not in self.declared[name], "two managers would own nodeTaints: an apply conflicts"
        self.applied[name] = list(body["spec"]["nodeTaints"])

    def live(self, name: str) -> dict[str, Any]:
        spec = dict(self.declared[name])
        if name in self.applied:
            spec["nodeTaints"] = self.applied[name]
        return spec


def live_flavors(c: Cluster, now: datetime.datetime, keeper: bool = True) -> dict[str, dict[str, Any]]:
    """The flavors at `now`: the keeper's last run before it has applied (every minute, POD_START after)."""
    api = ApiServer(c.flavors, c.keeper_may_patch)
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
    assert "nodeTaints" not in home.flavors[BLOCK_FLAVOR]  # the keeper's field
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


def test_the_flavor_closes_while_the_group_can_still_grow_for_its_last_job() -> None:
    _, end, grace = block()
    group_closes = drain_at(end, grace)
    minute = datetime.timedelta(minutes=1)
    moments = [group_closes - CLOSE_LEAD - 3 * minute + k * datetime.timedelta(seconds=10) for k in range(60)]
    last_on_block = max(t for t in moments if where_it_runs(t) == {("us-west-2", BLOCK_FLAVOR)})
    # A job Kueue gives the block at that moment has its nodes asked for before the group closes.
    assert group_closes - last_on_block >= 30 * AUTOSCALER_SCAN


def test_without_the_keeper_the_job_waits_for_a_block_that_has_not_begun_or_has_ended() -> None:
    start, end, grace = block()
    assert where_it_runs(start - datetime.timedelta(hours=1), keeper=False) == {("us-west-2", BLOCK_FLAVOR)}
    after = drain_at(end, grace) + datetime.timedelta(hours=1)
    assert where_it_runs(after, keeper=False) == {("us-west-2", BLOCK_FLAVOR)}


def test_a_job_pinned_to_the_block_pool_is_never_given_the_site() -> None:
    """The site's flavor names its own pool (dlinfra/render/nodeadm.py POOL_LABEL), so the pin excludes it; without
    that key Kueue would give the site's H100s to a job pinned to train-h100, whose pods then fit no node."""
    start, _, _ = block()
    home = cluster("us-west-2")
    assert home.flavors[SITE_FLAVOR]["nodeLabels"]["dlinfra.io/pool"] == SITE_FLAVOR
    flavor, why = assign(home, live_flavors(home, start + datetime.timedelta(hours=1)), JOB)  # the site is free
    assert flavor == BLOCK_FLAVOR
    assert f"flavor {SITE_FLAVOR} doesn't match node affinity" in why
    unpinned = {**JOB, "nodeSelector": {"nvidia.com/gpu.product": "H100"}}
    assert assign(home, live_flavors(home, start + datetime.timedelta(hours=1)), unpinned)[0] == SITE_FLAVOR


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
    api = ApiServer(c.flavors, c.keeper_may_patch)
    assert c.keeper_script is not None
    module = keeper_module(c.keeper_script)
    start, _, _ = block()
    stray = module.FlavorWindow("pool-interactive", start, start + datetime.timedelta(days=1), ())
    with pytest.raises(module.KeeperError, match="forbidden"):
        module.run([stray], api, start)
    assert api.applied == {}
    assert json.loads(c.keeper_config or "{}")["flavors"][0]["flavor"] == BLOCK_FLAVOR
