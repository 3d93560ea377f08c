"""What the limit counts share: the fleet's accounts and raised quotas (Config), one count (Usage), and each plan as
the counts read it (Stack, with helpers to name and find resources)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlinfra.model import quotas as quota_data
from dlinfra.model.fleet.schema import Fleet

SHARED_ACCOUNT = "the shared account"  # environments without `account`


@dataclass(frozen=True)
class Config:
    """What the fleet says about accounts and raised quotas."""

    accounts: Mapping[str, str] = field(default_factory=dict)  # environment -> account (absent: the shared one)
    raised: quota_data.QuotaValues = field(default_factory=dict)  # fleet `quotas`: code -> applied value
    raised_in: Mapping[str, quota_data.QuotaValues] = field(default_factory=dict)  # region -> code -> value
    default_vpc_deleted: bool = False  # fleet `default_vpc_deleted`: no account keeps AWS's default VPCs

    @classmethod
    def of(cls, fleet: Fleet) -> Config:
        """The accounts and raised quotas a fleet file gives."""
        return cls(
            accounts={n: e.account for n, e in fleet.environments.items() if e.account},
            raised=dict(fleet.quotas),
            raised_in={r: dict(s.quotas) for r, s in fleet.regions.items() if s.quotas},
            default_vpc_deleted=fleet.default_vpc_deleted,
        )

    def account(self, environment: str | None) -> str:
        """The account an environment's stacks apply to, for people."""
        return self.accounts.get(environment or "", SHARED_ACCOUNT)


@dataclass(frozen=True)
class Usage:
    """One count of one quota in one scope."""

    quota: str  # key in dlinfra/data/quotas.yaml
    region: str  # whose raised values apply
    scope: str  # what was counted, for people
    stack: str  # the stack it is in; "" when it spans stacks
    resource: str  # URN of what bounds it (route table, security group, subnet); "" when it spans resources
    used: int
    how: str  # what the count is made of
    capacity: int | None = None  # the limit, for a quota whose limit is the counted thing's size


@dataclass(frozen=True)
class Stack:
    """One plan as the counts read it."""

    name: str
    kind: str
    environment: str | None
    region: str | None
    account: str
    resources: Sequence[Mapping[str, Any]]
    default_vpc: bool = True  # its account still has the default VPC AWS creates in every region

    def of(self, *types: str) -> list[Mapping[str, Any]]:
        """Its resources of these types, in plan order."""
        return [r for r in self.resources if r["type"] in types]


def stacks(plans: Sequence[Mapping[str, Any]], config: Config) -> list[Stack]:
    """The plans (dlinfra.plan/v1 exports) by stack name, each with its account; custom resources only."""
    out = []
    for plan in sorted(plans, key=lambda p: str(p["stack"])):
        role = plan.get("role") or {}
        out.append(
            Stack(
                name=str(plan["stack"]),
                kind=str(role.get("kind", "")),
                environment=role.get("environment"),
                region=role.get("region"),
                account=config.account(role.get("environment")),
                resources=[r for r in plan["resources"] if r.get("custom", True)],
                default_vpc=not config.default_vpc_deleted,
            )
        )
    return out


def number(value: Any) -> int:
    """An input count as an int: the plan export writes numbers as floats."""
    return int(value or 0)


def by_id(stacks: Sequence[Stack]) -> dict[str, tuple[Stack, Mapping[str, Any]]]:
    """Every resource by its id (ids are unique across stacks: each is derived from its URN), with its stack."""
    return {r["id"]: (s, r) for s in stacks for r in s.resources if r.get("id")}


def label(resource: Mapping[str, Any]) -> str:
    """`Type name`, with the physical name people find in the console where the plan has it."""
    return f"{resource['type'].split(':')[-1]} {name_of(resource)}"


def name_of(resource: Mapping[str, Any]) -> str:
    """The resource's physical name (its Name tag or name input), else its logical name."""
    inputs: Mapping[str, Any] = resource.get("inputs") or {}
    tags = inputs.get("tags")
    name = (tags.get("Name") if isinstance(tags, Mapping) else None) or inputs.get("name")
    return name if isinstance(name, str) and name else str(resource["name"])


def flat(value: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair under an input, at any depth."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield k, v
            yield from flat(v)
    elif isinstance(value, list):
        for item in value:
            yield from flat(item)
