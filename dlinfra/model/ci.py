"""The in-VPC CI runners: which workflow jobs each may take, and which images can run those jobs' steps.

Each region has an apply runner (apply.yml's in-cluster job, from the default branch only) and, where pull requests
get real previews, a preview runner (preview.yml's in-VPC job). A CodeBuild-hosted runner starts a build for every
queued workflow job its webhook admits, so the webhook's filter groups are the runner's access control (AWS
CodeBuild user guide, "GitHub webhook events"; API reference, "WebhookFilter"). Pure: no pulumi.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from ruamel.yaml import YAML

Purpose = Literal["apply", "preview"]
PURPOSES: tuple[Purpose, ...] = ("apply", "preview")

# The `name:` of the workflow whose in-VPC jobs each runner takes (.github/workflows/apply.yml, preview.yml).
# CodeBuild's WORKFLOW_NAME filter matches the queued job's workflow name and works with WORKFLOW_JOB_QUEUED
# events only (API reference, "WebhookFilter").
WORKFLOWS: Mapping[Purpose, str] = {"apply": "apply", "preview": "preview"}
# apply.yml runs on pushes to this branch (and by hand from it); nothing else may reach the apply runner.
DEFAULT_BRANCH = "main"
JOB_QUEUED = "WORKFLOW_JOB_QUEUED"  # GitHub's workflow_job event, action "queued"


@dataclass(frozen=True)
class WebhookFilter:
    """One CodeBuild webhook filter: every filter of a group must pass for the group to start a build."""

    type: str  # EVENT, WORKFLOW_NAME, HEAD_REF or ACTOR_ACCOUNT_ID
    pattern: str  # EVENT: comma-separated event types; the others: a regular expression
    exclude: bool = False  # true: the filter passes when the pattern does not match


@dataclass(frozen=True)
class WorkflowJob:
    """What the filters read from a queued workflow job (GitHub's `workflow_job` webhook payload)."""

    workflow: str  # workflow_job.workflow_name: the workflow's `name:`
    head_ref: str  # refs/heads/<workflow_job.head_branch>: the pushed branch, or a pull request's head branch
    actor_id: int  # sender.id: the GitHub account that triggered the run
    event: str = JOB_QUEUED


def webhook_filters(purpose: Purpose, *, actor_ids: Sequence[int] = ()) -> tuple[WebhookFilter, ...]:
    """The one filter group of a runner's webhook: queued jobs of its own workflow, from the default branch only
    (apply) or from any other branch (preview), by one of `actor_ids` when any are given.

    A repository webhook (the project's source location) only ever sees that repository's events, so there is no
    REPOSITORY_NAME filter: CodeBuild accepts it on organization and global webhooks only (API reference,
    "WebhookFilter").
    """
    default = f"^refs/heads/{re.escape(DEFAULT_BRANCH)}$"
    filters = [
        WebhookFilter("EVENT", JOB_QUEUED),
        WebhookFilter("WORKFLOW_NAME", f"^{re.escape(WORKFLOWS[purpose])}$"),
        # HEAD_REF: "refs/heads/branch-name" (CodeBuild user guide, "GitHub webhook events"). Pull requests run
        # from their own branches, so the apply runner, which admits the default branch alone, never takes one;
        # the preview runner takes nothing from the default branch, where only applies run.
        WebhookFilter("HEAD_REF", default, exclude=purpose == "preview"),
    ]
    if actor_ids:
        # ACTOR_ACCOUNT_ID: the sender's numeric GitHub id (CodeBuild user guide, "Best practices for using
        # webhooks": who may start builds). Sorted, so reordering the fleet's list changes nothing.
        ids = "|".join(str(i) for i in sorted(set(actor_ids)))
        filters.append(WebhookFilter("ACTOR_ACCOUNT_ID", f"^({ids})$"))
    return tuple(filters)


def admits(groups: Sequence[Sequence[WebhookFilter]], job: WorkflowJob) -> bool:
    """Whether a webhook with these filter groups starts a build for the job: CodeBuild builds when any group
    passes, and a group passes when each of its filters does (API reference, "CreateWebhook": filterGroups)."""
    return any(group_passes(group, job) for group in groups)


def group_passes(group: Sequence[WebhookFilter], job: WorkflowJob) -> bool:
    """Whether every filter of one group passes for the job; a filter type the job has no value for fails."""
    values = {"WORKFLOW_NAME": job.workflow, "HEAD_REF": job.head_ref, "ACTOR_ACCOUNT_ID": str(job.actor_id)}
    for f in group:
        if f.type == "EVENT":
            matched = job.event in {e.strip() for e in f.pattern.split(",")}
        elif f.type in values:
            matched = re.search(f.pattern, values[f.type]) is not None
        else:
            return False  # FILE_PATH, BASE_REF, TAG_NAME...: no value in a workflow_job event
        if matched == f.exclude:
            return False
    return any(f.type == "EVENT" for f in group)


# --- images ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Platform:
    """An image's operating system as actions/setup-python tells them apart."""

    os: str  # ubuntu, amazonlinux
    version: str  # 22.04, 2023
    arch: str  # x64, arm64

    def __str__(self) -> str:
        return f"{self.os} {self.version} {self.arch}"


@dataclass(frozen=True)
class ImageTable:
    """dlinfra/data/codebuild_images.yaml: curated images, the runner label overrides, setup-python's platforms."""

    images: Mapping[str, Platform]  # image identifier -> its platform
    labels: Mapping[str, str]  # runs-on `image:` override value -> image identifier
    setup_python: frozenset[Platform]  # where actions/setup-python can install CPython
    checked: str  # when the sources were last read


@functools.cache
def image_table() -> ImageTable:
    """The image table, read once."""
    text = resources.files("dlinfra").joinpath("data/codebuild_images.yaml").read_text()
    data = YAML(typ="safe").load(text)
    return ImageTable(
        images={name: Platform(**spec) for name, spec in data["images"].items()},
        labels=dict(data["labels"]),
        setup_python=frozenset(Platform(**spec) for spec in data["setup_python"]),
        checked=str(data["checked"]),
    )


def setup_python_problem(image: str) -> str | None:
    """Why the workflow jobs' actions/setup-python cannot run on a CodeBuild image, or None when it can."""
    table = image_table()
    platform = table.images.get(image)
    if platform is None:
        known = ", ".join(sorted(table.images))
        return f"{image!r} is not a curated image in dlinfra/data/codebuild_images.yaml ({known})"
    if platform not in table.setup_python:
        supported = ", ".join(sorted(str(p) for p in table.setup_python))
        return (
            f"{image!r} is {platform}, where actions/setup-python has no Python builds (it has {supported}; "
            "setup-python docs, 'Using setup-python with a self-hosted runner'; issues 92 and 96)"
        )
    return None
