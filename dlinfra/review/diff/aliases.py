"""Matching a resource across revisions when its URN changed: aliases resolved as the Pulumi engine does, and the
fake-cloud identities an aliased resource keeps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

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


def alias_urns(resource: Mapping[str, Any], resources: Mapping[str, Mapping[str, Any]]) -> list[str]:
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
        for parent_alias in alias_urns(parent_resource, resources):
            old_name = name
            if name.startswith(parent_name):
                old_name = parent_alias.split("::", 3)[3] + name[len(parent_name) :]
            out += _child_urns(f"{stack_part}::{project}", parent_alias, type_, old_name)
    return list(dict.fromkeys(out))


def kept_identities(pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> dict[str, str]:
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


def substituted(value: Any, identities: Mapping[str, str]) -> Any:
    """A value with every old identity of an aliased resource replaced by its new one."""
    if isinstance(value, str):
        for before, after in identities.items():
            value = value.replace(before, after)
        return value
    if isinstance(value, dict):
        return {k: substituted(v, identities) for k, v in value.items()}
    if isinstance(value, list):
        return [substituted(v, identities) for v in value]
    return value
