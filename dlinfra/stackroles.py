"""Stack names and what each stack is: `<env>-<region>` (regional) or `<env>-global`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dlinfra.errors import StackNameError
from dlinfra.fleet import Fleet


@dataclass(frozen=True)
class StackRole:
    """What a stack declares: one region of an environment, or what spans the environment's regions."""

    kind: Literal["regional", "global"]
    environment: str
    region: str | None = None

    @property
    def name(self) -> str:
        return f"{self.environment}-{self.region or 'global'}"


def roles(fleet: Fleet) -> list[StackRole]:
    """Every stack of the fleet in dependency order: regional stacks, then global ones.

    An environment gets a global stack only when it spans two or more regions: with one region there
    is nothing to peer.
    """
    out = [StackRole("regional", env, region) for env, region in fleet.regional_stacks()]
    out += [StackRole("global", env) for env, spec in fleet.environments.items() if len(spec.regions) > 1]
    return out


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
        reason = f"{stack.removeprefix(env + '-')!r} is not a region of environment {env!r}"
    raise StackNameError(f"stack {stack!r}: {reason}; stacks of this fleet: {valid}", file=fleet_file)


def dependencies(fleet: Fleet, role: StackRole) -> list[StackRole]:
    """Stacks a stack reads through StackReference (a global stack reads its environment's regions)."""
    if role.kind == "regional":
        return []
    return [StackRole("regional", role.environment, r) for r in fleet.environments[role.environment].regions]
