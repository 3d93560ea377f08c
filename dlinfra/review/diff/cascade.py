"""Replacement cascades: what a replaced resource drags along, through the ids and outputs others hold of it."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dlinfra.model import replacement
from dlinfra.review.diff.changes import Change

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
