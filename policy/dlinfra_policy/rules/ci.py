"""Rules for the in-VPC CI runners: a CodeBuild-hosted runner takes only the workflow jobs it is for.

CodeBuild starts a runner inside the VPC for every queued workflow job its webhook's filter groups admit (AWS
CodeBuild user guide, "GitHub webhook events" and "Tutorial: Configure a CodeBuild-hosted GitHub Actions runner";
API reference, "WebhookFilter"). Any workflow, in any branch or pull request, can ask for the runner's label, so a
webhook that admits every WORKFLOW_JOB_QUEUED event runs untrusted code next to the EKS API and the sites.
"""

from __future__ import annotations

from dlinfra.model import ci

from .core import Context, Resource, as_objects, is_true

WEBHOOK = "aws:codebuild/webhook:Webhook"
_UNTRUSTED = "untrusted"  # a workflow name no runner is for
# Refs a pull request or a pushed branch can have that merely resemble the default branch.
_OTHER_REFS = (
    "refs/heads/feature",
    f"refs/heads/{ci.DEFAULT_BRANCH}-copy",
    f"refs/heads/copy-{ci.DEFAULT_BRANCH}",
    f"refs/tags/{ci.DEFAULT_BRANCH}",
    "refs/pull/1/merge",
)


def runner_webhook_narrowed(resource: Resource, ctx: Context) -> list[str]:
    """A runner webhook names its workflow and filters on the branch, and no job of the apply workflow from any ref
    but the default branch passes it: so a pull request can reach neither the apply runner nor, by copying the
    apply workflow's name, any other."""
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
        if not any(f.type == "HEAD_REF" for f in group):
            out.append(f"runner filter group {number} admits jobs from every branch: add a HEAD_REF filter")
    # Judge workflow names and refs as if every actor were admitted: a lab member's pull request is untrusted code
    # for the apply runner too.
    probe = [[f for f in g if f.type != "ACTOR_ACCOUNT_ID"] for g in runner_groups]
    default = f"refs/heads/{ci.DEFAULT_BRANCH}"
    names = sorted({_UNTRUSTED} | {n for w in ci.WORKFLOWS.values() for n in (f"{w}-copy", f"copy-{w}")})
    for name in names:
        if ci.admits(probe, ci.WorkflowJob(name, default, 1)):
            out.append(
                f"admits jobs of workflow {name!r}: a WORKFLOW_NAME filter must name the runner's workflow exactly "
                "(^name$)"
            )
    apply = ci.WORKFLOWS["apply"]
    for ref in _OTHER_REFS:
        if ci.admits(probe, ci.WorkflowJob(apply, ref, 1)):
            out.append(
                f"admits the {apply} workflow's jobs from {ref}: the apply runner takes jobs from {default} only "
                f"(HEAD_REF ^{default}$), so no pull request reaches it"
            )
    return out
