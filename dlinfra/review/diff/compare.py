"""The pure comparison of two plan sets: per-stack changes with their values, the address plan, the stacks a
real preview should cover, and the fleet entities a change adds or removes."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dlinfra.model import gpu_quotas, replacement, stackroles
from dlinfra.model.fleet.schema import Fleet
from dlinfra.review.diff.aliases import alias_urns, kept_identities, substituted
from dlinfra.review.diff.cascade import cascade
from dlinfra.review.diff.changes import Change, Diff, LockChange
from dlinfra.review.diff.plans import PlanSet

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
            for alias in alias_urns(resource, everything):
                if alias in before and alias not in after:
                    renamed[alias] = urn
                    break
    out: list[Change] = []
    matched_heads = set(renamed.values())
    identities = kept_identities((before[b], after[h]) for b, h in renamed.items())
    for urn, old in sorted(before.items()):
        new_urn = urn if urn in after else renamed.get(urn)
        if new_urn is None:
            continue
        new = after[new_urn]
        if old == new and not identities:
            # The same resource, inputs and options (most of any plan): nothing below can find a change, as what
            # it compares (normal() of each input) is equal where the values are.
            continue
        note = ""
        if new_urn != urn:
            note = f"renamed from {old['name']} (alias)" if old["name"] != new["name"] else "moved (alias)"
        old_inputs, new_inputs = substituted(old.get("inputs") or {}, identities), new.get("inputs") or {}
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
        # From the rendered Kueue objects, not the fleet: an older revision's fleet may not load today, and its
        # objects are what its apply would set (dlinfra.model.gpu_quotas.from_plans).
        base_quotas=gpu_quotas.from_plans(base.plans.values(), base.topology.scaled_quotas),
        head_quotas=gpu_quotas.from_plans(head.plans.values(), head.topology.scaled_quotas),
    )


@dataclass(frozen=True)
class QuotaChange:
    """A team's guaranteed and borrowable GPUs in one flavor, before and after (None: no quota there)."""

    environment: str
    team: str
    region: str
    flavor: str
    before: gpu_quotas.TeamQuota | None
    after: gpu_quotas.TeamQuota | None

    def to_json(self) -> dict[str, Any]:
        def gpus(row: gpu_quotas.TeamQuota | None) -> dict[str, int] | None:
            return None if row is None else {"guaranteed": row.guaranteed, "borrowable": row.borrowable}

        return {
            "environment": self.environment,
            "team": self.team,
            "region": self.region,
            "flavor": self.flavor,
            "before": gpus(self.before),
            "after": gpus(self.after),
        }


def quota_changes(diff: Diff) -> list[QuotaChange]:
    """Every flavor where a team's guaranteed or borrowable GPUs change, by environment, team and region."""
    before, after = diff.base_quotas.by_key(), diff.head_quotas.by_key()
    out = []
    # The head's order first (flavors in admission order), then what only the base had.
    for key in [*after, *(k for k in before if k not in after)]:
        old, new = before.get(key), after.get(key)
        if old is None or new is None or (old.guaranteed, old.borrowable) != (new.guaranteed, new.borrowable):
            out.append(QuotaChange(*key, old, new))
    return sorted(out, key=lambda c: (c.environment, c.team, c.region))


def touched(diff: Diff, fleet: Fleet | None = None) -> list[dict[str, str]]:
    """Stacks of the head revision that a real preview should cover: planned changes or a changed config.

    With the head's fleet, each row also says where its preview runs (`runs_on`: github-hosted or the label prefix of
    the region's in-VPC preview runner, declared only where previews are real) and whether pull requests may preview
    it for real (`preview`: real or offline).
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
        row["runs_on"] = stackroles.runs_on(fleet, role, "preview")
        row["preview"] = "real" if stackroles.pull_request_preview(fleet, role) else "offline"
    return rows


def _token(name: str, word: str) -> bool:
    return re.search(rf"(^|-){re.escape(word)}(-|$)", name) is not None


def entity_summary(diff: Diff) -> list[str]:
    """Pools, dev boxes, teams and sites the change adds or removes, with where their resources are: "+ pool
    infer-l4 (prod, 2 regions)", "- site ams1 (prod, 3 regions)"; removals first, then whole stacks added or removed.

    The entities are the difference between the two revisions' fleets; a resource counts for one when its logical
    name starts with pool-<pool>- (in that pool's environment) or holds the site's or team's name as a word.
    """
    base, head = diff.base_topology, diff.head_topology
    changed: list[tuple[str, str, str, str | None]] = []  # (sign, kind, name, environment)
    for sign, mine, theirs in (("-", base, head), ("+", head, base)):
        changed += [(sign, "pool", p, e) for e, p in sorted(set(mine.pools) - set(theirs.pools))]
        changed += [(sign, "dev box", p, e) for e, p in sorted(set(mine.dev_boxes) - set(theirs.dev_boxes))]
        changed += [
            (sign, "site", n, None) for n in sorted({s.name for s in mine.sites} - {s.name for s in theirs.sites})
        ]
        changed += [(sign, "team", t, None) for t in sorted(set(mine.teams) - set(theirs.teams))]
    where: dict[tuple[str, str, str], set[str]] = {(sign, kind, name): set() for sign, kind, name, _ in changed}
    for c in diff.changes:
        if c.action not in ("create", "delete"):
            continue
        for sign, kind, name, env in changed:
            if kind in ("pool", "dev box"):
                prefix = "pool" if kind == "pool" else "devbox"
                hit = c.stack.split("-", 1)[0] == env and c.name.startswith(f"{prefix}-{name}-")
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
