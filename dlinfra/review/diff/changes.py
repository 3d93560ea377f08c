"""What the diff finds: each resource's change, each address-plan change, and the whole `Diff` of two plan sets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dlinfra.model.gpu_quotas import QuotaView
from dlinfra.review.diff.plans import Topology
from policy.dlinfra_policy.rules.state import STATEFUL_TYPES

Action = Literal["create", "update", "replace", "delete"]


@dataclass(frozen=True)
class Change:
    """What happens to one resource."""

    stack: str
    action: Action
    type: str
    name: str
    urn: str
    inputs: tuple[str, ...] = ()  # update: the inputs that change; replace: the ones forcing it
    note: str = ""
    values: tuple[tuple[str, str], ...] = ()  # (input, "old → new") for top-level inputs that changed
    protected: bool = False  # the base resource is protected: `pulumi up` refuses to replace or delete it
    conditional: tuple[str, ...] = ()  # update: "path: when" for inputs whose change replaces it under a condition

    @property
    def stateful(self) -> bool:
        return self.type in STATEFUL_TYPES


@dataclass(frozen=True)
class LockChange:
    """An address-plan allocation added, released or renumbered."""

    key: str
    before: str | None
    after: str | None


@dataclass(frozen=True)
class Diff:
    """Everything that differs between two plan sets."""

    base: str
    head: str
    changes: tuple[Change, ...]
    stacks_added: tuple[str, ...]
    stacks_removed: tuple[str, ...]
    lock: tuple[LockChange, ...]
    base_topology: Topology
    head_topology: Topology
    config_changed: tuple[str, ...] = ()  # stacks whose stack config file changed (secrets never show offline)
    roles: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # head stack -> its plan's role
    base_reach: Mapping[str, Any] | None = None
    head_reach: Mapping[str, Any] | None = None
    reach_errors: tuple[str, ...] = ()
    base_cost: Mapping[str, Any] | None = None
    head_cost: Mapping[str, Any] | None = None
    base_quotas: QuotaView = field(default_factory=lambda: QuotaView(()))  # from the base's Kueue objects
    head_quotas: QuotaView = field(default_factory=lambda: QuotaView(()))

    @property
    def empty(self) -> bool:
        """Nothing to apply: no resource, stack, address-plan or stack-config change."""
        return not (self.changes or self.stacks_added or self.stacks_removed or self.lock or self.config_changed)

    @property
    def dangerous(self) -> list[Change]:
        """Stateful resources replaced or deleted: data would be lost."""
        return [c for c in self.changes if c.stateful and c.action in ("replace", "delete")]

    @property
    def unprotected(self) -> list[Change]:
        """Stateful resources that lose protect or retain-on-delete: the next mistake could delete their data."""
        return [
            c for c in self.changes if c.stateful and c.action == "update" and any("→ false)" in k for k in c.inputs)
        ]

    @property
    def blocking(self) -> list[Change]:
        """Protected resources replaced or deleted: `pulumi up` stops there until someone unprotects them."""
        return [c for c in self.changes if c.protected and c.action in ("replace", "delete")]

    @property
    def capacity_reductions(self) -> list[Change]:
        """Auto Scaling groups whose maximum or minimum goes down: running nodes may be terminated."""
        out = []
        for c in self.changes:
            if c.type != "aws:autoscaling/group:Group" or c.action != "update":
                continue
            for key, change in c.values:
                if key in ("maxSize", "minSize", "desiredCapacity") and " → " in change:
                    before, after = change.split(" → ", 1)
                    if _number(after) < _number(before):
                        out.append(c)
                        break
        return out

    @property
    def apply_order(self) -> list[str]:
        """Changed stacks in the order they must be applied: regional, then in-cluster, then global."""
        rank = {"regional": 0, "k8s": 1, "global": 2}
        stacks = {c.stack for c in self.changes}
        return sorted(stacks, key=lambda s: (rank.get(str((self.roles.get(s) or {}).get("kind")), 3), s))

    @property
    def renumbered(self) -> list[LockChange]:
        return [c for c in self.lock if c.before is not None and c.after is not None]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")
