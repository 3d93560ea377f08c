"""What a plan export was made from: the fleet, the lock, the images manifest and the program's code, by hash.

`dlinfra preview` records it in every plan; commands that read plans (`check`, `reach`, `access`) refuse a plan
whose inputs have changed since, naming which one, so a review never rests on a stale plan.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

# The program that shapes a plan: the stack program, its components, the planning core and the offline
# engine, the data they read, and the pinned dependencies. Any change there can change a plan.
CODE_DIRS = ("stacks", "components", "dlinfra")
CODE_FILES = ("Pulumi.yaml", "requirements.txt")
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".j2", ".txt")


@dataclass(frozen=True)
class Provenance:
    """Hashes (sha256) of each input of a preview, and the git revision it ran on (for people, not compared)."""

    fleet: str
    lock: str
    images: str
    code: str
    catalog: str = ""  # the lab's catalog beside the fleet (dlinfra.model.catalog); "missing" without one
    images_path: str = ""  # the manifest, relative to the project when inside it
    revision: str = ""  # `git describe --always --dirty`, when the project is a git checkout

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Provenance:
        return cls(**{k: str(data.get(k, "")) for k in cls.__dataclass_fields__})

    def changed(self, now: Provenance) -> list[str]:
        """Which inputs differ from `now`, in words."""
        words = {
            "fleet": "the fleet file",
            "lock": "the address-plan lock",
            "images": f"the images manifest ({self.images_path or 'default'})",
            "code": "dlinfra's code (stacks/, components/, dlinfra/)",
            "catalog": "the catalog beside the fleet (catalog.yaml)",
        }
        # A plan made before catalogs were recorded has none: it is stale only if the fleet now has a catalog.
        recorded = self if self.catalog else replace(self, catalog="missing")
        return [text for k, text in words.items() if getattr(recorded, k) != getattr(now, k)]


def sha256(path: Path) -> str:
    """The file's sha256, or "missing"."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"


def code_hash(root: Path) -> str:
    """One hash over every file of the program that shapes plans (paths and contents, in path order)."""
    digest = hashlib.sha256()
    files = [root / name for name in CODE_FILES]
    for folder in CODE_DIRS:
        files += [p for p in (root / folder).rglob("*") if p.is_file() and p.suffix in CODE_SUFFIXES]
    for path in sorted(set(files)):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _revision(root: Path) -> str:
    try:
        proc = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=root, capture_output=True, text=True, check=False
        )
    except OSError:
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def relative(path: Path, root: Path) -> str:
    """The path relative to the project when inside it, else absolute."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(resolved)


def current(root: Path, fleet: Path, lock: Path, images: Path, *, revision: bool = True) -> Provenance:
    """The provenance a preview run now would record."""
    return Provenance(
        fleet=sha256(fleet),
        lock=sha256(lock),
        images=sha256(images),
        code=code_hash(root),
        catalog=sha256(fleet.parent / "catalog.yaml"),
        images_path=relative(images, root),
        revision=_revision(root) if revision else "",
    )


def images_of(recorded: Provenance, root: Path, default: Path) -> Path:
    """The manifest a plan was previewed with (recorded), to hash again; the default for old plans."""
    if not recorded.images_path:
        return default
    path = Path(recorded.images_path)
    return path if path.is_absolute() else root / path
