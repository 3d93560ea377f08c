"""`dlinfra pool roll` against moto: the real boto3 client, request validation and wire format.

moto (5.x) serves Auto Scaling groups, launch templates and lifecycle hooks but not the instance refresh
actions, so the two that the command calls are added to moto's Auto Scaling responses here. They still go
through botocore's parameter validation and moto's request parsing, so a misspelt preference fails.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.autoscaling.exceptions import AutoscalingClientError, ValidationError
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import ActionResult

from dlinfra.cli import main as cli
from dlinfra.model.naming import Names
from dlinfra.ops import pools
from tests.conftest import REFERENCE_FLEET

REGION = "us-west-2"
STACK = f"prod-{REGION}"
POOL = "train-h100"  # GPU, EFA, in a capacity block in us-west-2
GROUP = Names("dlinfra", "prod", REGION).physical("pool", POOL, max_len=255)


class RefreshInProgressError(AutoscalingClientError):
    code = "InstanceRefreshInProgress"


class FakeRefreshes:
    """StartInstanceRefresh / DescribeInstanceRefreshes for moto; each describe moves a refresh one state on."""

    def __init__(self) -> None:
        self.started: list[dict[str, Any]] = []  # the parsed requests, as AWS would receive them
        self.script = ["Pending", "InProgress", "Successful"]
        self._states: dict[str, Iterator[str]] = {}
        self._status: dict[str, str] = {}
        self._ids = (f"08b91cf7-8fa6-48af-b6a6-d227f40f{n:04d}" for n in itertools.count())

    def start(self, response: AutoScalingResponse) -> ActionResult:
        params = response._get_params()
        name = params["AutoScalingGroupName"]
        if not response.autoscaling_backend.describe_auto_scaling_groups([name]):
            raise ValidationError(f"AutoScalingGroup name not found - {name}")
        if any(r["AutoScalingGroupName"] == name and self._status[r["id"]] not in pools.DONE for r in self.started):
            raise RefreshInProgressError(
                "An Instance Refresh is already in progress and blocks the execution of this Instance Refresh."
            )
        refresh_id = next(self._ids)
        self.started.append(params | {"id": refresh_id})
        self._states[refresh_id] = iter(self.script)
        self._status[refresh_id] = "Pending"
        return ActionResult({"InstanceRefreshId": refresh_id})

    def describe(self, response: AutoScalingResponse) -> ActionResult:
        params = response._get_params()
        wanted = params.get("InstanceRefreshIds")
        found = []
        for request in reversed(self.started):  # newest first, as AWS answers
            if request["AutoScalingGroupName"] != params["AutoScalingGroupName"]:
                continue
            if wanted and request["id"] not in wanted:
                continue
            status = self._status[request["id"]] = next(self._states[request["id"]], self._status[request["id"]])
            done = {"Successful": 100}.get(status, 0)
            found.append(
                {
                    "InstanceRefreshId": request["id"],
                    "AutoScalingGroupName": request["AutoScalingGroupName"],
                    "Status": status,
                    "PercentageComplete": done,
                    "InstancesToUpdate": 0 if done else 2,
                    "Preferences": request.get("Preferences", {}),
                }
            )
        return ActionResult({"InstanceRefreshes": found})


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRefreshes]:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    fake = FakeRefreshes()
    # Plain functions on the class, so moto finds them and calls them with the response as the argument.
    monkeypatch.setattr(AutoScalingResponse, "start_instance_refresh", lambda r: fake.start(r), raising=False)
    monkeypatch.setattr(AutoScalingResponse, "describe_instance_refreshes", lambda r: fake.describe(r), raising=False)
    with mock_aws():
        yield fake


def make_group(*, hook: bool = True, rolled: bool = True, heartbeat: int = 2100) -> None:
    """A GPU pool as NodePool declares it: nodes on version 1; after `pulumi up` the group is on version 2."""
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.2.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.2.0.0/24", AvailabilityZone=f"{REGION}a")["Subnet"]
    template = ec2.create_launch_template(
        LaunchTemplateName=f"{GROUP}-lt", LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "p5.48xlarge"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=GROUP,
        LaunchTemplate={"LaunchTemplateId": template, "Version": "1"},
        MinSize=0,
        MaxSize=4,
        DesiredCapacity=2,
        VPCZoneIdentifier=subnet["SubnetId"],
    )
    if hook:
        autoscaling.put_lifecycle_hook(
            AutoScalingGroupName=GROUP,
            LifecycleHookName="drain-before-terminate",
            LifecycleTransition=pools.TERMINATING,
            HeartbeatTimeout=heartbeat,  # train-h100: its 1800 s checkpoint grace + the 300 s margin
            DefaultResult="CONTINUE",
        )
    if rolled:  # a new AMI: a new template version, which the group now follows
        ec2.create_launch_template_version(LaunchTemplateId=template, LaunchTemplateData={"ImageId": "ami-1234abcd"})
        autoscaling.update_auto_scaling_group(
            AutoScalingGroupName=GROUP, LaunchTemplate={"LaunchTemplateId": template, "Version": "2"}
        )


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["pool", "roll", "--fleet", str(REFERENCE_FLEET), "--stack", STACK, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def outputs_file(tmp_path: Path, **change: Any) -> Path:
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps({"environment": "prod", "region": REGION, "node_pools": {POOL: GROUP}} | change))
    return path


def test_roll_by_pool_starts_a_draining_refresh_of_outdated_nodes(
    aws: FakeRefreshes, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    make_group()
    code, out, err = run(capsys, "--pool", POOL, "--outputs", str(outputs_file(tmp_path)), "--min-healthy", "75")
    assert code == 0, err
    (request,) = aws.started
    assert request["AutoScalingGroupName"] == GROUP and request["Strategy"] == "Rolling"
    assert request["Preferences"] == {
        "MinHealthyPercentage": 75,
        "SkipMatching": True,
        "CheckpointPercentages": [20, 100],
        "CheckpointDelay": 3600,
        "ScaleInProtectedInstances": "Ignore",
        "StandbyInstances": "Ignore",
    }
    assert f"Started instance refresh {request['id']} on {GROUP}" in out
    assert "2 node(s) are not on launch template version 2 and will drain" in out
    assert "capacity block" in out  # train-h100 runs in one in us-west-2
    # Which grace each node's pods get, and that the refresh's own timings never cut a drain short.
    assert "checkpoint_grace of 1800s; the termination hook holds each node 2100s" in out
    assert "never inside a drain" in out


def test_a_hook_shorter_than_the_pools_grace_is_refused(
    aws: FakeRefreshes, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    make_group(heartbeat=900)  # the fixed hold every pool had before checkpoint_grace
    code, _, err = run(capsys, "--pool", POOL, "--outputs", str(outputs_file(tmp_path)))
    assert code == 2 and "less than the pool's checkpoint_grace 1800s" in err and not aws.started


def test_a_roll_by_group_says_what_the_hook_allows(aws: FakeRefreshes, capsys: pytest.CaptureFixture[str]) -> None:
    make_group(heartbeat=1200)
    code, out, _ = run(capsys, "--group", GROUP, "--dry-run")
    assert code == 0 and "a pod gets at most 900s" in out


def test_wait_follows_the_refresh_to_its_end(aws: FakeRefreshes, capsys: pytest.CaptureFixture[str]) -> None:
    make_group()
    code, out, _ = run(capsys, "--group", GROUP, "--checkpoints", "none", "--wait", "--interval", "0")
    assert code == 0
    assert "Preferences" in aws.started[0] and "CheckpointPercentages" not in aws.started[0]["Preferences"]
    assert ": InProgress" in out and ": Successful, 100% done" in out


def test_wait_exits_1_when_the_refresh_fails(aws: FakeRefreshes, capsys: pytest.CaptureFixture[str]) -> None:
    make_group()
    aws.script = ["InProgress", "Failed"]
    code, out, _ = run(capsys, "--group", GROUP, "--wait", "--interval", "0")
    assert code == 1 and ": Failed" in out


def test_status_lists_and_watches_refreshes(aws: FakeRefreshes, capsys: pytest.CaptureFixture[str]) -> None:
    make_group()
    code, out, _ = run(capsys, "--group", GROUP, "--status")
    assert code == 0 and "no instance refreshes" in out and not aws.started
    run(capsys, "--group", GROUP)
    code, out, _ = run(capsys, "--group", GROUP, "--status", "--wait", "--interval", "0")
    assert code == 0 and out.strip().splitlines()[-1].endswith("Successful, 100% done, 0 to update")


def test_a_second_roll_while_one_runs_is_refused(aws: FakeRefreshes, capsys: pytest.CaptureFixture[str]) -> None:
    make_group()
    assert run(capsys, "--group", GROUP)[0] == 0
    code, _, err = run(capsys, "--group", GROUP)
    assert code == 2 and "already being refreshed" in err and len(aws.started) == 1


def test_nothing_to_roll_when_every_node_is_current(aws: FakeRefreshes, capsys: pytest.CaptureFixture[str]) -> None:
    make_group(rolled=False)
    code, out, _ = run(capsys, "--group", GROUP)
    assert code == 0 and "nothing to roll" in out and not aws.started


def test_dry_run_starts_nothing(aws: FakeRefreshes, capsys: pytest.CaptureFixture[str]) -> None:
    make_group()
    code, out, _ = run(capsys, "--group", GROUP, "--dry-run")
    assert code == 0 and "will drain" in out and "no refresh started" in out and not aws.started


def test_a_group_without_the_drain_hook_is_refused(aws: FakeRefreshes, capsys: pytest.CaptureFixture[str]) -> None:
    make_group(hook=False)
    code, _, err = run(capsys, "--group", GROUP)
    assert code == 2 and "without draining" in err and not aws.started


def test_unknown_group(aws: FakeRefreshes, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--group", "nope")
    assert code == 2 and "no Auto Scaling group 'nope' in us-west-2" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pool", "gpu-x"], "no pool 'gpu-x' runs in prod-us-west-2"),
        (["--pool", "train-a100"], "no pool 'train-a100' runs in prod-us-west-2"),  # eu-west-1 only
        (["--group", GROUP, "--checkpoints", "50,20,100"], "--checkpoints"),
        (["--group", GROUP, "--checkpoints", "20,50"], "the last one must be 100"),
        (["--group", GROUP, "--min-healthy", "150"], "--min-healthy"),
    ],
)
def test_bad_input_is_refused_before_any_aws_call(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err


def test_outputs_of_another_stack_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = outputs_file(tmp_path, region="us-east-1")
    code, _, err = run(capsys, "--pool", POOL, "--outputs", str(path))
    assert code == 2 and "outputs of stack prod-us-east-1" in err


def test_without_the_pulumi_cli_it_says_what_to_pass(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "")
    code, _, err = run(capsys, "--pool", POOL)
    assert code == 2 and "--outputs FILE" in err and "--group NAME" in err


def test_global_stack_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["pool", "roll", "--fleet", str(REFERENCE_FLEET), "--stack", "prod-global", "--group", GROUP])
    assert code == 2 and "not a regional stack" in capsys.readouterr().err


# --- unexpected AWS replies: one line naming the call, never a traceback ------------------------------------


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A real Auto Scaling client whose replies are set by the test (botocore's Stubber: nothing leaves the process)."""
    from botocore.stub import Stubber

    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    client = boto3.client(
        "autoscaling", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    monkeypatch.setattr("dlinfra.cli.pools.client_for", lambda region: client)
    with Stubber(client) as stubber:
        yield stubber


def test_status_with_a_refresh_missing_its_id_is_one_line(stubbed: Any, capsys: pytest.CaptureFixture[str]) -> None:
    stubbed.add_response("describe_instance_refreshes", {"InstanceRefreshes": [{"Status": "InProgress"}]})
    code, _, err = run(capsys, "--group", GROUP, "--status", "--wait", "--interval", "0")
    assert code == 2 and "Traceback" not in err
    assert err.strip() == (f"error: EC2 Auto Scaling ({GROUP} in {REGION}): unexpected reply: no 'InstanceRefreshId'")


def test_status_refused_by_aws_is_one_line(stubbed: Any, capsys: pytest.CaptureFixture[str]) -> None:
    stubbed.add_client_error(
        "describe_instance_refreshes", service_error_code="AccessDenied", service_message="not authorized"
    )
    code, _, err = run(capsys, "--group", GROUP, "--status")
    assert code == 2 and err.strip() == "error: DescribeInstanceRefreshes: AccessDenied: not authorized"


def test_a_reply_of_another_shape_is_one_line(
    stubbed: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What no service model allows (a proxy's page, a changed API): a list of strings where objects belong.
    monkeypatch.setattr(pools, "refreshes", lambda client, group, refresh_id=None: ["<html>Service Unavailable</html>"])
    code, _, err = run(capsys, "--group", GROUP, "--status")
    assert code == 2 and "Traceback" not in err
    assert err.startswith(f"error: EC2 Auto Scaling ({GROUP} in {REGION}): unexpected reply: ")


def test_an_aws_error_no_command_expected_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from botocore.exceptions import NoCredentialsError

    def no_credentials(region: str) -> Any:
        raise NoCredentialsError()

    monkeypatch.setattr("dlinfra.cli.pools.client_for", no_credentials)
    code, _, err = run(capsys, "--group", GROUP, "--status")
    assert code == 2 and err.strip() == "error: AWS: Unable to locate credentials"
