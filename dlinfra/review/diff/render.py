"""The diff's two outputs: markdown for a pull-request comment (with its diagram, reachability and cost
sections) and JSON for tools (schema dlinfra.diff/v1, docs/diff-json.md)."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from dlinfra.model.gpu_quotas import QuotaView
from dlinfra.review.diff.changes import Change, Diff
from dlinfra.review.diff.compare import QuotaChange, entity_summary, quota_changes
from dlinfra.review.diff.plans import Topology
from policy.dlinfra_policy.rules.state import STATEFUL_TYPES

COMMENT_MARKER = "<!-- dlinfra-diff -->"  # lets the workflow update its own comment instead of adding more
MAX_MARKDOWN = 60_000  # GitHub rejects comments over 65,536 characters
MAX_LISTED = 40  # resources listed per section before "and N more"


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
        "quotas": {
            "changes": [c.to_json() for c in quota_changes(diff)],
            "warnings": [str(w) for w in diff.head_quotas.warnings],
            "base": [r.to_json() for r in diff.base_quotas.rows],
            "head": [r.to_json() for r in diff.head_quotas.rows],
        },
    }


def render_markdown(diff: Diff) -> str:
    """The diff as GitHub-flavoured markdown for a pull-request comment."""
    out = [COMMENT_MARKER, f"## dlinfra offline diff: {_code(diff.base)} → {_code(diff.head)}", ""]
    out += _warnings(diff)
    out += _entities(diff)
    out += _summary(diff)
    out += _replacement_table(diff)
    out += _quota_section(diff)
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


def _quota_section(diff: Diff) -> list[str]:
    """Each team whose guaranteed or borrowable GPUs change, flavor by flavor and in total per environment, and the
    head's teams left without a guarantee. Every changed flavor is listed: this is what the quota change means."""
    if not diff.base_quotas.teams and not diff.head_quotas.teams:
        return []  # plans without in-cluster stacks: no queues to compare
    lines = ["### Team GPU quotas", ""]
    # What this change brings is a warning; what was already so is listed once, so that it is not taken for news.
    warned = {str(w) for w in diff.base_quotas.warnings}
    new = [str(w) for w in diff.head_quotas.warnings if str(w) not in warned]
    old = [str(w) for w in diff.head_quotas.warnings if str(w) in warned]
    if new:
        lines += ["> [!WARNING]", *(f"> - {_cell(w)}" for w in new), ""]
    if old:
        lines += ["Already so before this change:", "", *(f"- {_cell(w)}" for w in old), ""]
    changes = quota_changes(diff)
    if not changes:
        return [*lines, "No team's guaranteed or borrowable GPUs change.", ""]
    lines += [
        "Guaranteed: the team's Kueue nominal quota. Borrowable: the most it can hold on top while other teams leave "
        'theirs idle (docs/jobs.md, "Who gets which GPUs"). `–`: no quota there.',
        "",
        "| team | environment | region | flavor | guaranteed (base → head) | borrowable (base → head) |",
        "| --- | --- | --- | --- | ---: | ---: |",
    ]
    for (env, team), group in itertools.groupby(changes, key=lambda c: (c.environment, c.team)):
        for c in group:
            lines.append(
                f"| {_code(team)} | {env} | {c.region} | {_code(c.flavor)} | {_gpus(c, 'guaranteed')} "
                f"| {_gpus(c, 'borrowable')} |"
            )
        before, after = (_total(view, env, team) for view in (diff.base_quotas, diff.head_quotas))
        lines.append(
            f"| {_code(team)} | {env} | **all regions** | | **{before[0]} → {after[0]}** | {before[1]} → {after[1]} |"
        )
    return [*lines, ""]


def _total(view: QuotaView, env: str, team: str) -> tuple[str, str]:
    """A team's guaranteed and borrowable GPUs over an environment's regions; `–` where it has no queues."""
    if team not in view.teams.get(env, ()):
        return "–", "–"
    rows = [r for r in view.rows if (r.environment, r.team) == (env, team)]
    return str(sum(r.guaranteed for r in rows)), str(sum(r.borrowable for r in rows))


def _gpus(change: QuotaChange, what: str) -> str:
    before = "–" if change.before is None else str(getattr(change.before, what))
    after = "–" if change.after is None else str(getattr(change.after, what))
    return f"{before} → {after}"


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
        f"over {head.get('packets', 0):.3g} packets, every address and port of each intent (`dlinfra reach`)."
    )
    for refused in head.get("refused") or []:
        lines.append(f"> [!WARNING]\n> not analysed: {refused['reason']}")
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
            packet = f.get("packet") or {}
            example = (
                f" (e.g. {packet['source']}:{packet['source_port']} → {packet['destination']}:"
                f"{packet['destination_port']})"
                if packet
                else ""
            )
            lines.append(
                f"- {_code(intent)}: {f['source']} → {f['destination']} {f.get('ports', f['protocol'])}{example}: "
                f"{f['reason']}"
            )
    if repaired:
        lines += ["", "**This change repairs:** " + ", ".join(_code(i) for i in repaired[:20])]
    return [*lines, ""]
