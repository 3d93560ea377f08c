"""Scheduled maintenance, proven on the rendered configuration: a GPU host AWS schedules for maintenance is
tainted and cordoned when AWS announces it, not when the window starts (docs/maintenance.md).

The EventBridge patterns are the ones the offline plan declares, matched with moto's EventBridge pattern
matcher against AWS events written from AWS's documented shapes (tests/fixtures/events). What the handler does
with an event it receives is read from the rendered Helm values through `queue_processor_actions`, a model of
the pinned handler's source (aws/aws-node-termination-handler v1.25.6, chart 0.27.6).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from moto.events.models import EventPattern

from components.charts.termination_handler import TERMINATION_EVENTS, termination_handler_values
from dlinfra.model.fleet.labels import DRAIN_TAINT_KEYS
from tests import reference

SAMPLES = json.loads((Path(__file__).parents[1] / "fixtures" / "events" / "termination-handler.json").read_text())
# NTH pkg/node/node.go, ScheduledMaintenanceTaint
MAINTENANCE_TAINT = "aws-node-termination-handler/scheduled-maintenance"
RULE = "aws:cloudwatch/eventRule:EventRule"
TARGET = "aws:cloudwatch/eventTarget:EventTarget"
QUEUE = "aws:sqs/queue:Queue"
# Settings the chart (deployment.yaml) passes as environment variables; extraEnv must not override them.
OWN_ENV = {"CORDON_ONLY", "TAINT_NODE", "TAINT_EFFECT", "DRY_RUN", "ENABLE_SQS_TERMINATION_DRAINING"}


def queue_processor_actions(event: Mapping[str, Any], values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What the handler, run with these Helm values, does with this event from its queue: (action, instance) pairs,
    all at receipt. Read from aws/aws-node-termination-handler at tag v1.25.6:

    - chart config/helm/aws-node-termination-handler/templates/deployment.yaml: the queue processor (a Deployment)
      exists only with enableSqsTerminationDraining (line 1); CORDON_ONLY and TAINT_NODE come from cordonOnly and
      taintNode (lines 101-104); TAINT_EFFECT is not set, so pkg/config/config.go's default, NoSchedule (line 78).
    - pkg/monitor/sqsevent/sqs-monitor.go processEventBridgeEvent: source aws.health with detail-type
      "AWS Health Event" goes to scheduledEventToInterruptionEvents (lines 235-237).
    - pkg/monitor/sqsevent/scheduled-change-event.go: skipped unless service is EC2 (line 78) and
      eventTypeCategory scheduledChange (line 83); one interruption event per affected entity (line 88) with
      StartTime time.Now(), "Begin drain immediately" (lines 95-101), the AWS start time unread; its PreDrainTask
      taints the node with ScheduledMaintenanceTaint (line 128).
    - pkg/interruptioneventstore/interruption-event-store.go: an event is due once StartTime minus
      nodeTerminationGracePeriod has passed (lines 107-120), so at once.
    - pkg/node/node.go TaintScheduledMaintenance: does nothing unless TaintNode (lines 532-546).
    - pkg/interruptionevent/draincordon/handler.go HandleEvent: the PreDrainTask (line 83), then cordon only when
      CordonOnly, else cordon and drain (lines 103-107).

    Every entity's event carries the same event id (line 97) and the store keeps the first event of an id
    (interruption-event-store.go AddInterruptionEvent, lines 63-70): of a Health event naming several instances,
    only the first is acted on (docs/maintenance.md, "Limits").
    """
    if not values.get("enableSqsTerminationDraining") or values.get("dryRun"):
        return []
    if event.get("source") != "aws.health" or event.get("detail-type") != "AWS Health Event":
        return []
    detail = event["detail"]
    if detail.get("service") != "EC2" or detail.get("eventTypeCategory") != "scheduledChange":
        return []
    actions: list[tuple[str, str]] = []
    for entity in detail.get("affectedEntities", [])[:1]:
        instance = entity["entityValue"]
        if values.get("taintNode"):
            actions.append((f"taint {MAINTENANCE_TAINT}:NoSchedule", instance))
        actions.append(("cordon", instance))
        if not values.get("cordonOnly"):
            actions.append(("drain", instance))
    return actions


@functools.cache
def _rules(stack: str) -> dict[str, EventPattern]:
    """The stack's termination-handler rules, by rule key, with their planned patterns loaded by moto."""
    result = reference.runs()[stack]
    rules = [r for r in result.resources if r.type == RULE and r.name.startswith("platform-nth-")]
    assert rules, f"{stack}: the plan has no EventBridge rules"
    return {r.name.removeprefix("platform-nth-"): EventPattern.load(r.inputs["eventPattern"]) for r in rules}


def _handler_values(stack: str) -> dict[str, Any]:
    result = reference.runs()[f"{stack}-k8s"]
    return dict(reference.named(result, "platform-aws-node-termination-handler").inputs["values"])


def _case_id(sample: Mapping[str, Any]) -> str:
    return str(sample["name"])


@pytest.mark.parametrize("stack", reference.REGIONAL)
@pytest.mark.parametrize("sample", SAMPLES["samples"], ids=_case_id)
def test_planned_rules_route_exactly_the_maintenance_events(stack: str, sample: Mapping[str, Any]) -> None:
    """Every EC2 scheduled-maintenance Health event reaches the handler's queue through the scheduled-change rule;
    other Health events (issues, other services, abuse, a closed maintenance) reach it through no rule."""
    matched = {key for key, pattern in _rules(stack).items() if pattern.matches_event(sample["event"])}
    assert matched == ({sample["expect"]} if sample["expect"] else set())


@pytest.mark.parametrize("stack", reference.REGIONAL)
def test_every_rule_feeds_the_queue_the_handler_reads(stack: str) -> None:
    result = reference.runs()[stack]
    (queue,) = [r for r in result.resources if r.type == QUEUE]
    rules = {r.urn: r for r in result.resources if r.type == RULE and r.name.startswith("platform-nth-")}
    targets = [r for r in result.resources if r.type == TARGET and r.parent in rules]
    assert {t.parent for t in targets} == set(rules), "a rule without a target sends nothing anywhere"
    assert {t.inputs["arn"] for t in targets} == {queue.outputs["arn"]}
    assert _handler_values(stack)["queueURL"] == queue.outputs["url"]


@pytest.mark.parametrize("stack", reference.REGIONAL)
def test_the_handler_taints_and_cordons_at_announcement(stack: str) -> None:
    """On the announcement (statusCode upcoming, two weeks before the window) the handler as configured taints,
    cordons and drains each affected node at once; nothing it receives from another rule is mistaken for one."""
    values = _handler_values(stack)
    assert not OWN_ENV & {e.get("name") for e in values.get("extraEnv", [])}
    maintenance = [s for s in SAMPLES["samples"] if s["expect"] == "scheduled-change"]
    assert len(maintenance) >= 8
    for sample in maintenance:
        first = sample["event"]["detail"]["affectedEntities"][0]["entityValue"]
        expected = [(action, first) for action in (f"taint {MAINTENANCE_TAINT}:NoSchedule", "cordon", "drain")]
        assert queue_processor_actions(sample["event"], values) == expected, sample["name"]
    # The other rules' events go down the handler's other paths (spot, state change), never this one.
    others = [s for s in SAMPLES["samples"] if s["expect"] not in ("scheduled-change", None)]
    assert others and all(queue_processor_actions(s["event"], values) == [] for s in others)


@pytest.mark.parametrize("stack", reference.REGIONAL)
def test_a_closed_maintenance_would_drain_again_so_no_rule_delivers_it(stack: str) -> None:
    """The handler reads no statusCode: it would cordon and drain a node whose maintenance is over (or was
    cancelled) if the event reached it. The scheduled-change rule is what keeps it out."""
    (sample,) = [s for s in SAMPLES["samples"] if s["name"] == "system-reboot-closed"]
    assert queue_processor_actions(sample["event"], _handler_values(stack))
    assert not any(pattern.matches_event(sample["event"]) for pattern in _rules(stack).values())


def test_the_model_notices_a_configuration_that_would_only_drain_late_or_not_at_all() -> None:
    """The model is not a tautology: the settings that would break the promise change its answer."""
    (event,) = [s["event"] for s in SAMPLES["samples"] if s["name"] == "instance-retirement-scheduled-announced"]
    good = termination_handler_values("https://sqs.us-west-2.amazonaws.com/111122223333/q", "us-west-2")
    assert [a for a, _ in queue_processor_actions(event, good)] == [
        f"taint {MAINTENANCE_TAINT}:NoSchedule",
        "cordon",
        "drain",
    ]
    assert [a for a, _ in queue_processor_actions(event, good | {"taintNode": False})] == ["cordon", "drain"]
    assert queue_processor_actions(event, good | {"enableSqsTerminationDraining": False}) == []
    assert queue_processor_actions(event, good | {"dryRun": True}) == []


def test_the_maintenance_taint_is_one_workloads_may_not_tolerate() -> None:
    assert MAINTENANCE_TAINT in DRAIN_TAINT_KEYS


def test_samples_name_their_source_and_cover_every_rule_outcome() -> None:
    samples = SAMPLES["samples"]
    assert all(s["source"] for s in samples)
    assert len({s["name"] for s in samples}) == len(samples)
    outcomes = {s["expect"] for s in samples}
    assert {"scheduled-change", None} <= outcomes
    assert outcomes - {None} <= set(TERMINATION_EVENTS)


def test_one_health_event_naming_two_instances_gets_one_acted_on() -> None:
    """The handler's limit, kept visible: see queue_processor_actions and docs/maintenance.md, "Limits"."""
    (sample,) = [s for s in SAMPLES["samples"] if s["name"] == "two-instances-in-one-event"]
    values = termination_handler_values("https://sqs.us-west-2.amazonaws.com/111122223333/q", "us-west-2")
    instances = [e["entityValue"] for e in sample["event"]["detail"]["affectedEntities"]]
    assert len(instances) == 2
    assert {i for _, i in queue_processor_actions(sample["event"], values)} == {instances[0]}
