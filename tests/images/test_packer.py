"""images/: Packer template validated by Debian's packer 1.6.6, scripts, and variable files that agree
with chef/ and fleet.yaml."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REFERENCE_FLEET

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
CHEF = ROOT / "chef"
VARIANTS = ("cpu", "gpu")
STRICT_MODE = "set -o errexit -o nounset -o pipefail"
MODERN_BLOCK = re.compile(r"\n[ \t]*# BEGIN modern-packer-only.*?# END modern-packer-only[^\n]*", re.DOTALL)


def var_files(variant: str) -> list[str]:
    """The fixed layering order: common first, then the variant (later files win)."""
    return [
        "-var-file=variables/common.pkrvars.hcl",
        f"-var-file=variables/{variant}.pkrvars.hcl",
    ]


def legacy_copy(tmp_path: Path) -> Path:
    """images/ (next to a copy of chef/) as packer 1.6.6 can read it: modern-only block stripped."""
    shutil.copytree(IMAGES, tmp_path / "images", ignore=shutil.ignore_patterns("manifest.json"))
    # The file provisioner uploads ../chef/ and packer validate checks that the source exists.
    shutil.copytree(CHEF, tmp_path / "chef")
    template = tmp_path / "images" / "node.pkr.hcl"
    text, count = MODERN_BLOCK.subn("", template.read_text())
    assert count == 1, "node.pkr.hcl must have exactly one modern-packer-only block"
    template.write_text(text)
    return tmp_path / "images"


def packer_validate(packer: str, images: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # CHECKPOINT_DISABLE: packer would otherwise phone home for version checks.
    env = {**os.environ, "CHECKPOINT_DISABLE": "1", "PACKER_LOG": ""}
    return subprocess.run(
        [packer, "validate", *args, "node.pkr.hcl"],
        cwd=images,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def read_pkrvars(path: Path) -> dict[str, Any]:
    """The simple `name = value` files in images/variables (strings, numbers, lists of strings)."""
    values: dict[str, Any] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition("=")
        values[name.strip()] = json.loads(value.strip())
    return values


def layered(variant: str) -> dict[str, Any]:
    return {
        **read_pkrvars(IMAGES / "variables" / "common.pkrvars.hcl"),
        **read_pkrvars(IMAGES / "variables" / f"{variant}.pkrvars.hcl"),
    }


# -- packer validate (Debian's packer 1.6.6) ------------------------------------------------------------


@pytest.mark.packer
@pytest.mark.parametrize("variant", VARIANTS)
def test_template_validates(variant: str, tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    result = packer_validate(require_tool("packer"), legacy_copy(tmp_path), *var_files(variant))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.packer
def test_misspelt_argument_fails_validation(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    images = legacy_copy(tmp_path)
    template = images / "node.pkr.hcl"
    text, count = re.subn(r"^(\s*)instance_type(\s*=)", r"\1instanse_type\2", template.read_text(), flags=re.M)
    assert count == 1
    template.write_text(text)
    result = packer_validate(require_tool("packer"), images, *var_files("gpu"))
    assert result.returncode != 0
    assert "instanse_type" in result.stdout + result.stderr


@pytest.mark.packer
def test_unknown_variant_fails_validation(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    result = packer_validate(require_tool("packer"), legacy_copy(tmp_path), *var_files("gpu"), "-var", "variant=tpu")
    assert result.returncode != 0
    assert "must be cpu or gpu" in result.stdout + result.stderr


@pytest.mark.packer
def test_missing_script_fails_validation(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    images = legacy_copy(tmp_path)
    (images / "scripts" / "20-run-chef.sh").unlink()
    result = packer_validate(require_tool("packer"), images, *var_files("cpu"))
    assert result.returncode != 0
    assert "20-run-chef.sh" in result.stdout + result.stderr


def test_modern_only_block_holds_only_imds_settings() -> None:
    # The block packer 1.6.6 never sees must not hide anything but the two settings it cannot parse.
    match = MODERN_BLOCK.search((IMAGES / "node.pkr.hcl").read_text())
    assert match is not None
    body = [line.strip() for line in match.group(0).splitlines() if line.strip()]
    code = [line for line in body if not line.startswith("#")]
    assert code[0] == "metadata_options {"
    assert 'http_tokens                 = "required"' in code
    top_level = [line.split()[0] for line in code if re.match(r"^[a-z_]+\s*(=|\{)", line)]
    assert set(top_level) <= {
        "metadata_options",
        "imds_support",
        "http_endpoint",
        "http_tokens",
        "http_put_response_hop_limit",
    }
    assert 'imds_support = "v2.0"' in code


def test_versions_file_pins_the_amazon_plugin() -> None:
    text = (IMAGES / "versions.pkr.hcl").read_text()
    assert "required_plugins" in text and 'source  = "github.com/hashicorp/amazon"' in text
    assert "required_plugins" not in (IMAGES / "node.pkr.hcl").read_text()


# -- provisioner scripts ------------------------------------------------------------------------------


SCRIPTS = sorted((IMAGES / "scripts").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_is_strict_and_guards_its_variants(script: Path) -> None:
    lines = script.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert lines[1] == STRICT_MODE
    assert re.search(r'^case "\$\{DLINFRA_VARIANT:\?[^}]*\}" in$', script.read_text(), re.M), (
        "each script exits early unless DLINFRA_VARIANT is one it serves"
    )
    assert os.access(script, os.X_OK)


def test_every_script_is_provisioned_and_every_provisioned_script_exists() -> None:
    referenced = set(re.findall(r'"\$\{path\.root\}/scripts/([^"]+)"', (IMAGES / "node.pkr.hcl").read_text()))
    assert referenced == {p.name for p in SCRIPTS}


@pytest.mark.packer
def test_shellcheck(require_tool: Callable[[str], str]) -> None:
    result = subprocess.run(
        [require_tool("shellcheck"), "--shell=bash", *map(str, SCRIPTS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- variable files agree with chef/ and fleet.yaml -----------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_file_names_an_existing_role_and_attribute_file(variant: str) -> None:
    values = layered(variant)
    assert values["variant"] == variant
    role = values["chef_role"]
    assert json.loads((CHEF / "roles" / f"{role}.json").read_text())["name"] == role
    assert json.loads((CHEF / "nodes" / f"{role}.json").read_text())["run_list"] == [f"role[{role}]"]


def test_gpu_driver_version_matches_chef() -> None:
    gpu = layered("gpu")
    node = json.loads((CHEF / "nodes" / "gpu-node.json").read_text())
    attributes = (CHEF / "cookbooks" / "dlinfra_gpu" / "attributes" / "default.rb").read_text()
    assert re.fullmatch(r"\d+\.\d+\.\d+", gpu["nvidia_driver_version"])
    assert node["dlinfra_gpu"]["driver"]["version"] == gpu["nvidia_driver_version"]
    assert f"['driver']['version'] = '{gpu['nvidia_driver_version']}'" in attributes
    assert layered("cpu")["nvidia_driver_version"] == ""


def test_regions_and_kubernetes_version_match_the_reference_fleet() -> None:
    fleet = yaml.safe_load((REFERENCE_FLEET).read_text())
    common = read_pkrvars(IMAGES / "variables" / "common.pkrvars.hcl")
    primary = [name for name, spec in fleet["regions"].items() if (spec or {}).get("primary")]
    assert sorted(common["regions"]) == sorted(fleet["regions"])
    assert common["regions"][0] == primary[0], "the primary region builds the AMI"
    versions = {env["kubernetes"]["version"] for env in fleet["environments"].values()}
    assert versions == {common["kubernetes_version"]}
    for role in ("cpu-node", "gpu-node"):
        node = json.loads((CHEF / "nodes" / f"{role}.json").read_text())
        assert node["dlinfra_base"]["kubernetes"]["version"] == common["kubernetes_version"]


def test_gp3_root_volume_settings_are_in_range() -> None:
    for variant in VARIANTS:
        values = layered(variant)
        assert 3000 <= values["root_volume_iops"] <= 16000
        assert 125 <= values["root_volume_throughput"] <= 1000
        # gp3 allows at most 0.25 MiB/s of throughput per provisioned IOPS.
        assert values["root_volume_throughput"] <= values["root_volume_iops"] / 4
