"""`dlinfra run` end to end: moto for S3 and STS, and the recorded Kubernetes API of the ops tests, which here also
takes a Job (POST), so the official client's real create request is exercised.

What is checked: the uploaded archive holds exactly what git would commit of the directory (nested .gitignore files,
negations, .git left out) and its sha256 is the one the Job checks; the Job the API received is the one
dlinfra.model.run_job builds, a valid batch/v1 Job for the fleet's Kubernetes version, suspended and labelled for the
team's LocalQueue; and each failure (no team, unknown image, over the limit, a refusal by the API) is one line.
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

ACCOUNT = "123456789012"  # moto's account
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
    s3: Any


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
    code = tmp_path / "my-idea"
    _tree(code)
    api = SubmittingApi()
    with mock_aws(), serving(api) as url:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
        s3 = boto3.client("s3", region_name="us-west-2")
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        yield Lab(code, api, s3)


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
    assert "kubectl -n team-vision logs -f job/my-idea-1 -c run" in printed
    assert "dlinfra what-happened team-vision/POD" in printed
    assert "port-forward" in printed and "6006:6006" in printed


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
        (("--max-code-mib", "0"), "--max-code-mib: 0 is below 1"),
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
