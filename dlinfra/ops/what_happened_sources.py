"""The readers behind `dlinfra what-happened`: the Kubernetes API, EC2, Auto Scaling and the termination
handler's SQS queue, with the user's own credentials, read only.

Every call is a Describe*, List*, Get* or ReceiveMessage with VisibilityTimeout=0; no message is ever deleted.
A source that cannot be read becomes an `Unread` line and the rest still runs. The meaning of each answer is in
dlinfra/ops/what_happened.py (pure); this module only fetches and follows links (pod -> node -> instance -> group).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from dlinfra.ops import aws as aws_replies
from dlinfra.ops import what_happened as wh
from dlinfra.ops import what_happened_causes as causes

K8S_TIMEOUT = 10  # seconds per Kubernetes request
EVENT_PAGE = 500  # events per page when scanning for a node's pod events
EVENT_PAGES = 10  # pages scanned at most (events are kept about an hour: a busy cluster has many)
QUEUE_RECEIVES = 10  # ReceiveMessage calls at most: SQS answers each from a sample of its servers
NODES_FOLLOWED = 3  # nodes a pod's events lead to that are read in full
ACTIVITY_PAGES = 5  # DescribeScalingActivities pages (100 each), newest first, until older than --since


NO_CREDENTIALS = (
    "no credentials (set AWS_PROFILE, run `aws sso login`, or export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
)


class SourceError(Exception):
    """One source could not answer; the message is for people ("AccessDenied: ...")."""


# --- Kubernetes ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kube:
    """The few Kubernetes reads the timeline needs, answering the API's own JSON."""

    core: Any  # kubernetes.client.CoreV1Api
    server: str
    batch: Any = None  # kubernetes.client.BatchV1Api

    def _get(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            reply = call(*args, _preload_content=False, _request_timeout=K8S_TIMEOUT, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise SourceError(f"{exc.status} {exc.reason} from {self.server}: {_api_message(exc.body)}") from None
        except HTTPError as exc:
            raise SourceError(f"cannot reach {self.server} ({type(exc).__name__}: {_first_line(exc)})") from None
        return json.loads(reply.data)

    def node(self, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self._get(self.core.read_node, name)
        return found

    def nodes(self) -> list[dict[str, Any]]:
        return list((self._get(self.core.list_node) or {}).get("items") or [])

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self._get(self.core.read_namespaced_pod, name, namespace)
        return found

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        """Every pod bound to the node, in all namespaces."""
        reply = self._get(self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
        return list((reply or {}).get("items") or [])

    def unfinished_pods(self) -> list[dict[str, Any]]:
        """Every pod not yet Succeeded or Failed, in all namespaces."""
        selector = "status.phase!=Succeeded,status.phase!=Failed"
        reply = self._get(self.core.list_pod_for_all_namespaces, field_selector=selector)
        return list((reply or {}).get("items") or [])

    def jobs(self) -> list[dict[str, Any]]:
        """Every batch Job, in all namespaces."""
        return list((self._get(self.batch.list_job_for_all_namespaces) or {}).get("items") or [])

    def events(self, kind: str, name: str, namespace: str | None = None) -> list[dict[str, Any]]:
        selector = f"involvedObject.kind={kind},involvedObject.name={name}"
        if namespace is None:
            reply = self._get(self.core.list_event_for_all_namespaces, field_selector=selector)
        else:
            reply = self._get(self.core.list_namespaced_event, namespace, field_selector=selector)
        return list((reply or {}).get("items") or [])

    def pod_events_on(self, node: str) -> tuple[list[dict[str, Any]], bool]:
        """Events of pods reported from this node (kubelet: Killing, Started...), and whether the scan stopped
        early. Drained pods are gone, and no field selector matches an event's host, so pages are scanned."""
        found: list[dict[str, Any]] = []
        token: str | None = None
        for _ in range(EVENT_PAGES):
            kwargs: dict[str, Any] = {"field_selector": "involvedObject.kind=Pod", "limit": EVENT_PAGE}
            if token:
                kwargs["_continue"] = token
            reply = self._get(self.core.list_event_for_all_namespaces, **kwargs) or {}
            found += [e for e in reply.get("items") or [] if wh.event_host(e) == node]
            token = (reply.get("metadata") or {}).get("continue")
            if not token:
                return found, False
        return found, True


def connect_kube(context: str | None) -> Kube:
    """A client from the user's kubeconfig (KUBECONFIG or ~/.kube/config), or in-cluster credentials."""
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise SourceError("the kubernetes Python package is not installed (pip install kubernetes)") from None
    configuration = client.Configuration()
    try:
        # KUBECONFIG is read now: the client reads it once, at import.
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=where, context=context, client_configuration=configuration
        )
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        problem = f"no usable kubeconfig ({_first_line(exc)})"
        if context or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise SourceError(problem) from None
        try:  # running in a pod: its service account
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except ConfigException:
            raise SourceError(problem) from None
    configuration.retries = 0  # one clear failure, not three slow ones
    api = client.ApiClient(configuration)
    return Kube(core=client.CoreV1Api(api), server=configuration.host, batch=client.BatchV1Api(api))


def _api_message(body: Any) -> str:
    try:
        return str(json.loads(body).get("message", body))
    except (TypeError, ValueError, AttributeError):
        return _first_line(body)


def _first_line(value: Any) -> str:
    lines = str(value).strip().splitlines()
    return lines[0] if lines else ""


# --- AWS ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Aws:
    """boto3 clients for one region."""

    region: str
    ec2: Any
    autoscaling: Any
    sqs: Any


def connect_aws(region: str, session: Any) -> Aws:
    """Clients from the user's boto3 session; SourceError when it has no credentials."""
    if session.get_credentials() is None:
        raise SourceError(NO_CREDENTIALS)
    return Aws(
        region=region,
        ec2=session.client("ec2", region_name=region),
        autoscaling=session.client("autoscaling", region_name=region),
        sqs=session.client("sqs", region_name=region),
    )


def _aws(what: str, call: Callable[[], Any]) -> Any:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call()
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise SourceError(f"{what}: {error.get('Code', 'error')}: {error.get('Message', '')}".rstrip(": ")) from None
    except BotoCoreError as exc:
        raise SourceError(f"{what}: {exc}") from None


# --- following the links ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Request:
    """What to read: the target, the window, and where the AWS side lives."""

    target: wh.Target
    since: datetime
    now: datetime
    region: str | None = None  # --region, else the node's zone, else the session's default
    queue_url: str | None = None  # the termination handler's queue; None: not read
    # Auto Scaling groups to search when an instance no longer says its own (the stack's node_pools output)
    groups: tuple[str, ...] = ()


def investigate(
    request: Request,
    *,
    kube: Kube | SourceError,
    aws: Callable[[str], Aws],
    default_region: str | None,
) -> wh.Timeline:
    """Read every source the target leads to; `aws(region)` may raise SourceError (no credentials)."""
    timeline = wh.Timeline(target=request.target, since=request.since, until=request.now)
    events: list[wh.Event] = []
    state = _State(timeline=timeline, events=events, now=request.now)
    if isinstance(kube, SourceError):
        timeline.unread.append(wh.Unread("Kubernetes", str(kube)))
    else:
        state.kube = kube
        try:
            _from_kubernetes(state, request.target)
        except SourceError as exc:
            timeline.unread.append(wh.Unread("Kubernetes", str(exc)))
            state.kube = None
    region = request.region or timeline.region or default_region
    if region is None:
        timeline.unread.append(wh.Unread("AWS", "no region: pass --region (or a node whose providerID names its zone)"))
    else:
        timeline.region = region
        try:
            clients = aws(region)
        except SourceError as exc:
            timeline.unread.append(wh.Unread("AWS", str(exc)))
        else:
            try:
                with aws_replies.reading("AWS"):
                    _from_aws(state, clients, request)
            except aws_replies.AwsError as exc:  # a reply of a shape not known: the rest is still told
                timeline.unread.append(wh.Unread("AWS", exc.detail))
    asked = f"instance/{request.target.name}"
    if request.target.kind == "instance" and any(e.subject == asked for e in events):
        timeline.found("instance", request.target.name)  # a source told of it, though EC2 no longer knows it
    timeline.events = wh.merge(events, request.since, request.now)
    # Who disrupted each pod, and whether it waited for the pod's grace (docs/what-happened.md).
    timeline.notes += [str(d) for d in causes.disruptions(timeline.events, state.graces)]
    return timeline


@dataclass
class _State:
    timeline: wh.Timeline
    events: list[wh.Event]
    now: datetime
    kube: Kube | None = None
    node_list: list[dict[str, Any]] | None = None
    graces: dict[str, int] = field(default_factory=dict)  # pod/NS/NAME -> terminationGracePeriodSeconds

    def nodes(self) -> list[dict[str, Any]]:
        assert self.kube is not None
        if self.node_list is None:
            self.node_list = self.kube.nodes()
        return self.node_list


def _from_kubernetes(state: _State, target: wh.Target) -> None:
    kube = state.kube
    assert kube is not None
    if target.kind in ("node", "name"):
        node = kube.node(target.name)
        if node is not None or target.kind == "node":
            _read_node(state, target.name, node, pod_events=True)
            return
    if target.kind in ("pod", "name"):
        _read_pod(state, target.namespace or "default", target.name)
        return
    by_instance = [n for n in state.nodes() if (wh.instance_of(_provider_id(n)) or ("", ""))[0] == target.name]
    if by_instance:
        _read_node(state, by_instance[0]["metadata"]["name"], by_instance[0], pod_events=True)


def _provider_id(node: Mapping[str, Any]) -> str:
    return str((node.get("spec") or {}).get("providerID") or "")


def _read_node(state: _State, name: str, node: dict[str, Any] | None, *, pod_events: bool) -> None:
    kube = state.kube
    assert kube is not None
    timeline = state.timeline
    timeline.found("node", name)
    if node is None:
        timeline.notes.append(f"node {name} no longer exists in the cluster: only its events are shown")
    else:
        state.events.extend(wh.node_events(node) + wh.node_now(node, state.now))
        placed = wh.instance_of(_provider_id(node))
        if placed is not None:
            timeline.found("instance", placed[0])
            timeline.region = timeline.region or wh.region_of_zone(placed[1])
    state.events.extend(e for e in map(wh.k8s_event, kube.events("Node", name)) if e is not None)
    if pod_events:
        items, truncated = kube.pod_events_on(name)
        for item in items:
            event = wh.k8s_event(item)
            if event is not None:
                state.events.append(event)
                timeline.found("pod", event.subject.removeprefix("pod/"))
        if truncated:
            timeline.notes.append(
                f"pod events from {name}: stopped after {EVENT_PAGE * EVENT_PAGES} events; older ones not read"
            )


def _read_pod(state: _State, namespace: str, name: str) -> None:
    kube = state.kube
    assert kube is not None
    timeline = state.timeline
    pod = kube.pod(namespace, name)
    items = kube.events("Pod", name, namespace)
    if pod is None and not items:
        raise SourceError(
            f"no pod {namespace}/{name} and no events for it (events are kept about an hour; for a node, say node/NAME)"
        )
    timeline.found("pod", f"{namespace}/{name}")
    if pod is None:
        timeline.notes.append(f"pod {namespace}/{name} no longer exists: only its events are shown")
    else:
        state.events.extend(wh.pod_events(pod))
        # The kubelet's default is 30 s (core/v1 PodSpec terminationGracePeriodSeconds).
        state.graces[f"pod/{namespace}/{name}"] = int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
    state.events.extend(e for e in map(wh.k8s_event, items) if e is not None)
    nodes = wh.nodes_in_pod_events(items)
    current = ((pod or {}).get("spec") or {}).get("nodeName")
    if current and current not in nodes:
        nodes.append(current)
    for node_name in nodes[-NODES_FOLLOWED:]:
        _read_node(state, node_name, kube.node(node_name), pod_events=False)


def _from_aws(state: _State, aws: Aws, request: Request) -> None:
    timeline = state.timeline
    target = request.target
    if not timeline.instances and target.kind in ("node", "name"):
        # The Node is gone (or never had a providerID): EKS names nodes by the instance's private DNS name.
        try:
            reply = _aws(
                "DescribeInstances",
                lambda: aws.ec2.describe_instances(Filters=[{"Name": "private-dns-name", "Values": [target.name]}]),
            )
            for reservation in reply.get("Reservations") or []:
                for instance in reservation.get("Instances") or []:
                    timeline.found("instance", instance.get("InstanceId"))
        except SourceError as exc:
            timeline.unread.append(wh.Unread("EC2", str(exc)))
    # An instance asked for is found only once a source knows it (EC2, its group, a node, the queue).
    asked = [target.name] if target.kind == "instance" else []
    for instance_id in dict.fromkeys(asked + timeline.instances):
        _read_instance(state, aws, instance_id, request.groups)
    _read_queue(state, aws, request.queue_url, asked)


def _read_instance(state: _State, aws: Aws, instance_id: str, candidates: tuple[str, ...]) -> None:
    timeline = state.timeline
    groups: list[str] = []
    dns_names: list[str] = []
    try:
        reply = _aws("DescribeInstances", lambda: aws.ec2.describe_instances(InstanceIds=[instance_id]))
        for reservation in reply.get("Reservations") or []:
            for instance in reservation.get("Instances") or []:
                timeline.found("instance", instance.get("InstanceId"))
                state.events.extend(wh.instance_events(instance, state.now))
                tags = {t.get("Key"): t.get("Value") for t in instance.get("Tags") or []}
                groups.append(tags.get("aws:autoscaling:groupName") or "")
                dns_names.append(instance.get("PrivateDnsName") or "")
        status = _aws(
            "DescribeInstanceStatus",
            lambda: aws.ec2.describe_instance_status(InstanceIds=[instance_id], IncludeAllInstances=True),
        )
        for item in status.get("InstanceStatuses") or []:
            state.events.extend(wh.instance_status_events(item))
    except SourceError as exc:
        timeline.unread.append(wh.Unread("EC2", str(exc)))
    if state.kube is not None and not timeline.nodes and any(dns_names):
        # No Node has this instance's providerID (deleted already): EKS named it by the private DNS name.
        try:
            _read_node(state, next(n for n in dns_names if n), None, pod_events=True)
        except SourceError as exc:
            timeline.unread.append(wh.Unread("Kubernetes", str(exc)))
    try:
        members = _aws(
            "DescribeAutoScalingInstances",
            lambda: aws.autoscaling.describe_auto_scaling_instances(InstanceIds=[instance_id]),
        )
        for member in members.get("AutoScalingInstances") or []:
            timeline.found("instance", instance_id)
            groups.append(member.get("AutoScalingGroupName", ""))
            if member.get("LifecycleState") not in (None, "InService"):
                subject = f"instance/{instance_id}"
                state.events.append(
                    wh.Event(state.now, "autoscaling", subject, "now", f"lifecycle state {member['LifecycleState']}")
                )
        named = [g for g in dict.fromkeys(groups) if g]
        activities = {g: _activities(state, aws, g) for g in named or candidates}
        # An instance's group tag is gone once it is detached: then the group whose activities name it.
        for group in named or [g for g, found in activities.items() if _names(found, instance_id)]:
            timeline.found("group", group)
            _read_group(state, aws, group, instance_id, activities[group])
    except SourceError as exc:
        timeline.unread.append(wh.Unread("Auto Scaling", str(exc)))


def _read_group(state: _State, aws: Aws, group: str, instance_id: str, activities: list[dict[str, Any]]) -> None:
    hooks = _aws("DescribeLifecycleHooks", lambda: aws.autoscaling.describe_lifecycle_hooks(AutoScalingGroupName=group))
    for hook in hooks.get("LifecycleHooks") or []:
        state.timeline.notes.append(
            f"group {group}: lifecycle hook {hook.get('LifecycleHookName')} on {hook.get('LifecycleTransition')}, "
            f"heartbeat {hook.get('HeartbeatTimeout')}s, default {hook.get('DefaultResult')}"
        )
    related = wh.related_activities(activities, instance_id)
    state.events.extend(wh.activity_events(related))
    for activity in related:
        replacement = wh.launched_instance(activity)
        if replacement and replacement != instance_id:
            state.timeline.notes.append(f"{instance_id} was replaced by {replacement} (next launch in {group})")
            _read_replacement_node(state, replacement)


def _activities(state: _State, aws: Aws, group: str) -> list[dict[str, Any]]:
    """The group's scaling activities, newest first, back to --since (a few pages at most)."""
    activities: list[dict[str, Any]] = []
    token: str | None = None
    for _ in range(ACTIVITY_PAGES):
        kwargs: dict[str, Any] = {"AutoScalingGroupName": group, "MaxRecords": 100}
        if token:
            kwargs["NextToken"] = token
        reply = _aws("DescribeScalingActivities", partial(aws.autoscaling.describe_scaling_activities, **kwargs))
        page = reply.get("Activities") or []
        activities += page
        token = reply.get("NextToken")
        starts = [t for t in (wh.when(a.get("StartTime")) for a in page) if t is not None]
        if not token or (starts and min(starts) < state.timeline.since):
            break
    return activities


def _names(activities: list[dict[str, Any]], instance_id: str) -> bool:
    return any(instance_id in str(a.get("Description", "")) for a in activities)


def _read_replacement_node(state: _State, instance_id: str) -> None:
    """The node the replacement instance became, if it has joined: its registration and readiness."""
    if state.kube is None:
        return
    try:
        joined = [n for n in state.nodes() if (wh.instance_of(_provider_id(n)) or ("", ""))[0] == instance_id]
    except SourceError as exc:
        state.timeline.unread.append(wh.Unread("Kubernetes", str(exc)))
        return
    for node in joined:
        state.timeline.found("node", node["metadata"]["name"])
        state.events.extend(e for e in wh.node_events(node) if e.what in ("node registered", "Ready=True"))


def _read_queue(state: _State, aws: Aws, queue_url: str | None, asked: list[str]) -> None:
    """Peek at the termination handler's queue: VisibilityTimeout=0 leaves every message where it was."""
    timeline = state.timeline
    if not queue_url:
        timeline.unread.append(
            wh.Unread("termination queue", "no queue URL: pass --queue-url URL, or --stack <env>-<region>")
        )
        return
    seen: dict[str, str] = {}
    try:
        for _ in range(QUEUE_RECEIVES):
            reply = _aws(
                "ReceiveMessage",
                lambda: aws.sqs.receive_message(
                    QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=0, WaitTimeSeconds=0
                ),
            )
            fresh = {
                m["MessageId"]: m.get("Body", "") for m in reply.get("Messages") or [] if m["MessageId"] not in seen
            }
            if not fresh:
                break
            seen.update(fresh)
    except SourceError as exc:
        timeline.unread.append(wh.Unread("termination queue", str(exc)))
        if not seen:
            return
    wanted = list(dict.fromkeys(asked + timeline.instances))
    about = [e for e in (wh.queue_message_event(body, wanted) for body in seen.values()) if e is not None]
    state.events.extend(about)
    timeline.notes.append(
        f"termination queue: {len(seen)} message(s) peeked (none deleted), {len(about)} about "
        f"{', '.join(wanted) or 'no instance found'}; the handler deletes what it has handled"
    )
