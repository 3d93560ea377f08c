"""Disruptions under a job that needs 10 minutes to checkpoint, driven through the rendered configuration of the
reference fleet (prod-us-west-2: the EventBridge rules, the termination handler's values, the pool's termination
hook, the autoscaler's flags and the grace admission policy), in simulated time.

The job: one pod with terminationGracePeriodSeconds 600 that, on SIGTERM, writes a checkpoint for CHECKPOINT_S and
exits. A scenario's outcome says when the pod got SIGTERM, when it ended, whether its checkpoint was complete, and
what happened to the node. Each scenario is also run with the piece it relies on removed, and fails there.

Controllers stood in for (their documented behaviour, at the pinned versions):
- EventBridge delivers an event to the handler's queue when a rule's pattern matches it (moto's EventPattern, the
  same matcher tests/components/test_maintenance.py uses).
- aws-node-termination-handler v1.25.6, queue mode: drains at once on every queue event (sqsevent/*: StartTime
  now or the event's time, so interruptioneventstore TimeUntilDrain is past); evicts each pod with
  podTerminationGracePeriod, -1 meaning the pod's own (pkg/node/node.go getDrainHelper), and waits up to
  nodeTerminationGracePeriod; on an Auto Scaling lifecycle action it completes the hook after the drain
  (asg-lifecycle-event.go PostDrainTask), and not when the drain times out (draincordon/handler.go).
- kubelet: SIGTERM, then SIGKILL after the grace period (Kubernetes docs, "Pod Lifecycle", termination of Pods).
- EC2: a spot instance is reclaimed two minutes after its interruption warning (EC2 guide "Spot Instance
  interruption notices"); a scheduled stop happens at its window's start (EC2 guide "Scheduled events for your
  instances"); Auto Scaling holds a terminating instance until the hook completes or its HeartbeatTimeout passes,
  then applies the default result (user guide "Amazon EC2 Auto Scaling lifecycle hooks").
- cluster-autoscaler v1.33.6: a GPU node is a scale-down candidate only when GPU requests / allocatable is at or
  below scale-down-gpu-utilization-threshold (core/scaledown/eligibility/eligibility.go), default 0.5
  (config/const.go); a pod it evicts gets min(its grace, max-graceful-termination-sec), default 600
  (scaledown/actuation/drain.go evictPod; flags.go).
- batch Job controller: a pod that ended (evicted, deleted) is replaced, and the replacement is pending until a node
  takes it (Kubernetes docs "Jobs"); under Kueue the workload stays admitted, and is requeued when evicted.
"""

from __future__ import annotations

import copy
import heapq
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from moto.events.models import EventPattern

from components.charts import checkpoint_grace
from dlinfra.model import instances
from tests import reference

STACK = "prod-us-west-2"
GRACE_S = 600  # the job's terminationGracePeriodSeconds: 10 minutes to checkpoint
CHECKPOINT_S = 590  # how long its checkpoint takes once SIGTERM arrives
SAMPLES = json.loads((Path(__file__).parents[1] / "fixtures" / "events" / "termination-handler.json").read_text())
RULE = "aws:cloudwatch/eventRule:EventRule"
ASG = "aws:autoscaling/group:Group"
LIFECYCLE_HOOK = "aws:autoscaling/lifecycleHook:LifecycleHook"
VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
SPOT_RECLAIM_S = 120  # EC2 guide "Spot Instance interruption notices": two minutes
CA_DEFAULTS = {"scale-down-gpu-utilization-threshold": "0.5", "max-graceful-termination-sec": "600"}


# --- the rendered configuration ---------------------------------------------------------------------------------
@dataclass
class Config:
    """What the scenarios read from the offline plan; a scenario's "removed" variant edits a copy."""

    rules: dict[str, EventPattern]  # the termination handler's EventBridge rules, by key
    handler: dict[str, Any]  # the termination handler's Helm values
    hooks: dict[str, int]  # pool -> its termination hook's HeartbeatTimeout
    groups: dict[str, str]  # pool -> its Auto Scaling group's name
    autoscaler: dict[str, str]  # cluster-autoscaler's extraArgs
    caps: dict[str, int]  # pool -> checkpoint grace cap, from the admission policy


def _rendered() -> Config:
    runs = reference.runs()
    regional, in_cluster = runs[STACK], runs[f"{STACK}-k8s"]
    rules = {
        r.name.removeprefix("platform-nth-"): EventPattern.load(r.inputs["eventPattern"])
        for r in regional.resources
        if r.type == RULE and r.name.startswith("platform-nth-")
    }
    hooks, groups = {}, {}
    for group in (r for r in regional.resources if r.type == ASG):
        pool = group.name.removeprefix("pool-").removesuffix("-asg")  # NodePool names its group pool-<pool>-asg
        # The timeout AWS holds: the hook resource on the group overrides the initial hook of the same name.
        (hook,) = [
            r.inputs
            for r in regional.resources
            if r.type == LIFECYCLE_HOOK and r.inputs["autoscalingGroupName"] == group.inputs["name"]
        ]
        hooks[pool], groups[pool] = int(hook["heartbeatTimeout"]), str(group.inputs["name"])
    releases = {r.name: r.inputs for r in in_cluster.resources}
    (policy,) = [
        r
        for r in in_cluster.resources
        if r.type == VAP and r.inputs["metadata"]["name"] == checkpoint_grace.POLICY_NAME
    ]
    caps = json.loads(policy.inputs["metadata"]["annotations"]["dlinfra.io/checkpoint-grace-caps"])
    return Config(
        rules=rules,
        handler=dict(releases["platform-aws-node-termination-handler"]["values"]),
        hooks=hooks,
        groups=groups,
        autoscaler=dict(releases["platform-cluster-autoscaler"]["values"]["extraArgs"]),
        caps=caps,
    )


@pytest.fixture(scope="module")
def rendered() -> Config:
    return _rendered()


def _without(config: Config, change: Callable[[Config], None]) -> Config:
    edited = copy.deepcopy(config)
    change(edited)
    return edited


# --- a tiny discrete-event engine -----------------------------------------------------------------------------
@dataclass
class Sim:
    """Simulated seconds; actions run in time order (ties in scheduling order)."""

    now: float = 0.0
    queue: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    log: list[tuple[float, str]] = field(default_factory=list)

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.queue, (when, len(self.log) + len(self.queue), action))

    def note(self, what: str) -> None:
        self.log.append((self.now, what))

    def run(self, until: float) -> None:
        while self.queue and self.queue[0][0] <= until:
            self.now, _, action = heapq.heappop(self.queue)
            action()


@dataclass
class Pod:
    grace: int  # terminationGracePeriodSeconds
    checkpoint: int = CHECKPOINT_S  # seconds it takes to checkpoint after SIGTERM
    sigterm: float | None = None
    ended: float | None = None
    checkpointed: bool = False
    replaced: bool = False


@dataclass
class Outcome:
    pod: Pod
    node_gone: float | None
    log: list[tuple[float, str]]


def _admitted(config: Config, pool: str, grace: int) -> None:
    """The grace admission policy's rule for a pod naming its pool (checkpoint_grace.validations)."""
    assert grace <= config.caps[pool], f"the policy would refuse a {grace} s grace on {pool}"


def _signal(sim: Sim, pod: Pod, grace: int) -> None:
    """The kubelet: SIGTERM now; the job checkpoints and exits, or is killed at the grace's end."""
    if pod.sigterm is not None or pod.ended is not None:
        return
    pod.sigterm = sim.now
    sim.note(f"SIGTERM (grace {grace} s)")
    deadline = sim.now + grace

    def exits() -> None:
        if pod.ended is None:
            pod.ended, pod.checkpointed = sim.now, True
            sim.note("checkpoint written, pod exited")

    def killed() -> None:
        if pod.ended is None:
            pod.ended = sim.now
            sim.note("SIGKILL at the end of the grace")

    if pod.checkpoint <= grace:
        sim.at(sim.now + pod.checkpoint, exits)
    else:
        sim.at(deadline, killed)


def _node_goes(sim: Sim, pod: Pod, why: str) -> float:
    sim.note(f"node gone: {why}")
    if pod.ended is None:
        pod.ended = sim.now
        sim.note("pod lost with its node, checkpoint incomplete")
    return sim.now


def _handler_drain(sim: Sim, config: Config, pod: Pod, on_done: Callable[[], None] | None = None) -> None:
    """NTH's drain: each pod evicted with podTerminationGracePeriod (-1: its own), waited for up to the timeout."""
    own = config.handler.get("podTerminationGracePeriod", -1)
    grace = pod.grace if own is None or own < 0 else int(own)
    timeout = int(config.handler.get("nodeTerminationGracePeriod", 120))
    sim.note("termination handler: taint, cordon, evict")
    _signal(sim, pod, grace)
    started = sim.now

    def check() -> None:
        if pod.ended is not None:
            sim.note("drained")
            if on_done:
                on_done()
        elif sim.now - started >= timeout:
            sim.note("drain timed out (CordonAndDrainError): the hook is not completed")
        else:
            sim.at(sim.now + 5, check)

    sim.at(sim.now + 5, check)


def _delivered(config: Config, event: Mapping[str, Any]) -> bool:
    return any(pattern.matches_event(event) for pattern in config.rules.values())


def _sample(name: str) -> dict[str, Any]:
    (event,) = [s["event"] for s in SAMPLES["samples"] if s["name"] == name]
    return dict(event)


def _finish(sim: Sim, pod: Pod, node_gone: float | None) -> Outcome:
    if pod.ended is not None:
        pod.replaced = True  # the Job controller replaces it; Kueue keeps (or requeues) the workload
    return Outcome(pod=pod, node_gone=node_gone, log=sim.log)


# --- scenarios --------------------------------------------------------------------------------------------------
def maintenance(config: Config, pool: str = "train-h100") -> Outcome:
    """AWS Health announces an instance stop two weeks ahead; EC2 stops the instance at the window's start."""
    _admitted(config, pool, GRACE_S)
    sim, pod = Sim(), Pod(grace=GRACE_S)
    window = 14 * 86400.0
    gone: list[float] = []
    if _delivered(config, _sample("instance-stop-scheduled-announced")):
        sim.at(2.0, lambda: _handler_drain(sim, config, pod))
    sim.at(window, lambda: gone.append(_node_goes(sim, pod, "EC2 stops the instance at its window")))
    sim.run(window + 1)
    return _finish(sim, pod, gone[0] if gone else None)


def spot_interruption(config: Config, pool: str = "cpu") -> Outcome:
    """A spot warning on the CPU spot pool (GPU pools are never spot); EC2 reclaims the instance 2 minutes later."""
    _admitted(config, pool, GRACE_S)
    sim, pod = Sim(), Pod(grace=GRACE_S)
    gone: list[float] = []
    if _delivered(config, _sample("spot-interruption")):
        sim.at(1.0, lambda: _handler_drain(sim, config, pod))
    sim.at(SPOT_RECLAIM_S, lambda: gone.append(_node_goes(sim, pod, "EC2 reclaims the spot instance")))
    sim.run(SPOT_RECLAIM_S + 1)
    return _finish(sim, pod, gone[0])


def pool_roll(config: Config, pool: str = "train-h100", grace: int = 1800) -> Outcome:
    """`pool roll`'s instance refresh terminates the node: the hook holds it while the handler drains."""
    _admitted(config, pool, grace)
    sim, pod = Sim(), Pod(grace=grace, checkpoint=grace - 10)  # a job that uses almost all of its larger grace
    hook = config.hooks[pool]
    gone: list[float] = []
    done = {"hook": False}

    def complete() -> None:
        if not done["hook"]:
            done["hook"] = True
            sim.note("lifecycle action completed (CONTINUE)")
            gone.append(_node_goes(sim, pod, "terminated after the drain"))

    def timeout() -> None:
        if not done["hook"]:
            done["hook"] = True
            sim.note(f"hook timed out after {hook} s: default result CONTINUE")
            gone.append(_node_goes(sim, pod, "terminated at the hook's timeout"))

    lifecycle = {
        "source": "aws.autoscaling",
        "detail-type": "EC2 Instance-terminate Lifecycle Action",
        "detail": {
            "AutoScalingGroupName": config.groups[pool],
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
        },
    }
    if _delivered(config, lifecycle):
        sim.at(1.0, lambda: _handler_drain(sim, config, pod, on_done=complete))
    sim.at(float(hook), timeout)
    sim.run(hook + 1)
    return _finish(sim, pod, gone[0] if gone else None)


def scale_down(config: Config, gpus_requested: int = 1, pool: str = "train-h100") -> Outcome:
    """The autoscaler looks at an otherwise idle p5.48xlarge node where the job requests one GPU."""
    _admitted(config, pool, GRACE_S)
    sim, pod = Sim(), Pod(grace=GRACE_S)
    args = CA_DEFAULTS | config.autoscaler
    utilization = gpus_requested / instances.lookup("p5.48xlarge").gpus
    gone: list[float] = []
    if utilization <= float(args["scale-down-gpu-utilization-threshold"]):
        sim.note(f"GPU utilization {utilization:.3f}: unneeded, scale-down")
        grace = min(pod.grace, int(args["max-graceful-termination-sec"]))
        sim.at(600.0, lambda: _signal(sim, pod, grace))  # after scale-down-unneeded-time
        sim.at(600.0 + grace + 30, lambda: gone.append(_node_goes(sim, pod, "removed by the autoscaler")))
    else:
        sim.note(f"GPU utilization {utilization:.3f} is above the threshold: the node stays")
    sim.run(86400)
    return _finish(sim, pod, gone[0] if gone else None)


# --- the tests --------------------------------------------------------------------------------------------------
def test_maintenance_signals_waits_for_the_checkpoint_then_drains(rendered: Config) -> None:
    out = maintenance(rendered)
    assert out.pod.sigterm is not None and out.pod.sigterm < 60  # at the announcement, not at the window
    assert out.pod.checkpointed and out.pod.ended == out.pod.sigterm + CHECKPOINT_S
    assert out.pod.replaced  # requeued onto another node long before EC2 stops this one
    assert out.node_gone is not None and out.node_gone - out.pod.ended > 13 * 86400


def test_maintenance_without_its_rule_loses_the_checkpoint(rendered: Config) -> None:
    out = maintenance(_without(rendered, lambda c: c.rules.pop("scheduled-change")))
    assert out.pod.sigterm is None and not out.pod.checkpointed  # killed with the instance at the window


def test_spot_gives_at_most_two_minutes_whatever_the_grace(rendered: Config) -> None:
    """The contract cannot give more than EC2 does: SIGTERM at once, and 2 minutes, not the 10 asked for."""
    out = spot_interruption(rendered)
    assert out.pod.sigterm is not None and out.pod.sigterm <= 2
    assert out.node_gone == SPOT_RECLAIM_S and out.pod.ended == SPOT_RECLAIM_S
    assert not out.pod.checkpointed  # 590 s of checkpoint do not fit in 120 s
    assert out.pod.ended - out.pod.sigterm < GRACE_S
    assert out.pod.ended - out.pod.sigterm >= SPOT_RECLAIM_S - 2  # but it had the whole notice


def test_spot_without_its_rule_gives_no_signal(rendered: Config) -> None:
    out = spot_interruption(_without(rendered, lambda c: c.rules.pop("spot-interruption")))
    assert out.pod.sigterm is None and out.pod.ended == SPOT_RECLAIM_S


def test_scale_down_leaves_a_node_with_a_gpu_job(rendered: Config) -> None:
    out = scale_down(rendered)
    assert out.node_gone is None and out.pod.sigterm is None and out.pod.ended is None


def test_scale_down_with_the_chart_defaults_evicts_the_job(rendered: Config) -> None:
    gutted = _without(
        rendered,
        lambda c: [
            c.autoscaler.pop(k) for k in ("scale-down-gpu-utilization-threshold", "max-graceful-termination-sec")
        ],
    )
    out = scale_down(gutted)
    assert out.node_gone is not None and out.pod.sigterm is not None  # one GPU of eight is below 0.5


def test_pool_roll_waits_for_a_long_grace(rendered: Config) -> None:
    """train-h100's 1800 s grace: the hook (grace + margin) outlasts the checkpoint, then the node goes."""
    out = pool_roll(rendered)
    assert out.pod.checkpointed and out.node_gone is not None and out.node_gone < rendered.hooks["train-h100"]
    assert "lifecycle action completed (CONTINUE)" in [what for _, what in out.log]


def test_pool_roll_with_the_old_fixed_hook_cuts_the_checkpoint(rendered: Config) -> None:
    out = pool_roll(_without(rendered, lambda c: c.hooks.update({"train-h100": 900})))
    assert not out.pod.checkpointed and out.node_gone == 900


def test_pool_roll_with_the_chart_drain_timeout_never_completes_the_hook(rendered: Config) -> None:
    out = pool_roll(_without(rendered, lambda c: c.handler.pop("nodeTerminationGracePeriod")))
    whats = [what for _, what in out.log]
    assert any("drain timed out" in w for w in whats) and "lifecycle action completed (CONTINUE)" not in whats
