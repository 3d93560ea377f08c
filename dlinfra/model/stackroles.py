"""Stack names and what each stack is.

- `<env>-<region>` (regional): the region's AWS resources, applied from GitHub-hosted runners.
- `<env>-<region>-k8s` (in-cluster): the objects inside the region's EKS cluster (Helm releases, namespaces,
  RBAC, Kueue, storage classes). The EKS endpoint is private, so this stack is applied from the runner the
  regional stack declares inside the VPC; it reads the cluster through StackReference.
- `<env>-global`: what spans an environment's regions (the transit gateway peering mesh).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from dlinfra.errors import StackNameError
from dlinfra.model import ci
from dlinfra.model.ci import Purpose
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.naming import Names

K8S_SUFFIX = "k8s"
# The in-VPC runners' CodeBuild projects: Names.physical(RUNNER_COMPONENTS[purpose]). Apply and preview are
# separate projects with separate roles, so the preview runner's pull-request jobs never run where applies do
# (which jobs reach each runner: dlinfra.model.ci).
RUNNER_COMPONENTS: dict[Purpose, str] = {"apply": "ci-apply", "preview": "ci-preview"}


@dataclass(frozen=True)
class StackRole:
    """What a stack declares: one region of an environment, or what spans the environment's regions."""

    kind: Literal["regional", "k8s", "global"]
    environment: str
    region: str | None = None

    @property
    def name(self) -> str:
        if self.kind == "k8s":
            return f"{self.environment}-{self.region}-{K8S_SUFFIX}"
        return f"{self.environment}-{self.region or 'global'}"

    @property
    def runs_in_vpc(self) -> bool:
        """True when only a runner inside the region's VPC can apply the stack (private EKS endpoint)."""
        return self.kind == "k8s"


def roles(fleet: Fleet) -> list[StackRole]:
    """Every stack of the fleet in dependency order: regional stacks, their in-cluster stacks, then global ones.

    An environment gets a global stack only when it spans two or more regions: with one region there
    is nothing to peer.
    """
    regional = list(fleet.regional_stacks())
    out = [StackRole("regional", env, region) for env, region in regional]
    # A MultiKueue manager's in-cluster stack reads its workers' (their kubeconfigs): it comes after them.
    in_cluster = [StackRole("k8s", env, region) for env, region in regional]
    out += sorted(in_cluster, key=lambda r: _has_workers(fleet, r))
    out += [StackRole("global", env) for env, spec in fleet.environments.items() if len(spec.regions) > 1]
    return out


def _has_workers(fleet: Fleet, role: StackRole) -> bool:
    """Whether a stack is an in-cluster stack of a MultiKueue manager that has workers."""
    env = role.environment
    return role.kind == "k8s" and role.region == fleet.multikueue_manager(env) and bool(fleet.multikueue_workers(env))


def parse(fleet: Fleet, stack: str, *, fleet_file: str = "fleet.yaml") -> StackRole:
    """The role of a stack name; StackNameError listing the valid names when it matches nothing."""
    for role in roles(fleet):
        if role.name == stack:
            return role
    valid = ", ".join(r.name for r in roles(fleet))
    env = next((e for e in fleet.environments if stack.startswith(f"{e}-")), None)
    reason = "matches no environment and region"
    if env is not None and stack == f"{env}-global":
        reason = f"environment {env!r} has one region, so it has no global stack"
    elif env is not None:
        region = stack.removeprefix(env + "-").removesuffix(f"-{K8S_SUFFIX}")
        reason = f"{region!r} is not a region of environment {env!r}"
    raise StackNameError(f"stack {stack!r}: {reason}; stacks of this fleet: {valid}", file=fleet_file)


def dependencies(fleet: Fleet, role: StackRole) -> list[StackRole]:
    """Stacks a stack reads through StackReference: an in-cluster stack reads its region's stack, a global
    stack every region of its environment."""
    if role.kind == "regional":
        return []
    if role.kind == "k8s":
        workers = fleet.multikueue_workers(role.environment) if _has_workers(fleet, role) else ()
        return [StackRole("regional", role.environment, role.region)] + [
            StackRole("k8s", role.environment, w) for w in workers
        ]
    return [StackRole("regional", role.environment, r) for r in fleet.environments[role.environment].regions]


def with_dependencies(fleet: Fleet, wanted: list[StackRole]) -> set[StackRole]:
    """`wanted` and every stack they read, directly or through another: an in-cluster stack that manages
    MultiKueue reads its workers' in-cluster stacks, which read their own regions' stacks."""
    needed: set[StackRole] = set()
    pending = list(wanted)
    while pending:
        role = pending.pop()
        if role not in needed:
            needed.add(role)
            pending.extend(dependencies(fleet, role))
    return needed


def runner_project(fleet: Fleet, role: StackRole, purpose: Purpose = "apply") -> str:
    """The CodeBuild project of the in-VPC runner that applies (or previews) an in-cluster stack, declared by its
    region. The preview runner exists only where the environment allows real pull-request previews."""
    if role.kind != "k8s" or role.region is None:
        raise ValueError(f"{role.name}: only in-cluster stacks run on the in-VPC runner")
    return Names(fleet.project, role.environment, role.region).physical(RUNNER_COMPONENTS[purpose])


def runs_on(fleet: Fleet, role: StackRole, purpose: Purpose = "apply") -> str:
    """Where a stack is applied (or previewed): `github-hosted`, or the label prefix of the region's CodeBuild-hosted
    runner for that purpose.

    A workflow job targets a CodeBuild runner with `runs-on: <prefix>-${{ github.run_id }}-${{ github.run_attempt }}`
    (AWS CodeBuild, "Tutorial: Configure a CodeBuild-hosted GitHub Actions runner").
    """
    return f"codebuild-{runner_project(fleet, role, purpose)}" if role.runs_in_vpc else "github-hosted"


def has_preview_runner(fleet: Fleet, environment: str) -> bool:
    """Whether an environment's regions declare a preview runner: only where pull requests get a real preview."""
    ci = fleet.environments[environment].ci
    return bool(ci and ci.pull_request_preview)


def rows(fleet: Fleet, selected: list[StackRole]) -> dict[str, list[dict[str, str]]]:
    """The stacks grouped by kind, in dependency order, as the apply workflow's job matrices read them."""
    out: dict[str, list[dict[str, str]]] = {"regional": [], "k8s": [], "global": []}
    for role in selected:
        out[role.kind].append(
            {
                "stack": role.name,
                "kind": role.kind,
                "environment": role.environment,
                "region": role.region or "",
                "runs_on": runs_on(fleet, role),
            }
        )
    return out


def pull_request_preview(fleet: Fleet, role: StackRole) -> bool:
    """True when pull requests get a real `pulumi preview` of the stack: its environment says so (ci), since
    the preview credential can then decrypt that environment's state."""
    return has_preview_runner(fleet, role.environment)


def runner_refusals(
    fleet: Fleet, selected: Sequence[StackRole], actor_id: int, purpose: Purpose = "apply"
) -> list[tuple[str, str]]:
    """(fleet key, problem) per environment whose in-VPC stacks among `selected` no runner would take from the
    GitHub account `actor_id`. A runner's webhook admits only the jobs of its workflow that an account in
    ci.runner_actor_ids started (dlinfra.model.ci.webhook_filters), and a job no runner takes stays queued until
    GitHub cancels it, after 24 to 48 hours (GitHub docs, "Usage limits for self-hosted runners": job queue time),
    holding apply.yml's single `apply` concurrency group all that time."""
    out = []
    in_vpc = [r for r in selected if r.runs_in_vpc]
    for env in dict.fromkeys(r.environment for r in in_vpc):
        stacks = ", ".join(r.name for r in in_vpc if r.environment == env)
        spec = fleet.environments[env].ci
        if spec is None:
            out.append(
                (
                    f"environments.{env}",
                    f"no `ci`, so no in-VPC runner takes {stacks}: apply it over the laptop VPN "
                    "(scripts/bootstrap-region.sh)",
                )
            )
            continue
        job = ci.WorkflowJob(ci.WORKFLOWS[purpose], f"refs/heads/{ci.DEFAULT_BRANCH}", actor_id=actor_id)
        if not ci.admits([ci.webhook_filters(purpose, actor_ids=spec.runner_actor_ids)], job):
            listed = ", ".join(str(i) for i in spec.runner_actor_ids)
            out.append(
                (
                    f"environments.{env}.ci.runner_actor_ids",
                    f"GitHub account {actor_id} started this run, and the {purpose} runner takes jobs from {listed} "
                    f"only: {stacks} would wait 24 to 48 hours for a runner. Add the account's id here (a reviewed "
                    "change), or push or dispatch as a listed account",
                )
            )
    return out
