"""The CI rule: a CodeBuild runner's webhook admits only its workflow's jobs, from listed accounts, and no HEAD_REF."""

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


def _planned(purpose: ci.Purpose, actor_ids: tuple[int, ...] = (583231, 9919)) -> Resource:
    return _hook([(f.type, f.pattern, f.exclude) for f in ci.webhook_filters(purpose, actor_ids=actor_ids)])


QUEUED = ("EVENT", "WORKFLOW_JOB_QUEUED", False)
APPLY = ("WORKFLOW_NAME", "^apply$", False)
ACTORS = ("ACTOR_ACCOUNT_ID", "^(583231|9919)$", False)
MAIN = ("HEAD_REF", "^refs/heads/main$", False)

# rule -> (resources that pass, resources that fail).
CASES: dict[str, tuple[list[Resource], list[Resource]]] = {
    "ci-runner-webhook-narrowed": (
        [
            _planned("apply"),
            _planned("apply", actor_ids=(42,)),
            _planned("preview"),
            # Not a runner: a push build's webhook is not this rule's business, and HEAD_REF works on pushes.
            _hook([("EVENT", "PUSH", False), MAIN]),
        ],
        [
            _hook([QUEUED]),  # what the runner had first: every queued job of every workflow, from anyone
            _hook([QUEUED, APPLY]),  # no actor filter: a fork's pull request naming its workflow apply passes
            _hook([QUEUED, ACTORS]),  # no workflow filter
            # What the runner had next: HEAD_REF is not evaluated on workflow jobs (API reference, "WebhookFilter"),
            # so it kept out no fork whose pull request comes from its own main.
            _hook([QUEUED, APPLY, MAIN]),
            _hook([QUEUED, APPLY, ACTORS, MAIN]),  # the actor list holds, but HEAD_REF is there as if it guarded
            _hook([("EVENT", "PUSH, WORKFLOW_JOB_QUEUED", False), APPLY, ACTORS, MAIN]),  # mixed events, same
            _hook([QUEUED, ("WORKFLOW_NAME", "apply", False), ACTORS]),  # unanchored: "apply-copy" passes
            _hook([QUEUED, ("WORKFLOW_NAME", "^apply$", True), ACTORS]),  # excluded: every other workflow passes
            _hook([QUEUED, APPLY, ("ACTOR_ACCOUNT_ID", "583231", False)]),  # unanchored: 1583231 passes
            _hook([QUEUED, APPLY, ("ACTOR_ACCOUNT_ID", "^.*$", False)]),  # anyone
            _hook([QUEUED, APPLY, ("ACTOR_ACCOUNT_ID", "^(583231)$", True)]),  # everyone but one
            # A second group that is open undoes a narrow first one.
            _hook([QUEUED, APPLY, ACTORS], [QUEUED, ("WORKFLOW_NAME", "^.*$", False), ACTORS]),
            _hook([QUEUED, APPLY, ACTORS], [QUEUED, APPLY]),
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
    found: list[Any] = messages("ci-runner-webhook-narrowed", [_hook([QUEUED, APPLY, ACTORS, MAIN])])
    assert found == [
        "runner filter group 1: HEAD_REF is not a guard on WORKFLOW_JOB_QUEUED events (CodeBuild documents it for "
        "other events; a pull request's author picks the branch name): remove it and rely on WORKFLOW_NAME and "
        "ACTOR_ACCOUNT_ID"
    ]
    assert messages("ci-runner-webhook-narrowed", [_hook([QUEUED])])[:2] == [
        "runner filter group 1 admits every workflow's jobs: add a WORKFLOW_NAME filter",
        "runner filter group 1 admits jobs anyone starts, a fork's pull request included: add an ACTOR_ACCOUNT_ID "
        "filter listing the accounts (fleet: environments.<env>.ci.runner_actor_ids)",
    ]
