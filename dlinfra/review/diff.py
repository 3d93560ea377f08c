"""`dlinfra diff`: what a change does to the infrastructure, from the offline plans of two git revisions.

`compare` is a pure function over two plan sets; `diff_revisions` produces those sets by exporting each
revision with `git archive` (read-only on the repository) and running that revision's own offline preview
in a subprocess. `render_markdown` writes the result for a pull-request comment: stateful losses and
renumbered networks first, then per-stack creates, updates, replacements and deletes, the address-plan
diff and a diagram of regions, sites and links.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import itertools
import json
import os
import re
import subprocess
import tarfile
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from dlinfra.errors import DlinfraError
from dlinfra.model import replacement, stackroles
<<<<<<< HEAD
from dlinfra.model.fleet.schema import Fleet
from policy.dlinfra_policy.rules import STATEFUL_TYPES
=======
from dlinfra.model.fleet import Fleet
from policy.dlinfra_policy.rules.state import STATEFUL_TYPES
>>>>>>> helper-rules

Action = Literal["create", "update", "replace", "delete"]
COMMENT_MARKER = "<!-- dlinfra-diff -->"  # lets the workflow update its own comment instead of adding more
MAX_MARKDOWN = 60_000  # GitHub rejects comments over 65,536 characters
MAX_LISTED = 40  # resources listed per section before "and N more"
PREVIEW_TIMEOUT = 600


@dataclass(frozen=True)
class Site:
    """A physical site as the diagram shows it."""

    name: str
    region: str
    environment: str
    routing: str


@dataclass(frozen=True)
class Topology:
    """Regions, regional stacks, sites and links of a fleet."""

    regions: tuple[str, ...] = ()
    primary: str | None = None
    stacks: tuple[tuple[str, str], ...] = ()  # (environment, region)
    sites: tuple[Site, ...] = ()
    peerings: tuple[tuple[str, str, str], ...] = ()  # (environment, region, region)
    pools: tuple[tuple[str, str], ...] = ()  # (environment, pool)
    teams: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanSet:
    """One revision's offline plans, address plan and topology."""

    label: str  # e.g. "origin/main (1a2b3c4)"
    plans: Mapping[str, Mapping[str, Any]]  # stack -> plan export (docs/plan-export.md)
    lock: Mapping[str, str] = field(default_factory=dict)  # allocation key -> CIDR
    topology: Topology = field(default_factory=Topology)
    configs: Mapping[str, str] = field(default_factory=dict)  # stack -> text of stacks/Pulumi.<stack>.yaml
    reach: Mapping[str, Any] | None = None  # `dlinfra reach --json` of these plans; None: not analysed
    reach_error: str = ""  # why the reachability analysis could not run on this revision
    cost: Mapping[str, Any] | None = None  # `dlinfra cost --json` of these plans; None: not estimated


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


# --- comparing ------------------------------------------------------------------------------------------


_normal = replacement.normal


MAX_VALUE = 80  # characters of a value shown in the report


def _short(value: Any) -> str:
    text = json.dumps(_normal(value), sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def _value_change(before: Any, after: Any) -> str:
    """ "old → new" for one input; lists as the items added and removed; secrets stay masked as the plans hold them."""
    if isinstance(before, list) and isinstance(after, list):
        # Items compare whole; only their display is shortened (two items may share their first 80 characters).
        def full(v: Any) -> str:
            return json.dumps(_normal(v), sort_keys=True)

        old, new = [full(v) for v in before], [full(v) for v in after]
        added = [_short(v) for v, f in zip(after, new, strict=True) if f not in old]
        removed = [_short(v) for v, f in zip(before, old, strict=True) if f not in new]
        if added or removed:
            return ", ".join([*(f"+{v}" for v in added), *(f"-{v}" for v in removed)])
        return "reordered"
    if isinstance(before, str) and isinstance(after, str) and before[:1] in "{[" and after[:1] in "{[":
        # JSON documents held as strings (IAM policies, add-on configuration): what changed inside them.
        try:
            return _value_change(json.loads(before), json.loads(after))
        except ValueError:
            pass
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        keys = _changed_inputs(before, after)
        return "; ".join(f"{k}: {_value_change(before.get(k), after.get(k))}" for k in keys[:6]) + (
            f"; … {len(keys) - 6} more" if len(keys) > 6 else ""
        )
    return f"{_shown(before)} → {_shown(after)}"


def _shown(value: Any) -> str:
    return "(none)" if value is None else _short(value)


def _changed_inputs(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(before) | set(after) if _normal(before.get(k)) != _normal(after.get(k)))


def _detail(key: str, before: Any, after: Any) -> list[str]:
    """A changed map input (tags) as the keys that changed in it, so reviewers see which tag moved."""
    if isinstance(before, Mapping) and isinstance(after, Mapping) and key in ("tags", "labels"):
        return [f"{key}.{k}" for k in _changed_inputs(before, after)]
    return [key]


STACK_TYPE = "pulumi:pulumi:Stack"


def _child_urns(prefix: str, parent: str | None, type_: str, name: str) -> list[str]:
    """The URN a resource gets under `parent` (None: no parent), in both conventions plans may hold.

    Pulumi prefixes the type with the parent's whole type chain and leaves out the stack; the offline engine (Pulumi's
    mock monitor) uses only the parent's own type, the stack's included. Both are tried: a candidate only counts when
    the base plan has that URN.
    """
    if parent is None:
        return [f"{prefix}::{type_}::{name}", f"{prefix}::{STACK_TYPE}${type_}::{name}"]
    chain = parent.split("::", 3)[2]
    own = chain.rsplit("$", 1)[-1]
    full = type_ if own == STACK_TYPE else f"{chain}${type_}"
    return list(dict.fromkeys(f"{prefix}::{t}::{name}" for t in (full, f"{own}${type_}")))


def _alias_urns(resource: Mapping[str, Any], resources: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """URNs a resource was known by, as the Pulumi engine resolves aliases.

    Its own aliases: URNs, and specs (name, type, stack, project, parent or noParent; docs/plan-export.md) applied
    to its URN. Then the aliases it inherits: a child whose parent was known by another URN was known by its own URN
    under that one (with the parent's old name as its name prefix, when its name starts with the parent's).
    `resources` is every resource of the plan by URN, components included, so parents can be looked up.
    """
    urn = resource["urn"]
    stack_part, project, _, name = urn.split("::", 3)
    type_ = str(resource["type"])
    parent = resource.get("parent")
    out: list[str] = []
    for alias in resource.get("aliases") or []:
        if alias.startswith("urn:"):
            out.append(alias)
            continue
        spec = dict(part.split("=", 1) for part in alias.split(",") if "=" in part)
        stack = spec.get("stack", stack_part.removeprefix("urn:pulumi:"))
        prefix = f"urn:pulumi:{stack}::{spec.get('project', project)}"
        # "noParent" alone: how plan exports before noParent=true was recorded wrote Alias(parent=None).
        old_parent = None if alias == "noParent" or spec.get("noParent") == "true" else spec.get("parent", parent)
        out += _child_urns(prefix, old_parent, spec.get("type", type_), spec.get("name", name))
    parent_resource = resources.get(parent) if parent else None
    if parent_resource is not None:
        parent_name = str(parent_resource["name"])
        for parent_alias in _alias_urns(parent_resource, resources):
            old_name = name
            if name.startswith(parent_name):
                old_name = parent_alias.split("::", 3)[3] + name[len(parent_name) :]
            out += _child_urns(f"{stack_part}::{project}", parent_alias, type_, old_name)
    return list(dict.fromkeys(out))


def _kept_identities(pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> dict[str, str]:
    """Old -> new values the fake cloud derived from the URN of each aliased resource (its id, ARN and the like).

    An aliased resource keeps its cloud identity, but offline its fake id and ARN follow its URN; without this map,
    every input referring to a moved resource would look changed, and a moved VPC would replace its subnets.
    """
    out: dict[str, str] = {}
    for old, new in pairs:
        old_outputs = old.get("outputs") or {}
        values = [(old.get("id"), new.get("id"))]
        values += [(old_outputs.get(key), value) for key, value in (new.get("outputs") or {}).items()]
        for before, after in values:
            # Fake ids and ARNs carry 12+ hex digits; short values (masks, flags) are left alone.
            if isinstance(before, str) and isinstance(after, str) and before != after and len(before) >= 12:
                out[before] = after
    return out


def _substituted(value: Any, identities: Mapping[str, str]) -> Any:
    """A value with every old identity of an aliased resource replaced by its new one."""
    if isinstance(value, str):
        for before, after in identities.items():
            value = value.replace(before, after)
        return value
    if isinstance(value, dict):
        return {k: _substituted(v, identities) for k, v in value.items()}
    if isinstance(value, list):
        return [_substituted(v, identities) for v in value]
    return value


def compare_stack(
    stack: str,
    base: Mapping[str, Any] | None,
    head: Mapping[str, Any] | None,
    table: replacement.Table | None = None,
) -> list[Change]:
    """Creates, updates, replacements and deletes of one stack's custom resources."""
    table = table or replacement.table()
    before = {r["urn"]: r for r in (base or {}).get("resources", []) if r.get("custom")}
    everything = {r["urn"]: r for r in (head or {}).get("resources", [])}  # components too: they are parents
    after = {urn: r for urn, r in everything.items() if r.get("custom")}
    renamed: dict[str, str] = {}  # base URN -> head URN, through aliases
    for urn, resource in after.items():
        if urn not in before:
            for alias in _alias_urns(resource, everything):
                if alias in before and alias not in after:
                    renamed[alias] = urn
                    break
    out: list[Change] = []
    matched_heads = set(renamed.values())
    identities = _kept_identities((before[b], after[h]) for b, h in renamed.items())
    for urn, old in sorted(before.items()):
        new_urn = urn if urn in after else renamed.get(urn)
        if new_urn is None:
            continue
        new = after[new_urn]
        note = ""
        if new_urn != urn:
            note = f"renamed from {old['name']} (alias)" if old["name"] != new["name"] else "moved (alias)"
        old_inputs, new_inputs = _substituted(old.get("inputs") or {}, identities), new.get("inputs") or {}
        changed = _changed_inputs(old_inputs, new_inputs)
        forced, maybe = table.forced(new["type"], old_inputs, new_inputs, new.get("replace_on_changes") or ())
        conditional = tuple(f"{k}: {table.rule(new['type']).why(k)}" for k in maybe)
        if old.get("provider") != new.get("provider") and old.get("provider") and new.get("provider"):
            forced.append("(provider)")
        # Options change no cloud resource, but dropping protect from stateful data is worth a reviewer's eye.
        options = [
            f"({option}: {str(bool(old.get(option))).lower()} → {str(bool(new.get(option))).lower()})"
            for option in ("protect", "retain_on_delete")
            if bool(old.get(option)) != bool(new.get(option))
        ]
        values = tuple((k, _value_change(old_inputs.get(k), new_inputs.get(k))) for k in changed)
        if forced:
            out.append(
                Change(
                    stack,
                    "replace",
                    new["type"],
                    new["name"],
                    new_urn,
                    tuple(forced),
                    note,
                    values,
                    bool(old.get("protect")),
                )
            )
        elif changed or options:
            shown = [d for k in changed for d in _detail(k, old_inputs.get(k), new_inputs.get(k))] + options
            out.append(
                Change(
                    stack,
                    "update",
                    new["type"],
                    new["name"],
                    new_urn,
                    tuple(shown),
                    note,
                    values,
                    conditional=conditional,
                )
            )
    deleted = [r for urn, r in sorted(before.items()) if urn not in after and urn not in renamed]
    created = [r for urn, r in sorted(after.items()) if urn not in before and urn not in matched_heads]
    # A resource whose URN changed without an alias (a moved parent, a renamed component) is deleted and
    # created again: report the pair as one replacement, with the fix.
    for old in list(deleted):
        twin = next((r for r in created if r["type"] == old["type"] and r["name"] == old["name"]), None)
        if twin is not None:
            deleted.remove(old)
            created.remove(twin)
            note = "URN changed (new parent or type chain) without an alias: add aliases to keep it"
            out.append(Change(stack, "replace", twin["type"], twin["name"], twin["urn"], ("(urn)",), note))
    for r in deleted:
        note = "protected: `pulumi up` refuses until it is unprotected" if r.get("protect") else ""
        out.append(Change(stack, "delete", r["type"], r["name"], r["urn"], note=note, protected=bool(r.get("protect"))))
    out += [Change(stack, "create", r["type"], r["name"], r["urn"]) for r in created]
    return out


# The fake cloud's ids and ARNs carry a hex digest of the URN (12+ digits with a letter in them); account ids,
# flags and names do not, so they are never mistaken for an identity shared by everything.
_FAKE_ID = re.compile(r"(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{12,}")


def _identities(resource: Mapping[str, Any]) -> set[str]:
    """What other resources can hold of this one: its id and the computed outputs that carry an id."""
    values = [resource.get("id"), *(resource.get("outputs") or {}).values()]
    return {v for v in values if isinstance(v, str) and _FAKE_ID.search(v)}


def _holds(value: Any, identities: set[str]) -> bool:
    if isinstance(value, str):
        return any(i in value for i in identities)
    if isinstance(value, Mapping):
        return any(_holds(v, identities) for v in value.values())
    if isinstance(value, list):
        return any(_holds(v, identities) for v in value)
    return False


def cascade(
    changes: Sequence[Change], head: Mapping[str, Mapping[str, Any]], table: replacement.Table | None = None
) -> list[Change]:
    """Changes plus what replacements drag along, transitively, across stacks.

    The fake cloud derives ids from URNs, so a replaced subnet keeps its offline id and nothing that holds it looks
    changed; a real preview gives it a new id, unknown until apply. Here every resource whose inputs hold a replaced
    resource's id or output becomes an update of those inputs ("known after apply"), or a replacement when one of
    them forces it (the replacement table), and so on until nothing new is dragged in. A replaced provider
    replaces every resource it manages.
    """
    table = table or replacement.table()
    resources = {
        (stack, r["urn"]): r for stack, plan in head.items() for r in plan.get("resources", []) if r.get("custom")
    }
    out = {(c.stack, c.urn): c for c in changes}
    originals = dict(out)
    causes: dict[tuple[str, str], list[str]] = {}  # updated resource -> the replaced resources it holds
    queue = [(c.stack, c.urn) for c in changes if c.action == "replace" and (c.stack, c.urn) in resources]
    while queue:
        source_key = queue.pop(0)
        source = resources[source_key]
        identities = _identities(source)
        is_provider = str(source["type"]).startswith("pulumi:providers:")
        if not identities and not is_provider:
            continue
        because = f"{source['name']} ({source_key[0]}) is replaced"
        for key, r in resources.items():
            current = out.get(key)
            if key == source_key or (current is not None and current.action in ("replace", "create")):
                continue
            managed = is_provider and str(r.get("provider") or "").startswith(source_key[1] + "::")
            inputs = r.get("inputs") or {}
            held = sorted(k for k, v in inputs.items() if _holds(v, identities))
            if not held and not managed:
                continue
            extra = r.get("replace_on_changes") or ()
            forced = (
                ["(provider)"]
                if managed
                else table.forcing_held(r["type"], inputs, functools.partial(_holds, identities=identities), extra)
            )
            stack, urn = key
            if forced:
                out[key] = Change(
                    stack,
                    "replace",
                    r["type"],
                    r["name"],
                    urn,
                    tuple(forced),
                    f"cascade: {because}",
                    protected=bool(r.get("protect")),
                )
                queue.append(key)
            else:
                causes.setdefault(key, []).append(f"{source['name']} ({source_key[0]})")
                original = originals.get(key)
                inputs = tuple(dict.fromkeys([*(current.inputs if current else ()), *held]))
                note = "; ".join(
                    n
                    for n in (
                        original.note if original else "",
                        f"cascade: {', '.join(causes[key])} replaced; new value known after apply",
                    )
                    if n
                )
                if current is not None:
                    out[key] = dataclasses.replace(current, inputs=inputs, note=note)
                else:
                    out[key] = Change(stack, "update", r["type"], r["name"], urn, inputs, note)
    return sorted(out.values(), key=lambda c: (c.stack, c.urn))


def compare(base: PlanSet, head: PlanSet) -> Diff:
    """The difference between two plan sets, stack by stack, with replacements' cascades; pure."""
    table = replacement.table()
    for plans, label in ((base.plans, base.label), (head.plans, head.label)):
        types = {r["type"] for plan in plans.values() for r in plan.get("resources", []) if r.get("custom")}
        table.require(types, what=f"the plans of {label}")
    stacks = sorted(set(base.plans) | set(head.plans))
    changes = [c for s in stacks for c in compare_stack(s, base.plans.get(s), head.plans.get(s), table)]
    changes = cascade(changes, head.plans, table)
    lock = [
        LockChange(key, base.lock.get(key), head.lock.get(key))
        for key in sorted(set(base.lock) | set(head.lock))
        if base.lock.get(key) != head.lock.get(key)
    ]
    return Diff(
        base=base.label,
        head=head.label,
        changes=tuple(changes),
        stacks_added=tuple(s for s in stacks if s not in base.plans),
        stacks_removed=tuple(s for s in stacks if s not in head.plans),
        lock=tuple(lock),
        base_topology=base.topology,
        head_topology=head.topology,
        config_changed=tuple(
            s for s in sorted(set(base.configs) | set(head.configs)) if base.configs.get(s) != head.configs.get(s)
        ),
        roles={s: dict(p.get("role") or {}) for s, p in head.plans.items()},
        base_reach=base.reach,
        head_reach=head.reach,
        reach_errors=tuple(f"{ps.label}: {ps.reach_error}" for ps in (base, head) if ps.reach_error),
        base_cost=base.cost,
        head_cost=head.cost,
    )


def touched(diff: Diff, fleet: Fleet | None = None) -> list[dict[str, str]]:
    """Stacks of the head revision that a real preview should cover: planned changes or a changed config.

    With the head's fleet, each row also says where the stack runs (`runs_on`: github-hosted or the in-VPC
    runner's label prefix) and whether pull requests may preview it for real (`preview`: real or offline).
    """
    stacks = {c.stack for c in diff.changes} | set(diff.config_changed)
    rows = [
        {
            "stack": stack,
            "kind": str(diff.roles[stack].get("kind") or ""),
            "environment": str(diff.roles[stack].get("environment") or ""),
            "region": str(diff.roles[stack].get("region") or ""),
        }
        for stack in sorted(stacks)
        if stack in diff.roles  # a stack the head removes has nothing left to preview
    ]
    if fleet is None:
        return rows
    for row in rows:
        role = stackroles.parse(fleet, row["stack"])
        row["runs_on"] = stackroles.runs_on(fleet, role)
        row["preview"] = "real" if stackroles.pull_request_preview(fleet, role) else "offline"
    return rows


# --- markdown ----------------------------------------------------------------------------------------------


def _code(text: str) -> str:
    return f"`{text.replace('`', '')}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _limited(lines: Sequence[str], limit: int = MAX_LISTED) -> list[str]:
    if len(lines) <= limit:
        return list(lines)
    return [*lines[:limit], f"| … | {len(lines) - limit} more | |"]


DIFF_SCHEMA = "dlinfra.diff/v1"


def to_json(diff: Diff) -> dict[str, Any]:
    """The diff for tools (docs/diff-json.md): what blocks first, entities, every change with its values."""

    def change(c: Change) -> dict[str, Any]:
        return {
            "stack": c.stack,
            "action": c.action,
            "type": c.type,
            "name": c.name,
            "urn": c.urn,
            "inputs": list(c.inputs),
            "values": {k: v for k, v in c.values},
            "note": c.note,
            "may_replace": list(c.conditional),
            "protected": c.protected,
            "stateful": c.stateful,
        }

    return {
        "schema": DIFF_SCHEMA,
        "base": diff.base,
        "head": diff.head,
        "blocking": [change(c) for c in diff.blocking],
        "data_loss": [change(c) for c in diff.dangerous],
        "unprotected": [change(c) for c in diff.unprotected],
        "capacity_reductions": [change(c) for c in diff.capacity_reductions],
        "renumbered": [{"key": c.key, "before": c.before, "after": c.after} for c in diff.renumbered],
        "apply_order": diff.apply_order,
        "entities": entity_summary(diff),
        "stacks_added": list(diff.stacks_added),
        "stacks_removed": list(diff.stacks_removed),
        "config_changed": list(diff.config_changed),
        "changes": [change(c) for c in diff.changes],
        "lock": [{"key": c.key, "before": c.before, "after": c.after} for c in diff.lock],
        "reach": {"base": diff.base_reach, "head": diff.head_reach, "errors": list(diff.reach_errors)},
        "cost": {"base": diff.base_cost, "head": diff.head_cost},
    }


def render_markdown(diff: Diff) -> str:
    """The diff as GitHub-flavoured markdown for a pull-request comment."""
    out = [COMMENT_MARKER, f"## dlinfra offline diff: {_code(diff.base)} → {_code(diff.head)}", ""]
    out += _warnings(diff)
    out += _entities(diff)
    out += _summary(diff)
    out += _replacement_table(diff)
    for stack in sorted({c.stack for c in diff.changes}):
        out += _stack_section(stack, [c for c in diff.changes if c.stack == stack], diff)
    out += _lock_section(diff)
    out += ["### Regions, sites and links", "", *mermaid(diff.base_topology, diff.head_topology), ""]
    out += _reach_section(diff)
    out += _cost_section(diff)
    out.append(
        "<sub>Offline preview under dlinfra's fake cloud: values the cloud computes are not compared. The real "
        "`pulumi preview` runs in the preview workflow where credentials exist.</sub>"
    )
    text = "\n".join(out) + "\n"
    if len(text) > MAX_MARKDOWN:
        cut = text[:MAX_MARKDOWN].rsplit("\n", 1)[0]
        text = cut + "\n\n… (truncated: run `dlinfra diff` locally for the whole diff)\n"
    return text


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _warnings(diff: Diff) -> list[str]:
    lines: list[str] = []
    if diff.blocking:
        lines += ["> [!CAUTION]", "> **This apply stops here: protected resources would be replaced or deleted.**"]
        for c in diff.blocking:
            why = f" (forced by {', '.join(c.inputs)})" if c.action == "replace" and c.inputs else ""
            lines.append(f"> - **{c.action.upper()}** {_code(c.type)} {_code(c.name)} in {_code(c.stack)}{why}")
        lines += [
            "> `pulumi up` refuses until each is unprotected on purpose (protect=False), or the change is undone.",
            "",
        ]
    if diff.capacity_reductions:
        lines += ["> [!WARNING]", "> **Node capacity goes down: running nodes above the new size are terminated.**"]
        for c in diff.capacity_reductions:
            sizes = ", ".join(f"{k} {v}" for k, v in c.values if k in ("minSize", "maxSize", "desiredCapacity"))
            lines.append(f"> - {_code(c.name)} in {_code(c.stack)}: {sizes}")
        lines.append("")
    maybe = [c for c in diff.changes if c.conditional]
    if maybe:
        lines += ["> [!WARNING]", "> **These updates replace the resource if the condition holds (check the values):**"]
        for c in maybe:
            data = f" ({STATEFUL_TYPES[c.type]})" if c.stateful else ""
            lines.append(f"> - {_code(c.name)} in {_code(c.stack)}{data}: " + "; ".join(c.conditional))
        lines.append("")
    order = diff.apply_order
    if len(order) > 1:
        lines += [
            "**Apply in this order** (each stack reads the ones before it): " + " → ".join(_code(s) for s in order),
            "",
        ]
    danger = diff.dangerous
    if danger or diff.renumbered or diff.unprotected:
        lines += ["> [!CAUTION]"]
        if danger:
            lines.append("> **Stateful resources would be replaced or deleted — their data would be lost:**")
            for c in danger:
                why = f" (forced by {', '.join(c.inputs)})" if c.inputs else ""
                extra = f" — {c.note}" if c.note else ""
                lines.append(
                    f"> - **{c.action.upper()}** {_code(c.type)} {_code(c.name)} in {_code(c.stack)}{why}: "
                    f"{STATEFUL_TYPES[c.type]}{extra}"
                )
        if diff.unprotected:
            lines += [">"] if danger else []
            lines.append("> **Stateful resources lose their protection:**")
            for c in diff.unprotected:
                dropped = ", ".join(k for k in c.inputs if "→ false)" in k)
                lines.append(f"> - {_code(c.type)} {_code(c.name)} in {_code(c.stack)}: {dropped}")
        if diff.renumbered:
            lines += [">"] if danger or diff.unprotected else []
            lines.append("> **The address plan renumbers live networks:**")
            lines += [f"> - {_code(c.key)}: {c.before} → {c.after}" for c in diff.renumbered]
        lines.append("")
    return lines


def _entities(diff: Diff) -> list[str]:
    named = entity_summary(diff)
    return ["**What this changes:** " + ", ".join(f"`{n}`" for n in named), ""] if named else []


def _summary(diff: Diff) -> list[str]:
    config = (
        [
            f"Stack config changed: {', '.join(_code(s) for s in diff.config_changed)} "
            "(the real preview shows its effect).",
            "",
        ]
        if diff.config_changed
        else []
    )
    if not diff.changes and not diff.lock:
        return ["No changes: every stack plans the same resources with the same inputs.", "", *config]
    counts = Counter((c.stack, c.action) for c in diff.changes)
    lines = ["| stack | create | update | replace | delete |", "| --- | ---: | ---: | ---: | ---: |"]
    for stack in sorted({c.stack for c in diff.changes}):
        tag = " (new stack)" if stack in diff.stacks_added else (" (removed)" if stack in diff.stacks_removed else "")
        row = [str(counts.get((stack, a), 0)) for a in ("create", "update", "replace", "delete")]
        lines.append(f"| {_code(stack)}{tag} | " + " | ".join(row) + " |")
    return [*lines, "", *config]


def _replacement_table(diff: Diff) -> list[str]:
    replaced = [c for c in diff.changes if c.action == "replace"]
    if not replaced:
        return []
    lines = ["### Replacements by type", "", "| type | resources | forced by |", "| --- | ---: | --- |"]
    for type_, group in itertools.groupby(sorted(replaced, key=lambda c: c.type), key=lambda c: c.type):
        members = list(group)
        keys = sorted({k for c in members for k in c.inputs})
        lines.append(f"| {_code(type_)} | {len(members)} | {', '.join(_code(k) for k in keys)} |")
    return [*lines, ""]


def _stack_section(stack: str, changes: Sequence[Change], diff: Diff) -> list[str]:
    counts = Counter(c.action for c in changes)
    summary = ", ".join(f"{counts[a]} to {a}" for a in ("create", "update", "replace", "delete") if counts[a])
    lines = [f"### {_code(stack)}", "", f"<details><summary>{summary}</summary>", ""]
    for action, heading, column in (
        ("replace", "Replace", "forced by"),
        ("delete", "Delete", "note"),
        ("update", "Update", "changed inputs"),
    ):
        rows = [c for c in changes if c.action == action]
        if not rows:
            continue
        # Stateful data first; every replacement and delete is listed (they are what a reviewer approves),
        # updates up to MAX_LISTED; the whole report is still cut to GitHub's size at the end.
        rows.sort(key=lambda c: (not c.stateful, not c.protected, c.type, c.name))
        lines += [f"**{heading}**", "", f"| type | name | {column} |", "| --- | --- | --- |"]
        body = [
            f"| {_code(c.type)} | {_code(c.name)} | "
            + _cell(
                ", ".join(_code(k) for k in c.inputs)
                + (f" — {c.note}" if c.note else "")
                + "".join(f"<br>{_code(k)}: {v}" for k, v in c.values)
                + "".join(f"<br>**may replace**: {m}" for m in c.conditional)
            )
            + " |"
            for c in rows
        ]
        lines += [*(body if action != "update" else _limited(body)), ""]
    created = [c for c in changes if c.action == "create"]
    if created:
        by_type = Counter(c.type for c in created)
        lines += ["**Create**", "", "| type | count |", "| --- | ---: |"]
        lines += [f"| {_code(t)} | {n} |" for t, n in sorted(by_type.items())]
        lines.append("")
    return [*lines, "</details>", ""]


def _lock_section(diff: Diff) -> list[str]:
    if not diff.lock:
        return ["### Address plan", "", "No allocation added, released or renumbered.", ""]
    lines = ["### Address plan", "", "| key | base | head | change |", "| --- | --- | --- | --- |"]
    for c in diff.lock:
        kind = "added" if c.before is None else ("released" if c.after is None else "**renumbered**")
        lines.append(f"| {_code(c.key)} | {c.before or ''} | {c.after or ''} | {kind} |")
    return [*lines, ""]


def _node(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", "_".join(parts))


def mermaid(base: Topology, head: Topology) -> list[str]:
    """A flowchart of regions (with their stacks), sites and links; what the change adds or removes is marked."""
    lines = ["```mermaid", "flowchart LR"]
    added: list[str] = []
    removed: list[str] = []
    regions = sorted(set(base.regions) | set(head.regions))
    for region in regions:
        label = f"{region} (primary)" if region == head.primary else region
        lines.append(f'  subgraph {_node("r", region)}["AWS {label}"]')
        for env, stack_region in sorted(set(base.stacks) | set(head.stacks)):
            if stack_region == region:
                node = _node("s", env, region)
                lines.append(f'    {node}["{env}-{region}"]')
                _mark(node, (env, region), base.stacks, head.stacks, added, removed)
        lines.append("  end")
        _mark(_node("r", region), region, base.regions, head.regions, added, removed)
    sites = {s.name: s for s in (*base.sites, *head.sites)}
    for name in sorted(sites):
        node = _node("site", name)
        lines.append(f'  {node}(["site {name}"])')
        _mark(node, name, [s.name for s in base.sites], [s.name for s in head.sites], added, removed)
    links: list[tuple[str, str, str, bool, bool]] = []  # (a, b, label, in base, in head)
    for site in sorted(set(base.sites) | set(head.sites), key=lambda s: s.name):
        a, b = _node("site", site.name), _node("s", site.environment, site.region)
        links.append((a, b, f"IPsec {site.routing}", site in base.sites, site in head.sites))
    for env, r1, r2 in sorted(set(base.peerings) | set(head.peerings)):
        peering = (env, r1, r2)
        links.append(
            (
                _node("s", env, r1),
                _node("s", env, r2),
                "TGW peering",
                peering in base.peerings,
                peering in head.peerings,
            )
        )
    for a, b, label, in_base, in_head in links:
        if in_head and not in_base:
            lines.append(f'  {a} ==>|"{label} (new)"| {b}')
        elif in_base and not in_head:
            lines.append(f'  {a} -.-|"{label} (removed)"| {b}')
        else:
            lines.append(f'  {a} ---|"{label}"| {b}')
    lines += [
        "  classDef added stroke:#1a7f37,stroke-width:3px",
        "  classDef removed stroke:#cf222e,stroke-dasharray:5 5",
    ]
    if added:
        lines.append(f"  class {','.join(added)} added")
    if removed:
        lines.append(f"  class {','.join(removed)} removed")
    return [*lines, "```"]


def _mark(node: str, key: Any, base: Iterable[Any], head: Iterable[Any], added: list[str], removed: list[str]) -> None:
    in_base, in_head = key in set(base), key in set(head)
    if in_head and not in_base:
        added.append(node)
    elif in_base and not in_head:
        removed.append(node)


# --- revisions ------------------------------------------------------------------------------------------


def topology(fleet: Mapping[str, Any]) -> Topology:
    """The diagram's view of a fleet file, read leniently: an older revision may predate today's schema."""
    regions = fleet.get("regions") or {}
    environments = fleet.get("environments") or {}
    stacks = [(env, region) for env, spec in environments.items() for region in ((spec or {}).get("regions") or {})]
    peerings = []
    for env, spec in environments.items():
        env_regions = sorted((spec or {}).get("regions") or {})
        peerings += [(env, a, b) for a, b in itertools.combinations(env_regions, 2)]
    sites = [
        Site(
            name=str(name),
            region=str((spec or {}).get("region", "")),
            environment=str((spec or {}).get("environment", "prod")),
            routing=str((spec or {}).get("routing", "static")),
        )
        for name, spec in (fleet.get("sites") or {}).items()
    ]
    primary = next((r for r, spec in regions.items() if (spec or {}).get("primary")), None)
    pools = [(env, str(p)) for env, spec in environments.items() for p in ((spec or {}).get("node_pools") or {})]
    return Topology(
        regions=tuple(sorted(regions)),
        primary=primary,
        stacks=tuple(sorted(stacks)),
        sites=tuple(sorted(sites, key=lambda s: s.name)),
        peerings=tuple(sorted(peerings)),
        pools=tuple(sorted(pools)),
        teams=tuple(sorted(str(t) for t in (fleet.get("teams") or {}))),
    )


def _token(name: str, word: str) -> bool:
    return re.search(rf"(^|-){re.escape(word)}(-|$)", name) is not None


def entity_summary(diff: Diff) -> list[str]:
    """Pools, teams and sites the change adds or removes, with where their resources are: "+ pool infer-l4 (prod,
    2 regions)", "- site ams1 (prod, 3 regions)"; removals first, then whole stacks added or removed.

    The entities are the difference between the two revisions' fleets; a resource counts for one when its logical
    name starts with pool-<pool>- (in that pool's environment) or holds the site's or team's name as a word.
    """
    base, head = diff.base_topology, diff.head_topology
    changed: list[tuple[str, str, str, str | None]] = []  # (sign, kind, name, environment)
    for sign, mine, theirs in (("-", base, head), ("+", head, base)):
        changed += [(sign, "pool", p, e) for e, p in sorted(set(mine.pools) - set(theirs.pools))]
        changed += [
            (sign, "site", n, None) for n in sorted({s.name for s in mine.sites} - {s.name for s in theirs.sites})
        ]
        changed += [(sign, "team", t, None) for t in sorted(set(mine.teams) - set(theirs.teams))]
    where: dict[tuple[str, str, str], set[str]] = {(sign, kind, name): set() for sign, kind, name, _ in changed}
    for c in diff.changes:
        if c.action not in ("create", "delete"):
            continue
        for sign, kind, name, env in changed:
            if kind == "pool":
                hit = c.stack.split("-", 1)[0] == env and c.name.startswith(f"pool-{name}-")
            else:
                hit = _token(c.name, name)
            if hit:
                where[(sign, kind, name)].add(c.stack)
    lines = []
    for (sign, kind, name), stacks in sorted(where.items(), key=lambda kv: (kv[0][0] != "-", kv[0][1], kv[0][2])):
        envs = sorted({s.split("-", 1)[0] for s in stacks})
        regional = {s for s in stacks if not s.endswith(("-k8s", "-global"))}
        detail = ", ".join(envs) + (f", {len(regional)} region{'s' if len(regional) != 1 else ''}" if regional else "")
        lines.append(f"{sign} {kind} {name}" + (f" ({detail})" if detail else ""))
    lines += [f"+ stack {s} (new)" for s in diff.stacks_added] + [f"- stack {s} (removed)" for s in diff.stacks_removed]
    # Renumbered networks, named by their allocation (vpc/prod/us-west-2), not by every subnet inside them.
    renumbered = diff.renumbered
    for moved in renumbered:
        inside = any(o.key != moved.key and _within(o.key, moved.key) for o in renumbered)
        if not any(o.key != moved.key and _within(moved.key, o.key) for o in renumbered):
            network = moved.key.split("/", 1)[1]
            lines.append(
                f"~ network {network} {moved.before} → {moved.after}" + (" (and its subnets)" if inside else "")
            )
    return lines


def _within(key: str, outer: str) -> bool:
    """Whether allocation `key` lies inside `outer`: subnet/prod/us-west-2/... inside vpc/prod/us-west-2."""
    kind, _, rest = outer.partition("/")
    return kind == "vpc" and key.startswith("subnet/") and key.removeprefix("subnet/").startswith(rest + "/")


def _git(repo: Path, *args: str, binary: bool = False) -> Any:
    try:
        proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, check=False, text=not binary)
    except FileNotFoundError:
        raise DlinfraError("git is not installed") from None
    if proc.returncode != 0:
        err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
        raise DlinfraError(f"git {' '.join(args)}: {err.strip()}", file=str(repo))
    return proc.stdout


def _resolve(repo: Path, rev: str) -> str:
    """The commit a revision names; DlinfraError for a revision git does not know."""
    try:
        return str(_git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")).strip()
    except DlinfraError:
        raise DlinfraError(
            f"unknown revision {rev!r} (fetch it first, e.g. `git fetch origin main`)", file=str(repo)
        ) from None


def _export(repo: Path, commit: str, dest: Path) -> None:
    """The tree of a commit, written to `dest` without touching the repository (git archive)."""
    data = _git(repo, "archive", "--format=tar", commit, binary=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")


def _preview(tree: Path, out: Path, fleet: Path, lock: Path, python: str, label: str) -> None:
    """Run a tree's own `dlinfra preview --all` with the given interpreter (the current venv)."""
    # Options after the subcommand: argparse lets a subcommand's defaults override options given before it.
    command = [python, "-m", "dlinfra", "preview", "--all", "--fleet", str(fleet), "--lock", str(lock)]
    command += ["--summary", "--out", str(out)]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)  # the revision's own packages, from its tree, must win
    try:
        proc = subprocess.run(
            command, cwd=tree, capture_output=True, text=True, check=False, timeout=PREVIEW_TIMEOUT, env=env
        )
    except subprocess.TimeoutExpired:
        raise DlinfraError(f"offline preview of {label} took longer than {PREVIEW_TIMEOUT}s") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        raise DlinfraError(f"offline preview of {label} failed:\n{tail}")


def _plan_set(tree: Path, out: Path, fleet: Path, lock: Path, label: str) -> PlanSet:
    plans = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(out.glob("*.json"))}
    lock_data = _read_yaml(tree / lock) or {}
    allocations = {str(k): str(v) for k, v in (lock_data.get("allocations") or {}).items()}
    configs = {
        p.name[len("Pulumi.") : -len(".yaml")]: p.read_text(encoding="utf-8") for p in tree.glob("stacks/Pulumi.*.yaml")
    }
    reach, reach_error = None, ""
    try:
        from dlinfra.checks.reach import check as reach_check

        reach = reach_check.summary_json(reach_check.analyse(tree / fleet, tree / lock, list(plans.values())))
    except DlinfraError as exc:
        reach_error = str(exc)
    estimate = None
    try:
        from dlinfra.review import cost

        estimate = cost.estimate(plans.values()).to_json()
    except DlinfraError:
        estimate = None  # a type the price table lacks: the cost section says it could not be estimated
    return PlanSet(
        label=label,
        plans=plans,
        lock=allocations,
        topology=topology(_read_yaml(tree / fleet) or {}),
        configs=configs,
        reach=reach,
        reach_error=reach_error,
        cost=estimate,
    )


def _usd(value: float) -> str:
    return f"{value:,.2f}"


def _signed(value: float) -> str:
    return ("+" if value > 0 else "") + _usd(value) if value else "0"


def _cost_section(diff: Diff) -> list[str]:
    """Monthly cost per stack at min and max pool size, base → head, from `dlinfra cost`'s dated price table."""
    head, base = diff.head_cost, diff.base_cost
    lines = ["### Cost (USD per month)", ""]
    if head is None or base is None:
        return [*lines, "The cost could not be estimated for one revision (run `dlinfra cost` for why).", ""]
    before = {s["stack"]: s for s in base["stacks"]}
    after = {s["stack"]: s for s in head["stacks"]}
    lines += ["| stack | min (base → head) | change | max (base → head) | change |", "|---|---:|---:|---:|---:|"]
    for stack in sorted(set(before) | set(after)):
        b, h = before.get(stack, {"usd_min": 0.0, "usd_max": 0.0}), after.get(stack, {"usd_min": 0.0, "usd_max": 0.0})
        if (b["usd_min"], b["usd_max"]) == (h["usd_min"], h["usd_max"]):
            continue  # unchanged stacks are in the total
        lines.append(
            f"| {_code(stack)} | {_usd(b['usd_min'])} → {_usd(h['usd_min'])} | {_signed(h['usd_min'] - b['usd_min'])} "
            f"| {_usd(b['usd_max'])} → {_usd(h['usd_max'])} | {_signed(h['usd_max'] - b['usd_max'])} |"
        )
    low, high = _signed(head["usd_min"] - base["usd_min"]), _signed(head["usd_max"] - base["usd_max"])
    lines.append(
        f"| **total** | {_usd(base['usd_min'])} → {_usd(head['usd_min'])} | **{low}** "
        f"| {_usd(base['usd_max'])} → {_usd(head['usd_max'])} | **{high}** |"
    )
    lines += [
        "",
        f"Prices of {head['price_date']} (dlinfra/data/prices.yaml, {len(head['unverified_prices'])} "
        "marked unverified), "
        f"{head['hours_per_month']:g} h per month; min and max are every pool at its minimum and maximum size. Not "
        f"counted: {', '.join(head['not_counted'])}.",
        "",
    ]
    return lines


def _reach_section(diff: Diff) -> list[str]:
    """Reachability of base and head, per family, and the intents this change breaks or repairs."""
    head, base = diff.head_reach, diff.base_reach
    lines = ["### Reachability", ""]
    for error in diff.reach_errors:
        lines.append(f"> [!WARNING]\n> reachability could not be analysed for {error}")
    if head is None:
        return [*lines, ""]
    failed_head = {f["intent"]: f for f in head["failures"]}
    failed_base = {f["intent"] for f in base["failures"]} if base else set()
    proved = head["flows"] - head["failed_flows"]
    lines.append(
        f"Head: **{head['intents']} intents, {head['flows']} flows, {proved} proved, {head['failed_flows']} failing** "
        f"(`dlinfra reach`)."
    )
    lines += ["", "| family | intents | flows | failing intents (base → head) |", "|---|---:|---:|---:|"]
    base_families = base["families"] if base else {}
    for family, row in head["families"].items():
        before = base_families.get(family, {}).get("failed_intents", "–")
        lines.append(f"| {family} | {row['intents']} | {row['flows']} | {before} → {row['failed_intents']} |")
    broken = sorted(set(failed_head) - failed_base)
    repaired = sorted(failed_base - set(failed_head))
    if broken:
        lines += ["", "**This change breaks:**"]
        for intent in broken[:20]:
            f = failed_head[intent]
            lines.append(
                f"- {_code(intent)}: {f['source']} → {f['destination']} {f['protocol']}/{f['port']}: {f['reason']}"
            )
    if repaired:
        lines += ["", "**This change repairs:** " + ", ".join(_code(i) for i in repaired[:20])]
    return [*lines, ""]


def _read_yaml(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise DlinfraError(f"not valid YAML ({exc})", file=str(path)) from None


def revision_plans(repo: Path, rev: str | None, *, fleet: Path, lock: Path, python: str, work: Path) -> PlanSet:
    """Offline plans of a revision (None: the working tree as it is, uncommitted changes included)."""
    if rev is None:
        tree, label = repo, "working tree"
    else:
        commit = _resolve(repo, rev)
        label = f"{rev} ({commit[:9]})"
        tree = work / f"tree-{commit[:12]}"
        tree.mkdir(parents=True, exist_ok=True)
        _export(repo, commit, tree)
    out = work / f"plans-{'worktree' if rev is None else _resolve(repo, rev)[:12]}"
    _preview(tree, out.resolve(), fleet, lock, python, label)
    return _plan_set(tree, out, fleet, lock, label)


def diff_revisions(*, repo: Path, base: str, head: str | None, fleet: Path, lock: Path, python: str) -> Diff:
    """What `head` (None: the working tree) changes against `base`."""
    top = Path(str(_git(repo, "rev-parse", "--show-toplevel")).strip())
    for rev in (base, head):
        if rev is not None:
            _resolve(top, rev)  # fail on a bad revision before any preview starts
    with tempfile.TemporaryDirectory(prefix="dlinfra-diff-") as tmp, ThreadPoolExecutor(max_workers=2) as pool:
        # The two previews are independent subprocesses: run them side by side.
        jobs = [
            pool.submit(revision_plans, top, rev, fleet=fleet, lock=lock, python=python, work=Path(tmp))
            for rev in (base, head)
        ]
        before, after = (job.result() for job in jobs)
        return compare(before, after)
