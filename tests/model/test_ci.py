"""The in-VPC runners' webhook filters, CodeBuild's way of judging a queued job against them, and the image table."""

from __future__ import annotations

import re

import pytest

from dlinfra.model import ci
from tests.conftest import ROOT

ACTORS = (583231, 9919)


@pytest.mark.parametrize("purpose", ci.PURPOSES)
def test_each_runner_takes_its_workflow_from_listed_accounts_only(purpose: ci.Purpose) -> None:
    # No HEAD_REF: CodeBuild documents it for push and pull-request events only (API reference, "WebhookFilter").
    assert list(ci.webhook_filters(purpose, actor_ids=ACTORS)) == [
        ci.WebhookFilter("EVENT", "WORKFLOW_JOB_QUEUED"),
        ci.WebhookFilter("WORKFLOW_NAME", f"^{purpose}$"),
        ci.WebhookFilter("ACTOR_ACCOUNT_ID", "^(9919|583231)$"),
    ]


def test_a_runner_needs_an_actor_list() -> None:
    with pytest.raises(ValueError, match="actor_ids: a runner needs at least one GitHub account id"):
        ci.webhook_filters("apply", actor_ids=())


def test_actor_ids_are_one_sorted_anchored_filter() -> None:
    (actors,) = [f for f in ci.webhook_filters("apply", actor_ids=(9919, 583231, 9919)) if f.type == "ACTOR_ACCOUNT_ID"]
    # Sorted and once each: reordering the fleet's list changes nothing declared.
    assert actors == ci.WebhookFilter("ACTOR_ACCOUNT_ID", "^(9919|583231)$")
    assert ci.ACTOR_PATTERN.fullmatch(actors.pattern)
    groups = [list(ci.webhook_filters("apply", actor_ids=ACTORS))]
    assert ci.admits(groups, ci.WorkflowJob("apply", "refs/heads/main", 583231))
    assert not ci.admits(groups, ci.WorkflowJob("apply", "refs/heads/main", 58323))  # anchored: no prefix match
    assert not ci.admits(groups, ci.WorkflowJob("apply", "refs/heads/main", 5832310))


def test_a_webhook_builds_when_any_group_passes_and_a_group_when_all_its_filters_do() -> None:
    push = [ci.WebhookFilter("EVENT", "PUSH, PULL_REQUEST_CREATED")]
    apply = list(ci.webhook_filters("apply", actor_ids=ACTORS))
    job = ci.WorkflowJob("apply", "refs/heads/main", 9919)
    assert not ci.admits([push], job)
    assert ci.admits([push, apply], job)
    assert not ci.admits([], job)
    assert not ci.admits([[ci.WebhookFilter("WORKFLOW_NAME", "^apply$")]], job)  # no EVENT filter: nothing


def test_filters_codebuild_does_not_document_for_workflow_jobs_guard_nothing() -> None:
    # HEAD_REF "works with ... push, ... pull request ... events" (API reference, "WebhookFilter"): on a queued
    # workflow job it is not a guard, so a fork's pull request from its own `main` is judged as if it were absent.
    group = [
        ci.WebhookFilter("EVENT", "WORKFLOW_JOB_QUEUED"),
        ci.WebhookFilter("WORKFLOW_NAME", "^apply$"),
        ci.WebhookFilter("HEAD_REF", "^refs/heads/main$"),
    ]
    assert ci.admits([group], ci.WorkflowJob("apply", "refs/heads/feature", 1))
    assert ci.admits([[*group, ci.WebhookFilter("FILE_PATH", "^nothing$")]], ci.WorkflowJob("apply", "x", 1))
    assert [f.type for f in ci.unguarded_filters(group)] == ["HEAD_REF"]


def test_setup_python_runs_on_ubuntu_images_only() -> None:
    assert ci.setup_python_problem("aws/codebuild/standard:7.0") is None
    problem = ci.setup_python_problem("aws/codebuild/amazonlinux-x86_64-standard:5.0")
    assert problem is not None and "amazonlinux 2023 x64, where actions/setup-python has no Python builds" in problem
    assert "not a curated image" in str(ci.setup_python_problem("public.ecr.aws/ubuntu/ubuntu:22.04"))


def test_the_image_table_has_its_sources_and_shape() -> None:
    table = ci.image_table()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", table.checked)
    assert set(table.labels.values()) <= set(table.images)
    assert {p.os for p in table.setup_python} == {"ubuntu"}
    text = (ROOT / "dlinfra" / "data" / "codebuild_images.yaml").read_text()
    for source in ("Using setup-python with a self-hosted runner", "Docker images provided by CodeBuild", "Label "):
        assert source in text
