"""Service quotas of what runs beside the network and the nodes: Lambda's concurrency per account and region, each
CodeBuild project's concurrent builds against the account's quota for its compute type, and the managed policies
attached to each IAM role across an account's stacks."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence

from dlinfra.checks.limits.scope import Stack, Usage, name_of, number

# Lambda keeps this much of the account's concurrency unreserved: a reservation may take the unreserved concurrency
# less 100 (Lambda developer guide, "Configuring reserved concurrency for a function").
UNRESERVED_MINIMUM = 100
# (environment type, compute type) -> the concurrent builds quota it counts against (dlinfra/data/quotas.yaml).
BUILD_QUOTAS = {("LINUX_CONTAINER", "BUILD_GENERAL1_SMALL"): "codebuild-linux-small-builds"}


def count_lambda_concurrency(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """Per account and region where a function reserves concurrency: the reservations plus the 100 Lambda keeps
    unreserved. Functions without a reservation draw on the unreserved pool and fail nothing on apply, so a region
    where none reserves is not counted (a new account's 10 would otherwise be reported over for no reason)."""
    reserved: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    for s in stacks:
        for function in s.of("aws:lambda/function:Function"):
            if s.region:
                # -1 (the provider's default) or absent: no reservation.
                held = max(number(function["inputs"].get("reservedConcurrentExecutions", -1)), 0)
                reserved[(s.account, s.region)].append((name_of(function), held))
    for (account, region), functions in sorted(reserved.items()):
        holders = [f"{name} {n}" for name, n in functions if n]
        if not holders:
            continue
        yield Usage(
            quota="lambda-concurrent-executions",
            region=region,
            scope=f"{region} ({account})",
            stack="",
            resource="",
            used=sum(n for _, n in functions) + UNRESERVED_MINIMUM,
            how=f"reserved: {', '.join(holders)}; {UNRESERVED_MINIMUM} kept unreserved",
        )


def count_build_limits(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """Each CodeBuild project against its compute type's concurrent builds quota: its concurrent build limit, which
    may not exceed the quota (terraform-provider-aws PR 37748), or, without one, the one build it needs to run at all:
    its builds queue against the quota (CodeBuild user guide, "Builds in AWS CodeBuild"), and at 0 none starts."""
    for s in stacks:
        for project in s.of("aws:codebuild/project:Project"):
            environment = project["inputs"].get("environment") or {}
            quota = BUILD_QUOTAS.get((environment.get("type", ""), environment.get("computeType", "")))
            if quota is None:
                continue
            limit = number(project["inputs"].get("concurrentBuildLimit"))
            compute_type = environment["computeType"]
            yield Usage(
                quota=quota,
                region=s.region or "",
                scope=f"build project {name_of(project)}",
                stack=s.name,
                resource=project["urn"],
                used=limit or 1,
                how=f"its concurrent build limit ({compute_type})"
                if limit
                else f"no project limit: one build at a time at least, the rest queue ({compute_type})",
            )


def count_role_policies(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """Managed policies attached to each role, per account: IAM is global, so every stack of the account that attaches
    one to the same role (by name) counts against that role's quota."""
    attached: dict[tuple[str, str], list[str]] = defaultdict(list)
    for s in stacks:
        for attachment in s.of("aws:iam/rolePolicyAttachment:RolePolicyAttachment"):
            role = attachment["inputs"].get("role")
            if isinstance(role, str) and role:
                attached[(s.account, role)].append(s.name)
    for (account, role), where in sorted(attached.items()):
        counts = sorted({stack: where.count(stack) for stack in where}.items())
        yield Usage(
            quota="iam-managed-policies-per-role",
            region="us-east-1",  # IAM's quotas are requested there
            scope=f"role {role} ({account})",
            stack="",
            resource="",
            used=len(where),
            how=", ".join(f"{stack} {n}" for stack, n in counts),
        )
