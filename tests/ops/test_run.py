"""`dlinfra run` end to end: moto for S3 and STS, and the recorded Kubernetes API of the ops tests, which here also
takes a Job (POST), so the official client's real create request is exercised.

What is checked: the upload acts as the team's role (moto keeps each account's S3 apart, so code put with the caller's
own credentials would land in another account); the kubeconfig's context is the run's cluster; the uploaded archive
holds exactly what the directory's .gitignore files leave (nested .gitignore files, negations, .git left out) and its
sha256 is the one the Job checks; the Job the API received is the one dlinfra.model.run_job builds, a valid batch/v1
Job for the fleet's Kubernetes version, suspended and labelled for the team's LocalQueue; and each failure (no team,
unknown image, over the limit, a refusal by the API, another cluster's context) is one line.
Whether every admission policy dlinfra installs accepts that Job and its pods: tests/ops/test_run_admission.py.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import kubernetes_validate
import pytest
from moto import mock_aws

from dlinfra.cli import main as cli
from dlinfra.model import run_job
from dlinfra.model.fleet.load import load_fleet
from tests.conftest import REFERENCE_FLEET
from tests.loopback import serving
from tests.ops.test_what_happened import RecordedApi, _Handler, write_kubeconfig

CALLER_ACCOUNT = "123456789012"  # moto's: the account of the caller's own credentials
ACCOUNT = "111122223333"  # the account of team vision's role (tests/fixtures/fleet.yaml), where the buckets are
TEAM_ROLE = f"arn:aws:iam::{ACCOUNT}:role/team-vision"
BUCKET = f"dlinfra-prod-usw2-results-{ACCOUNT}"
JOBS_PATH = ["apis", "batch", "v1", "namespaces"]


class SubmittingApi(RecordedApi):
    """The recorded API, which also creates Jobs: it stores what it is sent, or refuses with `refusal`."""

    def __init__(self, refusal: tuple[int, str, str] | None = None) -> None:
        ThreadingHTTPServer.__init__(self, ("127.0.0.1", 0), _SubmitHandler)
        self.objects = {"nodes": [], "pods": [], "events": [], "jobs": []}
        self.requests = []
        self.refusal = refusal  # (status, reason, message)


class _SubmitHandler(_Handler):
    server: SubmittingApi

    def do_POST(self) -> None:
        self.server.requests.append(("POST", self.path))
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts[:4] != JOBS_PATH or len(parts) != 6 or parts[5] != "jobs":
            return self._refuse()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.server.refusal is not None:
            status, reason, message = self.server.refusal
            return self._send(status, {"kind": "Status", "status": "Failure", "message": message, "reason": reason,
                                       "code": status})  # fmt: skip
        stored = json.loads(json.dumps(body))
        stored["metadata"] |= {
            "uid": "5d1c0a8e-77f2-4f0b-9a51-0e6f3c2b9d10",
            "creationTimestamp": "2027-01-05T10:00:00Z",
        }
        self.server.objects["jobs"].append(body)
        return self._send(201, stored)


@dataclass
class Lab:
    code: Path
    api: SubmittingApi
    s3: Any  # S3 as the team's role, in its account
    kubeconfig: Path
    url: str


def _as(role_arn: str, session: str = "test") -> boto3.Session:
    credentials = boto3.client("sts").assume_role(RoleArn=role_arn, RoleSessionName=session)["Credentials"]
    return boto3.Session(
        aws_access_key_id=credentials["AccessKeyId"],
        aws_secret_access_key=credentials["SecretAccessKey"],
        aws_session_token=credentials["SessionToken"],
    )


def _assumed() -> list[tuple[str, str]]:
    """(role ARN, session name) of every AssumeRole moto answered, in the account the roles are in."""
    from moto.sts.models import sts_backends

    return [(r.role_arn, r.session_name) for r in sts_backends[ACCOUNT]["global"].assumed_roles]


def _tree(root: Path) -> None:
    """A working directory with what a researcher has: code, data and outputs git ignores, a nested .gitignore."""
    files = {
        ".gitignore": "data/\n*.pt\nruns/\n__pycache__/\n",
        "train.py": "print('training')\n",
        "configs/base.yaml": "lr: 0.1\n",
        "model/__init__.py": "",
        "model/net.py": "import torch\n",
        "model/__pycache__/net.cpython-311.pyc": "bytecode",
        "model/.gitignore": "!pretrained.pt\nscratch.txt\n",
        "model/pretrained.pt": "small weights",
        "model/scratch.txt": "notes",
        "data/train.bin": "x" * 1000,
        "ckpt.pt": "big",
        "runs/old/events": "tb",
        ".git/HEAD": "ref: refs/heads/main\n",
        "scripts/go.sh": "#!/bin/sh\nexec python train.py\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "scripts/go.sh").chmod(0o755)


EXPECTED = {
    ".gitignore", "train.py", "configs", "configs/base.yaml", "model", "model/__init__.py", "model/net.py",
    "model/.gitignore", "model/pretrained.pt", "scripts", "scripts/go.sh",
}  # fmt: skip


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("USER", "alice")  # getpass.getuser(): the session name
    monkeypatch.setenv("LOGNAME", "alice")
    code = tmp_path / "my-idea"
    _tree(code)
    api = SubmittingApi()
    with mock_aws(), serving(api) as url:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        s3 = _as(TEAM_ROLE, "setup").client("s3", region_name="us-west-2")
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        yield Lab(code, api, s3, kubeconfig, url)


def _argv(lab: Lab, *extra: str) -> list[str]:
    return ["run", "--fleet", str(REFERENCE_FLEET), "--env", "prod", "--team", "vision", "--dir", str(lab.code),
            "--name", "my-idea-1", *extra, "--", "python", "train.py", "--epochs", "3"]  # fmt: skip


def _archive(lab: Lab, key: str) -> tuple[bytes, dict[str, tarfile.TarInfo], dict[str, bytes]]:
    data = lab.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        contents = {m.name: tar.extractfile(m).read() for m in members.values() if m.isfile()}  # type: ignore[union-attr]
    return data, members, contents


def test_run_uploads_what_git_would_commit_and_submits_the_job(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(_argv(lab)) == 0
    printed = capsys.readouterr().out
    key = "teams/vision/runs/my-idea-1/code.tar.gz"
    data, members, contents = _archive(lab, key)
    assert set(members) == EXPECTED
    assert contents["model/pretrained.pt"] == b"small weights"  # re-included by the nested .gitignore
    assert members["scripts/go.sh"].mode == 0o755 and members["train.py"].mode == 0o644
    assert {(m.uid, m.gid, m.mtime, m.uname) for m in members.values()} == {(0, 0, 0, "")}
    digest = hashlib.sha256(data).hexdigest()
    assert gzip.decompress(data)  # a plain gzip stream

    (job,) = lab.api.objects["jobs"]
    fleet = load_fleet(REFERENCE_FLEET).fleet
    run = run_job.plan(
        fleet, env="prod", region=None, team="vision", name="my-idea-1", account=ACCOUNT,
        command=["python", "train.py", "--epochs", "3"],
    )  # fmt: skip
    from dataclasses import replace

    assert job == run_job.job(replace(run, code_sha256=digest))
    assert ("POST", "/apis/batch/v1/namespaces/team-vision/jobs") in lab.api.requests
    kubernetes_validate.validate(job, fleet.environments["prod"].kubernetes.version, strict=True)
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"][run_job.QUEUE_LABEL] == "default"
    pod = job["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 900  # the smallest GPU pool grace of us-west-2 (interactive)
    assert digest in pod["initContainers"][1]["command"][2]
    assert f"s3://{BUCKET}/{key}" in pod["initContainers"][0]["command"]

    assert "submitted job team-vision/my-idea-1 to queue default in prod/us-west-2" in printed
    # Suspended until admitted, and no pod until then: the wait comes before the logs.
    wait = "kubectl -n team-vision wait --for=jsonpath='{.status.ready}'=1 job/my-idea-1 --timeout=24h"
    logs = "kubectl -n team-vision logs -f job/my-idea-1 -c run"
    assert wait in printed and logs in printed and printed.index(wait) < printed.index(logs)
    assert "kubectl -n team-vision get events --field-selector involvedObject.name=POD" in printed
    assert "what-happened" not in printed  # needs rights on nodes and EC2 a team's role does not have
    forward = [line for line in printed.splitlines() if "port-forward" in line]
    assert len(forward) == 1 and "--field-selector=status.phase=Running" in forward[0] and "6006:6006" in forward[0]
    assert "kubeconfig: context story (http://127.0.0.1:" in printed  # the context used is said
    assert _assumed()[-1] == (TEAM_ROLE, "dlinfra-run-alice")  # uploaded as the team's role, named for the person


def test_the_archive_is_the_same_bytes_for_the_same_tree(lab: Lab) -> None:
    assert cli.main(_argv(lab)) == 0
    (lab.code / "train.py").touch()  # a new mtime changes nothing packed
    argv = _argv(lab)
    argv[argv.index("my-idea-1")] = "my-idea-2"
    assert cli.main(argv) == 0
    first = _archive(lab, "teams/vision/runs/my-idea-1/code.tar.gz")[0]
    second = _archive(lab, "teams/vision/runs/my-idea-2/code.tar.gz")[0]
    assert first == second


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = " ".join(err.split())  # rich wraps at the terminal width: compare the words
    assert lines.startswith("error:"), err
    return lines


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("--team", "poetry"), "--team: no team 'poetry' in the fleet (vision, language, robotics)"),
        (("--image", "tensorflow"), "--image: no standard image 'tensorflow' in the fleet (lab-pytorch, pytorch)"),
        (("--pool", "cpu"), "--pool: cpu is a CPU pool; a run with --gpus 1 needs a GPU pool"),
        (("--grace", "1800"), "--grace: 1800 s is outside 1..900 s, the smallest GPU pool checkpoint_grace"),
        (("--max-code-mib", "0"), "--max-code-mib: 0 is outside 1..5120"),
        (("--max-code-mib", "5121"), "--max-code-mib: 5121 is outside 1..5120 (one S3 PutObject takes at most 5 GB"),
        (("--role-arn", "team-vision"), "--role-arn: 'team-vision' is not an IAM role ARN"),
        (("--memory", "64GB"), "--memory: '64GB' is not a Kubernetes quantity (e.g. 8, 500m, 64Gi)"),
        (("--name", "My_Idea"), "--name: 'My_Idea' is not a job name"),
    ],
)
def test_bad_options_are_one_line_before_anything_is_sent(
    lab: Lab, capsys: pytest.CaptureFixture[str], change: tuple[str, str], message: str
) -> None:
    argv = _argv(lab)
    team = argv.index("--team")
    argv[team : team + 2] = [] if change[0] == "--team" else argv[team : team + 2]
    assert cli.main([*argv[:-5], *change, *argv[-5:]]) == 2
    assert message in _one_line_error(capsys)
    assert lab.api.requests == []
    assert lab.s3.list_objects_v2(Bucket=BUCKET)["KeyCount"] == 0


def test_no_team_is_one_line(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _argv(lab)
    team = argv.index("--team")
    del argv[team : team + 2]
    assert cli.main(argv) == 2
    assert "--team: say which team runs it (teams: vision, language, robotics)" in _one_line_error(capsys)


def test_a_directory_over_the_limit_is_refused_naming_what_weighs(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    (lab.code / "model" / "weights.bin").write_bytes(b"\0" * (2 * 1024 * 1024))
    assert cli.main(_argv(lab, "--max-code-mib", "1")) == 2
    error = _one_line_error(capsys)
    assert "2.0 MiB of files to upload, over the 1 MiB limit (largest: model 2.0 MiB" in error
    assert lab.s3.list_objects_v2(Bucket=BUCKET)["KeyCount"] == 0 and lab.api.requests == []


def test_a_refusal_by_the_api_is_one_line_naming_the_call(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    lab.api.refusal = (
        403,
        "Forbidden",
        "jobs.batch \"my-idea-1\" is forbidden: ValidatingAdmissionPolicy 'dlinfra-checkpoint-grace-cap-jobs' "
        "denied request: terminationGracePeriodSeconds is above the checkpoint_grace",
    )
    assert cli.main(_argv(lab)) == 2
    error = _one_line_error(capsys)
    assert 'create Job team-vision/my-idea-1: 403 Forbidden: jobs.batch "my-idea-1" is forbidden' in error
    assert f"(the code stays at s3://{BUCKET}/teams/vision/runs/my-idea-1/code.tar.gz)" in error


def test_a_missing_bucket_is_one_line_naming_the_call(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    for item in lab.s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        lab.s3.delete_object(Bucket=BUCKET, Key=item["Key"])
    lab.s3.delete_bucket(Bucket=BUCKET)
    assert cli.main(_argv(lab)) == 2
    error = _one_line_error(capsys)
    assert f"PutObject s3://{BUCKET}/teams/vision/runs/my-idea-1/code.tar.gz: NoSuchBucket" in error
    assert lab.api.requests == []


def test_a_fleet_without_standard_images_says_so(
    lab: Lab, capsys: pytest.CaptureFixture[str], write_fleet: Any
) -> None:
    path = write_fleet(lambda data: data.pop("standard_images"))
    argv = _argv(lab)
    argv[argv.index(str(REFERENCE_FLEET))] = str(path)
    assert cli.main(argv) == 2
    assert "the fleet declares no standard_images" in _one_line_error(capsys)


def test_a_name_taken_is_refused_without_replacing_the_first_runs_code(
    lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(_argv(lab)) == 0
    first = _archive(lab, "teams/vision/runs/my-idea-1/code.tar.gz")[0]
    (lab.code / "train.py").write_text("print('changed')\n")
    capsys.readouterr()
    assert cli.main(_argv(lab)) == 2
    error = _one_line_error(capsys)
    assert "a run named my-idea-1 already has its code there; give this one another --name" in error
    assert _archive(lab, "teams/vision/runs/my-idea-1/code.tar.gz")[0] == first
    assert len(lab.api.objects["jobs"]) == 1


def test_the_upload_is_the_team_roles_not_the_callers(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    """The caller's own account has no such bucket, and the team role's upload right is not the caller's: code put
    with the caller's credentials would not arrive (moto keeps accounts apart as AWS does)."""
    caller_s3 = boto3.client("s3", region_name="us-west-2")
    assert cli.main(_argv(lab)) == 0, capsys.readouterr()
    assert lab.s3.list_objects_v2(Bucket=BUCKET)["KeyCount"] == 1
    assert [b["Name"] for b in caller_s3.list_buckets()["Buckets"]] == []
    assert f"s3://{BUCKET}/" in capsys.readouterr().out  # the account in the bucket's name is the role's


def test_role_arn_names_another_role(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    other = f"arn:aws:iam::{ACCOUNT}:role/lab/vision-uploader"
    assert cli.main(_argv(lab, "--role-arn", other)) == 0, capsys.readouterr()
    assert _assumed()[-1] == (other, "dlinfra-run-alice")


def test_a_caller_who_is_the_team_role_already_assumes_nothing(
    lab: Lab, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As with an IAM Identity Center profile whose permission set's role is the team's role."""
    credentials = _as(TEAM_ROLE, "alice@lab").get_credentials()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", credentials.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", credentials.secret_key)
    monkeypatch.setenv("AWS_SESSION_TOKEN", credentials.token)
    before = len(_assumed())
    assert cli.main(_argv(lab)) == 0, capsys.readouterr()
    assert len(_assumed()) == before
    assert lab.s3.list_objects_v2(Bucket=BUCKET)["KeyCount"] == 1


def test_an_identity_center_role_is_not_assumed_but_signed_in_to(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    sso = f"arn:aws:iam::{ACCOUNT}:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_vision_0123456789abcdef"
    before = len(_assumed())
    assert cli.main(_argv(lab, "--role-arn", sso)) == 2
    error = _one_line_error(capsys)
    assert "is an IAM Identity Center role, which only its permission set's sign-in can assume" in error
    assert f"you are arn:aws:sts::{CALLER_ACCOUNT}:user/moto" in error
    assert len(_assumed()) == before and lab.api.requests == []


def _kubeconfig_for(lab: Lab, cluster: str) -> None:
    config = json.loads(lab.kubeconfig.read_text())
    config["clusters"][0]["name"] = config["contexts"][0]["context"]["cluster"] = cluster
    config["contexts"][0]["name"] = config["current-context"] = "prod-us-west-2"
    lab.kubeconfig.write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("cluster", "refusal"),
    [
        (
            f"arn:aws:eks:us-east-1:{ACCOUNT}:cluster/dlinfra-prod-use1-eks",
            "is cluster dlinfra-prod-use1-eks in us-east-1",
        ),
        (f"arn:aws:eks:us-west-2:{ACCOUNT}:cluster/dlinfra-staging-usw2-eks", "is cluster dlinfra-staging-usw2-eks in"),
        (f"arn:aws:eks:us-west-2:{ACCOUNT}:cluster/dlinfra-prod-usw2-eks", None),
    ],
    ids=["another region", "another environment", "the run's cluster"],
)
def test_the_context_must_be_the_runs_cluster(
    lab: Lab, capsys: pytest.CaptureFixture[str], cluster: str, refusal: str | None
) -> None:
    """aws eks update-kubeconfig names the cluster by its ARN: another cluster's context gets neither code nor Job."""
    _kubeconfig_for(lab, cluster)
    if refusal is None:
        assert cli.main(_argv(lab)) == 0, capsys.readouterr()
        assert (
            "kubeconfig: context prod-us-west-2 (cluster dlinfra-prod-usw2-eks in us-west-2)" in capsys.readouterr().out
        )
        return
    assert cli.main(_argv(lab)) == 2
    error = _one_line_error(capsys)
    assert f"--context: prod-us-west-2 {refusal}" in error
    assert (
        "but this run goes to dlinfra-prod-usw2-eks in us-west-2 (aws eks update-kubeconfig --region us-west-2" in error
    )
    assert lab.s3.list_objects_v2(Bucket=BUCKET)["KeyCount"] == 0 and lab.api.requests == []


@pytest.mark.parametrize(
    ("server", "said"),
    [
        ("https://0123ABCD.gr7.us-west-2.eks.amazonaws.com", "an EKS cluster in us-west-2"),
        ("https://0123ABCD.gr7.us-east-1.eks.amazonaws.com", None),
        ("https://127.0.0.1:6443", "not an EKS endpoint, its cluster is not checked"),
    ],
    ids=["EKS endpoint of the region", "EKS endpoint of another region", "not EKS"],
)
def test_a_context_named_otherwise_is_checked_by_its_endpoints_region(server: str, said: str | None) -> None:
    """A kubeconfig another tool wrote (eksctl: <name>.<region>.eksctl.io) keeps the EKS endpoint, naming its region."""
    fleet = load_fleet(REFERENCE_FLEET).fleet
    run = run_job.plan(fleet, env="prod", region=None, team="vision", name="x", account=ACCOUNT, command=["true"])
    if said is None:
        with pytest.raises(run_job.RunError, match="is an EKS cluster in us-east-1, but this run goes to"):
            run_job.check_cluster(run, "other", "dlinfra-prod-use1-eks.us-east-1.eksctl.io", server)
    else:
        assert said in run_job.check_cluster(run, "here", "dlinfra-prod-usw2-eks.us-west-2.eksctl.io", server)
