"""The plan cache: a stack whose inputs are unchanged is not run again; its last offline result is reused.

A stack's key hashes everything that can change what it declares:
- the program (every file of stacks/, components/ and dlinfra/, Pulumi.yaml and requirements.txt: the code hash
  the plans' provenance records), which includes the stack's config file and the packaged data tables;
- the images manifest;
- its environment's slice of the fleet and of the address plan (dlinfra.model.slices);
- the lab's own catalog entries the fleet's pools use, when the fleet has a catalog beside it;
- the exports of the stacks it reads, as the offline run gave them to its StackReferences.

The last makes the key early-cutting, as build systems do: a stack that a dependency's change leaves with the
same exports is reused, so a pool's new maximum re-runs its regional stack but not the in-cluster stack that
reads only the cluster's outputs.

An entry is the whole offline result (resources, outputs, manifests' source) with its plan's text, pickled under
build/cache/stacks/.
Beside a stack's entries are the exports of its last run (`latest.exports`): a guess on which the stacks that read
it may start before it is done (dlinfra.offline.parallel), whose results count only when the guess was exact.
An offline run has no secret to keep: its secret outputs are the fake cloud's deterministic stand-ins (fake
keys derived from the resource's name, "offline-placeholder-secret" for encrypted config). The folder is
build output, ignored by git, and `DLINFRA_CACHE=off` turns the cache off.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pulumi import asset as pulumi_asset

from dlinfra.model import slices
from dlinfra.model.fleet.schema import Fleet
from dlinfra.model.stackroles import StackRole
from dlinfra.offline.plan_export import StackResult

VARIABLE = "DLINFRA_CACHE"  # the cache folder; "off" turns the cache off
FORMAT = 1  # bumped when an entry's shape changes: older entries are then misses
KEEP = 8  # entries kept per stack, newest first: a base and a few heads of a pull request


@dataclass
class StackCache:
    """Keys and entries of one preview run: what every stack shares (`common`) and each environment's slice."""

    folder: Path
    root: Path  # the project whose program ran: file assets (Lambda code) are kept relative to it
    common: Mapping[str, str]  # the code, images manifest, project and entry format, by hash
    environments: Mapping[str, str]  # environment -> hash of its fleet, address-plan and catalog slices
    dependencies: Mapping[StackRole, Sequence[StackRole]]
    images: Mapping[str, str] = field(default_factory=dict)  # stack -> hash of the images manifest it reads
    reused: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)

    def key(self, role: StackRole, exports: Mapping[str, Mapping[str, Any]]) -> str:
        """The key of a stack given the exports of the stacks it reads (only those count)."""
        read = {d.name: exports[d.name] for d in self.dependencies.get(role, ())}
        return slices.digest(
            {
                "common": self.common,
                "stack": role.name,
                "images": self.images.get(role.name, ""),
                "slice": self.environments[role.environment],
                "reads": read,
            }
        )

    def _path(self, role: StackRole, key: str) -> Path:
        return self.folder / "stacks" / role.name / f"{key}.pickle"

    def _exports_path(self, role: StackRole) -> Path:
        return self.folder / "stacks" / role.name / LATEST_EXPORTS  # not *.pickle: the pruning below passes it by

    def stored(self, role: StackRole, key: str) -> bool:
        """Whether an entry is stored under this key (load() may still find it unreadable)."""
        return self._path(role, key).is_file()

    def last_exports(self, role: StackRole) -> dict[str, Any] | None:
        """The exports the stack gave the last time it ran here (StackResult.exports); None when unknown."""
        try:
            with self._exports_path(role).open("rb") as fh:
                exports = pickle.load(fh)  # our own build output, written by store() below
        except Exception:  # noqa: BLE001 - a damaged file only costs the guess: the stack runs as it would without
            return None
        return exports if isinstance(exports, dict) else None

    def load(self, role: StackRole, key: str) -> StackResult | None:
        """The stored result under this key; None when there is none or it cannot be read (then it runs again)."""
        path = self._path(role, key)
        try:
            with path.open("rb") as fh:
                result = pickle.load(fh)  # our own build output, written by store() below
        except (OSError, pickle.PickleError, EOFError, AttributeError, ImportError, TypeError, ValueError):
            return None
        if not isinstance(result, StackResult) or result.role != role:
            return None
        os.utime(path)  # recently used: kept by the pruning below
        self.reused.append(role.name)
        return replace(_rebased(result, STORED_ROOT, self.root), cached=True)

    def store(self, role: StackRole, key: str, result: StackResult) -> None:
        """Keep a fresh result under its key, and its exports as the stack's latest, and only the newest KEEP
        entries of the stack."""
        self.ran.append(role.name)
        path = self._path(role, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        result.plan_text()  # serialized while its file assets are this project's; kept in the entry for its reuses
        _write_pickle(path, replace(_rebased(result, self.root, STORED_ROOT), cached=False))
        _write_pickle(self._exports_path(role), result.exports())
        entries = sorted(path.parent.glob("*.pickle"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[KEEP:]:
            old.unlink(missing_ok=True)


STORED_ROOT = Path("/dlinfra-project")  # stands for the project in a stored entry's file assets
LATEST_EXPORTS = "latest.exports"  # beside a stack's entries: the exports of its last run (pickled)


def _write_pickle(path: Path, value: Any) -> None:
    """Pickle `value` to `path` atomically: a concurrent reader (another preview sharing the cache) sees the old
    file or the new one, never half of one."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with tmp.open("wb") as fh:
        pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def _rebased(result: StackResult, old: Path, new: Path) -> StackResult:
    """The result with every file asset and archive under `old` moved under `new`: an entry made in one copy of the
    project (a revision's exported tree, since deleted) is reused in another, whose files have the same content
    (the code hash is in the key)."""

    def move(value: Any) -> Any:
        if isinstance(value, (pulumi_asset.FileAsset, pulumi_asset.FileArchive)):
            path = Path(value.path)
            if path.is_relative_to(old):
                return type(value)(str(new / path.relative_to(old)))
            return value
        if isinstance(value, pulumi_asset.AssetArchive):
            return pulumi_asset.AssetArchive({name: move(item) for name, item in value.assets.items()})
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        if isinstance(value, list):
            return [move(v) for v in value]
        return value

    resources = [replace(r, inputs=move(r.inputs), outputs=move(r.outputs)) for r in result.resources]
    return replace(result, resources=resources, outputs=move(result.outputs))


def folder(default: Path) -> Path | None:
    """The cache folder: DLINFRA_CACHE when set ("off": no cache), else `default`."""
    chosen = os.environ.get(VARIABLE, "")
    if chosen.lower() == "off":
        return None
    return Path(chosen) if chosen else default


def open_cache(
    where: Path,
    *,
    root: Path,
    fleet: Fleet,
    allocations: Mapping[str, str],
    catalogs: Mapping[str, Any],
    provenance: Mapping[str, str],
    images: Mapping[str, str] | None = None,
    project: str,
    roles: Sequence[StackRole],
    dependencies: Mapping[StackRole, Sequence[StackRole]],
) -> StackCache:
    """The cache of one preview run over these inputs (`provenance`: the hashes the plans record; `catalogs`: the
    lab's own catalog entries each environment's pools use)."""
    common = {
        "format": str(FORMAT),
        "project": project,
        "code": provenance["code"],
        "images": provenance["images"],
    }
    environments = {
        env: slices.digest(
            {
                "fleet": slices.fleet_slice(fleet, env),
                "lock": slices.lock_slice(fleet, allocations, env),
                "catalog": catalogs.get(env),
            }
        )
        for env in {r.environment for r in roles}
    }
    return StackCache(
        folder=where,
        root=root,
        common=common,
        environments=environments,
        images=dict(images or {}),
        dependencies=dependencies,
    )
