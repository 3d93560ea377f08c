"""Reading offline plan exports (docs/plan-export.md) for the checks: a missing or malformed plan is an error."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlinfra.errors import DlinfraError
from policy.dlinfra_policy.rules.core import Resource

PLAN_SCHEMA = "dlinfra.plan/v1"
_RESOURCE_KEYS: dict[str, type] = {
    "urn": str,
    "type": str,
    "name": str,
    "custom": bool,
    "id": str,
    "dependencies": list,
    "protect": bool,
    "inputs": dict,
    "outputs": dict,
}


class PlanError(DlinfraError):
    """A plan export is missing, unreadable or not in the dlinfra.plan/v1 schema."""


@dataclass(frozen=True)
class Plan:
    """One stack's offline plan export."""

    path: Path
    stack: str
    data: Mapping[str, Any]  # the whole export, as written by `dlinfra preview`

    @property
    def resources(self) -> Sequence[Mapping[str, Any]]:
        return list(self.data["resources"])

    @property
    def region(self) -> str | None:
        region = self.data["role"].get("region")
        return str(region) if region else None

    def rule_resources(self) -> list[Resource]:
        """The custom resources as the policy rules see them."""
        # A resource names its provider as "<provider urn>::<provider id>".
        providers = {f"{r['urn']}::{r['id']}": r for r in self.resources if r["type"].startswith("pulumi:providers:")}
        return [
            Resource(
                urn=r["urn"],
                type=r["type"],
                name=r["name"],
                inputs=r["inputs"],
                protect=r["protect"],
                dependencies=tuple(r["dependencies"]),
                id=r["id"],
                provider_urn=str((providers.get(r.get("provider") or "") or {}).get("urn", r.get("provider") or "")),
                provider_inputs=(providers.get(r.get("provider") or "") or {}).get("inputs", {}),
                parent=str(r.get("parent") or ""),
            )
            for r in self.resources
            if r["custom"]
        ]


def load_plan(path: Path) -> Plan:
    """Read and check one plan export; PlanError naming the file and key on any problem."""
    where = str(path)
    if not path.is_file():
        raise PlanError("plan file not found; run `dlinfra preview` to write it", file=where)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"not a readable JSON plan export ({exc})", file=where) from None
    if not isinstance(data, dict):
        raise PlanError("expected a JSON object", file=where)
    if data.get("schema") != PLAN_SCHEMA:
        raise PlanError(f"schema is {data.get('schema')!r}, expected {PLAN_SCHEMA!r}", file=where, key="schema")
    top: tuple[tuple[str, type], ...] = (("stack", str), ("project", str), ("role", dict), ("resources", list))
    for key, kind in top:
        if not isinstance(data.get(key), kind):
            raise PlanError(f"missing or not a {kind.__name__}", file=where, key=key)
    if path.stem != data["stack"]:
        raise PlanError(f"the file is named {path.name} but holds stack {data['stack']!r}", file=where, key="stack")
    for i, resource in enumerate(data["resources"]):
        if not isinstance(resource, dict):
            raise PlanError("expected an object", file=where, key=f"resources[{i}]")
        for key, kind in _RESOURCE_KEYS.items():
            if not isinstance(resource.get(key), kind):
                raise PlanError(f"missing or not a {kind.__name__}", file=where, key=f"resources[{i}].{key}")
    return Plan(path=path, stack=data["stack"], data=data)


def load_plans(
    directory: Path, stacks: Sequence[str] | None, expected: Sequence[str] = ()
) -> tuple[list[Plan], list[str]]:
    """Plans of the given stacks, or of every stack in `expected` (all must be there); and the plans ignored.

    With stacks=None and no `expected`, every plan in the folder is read.
    """
    if not directory.is_dir():
        raise PlanError("no plan folder; run `dlinfra preview --all` first", file=str(directory))
    if stacks is not None:
        return [load_plan(directory / f"{stack}.json") for stack in stacks], []
    found = {p.stem: p for p in sorted(directory.glob("*.json"))}
    missing = [s for s in expected if s not in found]
    if missing:
        raise PlanError(
            f"no plan for stack(s) {', '.join(missing)}; run `dlinfra preview --all` to write every plan",
            file=str(directory),
        )
    if not found:
        raise PlanError("no plan files (*.json); run `dlinfra preview --all` first", file=str(directory))
    wanted = list(expected) or list(found)
    # A plan left over from a stack the fleet no longer has is not checked (its VPC has no planned block).
    ignored = sorted(set(found) - set(wanted))
    return [load_plan(found[s]) for s in wanted], ignored


def refuse_stale(plans: Sequence[Plan], *, root: Path, fleet: Path, lock: Path) -> None:
    """PlanError for the first plan made from another fleet, lock, images manifest or code than the working tree's.

    Plans record their inputs' hashes (dlinfra.offline.provenance); one without a record was made by an older dlinfra.
    """
    from dlinfra.model import images
    from dlinfra.offline import provenance

    now: dict[Path, provenance.Provenance] = {}
    for plan in plans:
        where = str(plan.path)
        recorded = plan.data.get("provenance")
        if not isinstance(recorded, Mapping):
            raise PlanError(
                "records no provenance (made by an older dlinfra, or by hand); run `dlinfra preview --all` again, "
                "or pass --allow-stale to use it anyway",
                file=where,
                key="provenance",
            )
        made = provenance.Provenance.from_json(recorded)
        manifest = provenance.images_of(made, root, root / images.EXAMPLE_MANIFEST)
        if manifest not in now:
            now[manifest] = provenance.current(root, fleet, lock, manifest, revision=False)
        changed = made.changed(now[manifest])
        if changed:
            at = f" at {made.revision}" if made.revision else ""
            raise PlanError(
                f"stale: {', '.join(changed)} changed since this plan was made{at}; run `dlinfra preview --all` "
                "again, or pass --allow-stale to use it anyway",
                file=where,
                key="provenance",
            )
