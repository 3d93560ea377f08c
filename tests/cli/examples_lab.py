"""Running the examples people copy (--help epilogs, the README's sh blocks) as they are written.

A lab is a scratch folder as a fresh clone has it: the reference fleet, its lock and checkov-skips.yaml, in a git
repository whose `main` is also `origin/main`, so `diff origin/main` and preview's default base work. Commands run
in-process (dlinfra.cli.main.main) with the lab as the working directory; fleet.yaml and cidr-lock.yaml are put
back after each one, while build/ (plans, the plan cache) stays, so only the first preview pays for the stacks.

What needs a cloud runs against fakes: AWS is moto (an Auto Scaling group with its drain hook as NodePool declares
it, the termination queue, an EC2 instance launched now under the example's id, SSM); `pulumi stack output` is a
stand-in on PATH that prints the lab's offline outputs (`prod-us-west-2.outputs.json`: the offline engine's run of
the stack, what `site render --offline` reads); Kubernetes is the recorded API on loopback the ops tests use, with
a kubeconfig whose context is `prod-us-west-2`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import boto3
import pytest
from moto import mock_aws
from moto.autoscaling.responses import AutoScalingResponse

from dlinfra.model import stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.offline import engine
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT
from tests.loopback import serving
from tests.ops import test_pools
from tests.ops.test_gpu_status import GPU_TAINT, NEW_H100, _node, _pod
from tests.ops.test_run import BUCKET, SubmittingApi
from tests.ops.test_what_happened import RecordedApi

STACK = "prod-us-west-2"  # the stack the AWS and Kubernetes examples name
OUTPUTS = f"{STACK}.outputs.json"  # as `pulumi stack output --json --show-secrets --stack prod-us-west-2 > ...`


# --- reading examples ---------------------------------------------------------------------------------------------


def command_lines(text: str) -> list[str]:
    """The lines of a shell snippet, with `\\` continuations joined."""
    return text.replace("\\\n", " ").splitlines()


def commands(line: str) -> list[list[str]]:
    """Each command of a line (`a && b`), as words, comment dropped."""
    words = shlex.split(line, comments=True)
    found: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            found.append([])
        else:
            found[-1].append(word)
    return [c for c in found if c]


def dlinfra_argv(words: list[str]) -> list[str] | None:
    """The arguments after `dlinfra`, `.venv/bin/dlinfra` or `.venv/bin/python -m dlinfra`; None for another tool."""
    name = Path(words[0]).name
    if name == "dlinfra":
        return words[1:]
    if name.startswith("python") and words[1:3] == ["-m", "dlinfra"]:
        return words[3:]
    return None


def readme_lines(readme: Path = ROOT / "README.md") -> list[tuple[str, int]]:
    """Each line of the README's sh blocks that runs dlinfra, with its line number; other tools' lines are not ours."""
    found: list[tuple[str, int]] = []
    in_block, pending = False, ""
    for number, text in enumerate(readme.read_text().splitlines(), start=1):
        if not in_block:
            in_block = text.strip() == "```sh"
        elif text.strip() == "```":
            in_block = False
        elif text.endswith("\\"):
            pending += text[:-1] + " "
        else:
            line, pending = (pending + text).strip(), ""
            if any(dlinfra_argv(words) is not None for words in commands(line)):
                found.append((line, number))
    return found


def key(argv: list[str]) -> str:
    return shlex.join(argv)


# --- how each command runs, and what it promises ------------------------------------------------------------------

World = Literal["offline", "cloud"]


@dataclass(frozen=True)
class Run:
    """How a command is run and what it must print: `shows` is a line fragment (stdout or stderr) saying it worked."""

    shows: str  # with `writes`: a fragment of the file written
    code: int = 0
    world: World = "offline"  # cloud: moto, the pulumi stand-in and the recorded Kubernetes API
    before: tuple[str, ...] = ()  # commands that make the state the example assumes (its comment says which)
    outputs: bool = False  # write prod-us-west-2.outputs.json first (from the offline engine)
    checkov: bool = False  # runs checkov: skipped where it is not installed, failed in CI
    writes: str = ""  # the file the command writes instead of printing (removed first)
    after: tuple[str, ...] = ()  # commands that undo what it started (run whatever it printed)


NODE = "ip-10-1-0-2.us-west-2.compute.internal"  # gpu check's example: its GPUs are free
BUSY = "ip-10-1-0-1.us-west-2.compute.internal"
ADD_LAX1 = "site add lax1 --region us-west-2 --public-ip 64.62.141.20 --asn 65120 --bgp"
ROLL = f"pool roll --stack {STACK} --pool train-h100"
CHECKED = "passed: 0 blocking finding(s)"  # `check --all` on the reference fleet

RUNS: dict[str, Run] = {
    # fleet and address plan
    "--fleet fleet.yaml validate": Run("fleet.yaml: ok - 3 regions"),
    "validate --fleet fleet.yaml": Run("fleet.yaml: ok - 3 regions"),
    "validate": Run("cidr-lock.yaml: ok - 56 allocations, 0 orphaned"),
    "cidr": Run("site-lan/ams1"),
    "cidr --update": Run("the lock already covers the fleet: nothing changed"),
    "cidr --release site-lan/ams1": Run("site-lan/ams1", before=("site remove ams1",)),
    "stacks --json --only prod-us-west-2-k8s": Run('"stack": "prod-us-west-2-k8s"'),
    # preview, against main (the lab's default branch) or empty
    "preview --all": Run("9 stack(s) against main"),
    "preview --all --summary": Run("9 stack(s) against main"),
    "preview --all --empty": Run("9 stack(s): + "),
    "preview --stack prod-us-west-2": Run("1 stack(s) against main"),
    "preview --stack prod-global": Run("4 stack(s) against main"),
    # sites and laptop VPN
    "site list": Run("ams1"),
    "site list --json": Run('"ams1"'),
    "site add lax1 --region us-west-2 --public-ip 64.62.140.99 --asn 65110 --bgp --gpu-nodes 4 --lan 10.60.0.0/20 "
    "--nfs 10.60.0.5:/export/data:/data --activation-expiry 14d": Run("dlinfra site render lax1 --outputs"),
    ADD_LAX1: Run("dlinfra site render lax1 --outputs"),
    "site remove lax1": Run("pulumi up --stack prod-us-west-2", before=(ADD_LAX1,)),
    "site render ams1 --offline": Run("offline outputs of prod-eu-west-1"),
    "site render lax1 --outputs prod-us-west-2.outputs.json": Run("swanctl", before=(ADD_LAX1,), outputs=True),
    "vpn profile --environment staging --region us-west-2 --user alice --offline": Run("wrote build/vpn/"),
    "vpn profile --region us-west-2 --offline": Run("wrote build/vpn/"),
    "vpn profile --region us-west-2 --outputs prod-us-west-2.outputs.json": Run("wrote build/vpn/", outputs=True),
    # checks and review
    "check --all": Run(CHECKED, checkov=True),
    "check --all --json --sarif build/dlinfra.sarif": Run('"exit_code": 0', checkov=True),
    "reach --verbose": Run("0 failing flows"),
    "diff --base origin/main --out plan-diff.md": Run("wrote plan-diff.md"),
    "diff origin/main": Run("No changes"),
    "access --env prod": Run("from 7 plan(s)"),
    "access --env prod --team vision": Run("from 7 plan(s)"),
    "cost --json": Run('"usd_max"'),
    "quota": Run("vision"),
    "quota --env staging": Run("staging"),
    "quota --team vision --json": Run('"schema": "dlinfra.quota/v1"'),
    # AWS: pool rolls, what happened, a GPU check through SSM
    ROLL: Run("Started instance refresh", world="cloud"),
    f"{ROLL} --dry-run": Run("no refresh started", world="cloud"),
    f"{ROLL} --min-healthy 90": Run("At least 90% stays in service", world="cloud"),
    f"{ROLL} --status --wait": Run("Successful, 100% done", world="cloud", before=(ROLL,)),
    "what-happened i-0123456789abcdef0 --since 6h": Run("launched", world="cloud"),
    "what-happened i-0abc123def4567890 --since 2d --stack prod-us-west-2": Run("launched", world="cloud"),
    "what-happened training/llm-worker-0 --json --queue-url "
    "https://sqs.us-west-2.amazonaws.com/123456789012/dlinfra-prod-usw2-nth": Run(
        '"schema": "dlinfra.what-happened/v1"', world="cloud"
    ),
    # GPUs
    "gpu expect --env prod --region us-west-2 --pool train-h100 --dcgm-level 2 --out expect.json": Run(
        '"dcgm_level": 2', writes="expect.json"
    ),
    "gpu expect --instance-type p5.48xlarge --efa --out expect.json": Run('"gpu_count": 8', writes="expect.json"),
    "gpu expect --instance-type p5.48xlarge --efa --dcgm-level 1 --out expect.json": Run(
        '"dcgm_level": 1', writes="expect.json"
    ),
    "gpu status --context prod-us-west-2": Run(NODE, world="cloud"),  # exit 0: every GPU node is healthy
    "gpu check ip-10-1-0-2.us-west-2.compute.internal --context prod-us-west-2": Run(
        "started the GPU check on ip-10-1-0-2.us-west-2.compute.internal (i-0f1e2d3c4b5a69788, us-west-2)",
        world="cloud",
    ),
    "gpu labels --context prod-us-west-2": Run("no unfinished pod or Job selects a short model name", world="cloud"),
    # laptop code in a standard image: the lab's folder packed, uploaded to moto's bucket, the Job to the recorded API
    "run --env prod --team vision --gpus 1 -- python train.py --epochs 3": Run(
        "submitted job team-vision/", world="cloud"
    ),
    "doctor": Run("dlinfra doctor"),
    # the warm servers (in the session's own folder, tests/conftest.py), stopped again by the runner
    "server start": Run("dlinfra server: pid", after=("server stop",)),
    "server status --json": Run('"schema": 1'),
}


# --- the lab --------------------------------------------------------------------------------------------------------


def make_lab(path: Path) -> Path:
    """A fresh clone's view of the reference fleet: a git repository on main, with origin/main at the same commit."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(REFERENCE_FLEET, path / "fleet.yaml")
    shutil.copy(REFERENCE_LOCK, path / "cidr-lock.yaml")
    shutil.copy(ROOT / "checkov-skips.yaml", path / "checkov-skips.yaml")
    (path / ".gitignore").write_text("build/\n*.outputs.json\nexpect.json\nplan-diff.md\nbin/\n")
    identity = ["-c", "user.name=lab", "-c", "user.email=lab@example.com"]
    for git in (["init", "-q", "-b", "main"], ["add", "-A"], [*identity, "commit", "-q", "-m", "fleet"]):
        subprocess.run(["git", *git], cwd=path, check=True, capture_output=True)
    subprocess.run(["git", "update-ref", "refs/remotes/origin/main", "HEAD"], cwd=path, check=True)
    bin_dir = path / "bin"
    bin_dir.mkdir()
    pulumi = bin_dir / "pulumi"  # `pulumi stack output --json --stack S`: the lab's S.outputs.json
    pulumi.write_text(
        f"#!{sys.executable}\nimport sys\nargs = sys.argv[1:]\n"
        "sys.stdout.write(open(args[args.index('--stack') + 1] + '.outputs.json').read())\n"
    )
    pulumi.chmod(0o755)
    return path


_OUTPUTS_BY_FLEET: dict[bytes, str] = {}  # fleet and lock -> their outputs: one offline run each


def write_outputs(lab: Path) -> None:
    """prod-us-west-2's outputs from an offline run of the lab's fleet as it is now (fake addresses and keys)."""
    fleet, lock = lab / "fleet.yaml", lab / "cidr-lock.yaml"
    inputs = fleet.read_bytes() + b"\0" + lock.read_bytes()
    if inputs not in _OUTPUTS_BY_FLEET:
        loaded = load_fleet(fleet)
        role = stackroles.parse(loaded.fleet, STACK)
        config = {"dlinfra:fleet": str(fleet), "dlinfra:lock": str(lock)}
        result = engine.run_stack(ROOT, role, project=loaded.fleet.project, config=config, stack_exports={})
        _OUTPUTS_BY_FLEET[inputs] = json.dumps(result.outputs)
    (lab / OUTPUTS).write_text(_OUTPUTS_BY_FLEET[inputs])


# --- the cloud: AWS under moto, Kubernetes on loopback --------------------------------------------------------------

PASSED = {
    "status": "True",
    "reason": "CheckPassed",
    "message": "the GPU check passed",
    "lastTransitionTime": "2027-01-05T10:06:00Z",
}


def _cluster() -> RecordedApi:
    nodes = [_node(BUSY, NEW_H100, [GPU_TAINT], PASSED), _node(NODE, NEW_H100, [GPU_TAINT], PASSED)]
    nodes[0]["spec"]["providerID"] = "aws:///us-west-2a/i-0a1b2c3d4e5f60718"
    nodes[1]["spec"]["providerID"] = "aws:///us-west-2b/i-0f1e2d3c4b5a69788"
    worker = _pod("llm-worker-0", BUSY, gpus=True)
    worker["metadata"] |= {"namespace": "training", "creationTimestamp": "2027-01-05T10:10:00Z"}
    api = SubmittingApi()  # the recorded API, which also takes the Job `run` creates
    api.objects = {"nodes": nodes, "pods": [worker], "events": [], "jobs": []}
    return api


def _kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": STACK, "cluster": {"server": server}}],
        "users": [{"name": "reader", "user": {"token": "recorded"}}],
        "contexts": [{"name": STACK, "context": {"cluster": STACK, "user": "reader"}}],
        "current-context": STACK,
    }
    path.write_text(json.dumps(config))
    return path


def _aws_account(lab: Path, instance_id: str | None) -> None:
    """The pool's group as NodePool declares it, the termination queue, and the example's instance, launched now."""
    outputs = json.loads((lab / OUTPUTS).read_text())
    assert outputs["node_pools"]["train-h100"] == test_pools.GROUP, "the offline outputs name the group moto makes"
    test_pools.make_group()
    sqs = boto3.client("sqs", region_name="us-west-2")
    url = sqs.create_queue(QueueName=outputs["termination_queue_url"].rsplit("/", 1)[1])["QueueUrl"]
    assert url == outputs["termination_queue_url"]
    s3 = boto3.client("s3", region_name="us-west-2")  # the results bucket `run` uploads to, as Storage names it
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    if instance_id is not None:
        ec2 = boto3.client("ec2", region_name="us-west-2")
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("moto.ec2.models.instances.random_instance_id", lambda: instance_id)
            ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="p5.48xlarge")


@contextlib.contextmanager
def cloud(lab: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> Iterator[None]:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("PATH", f"{lab / 'bin'}{os.pathsep}{os.environ['PATH']}")
    fake = test_pools.FakeRefreshes()
    monkeypatch.setattr(AutoScalingResponse, "start_instance_refresh", lambda r: fake.start(r), raising=False)
    monkeypatch.setattr(AutoScalingResponse, "describe_instance_refreshes", lambda r: fake.describe(r), raising=False)
    monkeypatch.setattr("dlinfra.ops.pools.time.sleep", lambda seconds: None)  # --wait's polls, without the wait
    write_outputs(lab)
    instance = next((word for word in argv[1:2] if word.startswith("i-")), None)
    with mock_aws(), serving(_cluster()) as url:
        monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(lab / "bin" / "kubeconfig", url)))
        _aws_account(lab, instance)
        yield


# --- running ---------------------------------------------------------------------------------------------------------


def run_command(
    argv: list[str], lab: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """Run one dlinfra command as its runner says; returns its exit code and what it printed (stdout, stderr)."""
    from dlinfra.cli import main as cli

    spec = RUNS.get(key(argv))
    assert spec is not None, f"no runner for `dlinfra {key(argv)}`: add one to RUNS in {__file__}"
    if spec.checkov:
        require_checkov()
    saved = {name: (lab / name).read_bytes() for name in ("fleet.yaml", "cidr-lock.yaml")}
    written = lab / spec.writes if spec.writes else None
    if written is not None:
        written.unlink(missing_ok=True)
    try:
        with contextlib.ExitStack() as stack:
            if spec.world == "cloud":  # the reference fleet's outputs; what runs before needs the cloud too
                stack.enter_context(cloud(lab, monkeypatch, argv))
            for before in spec.before:
                assert cli.main(shlex.split(before)) == 0, (before, capsys.readouterr())
            if spec.outputs:  # after what runs before: the outputs of the fleet it made
                write_outputs(lab)
            capsys.readouterr()
            code = cli.main(argv)
            captured = capsys.readouterr()
    finally:
        for after in spec.after:
            cli.main(shlex.split(after))
        for name, data in saved.items():
            (lab / name).write_bytes(data)
        (lab / OUTPUTS).unlink(missing_ok=True)
    printed = captured.out + captured.err
    if written is not None:
        assert written.exists(), f"`dlinfra {key(argv)}` did not write {spec.writes}"
        printed = written.read_text()
    assert code == spec.code, f"`dlinfra {key(argv)}` exited {code}, not {spec.code}:\n{printed[-3000:]}"
    assert spec.shows in printed, f"`dlinfra {key(argv)}` did not print {spec.shows!r}:\n{printed[-3000:]}"
    return code, printed


def require_checkov() -> None:
    from dlinfra.checks import checkov

    if not checkov.executable(ROOT).is_file():
        message = "checkov is not installed (run .ci/setup): `check --all` runs it"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: in CI a check that cannot run is a failure")
        pytest.skip(message)
