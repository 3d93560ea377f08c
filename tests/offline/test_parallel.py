"""Parallel previews: stacks run in worker processes once the stacks they read are done, with the same plans;
the provider SDK modules they need are found and imported before forking."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from dlinfra.cli import main as cli
from dlinfra.model.stackroles import StackRole
from dlinfra.offline import cache, engine, parallel, plan_export
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

WEST = StackRole("regional", "prod", "us-west-2")
EAST = StackRole("regional", "prod", "us-east-1")
GLOBAL = StackRole("global", "prod")
ROLES = [WEST, EAST, GLOBAL]
DEPENDS_ON = {GLOBAL: [WEST, EAST]}

# Regional stacks declare a VPC each; the global stack reads both through StackReference.
PROGRAM = """
import pulumi
import pulumi_aws as aws

stack = pulumi.get_stack()
if stack == "prod-global":
    refs = [pulumi.StackReference(s, stack_name=f"organization/t/{s}") for s in ("prod-us-west-2", "prod-us-east-1")]
    pulumi.export("vpc_ids", pulumi.Output.all(*[r.get_output("vpc_id") for r in refs]))
else:
    if stack == FAILING:
        raise ValueError("no VPC for you")
    vpc = aws.ec2.Vpc("vpc", cidr_block="10.0.0.0/16")
    pulumi.export("vpc_id", vpc.id)
"""


WAIT_SECONDS = 120.0  # every wait returns as soon as its event happens


def _program(tmp_path: Path, failing: str = "") -> Path:
    path = tmp_path / "program.py"
    path.write_text(f"FAILING = {failing!r}\n" + textwrap.dedent(PROGRAM))
    return path


def _plans(results: list[plan_export.StackResult]) -> dict[str, str]:
    return {r.role.name: json.dumps(r.plan("t"), sort_keys=True) for r in results}


def _run_parallel(root: Path, program: Path, reported: list[str]) -> list[plan_export.StackResult]:
    """The test stacks in two processes; each stack's name goes to `reported` as it is reported."""
    return parallel.run_parallel(
        root,
        ROLES,
        DEPENDS_ON,
        project="t",
        config={},
        jobs=2,
        program=program,
        on_done=lambda r: reported.append(r.role.name),
    )


def test_parallel_run_gives_the_sequential_plans_in_the_same_order(tmp_path: Path) -> None:
    program = _program(tmp_path)
    sequential = engine.run_all(tmp_path, ROLES, project="t", config={}, program=program)
    reported: list[str] = []
    in_parallel = _run_parallel(tmp_path, program, reported)
    assert _plans(in_parallel) == _plans(sequential)
    assert reported == [r.name for r in ROLES]
    vpc_ids = in_parallel[2].outputs["vpc_ids"]
    assert vpc_ids == [in_parallel[0].outputs["vpc_id"], in_parallel[1].outputs["vpc_id"]]


def test_a_failed_stack_stops_its_dependents_and_is_named(tmp_path: Path) -> None:
    reported: list[str] = []
    with pytest.raises(engine.EngineError) as caught:
        _run_parallel(tmp_path, _program(tmp_path, failing="prod-us-east-1"), reported)
    message = str(caught.value)
    assert message.startswith("stack prod-us-east-1: ")
    assert "no VPC for you" in message
    assert "not previewed, as they depend on prod-us-east-1: prod-global" in message
    assert reported == ["prod-us-west-2"]  # the independent stack still ran and was reported


def _preview(capsys: pytest.CaptureFixture[str], out: Path, *extra: str) -> int:
    argv = ["preview", "--all", "--summary", "--empty", "--fleet", str(REFERENCE_FLEET), "--out", str(out), *extra]
    code = cli.main(argv)
    capsys.readouterr()
    return code


def test_jobs_1_keeps_the_sequential_path(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    calls: list[str] = []

    def fake(name: str) -> Any:
        return lambda *args, **kwargs: calls.append(name) or []

    monkeypatch.setattr(engine, "run_all", fake("run_all"))
    monkeypatch.setattr(parallel, "run_parallel", fake("run_parallel"))
    assert _preview(capsys, tmp_path / "plans", "--jobs", "1") == 0
    assert _preview(capsys, tmp_path / "plans", "--jobs", "2") == 0
    assert calls == ["run_all", "run_parallel"]


def test_jobs_must_be_a_positive_whole_number(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["preview", "--all", "--jobs", "0"])
    assert "--jobs takes a whole number of processes, 1 or more; got '0'" in capsys.readouterr().err


def test_every_plan_and_manifest_is_byte_identical_in_parallel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole fixture fleet, once each way (about 25 s each)."""
    assert REFERENCE_LOCK.exists()
    for jobs in ("1", "2"):
        assert _preview(capsys, tmp_path / f"j{jobs}" / "plans", "--jobs", jobs) == 0
    sequential, in_parallel = tmp_path / "j1", tmp_path / "j2"

    def outputs(folder: Path) -> list[Path]:  # the plans and manifests; the plan cache is not output
        return sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file() and "cache" not in p.parts)

    files = outputs(sequential)
    assert outputs(in_parallel) == files
    assert any(f.parts[0] == "manifests" for f in files) and any(f.parts[0] == "plans" for f in files)
    for name in files:
        assert (in_parallel / name).read_bytes() == (sequential / name).read_bytes(), name


def test_sdk_classes_are_found_through_the_sdks_registry() -> None:
    import pulumi_aws
    import pulumi_kubernetes

    assert parallel.sdk_class("aws:ec2/vpc:Vpc") is pulumi_aws.ec2.Vpc
    assert parallel.sdk_class("kubernetes:core/v1:ConfigMap") is pulumi_kubernetes.core.v1.ConfigMap
    assert parallel.sdk_class("dlinfra:network:Network") is None  # a component: no provider SDK declares it
    # Every module a worker needs is imported before forking: the ones of every type the programs declare.
    assert {"pulumi_aws.ec2", "pulumi_aws.eks", "pulumi_kubernetes.helm.v3"} <= set(parallel.preload_sdk_modules())


K8S = StackRole("k8s", "prod", "us-west-2")
READER = {K8S: [WEST]}

# The regional stack exports its VPC's block (config t:cidr); the in-cluster stack reads it through StackReference,
# declares a subnet with it and says so. Each run leaves a file naming its stack and process.
READER_PROGRAM = """
import os
from pathlib import Path

import pulumi
import pulumi_aws as aws

stack = pulumi.get_stack()
(Path(RUNS) / f"{stack} {os.getpid()}").touch()
if stack == "prod-us-west-2":
    cidr = pulumi.Config().require("cidr")
    vpc = aws.ec2.Vpc("vpc", cidr_block=cidr)
    pulumi.export("vpc_id", vpc.id)
    pulumi.export("cidr", cidr)
else:
    print(f"{stack}: declaring")
    if FAILING == "always" or (FAILING == "elsewhere" and os.getpid() != PARENT):
        raise ValueError("no subnet for you")
    ref = pulumi.StackReference("prod-us-west-2", stack_name="organization/t/prod-us-west-2")
    aws.ec2.Subnet("subnet", vpc_id=ref.get_output("vpc_id"), cidr_block=ref.get_output("cidr"))
    ref.get_output("cidr").apply(lambda cidr: print(f"{stack}: subnet {cidr}"))
"""


def _reader_program(tmp_path: Path, failing: str = "") -> Path:
    """The reader program; `failing`: "always", or "elsewhere" (the in-cluster stack fails outside this process)."""
    (tmp_path / "runs").mkdir(exist_ok=True)
    path = tmp_path / "reader.py"
    head = f"RUNS = {str(tmp_path / 'runs')!r}\nFAILING = {failing!r}\nPARENT = {os.getpid()}\n"
    path.write_text(head + textwrap.dedent(READER_PROGRAM))
    return path


def _run_reader(
    tmp_path: Path, program: Path, *, cidr: str, version: str, jobs: int = 2
) -> tuple[list[plan_export.StackResult], cache.StackCache, dict[str, set[int]]]:
    """Both stacks with the plan cache (a new `version` of the environment: every key new); the results, the cache,
    and the processes each stack ran in."""
    for old in (tmp_path / "runs").iterdir():
        old.unlink()
    store = cache.StackCache(
        folder=tmp_path / "cache", root=tmp_path, common={}, environments={"prod": version}, dependencies=READER
    )
    results = parallel.run_parallel(
        tmp_path, [WEST, K8S], READER, project="t", config={"t:cidr": cidr}, jobs=jobs, program=program, cache=store
    )
    runs: dict[str, set[int]] = {}
    for run in (tmp_path / "runs").iterdir():
        stack, pid = run.name.split()
        runs.setdefault(stack, set()).add(int(pid))
    return results, store, runs


def _subnet_block(result: plan_export.StackResult) -> str:
    subnet = next(r for r in result.plan("t")["resources"] if r["type"] == "aws:ec2/subnet:Subnet")
    return str(subnet["inputs"]["cidrBlock"])


def test_a_reader_started_on_a_right_guess_is_kept_and_matches_a_sequential_run(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    program = _reader_program(tmp_path)
    _run_reader(tmp_path, program, cidr="10.1.0.0/16", version="before")  # the cache learns the VPC's exports
    capfd.readouterr()
    results, store, runs = _run_reader(tmp_path, program, cidr="10.1.0.0/16", version="after")
    assert runs[WEST.name] == {os.getpid()}
    assert os.getpid() not in runs[K8S.name]  # ran meanwhile, in a forked process, on the guess
    assert capfd.readouterr().out.splitlines() == [f"{K8S.name}: declaring", f"{K8S.name}: subnet 10.1.0.0/16"]
    sequential = engine.run_all(tmp_path, [WEST, K8S], project="t", config={"t:cidr": "10.1.0.0/16"}, program=program)
    assert _plans(results) == _plans(sequential)
    assert store.ran == [WEST.name, K8S.name]
    assert store.stored(K8S, store.key(K8S, {WEST.name: results[0].exports()}))  # under the real exports' key


def test_a_reader_started_on_a_wrong_guess_runs_again_with_the_real_exports(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    program = _reader_program(tmp_path)
    _run_reader(tmp_path, program, cidr="10.1.0.0/16", version="before")
    capfd.readouterr()
    results, _, runs = _run_reader(tmp_path, program, cidr="10.2.0.0/16", version="after")
    assert _subnet_block(results[1]) == "10.2.0.0/16"
    assert os.getpid() in runs[K8S.name]  # the guess (10.1.0.0/16) was dropped, and the stack ran here
    assert capfd.readouterr().out.splitlines() == [f"{K8S.name}: declaring", f"{K8S.name}: subnet 10.2.0.0/16"]
    sequential = engine.run_all(tmp_path, [WEST, K8S], project="t", config={"t:cidr": "10.2.0.0/16"}, program=program)
    assert _plans(results) == _plans(sequential)


def test_a_guessed_runs_failure_counts_only_when_the_real_run_fails_too(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    program = _reader_program(tmp_path, failing="elsewhere")
    _run_reader(tmp_path, program, cidr="10.1.0.0/16", version="before")
    capfd.readouterr()
    results, _, runs = _run_reader(tmp_path, program, cidr="10.1.0.0/16", version="after")
    assert len(runs[K8S.name]) == 2  # failed in the forked process, then ran here
    assert _subnet_block(results[1]) == "10.1.0.0/16"
    assert capfd.readouterr().out.count(f"{K8S.name}: declaring") == 1  # the failed run's output is not shown
    failing = _reader_program(tmp_path, failing="always")
    with pytest.raises(engine.EngineError) as caught:
        _run_reader(tmp_path, failing, cidr="10.1.0.0/16", version="failing")
    assert str(caught.value).count("no subnet for you") == 1  # the real run's failure, once


def test_no_guess_without_a_second_process(tmp_path: Path) -> None:
    program = _reader_program(tmp_path)
    _run_reader(tmp_path, program, cidr="10.1.0.0/16", version="before")
    _, _, runs = _run_reader(tmp_path, program, cidr="10.1.0.0/16", version="after", jobs=1)
    assert runs == {WEST.name: {os.getpid()}, K8S.name: {os.getpid()}}


def test_exports_are_the_same_only_when_equal_in_type_and_order() -> None:
    assert parallel._same({"a": [1, "x", None], "b": 2.5}, {"a": [1, "x", None], "b": 2.5})
    assert not parallel._same({"a": 1}, {"a": 1.0})
    assert not parallel._same({"a": True}, {"a": 1})
    assert not parallel._same({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert not parallel._same([1, 2], [1, 2, 3])
    assert not parallel._same({"a": object()}, {"a": object()})
    assert not parallel._same({"a": -0.0}, {"a": 0.0}), "json writes them differently"
    assert parallel._same({"a": float("nan")}, {"a": float("nan")}), "the same export, so the same run"


def test_a_speculation_or_worker_dies_with_the_preview_that_forked_it() -> None:
    """A preview killed mid-run (SIGKILL: no finally runs) leaves none of its forked processes behind."""
    script = (
        "import multiprocessing, os, sys, time\n"
        "from dlinfra.offline import parallel\n"
        "def child():\n"
        "    parallel.die_with_parent()\n"
        "    print(os.getpid(), flush=True)\n"
        "    time.sleep(600)\n"
        "p = multiprocessing.get_context('fork').Process(target=child)\n"
        "p.start()\n"
        "time.sleep(600)\n"
    )
    preview = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert preview.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(preview.stdout, selectors.EVENT_READ)
            assert sel.select(WAIT_SECONDS), "the forked process did not start"
        forked = int(preview.stdout.readline())
        preview.kill()
        preview.wait(WAIT_SECONDS)
        deadline = time.monotonic() + WAIT_SECONDS
        while Path(f"/proc/{forked}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{forked}").exists(), "the forked process outlived the preview"
    finally:
        if preview.poll() is None:
            preview.kill()
            preview.wait(WAIT_SECONDS)
