"""Rules for the in-VPC CI runners: a CodeBuild-hosted runner takes only the workflow jobs it is for.

CodeBuild starts a runner inside the VPC for every queued workflow job its webhook's filter groups admit (AWS
CodeBuild user guide, "GitHub webhook events" and "Tutorial: Configure a CodeBuild-hosted GitHub Actions runner";
API reference, "WebhookFilter"). Any workflow, in any branch or pull request, can ask for the runner's label, so a
webhook that admits every WORKFLOW_JOB_QUEUED event runs untrusted code next to the EKS API and the sites. For
those events the API reference documents two narrowing filters, WORKFLOW_NAME ("Works with WORKFLOW_JOB_QUEUED
events only") and ACTOR_ACCOUNT_ID; HEAD_REF "works with ... push, ... pull request ... events", so on a workflow
job it guards nothing a pull request's author cannot pick (a fork's own `main`), or it keeps the runner from ever
starting.
"""

from __future__ import annotations

from dlinfra.model import ci

from .core import Context, Resource, as_objects, is_true

WEBHOOK = "aws:codebuild/webhook:Webhook"
_UNTRUSTED = "untrusted"  # a workflow name no runner is for
_STRANGER = 1  # a GitHub account id on no list: a fork's author


def runner_webhook_narrowed(resource: Resource, ctx: Context) -> list[str]:
    """Every runner filter group names its workflow exactly (WORKFLOW_NAME ^name$) and lists the accounts whose jobs
    it takes (ACTOR_ACCOUNT_ID ^(id|...)$), and holds no filter CodeBuild does not evaluate on workflow jobs
    (HEAD_REF and the like): so a fork's pull request reaches no runner, whatever its branch or workflow name."""
    if resource.type != WEBHOOK:
        return []
    groups = [
        [
            ci.WebhookFilter(str(f.get("type", "")), str(f.get("pattern", "")), is_true(f.get("excludeMatchedPattern")))
            for f in as_objects(group.get("filters"))
        ]
        for group in as_objects(resource.inputs.get("filterGroups"))
    ]
    runner_groups = [
        g
        for g in groups
        if any(f.type == "EVENT" and ci.JOB_QUEUED in {e.strip() for e in f.pattern.split(",")} for f in g)
    ]
    out = []
    for number, group in enumerate(runner_groups, start=1):
        if not any(f.type == "WORKFLOW_NAME" and not f.exclude for f in group):
            out.append(f"runner filter group {number} admits every workflow's jobs: add a WORKFLOW_NAME filter")
        actors = [f for f in group if f.type == "ACTOR_ACCOUNT_ID" and not f.exclude]
        if not actors:
            out.append(
                f"runner filter group {number} admits jobs anyone starts, a fork's pull request included: add an "
                "ACTOR_ACCOUNT_ID filter listing the accounts (fleet: environments.<env>.ci.runner_actor_ids)"
            )
        for f in actors:
            if not ci.ACTOR_PATTERN.fullmatch(f.pattern):
                out.append(
                    f"runner filter group {number}: ACTOR_ACCOUNT_ID {f.pattern!r} is not a list of numeric GitHub "
                    "ids anchored at both ends (^(id|id)$)"
                )
        for f in ci.unguarded_filters(group):
            out.append(
                f"runner filter group {number}: {f.type} is not a guard on WORKFLOW_JOB_QUEUED events (CodeBuild "
                "documents it for other events; a pull request's author picks the branch name): remove it and rely "
                "on WORKFLOW_NAME and ACTOR_ACCOUNT_ID"
            )
    # Judge workflow names as if every actor were admitted: the actor list is the other, separate guard.
    probe = [[f for f in g if f.type != "ACTOR_ACCOUNT_ID"] for g in runner_groups]
    names = sorted({_UNTRUSTED} | {n for w in ci.WORKFLOWS.values() for n in (f"{w}-copy", f"copy-{w}")})
    for name in names:
        if ci.admits(probe, ci.WorkflowJob(name, f"refs/heads/{ci.DEFAULT_BRANCH}", _STRANGER)):
            out.append(
                f"admits jobs of workflow {name!r}: a WORKFLOW_NAME filter must name the runner's workflow exactly "
                "(^name$)"
            )
    return out
