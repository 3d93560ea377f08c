"""`dlinfra what-happened` tells a recorded maintenance story: moto for AWS, a Kubernetes API on loopback.

The story (tests/fixtures/what_happened/): an instance of a GPU node group gets an EC2 instance-stop event,
announced 2025-06-09T08:00Z for 2025-06-11T08:00Z; the termination handler's queue holds the AWS Health
message; the handler cordons, taints and drains the node (its pod is killed and rescheduled elsewhere); the
instance is stopped, the group terminates it and launches a replacement, whose node joins.

AWS is moto, in process: it makes the group, the instances (on a story clock: moto's EC2 clock is patched),
the lifecycle hook and the queue. moto cannot produce two answers, so its handlers for them are replaced by
the recorded replies, which still go through moto's serializer and botocore's parser: DescribeInstanceStatus
(moto has no scheduled events) and DescribeScalingActivities (moto always answers an empty list).
Kubernetes is a small read-only API server on 127.0.0.1 answering from recorded objects, with a kubeconfig
pointing at it, so the official client's real requests (paths, field selectors, paging) are exercised.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from moto import mock_aws
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import ActionResult
from moto.ec2.responses.instances import InstanceResponse

from dlinfra.cli import main as cli
from dlinfra.errors import DlinfraError
from dlinfra.ops import what_happened as wh

FIXTURES = Path(__file__).parent.parent / "fixtures" / "what_happened"
REGION = "us-west-2"
GROUP = "dlinfra-prod-us-west-2-pool-train-a100"
OLD, NEW = "i-0f1e2d3c4b5a69788", "i-0a1b2c3d4e5f60718"  # stand-ins in the fixtures for moto's ids
OLD_NODE = "ip-10-20-1-17.us-west-2.compute.internal"
NEW_NODE = "ip-10-20-2-45.us-west-2.compute.internal"
OTHER_NODE = "ip-10-20-3-88.us-west-2.compute.internal"
SINCE = "2025-06-01T00:00:00Z"
LAUNCHED = datetime(2025, 6, 2, 10, 0, 0)  # moto's clock when the group launches the first instance
TERMINATED = datetime(2025, 6, 11, 8, 4, 30)  # ...and when the group terminates it


# --- a Kubernetes API from recorded objects -------------------------------------------------------------------


class RecordedApi(ThreadingHTTPServer):
    """GET-only answers from recorded objects; field selectors on involvedObject, limit/continue paging."""

    daemon_threads = True

    def __init__(self, objects: dict[str, list[dict[str, Any]]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects = objects
        self.requests: list[tuple[str, str]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: RecordedApi

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self.server.requests.append(("GET", self.path))
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        objects = self.server.objects
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            return self._one([n for n in objects["nodes"] if n["metadata"]["name"] == parts[3]], "nodes", parts[3])
        if parts == ["api", "v1", "nodes"]:
            return self._list("NodeList", objects["nodes"], query)
        if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            pods = [
                p
                for p in objects["pods"]
                if (p["metadata"]["namespace"], p["metadata"]["name"]) == (parts[3], parts[5])
            ]
            return self._one(pods, "pods", parts[5])
        if parts == ["api", "v1", "pods"]:  # the pods on a node (spec.nodeName=NODE), or not finished (status.phase!=)
            selector = query.get("fieldSelector", "")
            if selector.startswith("spec.nodeName="):
                node = selector.removeprefix("spec.nodeName=")
                return self._list("PodList", [p for p in objects["pods"] if p["spec"].get("nodeName") == node], query)
            done = {term.removeprefix("status.phase!=") for term in selector.split(",") if term}
            return self._list("PodList", [p for p in objects["pods"] if p["status"].get("phase") not in done], query)
        if parts == ["apis", "batch", "v1", "jobs"]:
            return self._list("JobList", objects.get("jobs", []), query)
        if parts == ["api", "v1", "events"] or (len(parts) == 5 and parts[4] == "events"):
            events = [e for e in objects["events"] if len(parts) == 3 or e["metadata"]["namespace"] == parts[3]]
            return self._list("EventList", [e for e in events if _selected(e, query.get("fieldSelector", ""))], query)
        return self._send(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})

    def _refuse(self) -> None:  # what-happened only reads: anything else is recorded and refused
        self.server.requests.append((self.command, self.path))
        self._send(405, {"kind": "Status", "status": "Failure", "code": 405})

    def do_POST(self) -> None:
        self._refuse()

    def do_PUT(self) -> None:
        self._refuse()

    def do_PATCH(self) -> None:
        self._refuse()

    def do_DELETE(self) -> None:
        self._refuse()

    def _one(self, found: list[dict[str, Any]], kind: str, name: str) -> None:
        if found:
            return self._send(200, found[0])
        message = f'{kind} "{name}" not found'
        return self._send(
            404, {"kind": "Status", "status": "Failure", "message": message, "reason": "NotFound", "code": 404}
        )

    def _list(self, kind: str, items: list[dict[str, Any]], query: dict[str, str]) -> None:
        start = int(query.get("continue", "0"))
        limit = int(query.get("limit", "0")) or len(items) or 1
        page = items[start : start + limit]
        more = str(start + limit) if start + limit < len(items) else None
        metadata = {"resourceVersion": "918273"} | ({"continue": more} if more else {})
        self._send(200, {"kind": kind, "apiVersion": "v1", "metadata": metadata, "items": page})

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _selected(event: dict[str, Any], selector: str) -> bool:
    obj = event["involvedObject"]
    for clause in filter(None, selector.split(",")):
        key, _, value = clause.partition("=")
        if not key.startswith("involvedObject.") or obj.get(key.removeprefix("involvedObject.")) != value:
            return False
    return True


def write_kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "story", "cluster": {"server": server}}],
        "users": [{"name": "reader", "user": {"token": "recorded-story"}}],
        "contexts": [{"name": "story", "context": {"cluster": "story", "user": "reader"}}],
        "current-context": "story",
    }
    path.write_text(json.dumps(config))
    return path


# --- the story --------------------------------------------------------------------------------------------------


@dataclass
class Story:
    old: str
    new: str
    queue_url: str
    outputs: Path
    api: RecordedApi
    sqs: Any
    tmp: Path
    substitutions: dict[str, str] = field(default_factory=dict)

    def argv(self, target: str, *extra: str) -> list[str]:
        return [
            "what-happened",
            target,
            "--since",
            SINCE,
            "--stack",
            f"prod-{REGION}",
            "--outputs",
            str(self.outputs),
            *extra,
        ]


def _fixture(name: str, substitutions: dict[str, str]) -> Any:
    text = (FIXTURES / name).read_text()
    for recorded, real in substitutions.items():
        text = text.replace(recorded, real)
    return json.loads(text)


@pytest.fixture
def story(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Story]:
    clock = [LAUNCHED]
    monkeypatch.setattr("moto.ec2.models.instances.utcnow", lambda: clock[0])
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never the link-local metadata address
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        autoscaling = boto3.client("autoscaling", region_name=REGION)
        sqs = boto3.client("sqs", region_name=REGION)
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        ec2.create_launch_template(
            LaunchTemplateName="train-a100", LaunchTemplateData={"ImageId": image, "InstanceType": "p4d.24xlarge"}
        )
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=GROUP,
            LaunchTemplate={"LaunchTemplateName": "train-a100", "Version": "$Latest"},
            MinSize=0,
            MaxSize=4,
            DesiredCapacity=1,
            AvailabilityZones=[f"{REGION}a"],
        )
        autoscaling.put_lifecycle_hook(
            AutoScalingGroupName=GROUP,
            LifecycleHookName="drain-before-terminate",
            LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
            HeartbeatTimeout=900,
            DefaultResult="CONTINUE",
        )
        old = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0][
            "Instances"
        ][0]["InstanceId"]
        clock[0] = TERMINATED
        autoscaling.terminate_instance_in_auto_scaling_group(InstanceId=old, ShouldDecrementDesiredCapacity=False)
        members = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]
        (new,) = [i["InstanceId"] for i in members["Instances"] if i["InstanceId"] != old]
        substitutions = {OLD: old, NEW: new, "GROUP": GROUP}
        recorded = _fixture("aws.json", substitutions)
        queue_url = sqs.create_queue(QueueName="dlinfra-prod-us-west-2-nth")["QueueUrl"]
        for message in recorded["queue"]:
            sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(message))

        def instance_status(response: InstanceResponse) -> ActionResult:
            wanted = response._get_param("InstanceIds", [])
            status = recorded["instance_status"]
            return ActionResult({"InstanceStatuses": [status] if status["InstanceId"] in wanted else []})

        def scaling_activities(response: AutoScalingResponse) -> ActionResult:
            name = response._get_param("AutoScalingGroupName")
            return ActionResult(
                {"Activities": [a for a in recorded["scaling_activities"] if a["AutoScalingGroupName"] == name]}
            )

        monkeypatch.setattr(InstanceResponse, "describe_instance_status", instance_status)
        monkeypatch.setattr(AutoScalingResponse, "describe_scaling_activities", scaling_activities)
        outputs = tmp_path / "outputs.json"
        outputs.write_text(
            json.dumps(
                {
                    "environment": "prod",
                    "region": REGION,
                    "termination_queue_url": queue_url,
                    "node_pools": {"train-a100": GROUP, "cpu": "dlinfra-prod-us-west-2-pool-cpu"},
                }
            )
        )
        api = RecordedApi(_fixture("k8s.json", substitutions))
        thread = threading.Thread(target=api.serve_forever, daemon=True)
        thread.start()
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", api.url)))
        try:
            yield Story(old, new, queue_url, outputs, api, sqs, tmp_path, substitutions)
        finally:
            api.shutdown()
            api.server_close()


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def timeline_json(story: Story, capsys: pytest.CaptureFixture[str], target: str, *extra: str) -> dict[str, Any]:
    code, out, err = run(capsys, story.argv(target, "--json", *extra))
    assert code == 0, err
    document: dict[str, Any] = json.loads(out)
    return document


# --- the story, told ------------------------------------------------------------------------------------------


def test_instance_story_in_order(story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    document = timeline_json(story, capsys, story.old)
    old, new = f"instance/{story.old}", f"instance/{story.new}"
    told = [(e["time"], e["source"], e["subject"], e["what"]) for e in document["events"] if e["what"] != "now"]
    assert told == [
        ("2025-06-02T09:59:58Z", "autoscaling", f"group/{GROUP}", f"Launching a new EC2 instance: {story.old}"),
        ("2025-06-02T10:00:00Z", "ec2", old, "launched"),
        ("2025-06-02T10:01:05Z", "kubernetes", f"node/{OLD_NODE}", "node registered"),
        ("2025-06-09T08:00:00Z", "termination-queue", old, "AWS Health scheduled change"),
        ("2025-06-09T08:00:09Z", "kubernetes", f"node/{OLD_NODE}", "ScheduledEvent"),
        ("2025-06-09T08:00:10Z", "kubernetes", f"node/{OLD_NODE}", "NodeNotSchedulable"),
        ("2025-06-09T08:00:10Z", "kubernetes", f"node/{OLD_NODE}", "PreDrain"),
        ("2025-06-09T08:00:10Z", "kubernetes", f"node/{OLD_NODE}", "tainted"),
        ("2025-06-09T08:00:10Z", "kubernetes", f"node/{OLD_NODE}", "tainted"),
        ("2025-06-09T08:00:12Z", "kubernetes", "pod/training/llm-worker-0", "Killing"),
        ("2025-06-09T08:00:41Z", "kubernetes", f"node/{OLD_NODE}", "CordonAndDrain"),
        ("2025-06-11T08:00:00Z", "ec2", old, "scheduled instance-stop"),
        ("2025-06-11T08:03:52Z", "kubernetes", f"node/{OLD_NODE}", "MemoryPressure=Unknown"),
        ("2025-06-11T08:03:52Z", "kubernetes", f"node/{OLD_NODE}", "Ready=Unknown"),
        ("2025-06-11T08:03:58Z", "kubernetes", f"node/{OLD_NODE}", "tainted"),
        ("2025-06-11T08:04:12Z", "autoscaling", f"group/{GROUP}", f"Terminating EC2 instance: {story.old}"),
        ("2025-06-11T08:04:13Z", "termination-queue", old, "EC2 Instance-terminate Lifecycle Action"),
        ("2025-06-11T08:04:24Z", "autoscaling", f"group/{GROUP}", f"Launching a new EC2 instance: {story.new}"),
        ("2025-06-11T08:04:30Z", "ec2", old, "state terminated"),
        ("2025-06-11T08:05:31Z", "kubernetes", f"node/{NEW_NODE}", "node registered"),
        ("2025-06-11T08:05:52Z", "kubernetes", f"node/{NEW_NODE}", "Ready=True"),
    ]
    assert new not in {e["subject"] for e in document["events"]}  # the replacement's own EC2 record is not read
    by_what = {e["what"]: e["detail"] for e in document["events"]}
    assert by_what["AWS Health scheduled change"].startswith(
        "AWS_EC2_INSTANCE_STOP_SCHEDULED from 2025-06-11T08:00:00Z to 2025-06-11T10:00:00Z: EC2 has detected"
    )
    assert "window 2025-06-11T08:00:00Z - 2025-06-11T10:00:00Z" in by_what["scheduled instance-stop"]
    assert (
        "taken out of service in response to an EC2 health check" in by_what[f"Terminating EC2 instance: {story.old}"]
    )
    assert by_what["state terminated"].startswith("User initiated (2025-06-11 08:04:30 UTC)")
    assert "hook drain-before-terminate" in by_what["EC2 Instance-terminate Lifecycle Action"]
    taints = sorted(e["detail"] for e in document["events"] if e["what"] == "tainted")
    assert taints[0] == "aws-node-termination-handler/scheduled-maintenance=e2e3c2a1:NoSchedule"
    (now,) = [e for e in document["events"] if e["what"] == "now"]
    assert now["subject"] == f"node/{OLD_NODE}" and "cordoned" in now["detail"]
    # What it led to, and context without a time.
    assert document["schema"] == "dlinfra.what-happened/v1"
    assert document["target"] == {"asked": f"instance/{story.old}", "kind": "instance"}
    assert document["instances"] == [story.old] and document["groups"] == [GROUP] and document["region"] == REGION
    assert document["nodes"] == [OLD_NODE, NEW_NODE] and document["pods"] == ["training/llm-worker-0"]
    notes = "\n".join(document["notes"])
    assert f"replaced by {story.new}" in notes
    assert "lifecycle hook drain-before-terminate on autoscaling:EC2_INSTANCE_TERMINATING, heartbeat 900s" in notes
    assert "3 message(s) peeked (none deleted), 2 about" in notes
    assert document["unread"] == []


def test_reads_only(story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    timeline_json(story, capsys, story.old)
    assert story.api.requests and {method for method, _ in story.api.requests} == {"GET"}
    # The peek left every message in the queue, visible at once (VisibilityTimeout=0, never deleted).
    attributes = story.sqs.get_queue_attributes(QueueUrl=story.queue_url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "3"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_table_tells_the_same_story(story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, story.argv(story.old))
    assert code == 0, err
    assert out.startswith(f"What happened to instance/{story.old}, 2025-06-01T00:00:00Z to ")
    rows = [line for line in out.splitlines() if line.startswith("│ 2025-")]
    assert len(rows) == 21
    assert rows[0].split("│")[2].strip() == "autoscaling" and "termination-queue" in rows[3]
    assert "Could not read" not in out


def test_since_cuts_the_window(story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    document = timeline_json(story, capsys, story.old, "--since", "2025-06-11T08:04:00Z")
    times = [e["time"] for e in document["events"] if e["what"] != "now"]
    assert times[0] == "2025-06-11T08:04:12Z" and len(times) == 6
    assert document["since"] == "2025-06-11T08:04:00Z"


def test_pod_leads_to_its_nodes_and_instance(story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    document = timeline_json(story, capsys, "training/llm-worker-0")
    # Killed on the first, rescheduled to the second; the first's instance was replaced by the third.
    assert document["nodes"] == [OLD_NODE, OTHER_NODE, NEW_NODE]
    assert document["instances"] == [story.old, "i-03c3c3c3c3c3c3c3c"]
    # The second node's instance is not in moto: said, and the rest is still told.
    (problem,) = document["unread"]
    assert problem["source"] == "EC2" and "i-03c3c3c3c3c3c3c3c" in problem["problem"], problem
    whats = [(e["subject"], e["what"]) for e in document["events"]]
    pod = "pod/training/llm-worker-0"
    assert whats.index((pod, "Killing")) < whats.index((pod, "Scheduled")) < whats.index((pod, "container started"))
    assert (f"node/{OLD_NODE}", "CordonAndDrain") in whats
    assert (f"instance/{story.old}", "AWS Health scheduled change") in whats


def test_node_that_is_gone_found_by_its_events_and_dns_name(story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    story.api.objects["nodes"] = [n for n in story.api.objects["nodes"] if n["metadata"]["name"] != OLD_NODE]
    document = timeline_json(story, capsys, f"node/{OLD_NODE}", "--region", REGION)
    assert any("no longer exists" in note for note in document["notes"])
    whats = {e["what"] for e in document["events"]}
    assert {"ScheduledEvent", "CordonAndDrain", "Killing"} <= whats
    # No providerID to follow: EKS names nodes by private DNS name, and moto's instance has another one.
    assert document["instances"] == []


def test_kubernetes_down_is_reported_and_aws_still_read(story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    story.api.shutdown()
    story.api.server_close()
    code, out, err = run(capsys, story.argv(story.old, "--region", REGION))
    assert code == 0, err
    assert f"Could not read Kubernetes: cannot reach {story.api.url}" in out
    assert "scheduled instance-stop" in out and "AWS Health scheduled change" in out and "Traceback" not in out + err


def test_unknown_instance_is_nothing_found_and_exits_1(story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    unknown = "i-0123456789abcdef0"  # neither EC2, a group, a node nor the queue has heard of it
    code, out, err = run(capsys, story.argv(unknown))
    assert code == 1, err
    assert "Nothing found: no source that could be read knows instance/i-0123456789abcdef0." in out
    assert "\nFound:" not in out and "Could not read EC2: DescribeInstances: InvalidInstanceID.NotFound" in out
    code, out, _ = run(capsys, story.argv(unknown, "--json"))
    document = json.loads(out)
    assert code == 1 and document["found"] is False and document["instances"] == []
    assert timeline_json(story, capsys, story.old)["found"] is True


def test_unreadable_queue_is_reported(story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    missing = story.queue_url + "-missing"
    code, out, _ = run(capsys, ["what-happened", story.old, "--since", SINCE, "--queue-url", missing, "--json"])
    assert code == 0
    document = json.loads(out)
    (problem,) = document["unread"]
    assert problem["source"] == "termination queue" and problem["problem"].startswith("ReceiveMessage: ")
    assert any(e["what"] == "scheduled instance-stop" for e in document["events"])


def test_no_queue_url_says_how_to_give_one(story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, ["what-happened", story.old, "--since", SINCE])
    assert code == 0
    assert "Could not read termination queue: no queue URL: pass --queue-url URL, or --stack <env>-<region>" in out


def test_without_any_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in list(os.environ):
        if name.startswith(("AWS_", "KUBERNETES_")) or name == "KUBECONFIG":
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code, out, err = run(capsys, ["what-happened", "i-0f1e2d3c4b5a69788"])
    assert code == 2 and out == ""
    assert "nothing to read from: Kubernetes: no usable kubeconfig" in err
    assert "AWS: no credentials" in err and "Traceback" not in err


# --- the pure core ------------------------------------------------------------------------------------------------

NOW = datetime(2025, 6, 11, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("6h", datetime(2025, 6, 11, 3, 0, tzinfo=UTC)),
        ("2d", datetime(2025, 6, 9, 9, 0, tzinfo=UTC)),
        ("30m", datetime(2025, 6, 11, 8, 30, tzinfo=UTC)),
        ("1w", datetime(2025, 6, 4, 9, 0, tzinfo=UTC)),
        ("2025-06-09T08:00:00Z", datetime(2025, 6, 9, 8, 0, tzinfo=UTC)),
        ("2025-06-09T10:00:00+02:00", datetime(2025, 6, 9, 8, 0, tzinfo=UTC)),
        ("2025-06-09", datetime(2025, 6, 9, tzinfo=UTC)),
    ],
)
def test_parse_since(text: str, expected: datetime) -> None:
    assert wh.parse_since(text, NOW) == expected


@pytest.mark.parametrize("text", ["yesterday", "6 hours", "-2d", "2025-13-01"])
def test_parse_since_rejects(text: str) -> None:
    with pytest.raises(DlinfraError, match=r"--since: .* neither a duration"):
        wh.parse_since(text, NOW)


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("i-0f1e2d3c4b5a69788", wh.Target("instance", "i-0f1e2d3c4b5a69788")),
        ("i-0f1e2d3c", wh.Target("instance", "i-0f1e2d3c")),
        ("node/ip-10-0-0-1.ec2.internal", wh.Target("node", "ip-10-0-0-1.ec2.internal")),
        ("training/llm-worker-0", wh.Target("pod", "llm-worker-0", "training")),
        ("pod/training/llm-worker-0", wh.Target("pod", "llm-worker-0", "training")),
        ("pod/llm-worker-0", wh.Target("pod", "llm-worker-0", "default")),
        ("ip-10-0-0-1.ec2.internal", wh.Target("name", "ip-10-0-0-1.ec2.internal", "default")),
    ],
)
def test_parse_target(text: str, target: wh.Target) -> None:
    assert wh.parse_target(text) == target


@pytest.mark.parametrize("text", ["", "a/b/c", "node/", "pod/a/"])
def test_parse_target_rejects(text: str) -> None:
    with pytest.raises(DlinfraError, match="is not a target"):
        wh.parse_target(text)


@pytest.mark.parametrize(
    ("message", "what", "detail"),
    [
        (
            {
                "detail-type": "EC2 Spot Instance Interruption Warning",
                "time": "2025-06-10T17:21:40Z",
                "detail": {"instance-id": "i-0123456789abcdef0", "instance-action": "terminate"},
            },
            "spot interruption warning",
            "action terminate",
        ),
        (
            {
                "detail-type": "EC2 Instance Rebalance Recommendation",
                "time": "2025-06-10T17:21:40Z",
                "detail": {"instance-id": "i-0123456789abcdef0"},
            },
            "rebalance recommendation",
            "",
        ),
        (
            {
                "detail-type": "EC2 Instance State-change Notification",
                "time": "2025-06-10T17:21:40Z",
                "detail": {"instance-id": "i-0123456789abcdef0", "state": "shutting-down"},
            },
            "state-change notification",
            "state shutting-down",
        ),
        (  # a lifecycle hook notifying the queue directly, without EventBridge
            {
                "Origin": "AutoScalingGroup",
                "Service": "AWS Auto Scaling",
                "Time": "2025-06-10T17:21:40.515Z",
                "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
                "EC2InstanceId": "i-0123456789abcdef0",
                "LifecycleHookName": "drain",
                "AutoScalingGroupName": "pool",
            },
            "autoscaling:EC2_INSTANCE_TERMINATING",
            "hook drain of pool (direct notification)",
        ),
    ],
)
def test_queue_messages_decoded(message: dict[str, Any], what: str, detail: str) -> None:
    event = wh.queue_message_event(json.dumps(message), ["i-0123456789abcdef0"])
    assert event is not None
    assert (event.time, event.what, event.detail) == (
        datetime(2025, 6, 10, 17, 21, 40, 515000 if "Time" in message else 0, tzinfo=UTC),
        what,
        detail,
    )
    assert wh.queue_message_event(json.dumps(message), ["i-0fedcba9876543210"]) is None


@pytest.mark.parametrize("body", ["not json", "[]", json.dumps({"Event": "autoscaling:TEST_NOTIFICATION"})])
def test_queue_messages_not_about_an_instance(body: str) -> None:
    assert wh.queue_message_event(body, ["i-0123456789abcdef0"]) is None


def test_merge_sorts_dedupes_and_windows() -> None:
    at = lambda hour: datetime(2025, 6, 11, hour, tzinfo=UTC)  # noqa: E731
    drained = wh.Event(at(8), "kubernetes", "node/n", "CordonAndDrain", "")
    merged = wh.merge(
        [
            wh.Event(at(9), "ec2", "instance/i-1", "state terminated"),
            drained,
            drained,  # the same event read through the pod and through its node
            wh.Event(at(8), "termination-queue", "instance/i-1", "AWS Health scheduled change"),
            wh.Event(at(3), "ec2", "instance/i-1", "launched"),
        ],
        since=at(4),
        until=at(10),
    )
    assert [(e.time.hour, e.what) for e in merged] == [
        (8, "AWS Health scheduled change"),
        (8, "CordonAndDrain"),
        (9, "state terminated"),
    ]
