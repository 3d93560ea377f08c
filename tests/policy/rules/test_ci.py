"""The CI rule: a CodeBuild runner's webhook admits only its workflow's jobs, and apply's from the default branch."""

from __future__ import annotations

from typing import Any

import pytest

from dlinfra.model import ci
from policy.dlinfra_policy.rules.core import Resource
from tests.policy.rules._resources import messages, res

WEBHOOK = "aws:codebuild/webhook:Webhook"


def _hook(*groups: list[tuple[str, str, bool]]) -> Resource:
    return res(WEBHOOK)(
        projectName="dlinfra-prod-usw2-ci-apply",
        buildType="BUILD",
        filterGroups=[
            {"filters": [{"type": t, "pattern": p, "excludeMatchedPattern": x} for t, p, x in group]}
            for group in groups
        ],
    )


def _planned(purpose: ci.Purpose, actor_ids: tuple[int, ...] = ()) -> Resource:
    return _hook([(f.type, f.pattern, f.exclude) for f in ci.webhook_filters(purpose, actor_ids=actor_ids)])


QUEUED = ("EVENT", "WORKFLOW_JOB_QUEUED", False)
APPLY = ("WORKFLOW_NAME", "^apply$", False)
MAIN = ("HEAD_REF", "^refs/heads/main$", False)

# rule -> (resources that pass, resources that fail).
CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "ci-runner-webhook-narrowed": (
        [
            _planned("apply"),
            _planned("apply", actor_ids=(583231, 9919)),
            _planned("preview"),
            # Not a runner: a push build's webhook is not this rule's business.
            _hook([("EVENT", "PUSH", False), ("HEAD_REF", "^refs/heads/main$", False)]),
        ],
        [
            _hook([QUEUED]),  # what the runner had: every queued job of every workflow and branch
            _hook([QUEUED, APPLY]),  # no branch filter: a pull request's job of a workflow named apply passes
            _hook([QUEUED, MAIN]),  # no workflow filter
            _hook([QUEUED, ("WORKFLOW_NAME", "apply", False), MAIN]),  # unanchored: "apply-copy" passes
            _hook([QUEUED, APPLY, ("HEAD_REF", "refs/heads/main", False)]),  # unanchored: main-copy passes
            _hook([QUEUED, APPLY, ("HEAD_REF", "^refs/heads/.*$", False)]),  # every branch
            # The apply workflow on a runner that takes anything but main: pull requests reach it.
            _hook([QUEUED, APPLY, ("HEAD_REF", "^refs/heads/main$", True)]),
            # A second group that is open undoes a narrow first one.
            _hook([QUEUED, APPLY, MAIN], [QUEUED, ("WORKFLOW_NAME", "^.*$", False), ("HEAD_REF", "^refs/", False)]),
            # An actor filter does not make a pull request trusted.
            _hook([QUEUED, APPLY, ("HEAD_REF", "^refs/heads/", False), ("ACTOR_ACCOUNT_ID", "^1$", False)]),
        ],
    ),
}


@pytest.mark.parametrize("rule_name", sorted(CASES))
def test_rule_passes_good_resources(rule_name: str) -> None:
    assert messages(rule_name, CASES[rule_name][0]) == []


@pytest.mark.parametrize("rule_name", sorted(CASES))
def test_rule_flags_bad_resources(rule_name: str) -> None:
    for resource in CASES[rule_name][1]:
        assert messages(rule_name, [resource]), f"{rule_name} let {resource.inputs['filterGroups']} through"


def test_the_messages_say_what_passes() -> None:
    found: list[Any] = messages("ci-runner-webhook-narrowed", [_hook([QUEUED, APPLY, ("HEAD_REF", "^refs/", False)])])
    assert "admits the apply workflow's jobs from refs/heads/feature" in found[0]
    assert messages("ci-runner-webhook-narrowed", [_hook([QUEUED])])[:2] == [
        "runner filter group 1 admits every workflow's jobs: add a WORKFLOW_NAME filter",
        "runner filter group 1 admits jobs from every branch: add a HEAD_REF filter",
    ]
