"""dlinfra.model.images: reading Packer's manifest into AMI ids per (variant, region), and its errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlinfra.model.images import AmiManifest, ManifestError, ami_for, load_manifest, parse_manifest
from tests.conftest import REFERENCE_FLEET

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "images" / "manifest.example.json"
AMI_ID = r"ami-[0-9a-f]{17}"


def build(variant: str, build_time: int, artifact: str) -> dict[str, Any]:
    return {
        "name": "ubuntu",
        "builder_type": "amazon-ebs",
        "build_time": build_time,
        "files": None,
        "artifact_id": artifact,
        "packer_run_uuid": "00000000-0000-0000-0000-000000000000",
        "custom_data": {"variant": variant},
    }


def test_example_covers_both_variants_in_every_fleet_region() -> None:
    manifest = load_manifest(EXAMPLE)
    regions = yaml.safe_load((REFERENCE_FLEET).read_text())["regions"]
    assert set(manifest) == {(v, r) for v in ("cpu", "gpu") for r in regions}
    assert len(set(manifest.values())) == len(manifest), "example AMI ids must be distinct"
    for ami in manifest.values():
        assert len(ami) == 21 and ami.startswith("ami-")


def test_newest_build_per_variant_wins() -> None:
    manifest = load_manifest(EXAMPLE)
    # The example has an older gpu build (…e30x) superseded by a newer one (…f32x).
    assert ami_for(manifest, "gpu", "us-west-2") == "ami-0f9e8d7c6b5a4f321"
    assert ami_for(manifest, "gpu", "eu-west-1") == "ami-0f9e8d7c6b5a4f323"
    assert ami_for(manifest, "cpu", "us-east-1") == "ami-0c1a2b3c4d5e6f702"


def test_regions_are_not_mixed_across_builds() -> None:
    data = {
        "builds": [
            build("gpu", 100, "us-west-2:ami-0123456789abcdef0,eu-west-1:ami-0123456789abcdef1"),
            build("gpu", 200, "us-west-2:ami-0123456789abcdef2"),
        ]
    }
    manifest = parse_manifest(data, "m.json")
    assert dict(manifest) == {("gpu", "us-west-2"): "ami-0123456789abcdef2"}
    with pytest.raises(ManifestError, match=r"no AMI for variant gpu in region eu-west-1 in m\.json"):
        ami_for(manifest, "gpu", "eu-west-1")


def test_equal_build_times_prefer_the_later_entry() -> None:
    data = {
        "builds": [
            build("cpu", 100, "us-west-2:ami-0123456789abcdef0"),
            build("cpu", 100, "us-west-2:ami-0123456789abcdef1"),
        ]
    }
    assert parse_manifest(data, "m.json")[("cpu", "us-west-2")] == "ami-0123456789abcdef1"


def test_missing_ami_names_file_and_fix() -> None:
    manifest = load_manifest(EXAMPLE)
    with pytest.raises(ManifestError) as info:
        ami_for(manifest, "gpu", "ap-south-1")
    message = str(info.value)
    assert f"no AMI for variant gpu in region ap-south-1 in {EXAMPLE}" in message
    assert "it has gpu AMIs for eu-west-1, us-east-1, us-west-2" in message
    assert "-var-file=variables/gpu.pkrvars.hcl" in message


def test_ami_for_accepts_a_plain_mapping() -> None:
    with pytest.raises(ManifestError, match="in the image manifest"):
        ami_for({}, "cpu", "us-west-2")
    assert ami_for({("cpu", "us-west-2"): "ami-12345678"}, "cpu", "us-west-2") == "ami-12345678"


def test_result_is_a_dict_that_remembers_its_file() -> None:
    manifest = load_manifest(EXAMPLE)
    assert isinstance(manifest, dict) and isinstance(manifest, AmiManifest)
    assert manifest.source == str(EXAMPLE)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"missing\.json: no such file; build the images"):
        load_manifest(tmp_path / "missing.json")


def test_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text('{"builds": [\n')
    with pytest.raises(ManifestError, match=r"manifest\.json: not valid JSON \(line 2"):
        load_manifest(path)


def _example() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(EXAMPLE.read_text())
    return data


def _set(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("builds",), {}, r"expected an object with a 'builds' list"),
        (("builds",), [], r"builds: has no builds"),
        (("builds", 0), "gpu", r"builds\[0\]: expected an object"),
        (
            ("builds", 1, "custom_data"),
            _DELETE,
            r"builds\[1\]\.custom_data\.variant: must be one of cpu, gpu",
        ),
        (("builds", 1, "custom_data", "variant"), "tpu", r"custom_data\.variant: .*got 'tpu'"),
        (
            ("builds", 2, "build_time"),
            "yesterday",
            r"builds\[2\]\.build_time: must be Unix seconds",
        ),
        (("builds", 2, "build_time"), True, r"build_time: must be Unix seconds, got True"),
        (("builds", 0, "artifact_id"), "", r"builds\[0\]\.artifact_id: expected 'region:ami-id,\.\.\.'"),
        (("builds", 0, "artifact_id"), "us-west-2=ami-0123456789abcdef0", r"is not 'region:ami-id'"),
        (("builds", 0, "artifact_id"), "us-west-2:ami-0123456789abcdefg", r"ami- and 8 or 17 hex digits"),
        (("builds", 0, "artifact_id"), "US-WEST-2:ami-0123456789abcdef0", r"is not 'region:ami-id'"),
        (
            ("builds", 0, "artifact_id"),
            "us-west-2:ami-0123456789abcdef0,us-west-2:ami-0123456789abcdef1",
            r"region us-west-2 appears twice",
        ),
    ],
)
def test_bad_manifest_names_file_and_key(path: tuple[Any, ...], value: Any, expected: str) -> None:
    with pytest.raises(ManifestError, match=expected) as info:
        parse_manifest(_set(_example(), path, value), "images/manifest.json")
    assert str(info.value).startswith("images/manifest.json")


def test_top_level_must_be_an_object() -> None:
    with pytest.raises(ManifestError, match="Packer manifest format"):
        parse_manifest([1, 2], "m.json")
