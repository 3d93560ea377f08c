"""Service quotas of what runs beside the network and the nodes: Lambda's concurrency per account and region, and
each CodeBuild project's concurrent builds against the account's quota for its compute type."""

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
    """Per account and region with functions: their reserved concurrency plus the 100 Lambda keeps unreserved."""
    reserved: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    for s in stacks:
        for function in s.of("aws:lambda/function:Function"):
            if s.region:
                # -1 (the provider's default) or absent: no reservation.
                held = max(number(function["inputs"].get("reservedConcurrentExecutions", -1)), 0)
                reserved[(s.account, s.region)].append((name_of(function), held))
    for (account, region), functions in sorted(reserved.items()):
        holders = [f"{name} {n}" for name, n in functions if n]
        yield Usage(
            quota="lambda-concurrent-executions",
            region=region,
            scope=f"{region} ({account})",
            stack="",
            resource="",
            used=sum(n for _, n in functions) + UNRESERVED_MINIMUM,
            how=f"reserved: {', '.join(holders) or 'none'}; {UNRESERVED_MINIMUM} kept unreserved",
        )


def count_build_limits(stacks: Sequence[Stack]) -> Iterator[Usage]:
    """Each CodeBuild project's concurrent build limit against its compute type's quota: a project's limit may not
    exceed it (terraform-provider-aws PR 37748). A project without a limit queues its builds instead."""
    for s in stacks:
        for project in s.of("aws:codebuild/project:Project"):
            environment = project["inputs"].get("environment") or {}
            quota = BUILD_QUOTAS.get((environment.get("type", ""), environment.get("computeType", "")))
            limit = number(project["inputs"].get("concurrentBuildLimit"))
            if quota is None or not limit:
                continue
            yield Usage(
                quota=quota,
                region=s.region or "",
                scope=f"build project {name_of(project)}",
                stack=s.name,
                resource=project["urn"],
                used=limit,
                how=f"its concurrent build limit ({environment['computeType']})",
            )
