"""The plan export: what an offline stack run recorded, written as plan JSON and Kubernetes manifests, secrets masked.

The schema is documented in docs/plan-export.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pulumi import asset as pulumi_asset

from dlinfra.model.replacement import normal
from dlinfra.model.stackroles import StackRole
from dlinfra.offline import schema

PLAN_SCHEMA = "dlinfra.plan/v1"
MASK = "[secret]"


@dataclass
class ResourceRecord:
    """One registered resource, as it goes into the plan export."""

    urn: str
    type: str
    name: str
    custom: bool
    parent: str | None
    provider: str | None
    dependencies: list[str]
    protect: bool
    retain_on_delete: bool
    delete_before_replace: bool
    replace_on_changes: list[str]
    ignore_changes: list[str]
    aliases: list[str]
    id: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    additional_secret_outputs: list[str]


@dataclass
class StackResult:
    """What one offline stack run produced."""

    role: StackRole
    resources: list[ResourceRecord] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)  # unmasked, kept in memory only
    secret_outputs: set[str] = field(default_factory=set)
    seconds: float = 0.0  # how long the offline run took (for a cached result: the run that made it)
    cached: bool = False  # reused from the plan cache (dlinfra.offline.cache), not run again
    text: PlanText | None = field(default=None, repr=False, compare=False)  # plan_text(), once made

    def exports(self) -> dict[str, Any]:
        """What the stacks that read this one get from it (their StackReferences' outputs), unmasked."""
        return {"outputs": self.outputs, "secret": sorted(self.secret_outputs)}

    def masked_outputs(self) -> dict[str, Any]:
        """The stack outputs as the plan export shows them: secrets read "[secret]"."""
        return {k: (MASK if k in self.secret_outputs else _mask(v)) for k, v in sorted(self.outputs.items())}

    def plan(self, project: str) -> dict[str, Any]:
        """The plan export: JSON-ready, secrets masked."""
        return {"schema": PLAN_SCHEMA, "project": project, **self._declared()}

    def plan_text(self) -> PlanText:
        """The plan export as write_plan writes it, but for the members that name the run (project, provenance):
        serialized once, then kept with the result, and so in the plan cache with it."""
        if self.text is None:
            self.text = PlanText.of({"schema": PLAN_SCHEMA, **self._declared()})
        return self.text

    def _declared(self) -> dict[str, Any]:
        """The plan export but for its schema and project: what the stack declares."""
        by_type: dict[str, int] = {}
        for r in self.resources:
            by_type[r.type] = by_type.get(r.type, 0) + 1
        return {
            "stack": self.role.name,
            "role": {"kind": self.role.kind, "environment": self.role.environment, "region": self.role.region},
            "resources": [_resource_json(r) for r in sorted(self.resources, key=lambda r: r.urn)],
            "outputs": self.masked_outputs(),
            "summary": {"resources": len(self.resources), "by_type": dict(sorted(by_type.items()))},
        }


@dataclass(frozen=True)
class PlanText:
    """Members of a plan export's top-level object, each as its text in the written file: the file is then composed
    from them with those that change from run to run, byte for byte what json.dumps(indent=2, sort_keys=True) of
    the whole would write (a member's value is written as on its own, one level in)."""

    members: Mapping[str, str]  # key -> the text of its value

    @classmethod
    def of(cls, members: Mapping[str, Any]) -> PlanText:
        return cls({key: _member_text(value) for key, value in members.items()})

    def compose(self, more: Mapping[str, Any]) -> str:
        """The file's text with `more` members (the project, the provenance) added."""
        members = {**self.members, **{key: _member_text(value) for key, value in more.items()}}
        body = ",\n".join(f"  {json.dumps(key)}: {members[key]}" for key in sorted(members))
        return "{\n" + body + "\n}\n"


def _member_text(value: Any) -> str:
    # A string never holds a raw line break in JSON, so every line break is the encoder's, one level deeper.
    return json.dumps(value, indent=2, sort_keys=True).replace("\n", "\n  ")


def _asset(value: Any) -> Any:
    """An asset or archive as plain data: the file's name and content hash (deterministic across machines)."""
    if isinstance(value, pulumi_asset.FileAsset):
        data = Path(value.path).read_bytes()
        return {"asset": {"file": Path(value.path).name, "sha256": hashlib.sha256(data).hexdigest()}}
    if isinstance(value, pulumi_asset.StringAsset):
        return {"asset": {"sha256": hashlib.sha256(value.text.encode()).hexdigest()}}
    if isinstance(value, pulumi_asset.AssetArchive):
        return {"archive": {name: _asset(item) for name, item in sorted(value.assets.items())}}
    return {"asset": {"kind": type(value).__name__}}


def _mask(value: Any) -> Any:
    """Replace every secret-wrapped value with the mask, and assets with their hashes, at any depth."""
    if schema.is_secret(value):
        return MASK
    if isinstance(value, (pulumi_asset.Asset, pulumi_asset.Archive)):
        return _asset(value)
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v) for v in value]
    return value


def unwrap(value: Any) -> tuple[Any, bool]:
    """Plain value and whether any part of it was secret."""
    if schema.is_secret(value):
        return unwrap(value.get("value"))[0], True
    if isinstance(value, dict):
        pairs = {k: unwrap(v) for k, v in value.items()}
        return {k: v for k, (v, _) in pairs.items()}, any(s for _, s in pairs.values())
    if isinstance(value, list):
        items = [unwrap(v) for v in value]
        return [v for v, _ in items], any(s for _, s in items)
    return value, False


def _resource_json(r: ResourceRecord) -> dict[str, Any]:
    secret_out = set(r.additional_secret_outputs)
    return {
        "urn": r.urn,
        "type": r.type,
        "name": r.name,
        "custom": r.custom,
        "id": r.id,
        "parent": r.parent,
        "provider": r.provider,
        "dependencies": sorted(r.dependencies),
        "protect": r.protect,
        "retain_on_delete": r.retain_on_delete,
        "delete_before_replace": r.delete_before_replace,
        "replace_on_changes": r.replace_on_changes,
        "ignore_changes": r.ignore_changes,
        "aliases": r.aliases,
        "inputs": _mask(r.inputs),
        "outputs": {k: (MASK if k in secret_out else _mask(v)) for k, v in sorted(r.outputs.items())},
    }


def manifests(result: StackResult) -> list[dict[str, Any]]:
    """The Kubernetes objects a stack declares as typed resources (not Helm charts), as manifests.

    The engine records kubernetes:* inputs exactly as the provider receives them: camelCase, with apiVersion
    and kind, so they are manifests already, once whole numbers are integers again: Pulumi's numbers are float64
    (65534.0), the provider's JSON writes a whole one as an integer, which integer fields and checks expect
    (replacement.normal). Secrets stay masked.
    """
    out = []
    for r in sorted(result.resources, key=lambda r: r.urn):
        if r.custom and r.type.startswith("kubernetes:") and not r.type.startswith("kubernetes:helm.sh/"):
            manifest = normal(_mask(r.inputs))
            if isinstance(manifest, dict) and "kind" in manifest and "apiVersion" in manifest:
                out.append(manifest)
    return out


def write_manifests(result: StackResult, out_dir: Path) -> Path | None:
    """Write build/manifests/<stack>.yaml (one document per object) when the stack declares any."""
    docs = manifests(result)
    if not docs:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result.role.name}.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=True))
    return path


def write_plan(result: StackResult, project: str, out_dir: Path, provenance: Mapping[str, str] | None = None) -> Path:
    """Write build/plans/<stack>.json (sorted keys, stable across runs), with what it was made from."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result.role.name}.json"
    more: dict[str, Any] = {"project": project}
    if provenance is not None:
        more["provenance"] = dict(provenance)
    path.write_text(result.plan_text().compose(more))
    return path
