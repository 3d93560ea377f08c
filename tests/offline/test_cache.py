"""The plan cache: unchanged stacks are reused with the plans a fresh run makes, and what an environment's stacks
read is its slice of the fleet (a change to another environment leaves its plans as they were)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlinfra.cli import main as cli
from dlinfra.model import planner, slices, stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.model.stackroles import StackRole
from dlinfra.offline import cache

STAGING = {"staging-us-west-2", "staging-us-west-2-k8s"}


def _preview(fleet: Path, out: Path, *extra: str, jobs: int = 1) -> dict[str, Any]:
    """`dlinfra preview --all --json` into out; returns its JSON summary."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = cli.main(
            ["preview", "--all", "--json", "--jobs", str(jobs), "--fleet", str(fleet), "--out", str(out), *extra]
        )
    assert code == 0
    return dict(json.loads(buffer.getvalue()))


def _plans(out: Path) -> dict[str, dict[str, Any]]:
    """Every plan in a folder, without the provenance (which names the run, not what is declared)."""
    plans = {}
    for path in sorted(out.glob("*.json")):
        data = json.loads(path.read_text())
        data.pop("provenance", None)
        plans[path.stem] = data
    return plans


def _grow_staging_cpu(data: dict[str, Any]) -> None:
    data["environments"]["staging"]["node_pools"]["cpu"]["max_size"] += 1


def test_a_second_preview_reuses_every_stack_with_the_same_plans(
    write_fleet: Callable[..., Path], tmp_path: Path
) -> None:
    fleet = write_fleet()
    first = _preview(fleet, tmp_path / "build" / "plans")
    made = _plans(tmp_path / "build" / "plans")
    second = _preview(fleet, tmp_path / "build" / "plans")
    assert first["cache"]["reused"] == [] and len(first["cache"]["ran"]) == 9
    assert sorted(second["cache"]["reused"]) == sorted(made) and second["cache"]["ran"] == []
    assert all(s["cached"] for s in second["stacks"])
    assert _plans(tmp_path / "build" / "plans") == made
    assert (tmp_path / "build" / "manifests" / "prod-us-west-2-k8s.yaml").is_file()


def test_a_change_to_one_environment_runs_only_its_stacks_and_matches_a_fresh_run(
    write_fleet: Callable[..., Path], tmp_path: Path
) -> None:
    base = write_fleet()
    _preview(base, tmp_path / "build" / "plans")
    head = write_fleet(_grow_staging_cpu)
    cached = _preview(head, tmp_path / "build" / "plans")
    assert set(cached["cache"]["ran"]) == STAGING
    fresh = _preview(head, tmp_path / "fresh" / "plans", "--no-cache")
    assert "cache" not in fresh
    assert _plans(tmp_path / "build" / "plans") == _plans(tmp_path / "fresh" / "plans")


def test_another_environments_change_leaves_an_environments_plans_as_they_were(
    write_fleet: Callable[..., Path], tmp_path: Path
) -> None:
    """The slice is sound on the reference fleet: without the cache, changing staging's pools changes no prod plan,
    and changing prod's changes no staging plan, while each environment's own slice does change."""
    reference = load_fleet(write_fleet()).fleet
    _preview(write_fleet(), tmp_path / "reference", "--no-cache", jobs=2)

    def grow_staging(data: dict[str, Any]) -> None:
        pools = data["environments"]["staging"]["node_pools"]
        pools["cpu"]["max_size"] += 3
        pools["burst"] = {**pools["cpu"], "max_size": 4}

    def grow_prod(data: dict[str, Any]) -> None:
        pools = data["environments"]["prod"]["node_pools"]
        pools["train-h100"]["max_size"] += 8
        pools["burst"] = {**pools["cpu"], "max_size": 4}

    for change, changed_env, other in ((grow_staging, "staging", "prod"), (grow_prod, "prod", "staging")):
        fleet = write_fleet(change)
        changed_fleet = load_fleet(fleet).fleet
        assert slices.fleet_slice(changed_fleet, changed_env) != slices.fleet_slice(reference, changed_env)
        assert slices.fleet_slice(changed_fleet, other) == slices.fleet_slice(reference, other)
        _preview(fleet, tmp_path / changed_env, "--no-cache", jobs=2)
        old, new = _plans(tmp_path / "reference"), _plans(tmp_path / changed_env)
        changed = {stack for stack in old if old[stack] != new[stack]}
        assert changed, f"growing {changed_env}'s pools changed no plan"
        assert all(stack.startswith(f"{changed_env}-") for stack in changed), changed


def test_a_site_of_another_environment_and_its_addresses_are_outside_the_slice(
    write_fleet: Callable[..., Path], tmp_path: Path
) -> None:
    fleet = load_fleet(write_fleet()).fleet
    allocations = {k: str(v) for k, v in planner.load_lock(tmp_path / "cidr-lock.yaml").allocations.items()}
    prod, staging = (slices.lock_slice(fleet, allocations, env) for env in ("prod", "staging"))
    assert "site-lan/sjc1" in prod and "site-lan/sjc1" not in staging
    assert "subnet/staging/us-west-2/private/us-west-2a" in staging
    assert not any("/staging/" in key for key in prod)
    assert set(slices.fleet_slice(fleet, "staging")["sites"]) == set()  # both sites join prod
    # An allocation kind the slice does not know stays in every slice: at worst a cache miss.
    assert "mystery/x" in slices.lock_slice(fleet, {**allocations, "mystery/x": "10.0.0.0/8"}, "staging")


def test_a_key_counts_only_the_exports_a_stack_reads(write_fleet: Callable[..., Path], tmp_path: Path) -> None:
    fleet = load_fleet(write_fleet()).fleet
    roles = stackroles.roles(fleet)
    depends = {r: stackroles.dependencies(fleet, r) for r in roles}
    store = cache.open_cache(
        tmp_path,
        root=tmp_path,
        fleet=fleet,
        allocations={},
        catalogs={},
        provenance={"code": "c", "images": "i"},
        project=fleet.project,
        roles=roles,
        dependencies=depends,
    )
    k8s = StackRole("k8s", "staging", "us-west-2")
    own = {"staging-us-west-2": {"outputs": {"cluster": "a"}, "secret": []}}
    other = {"prod-us-west-2": {"outputs": {"vpc": "b"}, "secret": []}}
    assert store.key(k8s, own) == store.key(k8s, {**own, **other})
    changed = {"staging-us-west-2": {"outputs": {"cluster": "z"}, "secret": []}}
    assert store.key(k8s, own) != store.key(k8s, changed)


def test_an_unreadable_entry_is_a_miss_and_runs_the_stack_again(
    write_fleet: Callable[..., Path], tmp_path: Path
) -> None:
    fleet = write_fleet()
    out = tmp_path / "build" / "plans"
    _preview(fleet, out)
    for entry in (tmp_path / "build" / "cache" / "stacks" / "staging-us-west-2").glob("*.pickle"):
        entry.write_bytes(b"not a pickle")
    again = _preview(fleet, out)
    assert again["cache"]["ran"] == ["staging-us-west-2"]


def test_dlinfra_cache_names_the_folder_or_turns_it_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(cache.VARIABLE, raising=False)
    assert cache.folder(tmp_path / "d") == tmp_path / "d"
    monkeypatch.setenv(cache.VARIABLE, str(tmp_path / "shared"))
    assert cache.folder(tmp_path / "d") == tmp_path / "shared"
    monkeypatch.setenv(cache.VARIABLE, "off")
    assert cache.folder(tmp_path / "d") is None


def test_a_file_asset_of_one_copy_of_the_project_is_read_in_the_copy_that_reuses_it(tmp_path: Path) -> None:
    """A revision's exported tree is deleted after its preview; the working tree reuses its entries, and the plan
    export hashes the Lambda code from the working tree's own file (same content: the code hash is in the key)."""
    from pulumi import asset

    from dlinfra.offline.plan_export import ResourceRecord, StackResult

    role = StackRole("regional", "staging", "us-west-2")
    first, second = tmp_path / "tree", tmp_path / "checkout"
    for root in (first, second):
        (root / "components").mkdir(parents=True)
        (root / "components" / "handler.py").write_text("def handler(event, context): ...\n")
    code = asset.AssetArchive({"handler.py": asset.FileAsset(str(first / "components" / "handler.py"))})
    record = ResourceRecord(
        "urn:a", "aws:lambda/function:Function", "fn", True, None, None, [], False, False, False, [], [], [], "id",
        {"code": code}, {}, [],
    )  # fmt: skip
    stores = [
        cache.StackCache(folder=tmp_path / "cache", root=root, common={}, environments={}, dependencies={})
        for root in (first, second)
    ]
    stores[0].store(role, "k", StackResult(role=role, resources=[record]))
    reused = stores[1].load(role, "k")
    assert reused is not None and reused.cached
    moved = reused.resources[0].inputs["code"].assets["handler.py"]
    assert moved.path == str(second / "components" / "handler.py")
    assert reused.plan("p")["resources"][0]["inputs"]["code"]["archive"]["handler.py"]["asset"]["sha256"]


def test_a_stacks_own_images_manifest_is_what_its_key_and_provenance_hash(tmp_path: Path) -> None:
    """stacks/compute.py reads dlinfra:images_manifest from the stack's config when the command line names none:
    that file, not the default, is the one whose change must make the stack run again."""
    from dlinfra.offline import preview

    role = StackRole("regional", "staging", "us-west-2")
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.staging-us-west-2.yaml").write_text(
        "config:\n  dlinfra:images_manifest: images/lab.json\n"
    )
    default = tmp_path / "images" / "manifest.example.json"
    assert preview._manifest_of(tmp_path, role, {}, default) == tmp_path / "images" / "lab.json"
    other = StackRole("regional", "prod", "us-west-2")
    assert preview._manifest_of(tmp_path, other, {}, default) == default
    given = {"dlinfra:images_manifest": str(tmp_path / "cli.json")}
    assert preview._manifest_of(tmp_path, role, given, default) == tmp_path / "cli.json"  # the command line wins
    keys = [
        cache.StackCache(
            folder=tmp_path, root=tmp_path, common={}, environments={"staging": "s"}, dependencies={}, images=images
        ).key(role, {})
        for images in ({"staging-us-west-2": "a"}, {"staging-us-west-2": "b"})
    ]
    assert keys[0] != keys[1]


def test_canonical_data_is_plain_json_whatever_the_types() -> None:
    """Exact dicts, lists and scalars are taken as they are; subclasses and other types by the rules."""

    class Level(enum.IntEnum):
        LOW = 1

    @dataclasses.dataclass(frozen=True)
    class Hop:
        at: str

    Pair = collections.namedtuple("Pair", "a b")
    value = {"plain": [1, 2.5, "x", None, True], Level.LOW: (Level.LOW, Pair(1, 2)), "set": {3, 1}, "hop": Hop("r")}
    assert slices.canonical(value) == {
        "plain": [1, 2.5, "x", None, True],
        "1": [1, [1, 2]],
        "set": [1, 3],
        "hop": {"__class__": "Hop", "at": "r"},
    }
    assert type(slices.canonical(value)["1"][0]) is int  # the enum's value, not the enum
