"""The in-VPC CI runners: which workflow jobs each may take, and which images can run those jobs' steps.

Each region has an apply runner (apply.yml's in-cluster job) and, where pull requests get real previews, a preview
runner (preview.yml's in-VPC job). A CodeBuild-hosted runner starts a build for every queued workflow job its
webhook admits, so the webhook's filter groups are the runner's access control (AWS CodeBuild user guide, "GitHub
webhook events"; API reference, "WebhookFilter"). For a WORKFLOW_JOB_QUEUED event CodeBuild documents two filters
that narrow it: WORKFLOW_NAME ("Works with WORKFLOW_JOB_QUEUED events only") and ACTOR_ACCOUNT_ID (the GitHub
account id of the event's sender). HEAD_REF is documented for push and pull-request events only, so it is no guard
here: a pull request's workflow job carries whatever head branch its author chose (a fork's own `main`). What guards
a runner is therefore: its workflow's exact name, and a listed account having started the job. Pure: no pulumi.
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
# apply.yml runs on pushes to this branch (and by hand from it).
DEFAULT_BRANCH = "main"
JOB_QUEUED = "WORKFLOW_JOB_QUEUED"  # GitHub's workflow_job event, action "queued"
# The filter types CodeBuild documents as evaluated on a WORKFLOW_JOB_QUEUED event of a repository webhook (API
# reference, "WebhookFilter"): WORKFLOW_NAME "works with WORKFLOW_JOB_QUEUED events only"; ACTOR_ACCOUNT_ID is
# documented for GitHub events with no event restriction. The others name the events they work with, and a
# workflow job is none of them: HEAD_REF and FILE_PATH "push and pull request", BASE_REF "pull request events
# only", TAG_NAME and RELEASE_NAME releases; REPOSITORY_NAME and ORGANIZATION_NAME organization or global webhooks.
JOB_FILTERS = frozenset({"EVENT", "WORKFLOW_NAME", "ACTOR_ACCOUNT_ID"})
# ACTOR_ACCOUNT_ID as webhook_filters writes it: one or more numeric GitHub ids, anchored at both ends.
ACTOR_PATTERN = re.compile(r"\^\((\d+(?:\|\d+)*)\)\$")


@dataclass(frozen=True)
class WebhookFilter:
    """One CodeBuild webhook filter: every filter of a group must pass for the group to start a build."""

    type: str  # EVENT, WORKFLOW_NAME, ACTOR_ACCOUNT_ID (or a type that does not apply to workflow jobs)
    pattern: str  # EVENT: comma-separated event types; the others: a regular expression
    exclude: bool = False  # true: the filter passes when the pattern does not match


@dataclass(frozen=True)
class WorkflowJob:
    """What GitHub sends for a queued workflow job (its `workflow_job` webhook payload)."""

    workflow: str  # workflow_job.workflow_name: the workflow's `name:`, which the author of a workflow file picks
    head_ref: str  # refs/heads/<workflow_job.head_branch>: the pushed branch, or a pull request's head branch (a
    # name the pull request's author picks: a fork's own `main`). No filter CodeBuild documents reads it.
    actor_id: int  # sender.id: the GitHub account that triggered the run (ACTOR_ACCOUNT_ID)
    event: str = JOB_QUEUED


def webhook_filters(purpose: Purpose, *, actor_ids: Sequence[int]) -> tuple[WebhookFilter, ...]:
    """The one filter group of a runner's webhook: queued jobs of its own workflow (by exact name), started by one
    of `actor_ids`.

    No HEAD_REF: CodeBuild documents it for push and pull-request events only, so on a queued workflow job it
    either never passes (the runner never starts) or is not evaluated (no guard at all). A repository webhook (the
    project's source location) only ever sees that repository's events, so there is no REPOSITORY_NAME filter
    either: CodeBuild accepts it on organization and global webhooks only (API reference, "WebhookFilter").
    """
    if not actor_ids:
        raise ValueError("actor_ids: a runner needs at least one GitHub account id whose jobs it takes")
    # ACTOR_ACCOUNT_ID: the sender's numeric GitHub id (API reference, "WebhookFilter"; CodeBuild user guide,
    # "Best practices for using webhooks": restrict who can start builds). Sorted and once each, so reordering the
    # fleet's list changes nothing declared.
    ids = "|".join(str(i) for i in sorted(set(actor_ids)))
    return (
        WebhookFilter("EVENT", JOB_QUEUED),
        WebhookFilter("WORKFLOW_NAME", f"^{re.escape(WORKFLOWS[purpose])}$"),
        WebhookFilter("ACTOR_ACCOUNT_ID", f"^({ids})$"),
    )


def admits(groups: Sequence[Sequence[WebhookFilter]], job: WorkflowJob) -> bool:
    """Whether a webhook with these filter groups may start a build for the job: CodeBuild builds when any group
    passes, and a group passes when each of its filters does (API reference, "CreateWebhook": filterGroups).

    A filter CodeBuild does not document for the job's event is taken as not evaluated: it narrows nothing. That is
    the reading a security judgement must make; the other reading (it never passes) would only keep the runner
    from ever starting."""
    return any(group_passes(group, job) for group in groups)


def group_passes(group: Sequence[WebhookFilter], job: WorkflowJob) -> bool:
    """Whether every filter of one group that CodeBuild evaluates for a workflow job passes for the job."""
    values = {"WORKFLOW_NAME": job.workflow, "ACTOR_ACCOUNT_ID": str(job.actor_id)}
    for f in group:
        if f.type == "EVENT":
            matched = job.event in {e.strip() for e in f.pattern.split(",")}
        elif f.type in values:
            matched = re.search(f.pattern, values[f.type]) is not None
        else:
            continue  # HEAD_REF, FILE_PATH, BASE_REF...: not documented for workflow jobs, so no guard
        if matched == f.exclude:
            return False
    return any(f.type == "EVENT" for f in group)


def unguarded_filters(group: Sequence[WebhookFilter]) -> list[WebhookFilter]:
    """The filters of a runner group that CodeBuild does not document for WORKFLOW_JOB_QUEUED events."""
    return [f for f in group if f.type not in JOB_FILTERS]


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
