"""The timeline core of `dlinfra what-happened`: typed events, what each source's answer means, merge and render.

Pure: no AWS or Kubernetes calls here (dlinfra/ops/what_happened_sources.py reads them). Each `*_events` function
turns one API answer, in the shape the API returns it (Kubernetes objects as their JSON, boto3 replies as
dicts), into events. Schema of --json and the sources: docs/what-happened.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlinfra.errors import DlinfraError

SCHEMA = "dlinfra.what-happened/v1"
# Sources, in the order they are listed when two events share a second (cause before effect, mostly).
SOURCES = ("termination-queue", "ec2", "autoscaling", "kubernetes")
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8}(?:[0-9a-f]{9})?$")
# EKS nodes: spec.providerID is aws:///<zone>/<instance-id>.
PROVIDER_ID = re.compile(r"^aws:///(?P<zone>[a-z]{2}(?:-[a-z]+)+-\d[a-z])/(?P<instance>i-[0-9a-f]+)$")
# DescribeInstances StateTransitionReason: "User initiated (2025-06-11 08:04:30 GMT)".
REASON_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")
DURATION = re.compile(r"^(\d+)([mhdw])$")
UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


@dataclass(frozen=True)
class Event:
    """One thing that happened, as one source saw it."""

    time: datetime  # UTC
    source: str  # one of SOURCES
    subject: str  # node/NAME, pod/NAMESPACE/NAME, instance/ID or group/NAME
    what: str  # short: an event reason, a state, an activity
    detail: str = ""  # one line, as the source words it

    def sort_key(self) -> tuple[datetime, int, str, str, str]:
        return (self.time, SOURCES.index(self.source), self.subject, self.what, self.detail)

    def to_json(self) -> dict[str, str]:
        return {
            "time": iso(self.time),
            "source": self.source,
            "subject": self.subject,
            "what": self.what,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Unread:
    """What one source could not tell, and why ("EC2: AccessDenied: ...")."""

    source: str  # Kubernetes, EC2, Auto Scaling, termination queue
    problem: str

    def __str__(self) -> str:
        return f"{self.source}: {self.problem}"


@dataclass(frozen=True)
class Target:
    """What was asked about, as typed: a node, an instance id or a pod."""

    kind: str  # node, instance, pod, or "name" (a node if one has that name, else a pod)
    name: str  # node name, instance id, or pod name
    namespace: str = ""  # pods only

    @property
    def label(self) -> str:
        if self.kind == "pod":
            return f"pod/{self.namespace}/{self.name}"
        return self.name if self.kind == "name" else f"{self.kind}/{self.name}"


@dataclass
class Timeline:
    """The merged answer: what was asked, what it led to, the events and what could not be read."""

    target: Target
    since: datetime
    until: datetime
    nodes: list[str] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    region: str | None = None
    notes: list[str] = field(default_factory=list)  # context without a time: lifecycle hooks, queue read
    events: list[Event] = field(default_factory=list)
    unread: list[Unread] = field(default_factory=list)

    def found(self, kind: str, value: str | None) -> None:
        """Record a node, instance, pod or group the target led to (once, in the order found)."""
        if not value:
            return
        bucket = {"node": self.nodes, "instance": self.instances, "pod": self.pods, "group": self.groups}[kind]
        if value not in bucket:
            bucket.append(value)

    @property
    def anything_found(self) -> bool:
        """Whether any source knew the target: a node, instance, pod or group it led to."""
        return bool(self.nodes or self.instances or self.pods or self.groups)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "target": {"asked": self.target.label, "kind": self.target.kind},
            "found": self.anything_found,
            "since": iso(self.since),
            "until": iso(self.until),
            "region": self.region,
            "nodes": self.nodes,
            "instances": self.instances,
            "pods": self.pods,
            "groups": self.groups,
            "notes": self.notes,
            "events": [e.to_json() for e in self.events],
            "unread": [{"source": u.source, "problem": u.problem} for u in self.unread],
        }


# --- input --------------------------------------------------------------------------------------------------


def parse_target(text: str, namespace: str = "default") -> Target:
    """NODE, INSTANCE-ID or POD: `i-...` is an instance; node/NAME, pod/NAME, pod/NS/NAME or NS/NAME say which."""
    value = text.strip()
    if INSTANCE_ID.match(value):
        return Target("instance", value)
    parts = value.split("/")
    if len(parts) == 2 and parts[0] == "node" and parts[1]:
        return Target("node", parts[1])
    if len(parts) == 2 and parts[0] == "pod" and parts[1]:
        return Target("pod", parts[1], namespace)
    if len(parts) == 3 and parts[0] == "pod" and parts[1] and parts[2]:
        return Target("pod", parts[2], parts[1])
    if len(parts) == 2 and all(parts):
        return Target("pod", parts[1], parts[0])
    if len(parts) == 1 and value:
        return Target("name", value, namespace)
    raise DlinfraError(
        f"{text!r} is not a target: give an instance id (i-0123456789abcdef0), a node (node/NAME or NAME) "
        "or a pod (NAMESPACE/NAME, pod/NAME with --namespace)",
        key="what-happened",
    )


def parse_since(text: str, now: datetime) -> datetime:
    """--since: a duration back from now (30m, 6h, 2d, 1w) or an ISO 8601 time (UTC unless it says)."""
    value = text.strip()
    duration = DURATION.match(value)
    if duration:
        return now - timedelta(**{UNITS[duration.group(2)]: int(duration.group(1))})
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise DlinfraError(
            f"{text!r} is neither a duration (30m, 6h, 2d, 1w) nor an ISO time (2025-06-09T08:00:00Z)",
            key="--since",
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def instance_of(provider_id: str) -> tuple[str, str] | None:
    """(instance id, availability zone) of an EKS node's spec.providerID; None for other providers (hybrid)."""
    found = PROVIDER_ID.match(provider_id or "")
    return (found.group("instance"), found.group("zone")) if found else None


def region_of_zone(zone: str) -> str:
    return zone[:-1]


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def when(value: Any) -> datetime | None:
    """A time as an API gives it: datetime (boto3), RFC 3339 (Kubernetes, EventBridge) or RFC 1123 (AWS Health)."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        try:
            moment = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


# --- Kubernetes ---------------------------------------------------------------------------------------------


def k8s_event(item: Mapping[str, Any]) -> Event | None:
    """A core/v1 Event (as JSON) on the timeline, at its last occurrence; repeats are counted in the detail."""
    moment = (
        when(item.get("lastTimestamp"))
        or when(item.get("eventTime"))
        or when(item.get("firstTimestamp"))
        or when((item.get("metadata") or {}).get("creationTimestamp"))
    )
    if moment is None:
        return None
    obj = item.get("involvedObject") or {}
    kind = str(obj.get("kind", "")).lower()
    subject = f"pod/{obj.get('namespace', '')}/{obj.get('name', '')}" if kind == "pod" else f"{kind}/{obj.get('name')}"
    source = item.get("source") or {}
    reporter = item.get("reportingComponent") or source.get("component") or ""
    detail = " ".join(str(item.get("message", "")).split())
    count = item.get("count") or 0
    if isinstance(count, int) and count > 1:
        detail += f" (x{count} since {iso(when(item.get('firstTimestamp')) or moment)})"
    if reporter:
        detail += f" [{reporter}]"
    what = str(item.get("reason", "")) + (" (Warning)" if item.get("type") == "Warning" else "")
    return Event(moment, "kubernetes", subject, what, detail)


def event_host(item: Mapping[str, Any]) -> str:
    """The node an event was reported from (kubelet events: source.host, or reportingInstance)."""
    return str((item.get("source") or {}).get("host") or item.get("reportingInstance") or "")


ASSIGNED = re.compile(r"^Successfully assigned \S+ to (?P<node>\S+)$")


def nodes_in_pod_events(items: Iterable[Mapping[str, Any]]) -> list[str]:
    """Nodes a pod was scheduled to or reported from, per its events, in time order (a pod that was evicted and
    recreated under the same name ran on several)."""
    found: list[tuple[datetime, str]] = []
    for item in items:
        assigned = ASSIGNED.match(str(item.get("message", "")))
        node = assigned.group("node") if assigned else event_host(item)
        event = k8s_event(item)
        if node and event is not None:
            found.append((event.time, node))
    ordered: list[str] = []
    for _, node in sorted(found):
        if node not in ordered:
            ordered.append(node)
    return ordered


def _created(meta: Mapping[str, Any], subject: str, what: str, detail: str) -> list[Event]:
    moment = when(meta.get("creationTimestamp"))
    return [] if moment is None else [Event(moment, "kubernetes", subject, what, detail)]


def node_events(node: Mapping[str, Any]) -> list[Event]:
    """A Node's history as the object still shows it: creation, condition transitions, taints with their time."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    subject = f"node/{meta.get('name')}"
    out = _created(meta, subject, "node registered", f"providerID {spec.get('providerID', '-')}")
    for cond in (node.get("status") or {}).get("conditions") or []:
        moment = when(cond.get("lastTransitionTime"))
        if moment is None:
            continue
        message = " ".join(str(cond.get("message", "")).split())
        detail = f"{cond.get('reason', '')}: {message}".strip(": ")
        out.append(Event(moment, "kubernetes", subject, f"{cond.get('type')}={cond.get('status')}", detail))
    for taint in spec.get("taints") or []:
        moment = when(taint.get("timeAdded"))
        text = f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}".replace("=:", ":")
        if moment is not None:
            out.append(Event(moment, "kubernetes", subject, "tainted", text))
    return out


def node_now(node: Mapping[str, Any], now: datetime) -> list[Event]:
    """What the Node shows now without a time of its own (cordon without an event, taints without timeAdded)."""
    spec = node.get("spec") or {}
    subject = f"node/{(node.get('metadata') or {}).get('name')}"
    untimed = [
        f"{t.get('key')}:{t.get('effect')}" for t in spec.get("taints") or [] if when(t.get("timeAdded")) is None
    ]
    state = ["cordoned (spec.unschedulable)"] if spec.get("unschedulable") else []
    if not state and not untimed:
        return []
    return [
        Event(
            now, "kubernetes", subject, "now", "; ".join(state + (["taints " + ", ".join(untimed)] if untimed else []))
        )
    ]


def pod_events(pod: Mapping[str, Any]) -> list[Event]:
    """A Pod's own record: creation, conditions, container starts and terminations, and the node it is on."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    subject = f"pod/{meta.get('namespace')}/{meta.get('name')}"
    out = _created(meta, subject, "pod created", f"uid {meta.get('uid', '-')}")
    for cond in status.get("conditions") or []:
        moment = when(cond.get("lastTransitionTime"))
        if moment is not None:
            detail = " ".join(f"{cond.get('reason', '')} {cond.get('message', '')}".split())
            out.append(Event(moment, "kubernetes", subject, f"{cond.get('type')}={cond.get('status')}", detail))
    node = (pod.get("spec") or {}).get("nodeName", "")
    for container in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
        name = container.get("name")
        for which in ("state", "lastState"):
            state = container.get(which) or {}
            running = state.get("running") or {}
            if when(running.get("startedAt")) is not None:
                out.append(
                    Event(when(running["startedAt"]), "kubernetes", subject, "container started", f"{name} on {node}")  # type: ignore[arg-type]
                )
            ended = state.get("terminated") or {}
            if when(ended.get("finishedAt")) is not None:
                detail = (
                    f"{name}: {ended.get('reason', '')}, exit code {ended.get('exitCode')}"
                    + (f", signal {ended['signal']}" if ended.get("signal") else "")
                    + (f" ({ended['message']})" if ended.get("message") else "")
                )
                out.append(Event(when(ended["finishedAt"]), "kubernetes", subject, "container ended", detail))  # type: ignore[arg-type]
    if status.get("reason") or status.get("phase") in ("Failed", "Succeeded"):
        moment = max((e.time for e in out), default=None)
        if moment is not None:
            detail = " ".join(f"{status.get('reason', '')} {status.get('message', '')}".split())
            out.append(Event(moment, "kubernetes", subject, f"phase {status.get('phase')}", detail))
    return out


# --- EC2 ------------------------------------------------------------------------------------------------------


def instance_events(instance: Mapping[str, Any], now: datetime) -> list[Event]:
    """DescribeInstances: the launch, and the current state at the time its transition reason gives."""
    subject = f"instance/{instance.get('InstanceId')}"
    out: list[Event] = []
    launched = when(instance.get("LaunchTime"))
    if launched is not None:
        where = (instance.get("Placement") or {}).get("AvailabilityZone", "")
        out.append(
            Event(launched, "ec2", subject, "launched", f"{instance.get('InstanceType', '')} in {where}".strip())
        )
    state = (instance.get("State") or {}).get("Name", "unknown")
    reason = str(instance.get("StateTransitionReason") or "")
    stamped = REASON_TIME.search(reason)
    if state != "running" or stamped:
        moment = datetime.fromisoformat(stamped.group(1)).replace(tzinfo=UTC) if stamped else now
        code = (instance.get("StateReason") or {}).get("Message", "")
        detail = "; ".join(part for part in (reason, code) if part) + (
            "" if stamped else " (time not given: as of now)"
        )
        out.append(Event(moment, "ec2", subject, f"state {state}", detail))
    return out


def instance_status_events(status: Mapping[str, Any]) -> list[Event]:
    """DescribeInstanceStatus: scheduled events (at their window's start) and impaired status checks."""
    subject = f"instance/{status.get('InstanceId')}"
    out: list[Event] = []
    for scheduled in status.get("Events") or []:
        start = when(scheduled.get("NotBefore"))
        if start is None:
            continue
        end = when(scheduled.get("NotAfter"))
        window = f"window {iso(start)} - {iso(end)}" if end else f"not before {iso(start)}"
        deadline = when(scheduled.get("NotBeforeDeadline"))
        detail = f"{scheduled.get('Description', '')} ({window}" + (f", deadline {iso(deadline)}" if deadline else "")
        detail += f", {scheduled.get('InstanceEventId')})" if scheduled.get("InstanceEventId") else ")"
        out.append(Event(start, "ec2", subject, f"scheduled {scheduled.get('Code')}", detail))
    for check in ("SystemStatus", "InstanceStatus", "AttachedEbsStatus"):
        summary = status.get(check) or {}
        for item in summary.get("Details") or []:
            since = when(item.get("ImpairedSince"))
            if since is not None:
                what = f"{check} {item.get('Name', '')} {item.get('Status', '')}".strip()
                out.append(
                    Event(since, "ec2", subject, "status check impaired", f"{what} (now {summary.get('Status')})")
                )
    return out


# --- Auto Scaling -----------------------------------------------------------------------------------------


def activity_events(activities: Iterable[Mapping[str, Any]]) -> list[Event]:
    """DescribeScalingActivities: each activity at its start, with its cause and status."""
    out: list[Event] = []
    for activity in activities:
        start = when(activity.get("StartTime"))
        if start is None:
            continue
        status = activity.get("StatusCode", "")
        detail = " ".join(str(activity.get("Cause", "")).split())
        if activity.get("StatusMessage"):
            detail += f" ({activity['StatusMessage']})"
        end = when(activity.get("EndTime"))
        detail += f" [{status}" + (f", ended {iso(end)}]" if end else "]")
        subject = f"group/{activity.get('AutoScalingGroupName')}"
        out.append(Event(start, "autoscaling", subject, str(activity.get("Description", "")), detail))
    return out


ACTIVITY_INSTANCE = re.compile(r"\b(i-[0-9a-f]{8,17})\b")


def related_activities(activities: Sequence[Mapping[str, Any]], instance_id: str) -> list[Mapping[str, Any]]:
    """The group's activities about this instance, plus the first launch that started after its termination
    began (its replacement: AWS's cause names the capacity, not the instance replaced)."""
    mine = [a for a in activities if instance_id in str(a.get("Description", ""))]
    ended = [when(a.get("StartTime")) for a in mine if str(a.get("Description", "")).startswith("Terminating")]
    began = min((t for t in ended if t is not None), default=None)
    if began is None:
        return mine
    launches = sorted(
        (a for a in activities if str(a.get("Description", "")).startswith("Launching") and a not in mine),
        key=lambda a: when(a.get("StartTime")) or began,
    )
    replacement = next((a for a in launches if (when(a.get("StartTime")) or began) >= began), None)
    return mine + ([replacement] if replacement is not None else [])


def launched_instance(activity: Mapping[str, Any]) -> str | None:
    found = ACTIVITY_INSTANCE.search(str(activity.get("Description", "")))
    return found.group(1) if found and str(activity.get("Description", "")).startswith("Launching") else None


# --- the termination handler's queue ------------------------------------------------------------------------


def queue_message_event(body: str, instance_ids: Iterable[str]) -> Event | None:
    """One SQS message body as the termination handler reads it (EventBridge envelope, or an Auto Scaling
    lifecycle notification sent straight to the queue), if it is about one of these instances."""
    try:
        message = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(message, dict):
        return None
    wanted = set(instance_ids)
    if "detail-type" in message:
        return _eventbridge(message, wanted)
    if message.get("LifecycleTransition") and message.get("EC2InstanceId") in wanted:
        moment = when(message.get("Time"))
        if moment is None:
            return None
        detail = (
            f"hook {message.get('LifecycleHookName')} of {message.get('AutoScalingGroupName')} (direct notification)"
        )
        return Event(
            moment, "termination-queue", f"instance/{message['EC2InstanceId']}", message["LifecycleTransition"], detail
        )
    return None


def _eventbridge(message: Mapping[str, Any], wanted: set[str]) -> Event | None:
    detail = message.get("detail") or {}
    kind = str(message.get("detail-type"))
    moment = when(message.get("time"))
    resources = [str(r).rsplit("/", 1)[-1] for r in message.get("resources") or []]
    entities = [str(e.get("entityValue")) for e in detail.get("affectedEntities") or [] if isinstance(e, Mapping)]
    candidates = [detail.get("instance-id"), detail.get("EC2InstanceId"), *resources, *entities]
    instance = next((c for c in candidates if c in wanted), None)
    if instance is None or moment is None:
        return None
    subject = f"instance/{instance}"
    if kind == "AWS Health Event":
        start, end = when(detail.get("startTime")), when(detail.get("endTime"))
        window = f"from {iso(start)}" if start else ""
        window += f" to {iso(end)}" if end else ""
        text = next(
            (d.get("latestDescription", "") for d in detail.get("eventDescription") or [] if isinstance(d, Mapping)), ""
        )
        words = " ".join(str(text).split())
        line = f"{detail.get('eventTypeCode', '')} {window}: {words}".strip(": ")
        return Event(moment, "termination-queue", subject, "AWS Health scheduled change", line)
    if kind == "EC2 Spot Instance Interruption Warning":
        return Event(
            moment, "termination-queue", subject, "spot interruption warning", f"action {detail.get('instance-action')}"
        )
    if kind == "EC2 Instance Rebalance Recommendation":
        return Event(moment, "termination-queue", subject, "rebalance recommendation", "")
    if kind == "EC2 Instance State-change Notification":
        return Event(moment, "termination-queue", subject, "state-change notification", f"state {detail.get('state')}")
    if kind.endswith("Lifecycle Action"):
        hook, group = detail.get("LifecycleHookName"), detail.get("AutoScalingGroupName")
        line = f"{detail.get('LifecycleTransition')} hook {hook} of {group}"
        return Event(moment, "termination-queue", subject, kind, line)
    return Event(moment, "termination-queue", subject, kind, "")


# --- merge and render ---------------------------------------------------------------------------------------


def merge(events: Iterable[Event], since: datetime, until: datetime) -> list[Event]:
    """One time-ordered list within [since, until], each event once (two paths can read the same one)."""
    kept = {e for e in events if since <= e.time <= until}
    return sorted(kept, key=Event.sort_key)


def render_table(timeline: Timeline, console: Console) -> None:
    """The readable form: what was asked and found, the timeline, then what could not be read."""
    found = [
        f"{label} {', '.join(values)}"
        for label, values in (
            ("nodes", timeline.nodes),
            ("instances", timeline.instances),
            ("pods", timeline.pods),
            ("groups", timeline.groups),
        )
        if values
    ]
    console.print(
        f"What happened to {timeline.target.label}, {iso(timeline.since)} to {iso(timeline.until)}"
        + (f" ({timeline.region})" if timeline.region else ""),
        markup=False,
    )
    if found:
        console.print("Found: " + "; ".join(found), markup=False)
    else:
        console.print(f"Nothing found: no source that could be read knows {timeline.target.label}.", markup=False)
    for note in timeline.notes:
        console.print(f"Note: {note}", markup=False)
    table = Table(show_lines=False)
    for column in ("time (UTC)", "source", "subject", "what", "detail"):
        table.add_column(column, overflow="fold")
    for e in timeline.events:
        table.add_row(iso(e.time), e.source, Text(e.subject), Text(e.what), Text(e.detail))
    console.print(table)
    if not timeline.events:
        console.print("No events in this window.", markup=False)
    for problem in timeline.unread:
        console.print(f"Could not read {problem}", markup=False)
