"""One offline preview: the selected stacks run (or are reused from the plan cache), their plans and manifests
written, and the inputs beside them so that a saved plan folder can serve as the base of a later comparison."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dlinfra.model import catalog, images, planner, stackroles
from dlinfra.model.fleet.load import LoadedFleet
from dlinfra.model.stackroles import StackRole
from dlinfra.offline import cache, engine, parallel, plan_export, provenance
from dlinfra.offline.cache import StackCache
from dlinfra.offline.plan_export import StackResult

INPUTS = "inputs"  # <plans>/inputs/: the fleet, the lock and the stack configs the plans were made from


@dataclass(frozen=True)
class Previewed:
    """What one preview run made."""

    results: list[StackResult]
    provenance: dict[str, str]
    cache: StackCache | None


def run(
    root: Path,
    loaded: LoadedFleet,
    lock_path: Path,
    selected: Sequence[StackRole],
    *,
    out: Path,
    images_manifest: Path | None = None,
    jobs: int = 1,
    cache_folder: Path | None = None,
    on_done: Callable[[StackResult, Path], None] | None = None,
    manifests: bool = True,
) -> Previewed:
    """Run the stacks (in dependency order, `jobs` at once), write each plan to `out` and its manifests to the
    sibling manifests/ as it is done (unless not `manifests`: a comparison reads plans only), and the inputs to
    out/inputs/; on_done(result, plan path) after each."""
    fleet = loaded.fleet
    lock = planner.load_lock(lock_path)
    config = {"dlinfra:fleet": str(loaded.path.resolve()), "dlinfra:lock": str(lock_path.resolve())}
    if images_manifest is not None:
        config["dlinfra:images_manifest"] = str(images_manifest.resolve())
    manifest = images_manifest if images_manifest is not None else root / images.EXAMPLE_MANIFEST
    made_from = provenance.current(root, loaded.path, lock_path, manifest).to_json()
    # A stack's config may name its own images manifest (stacks/compute.py reads dlinfra:images_manifest, the
    # command line's winning): each plan records, and each cache key hashes, the manifest its stack reads.
    own = {role.name: _manifest_of(root, role, config, manifest) for role in selected}
    made_by = {
        name: {**made_from, "images": provenance.sha256(path), "images_path": provenance.relative(path, root)}
        for name, path in own.items()
    }
    depends_on = {role: stackroles.dependencies(fleet, role) for role in selected}
    plan_cache = None
    if cache_folder is not None:
        plan_cache = cache.open_cache(
            cache_folder,
            root=root,
            fleet=fleet,
            allocations={key: str(cidr) for key, cidr in lock.allocations.items()},
            catalogs={env: catalog.used(catalog.installed(), fleet, env) for env in fleet.environments},
            provenance=made_from,
            images={name: made["images"] for name, made in made_by.items()},
            project=fleet.project,
            roles=selected,
            dependencies=depends_on,
        )

    def done(result: StackResult) -> None:
        path = plan_export.write_plan(result, fleet.project, out, made_by[result.role.name])
        if manifests:
            plan_export.write_manifests(result, out.parent / "manifests")
        if on_done is not None:
            on_done(result, path)

    if jobs > 1 and len(selected) > 1:
        results = parallel.run_parallel(
            root, selected, depends_on, project=fleet.project, config=config, jobs=jobs, on_done=done, cache=plan_cache
        )
    else:
        results = engine.run_all(root, selected, project=fleet.project, config=config, on_done=done, cache=plan_cache)
    save_inputs(root, loaded.path, lock_path, out)
    return Previewed(results=results, provenance=made_from, cache=plan_cache)


def _manifest_of(root: Path, role: StackRole, config: dict[str, str], default: Path) -> Path:
    """The images manifest a stack's program reads: the command line's, else its stack config's, else `default`."""
    named = config.get("dlinfra:images_manifest") or engine.stack_config(root, role.name).get("dlinfra:images_manifest")
    return root / str(named) if named else default


def save_inputs(root: Path, fleet: Path, lock: Path, out: Path) -> None:
    """Copy the fleet (and its catalog), the lock and the stack configs beside the plans (out/inputs/)."""
    inputs = out / INPUTS
    shutil.rmtree(inputs / "stacks", ignore_errors=True)  # a stack removed since leaves no config behind
    (inputs / "stacks").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(fleet, inputs / "fleet.yaml")
    lab = catalog.beside(fleet)
    (inputs / catalog.CATALOG_FILE).unlink(missing_ok=True)
    if lab.is_file():
        shutil.copyfile(lab, inputs / catalog.CATALOG_FILE)
    if lock.is_file():
        shutil.copyfile(lock, inputs / "cidr-lock.yaml")
    for config in sorted((root / "stacks").glob("Pulumi.*.yaml")):
        shutil.copyfile(config, inputs / "stacks" / config.name)
