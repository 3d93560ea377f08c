"""AMI ids per (variant, region) from the manifest that Packer's manifest post-processor writes.

Pure planning code (no pulumi): stacks give each node pool the AMI of its variant in its region.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlinfra.errors import DlinfraError

VARIANTS = ("cpu", "gpu")
EXAMPLE_MANIFEST = "images/manifest.example.json"

_REGION = re.compile(r"^[a-z]{2}(?:-gov)?-[a-z]+-\d+$")
# EC2 image ids: "ami-" and 8 (old) or 17 hex digits.
_AMI_ID = re.compile(r"^ami-(?:[0-9a-f]{8}|[0-9a-f]{17})$")


class ManifestError(DlinfraError):
    """The image manifest is missing, malformed, or has no AMI for what was asked."""


class AmiManifest(dict[tuple[str, str], str]):
    """(variant, region) -> AMI id, remembering which file it came from for error messages."""

    def __init__(self, entries: Mapping[tuple[str, str], str], source: str) -> None:
        super().__init__(entries)
        self.source = source


def load_manifest(path: str | Path) -> AmiManifest:
    """AMI ids of the newest build of each variant in a Packer manifest file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(
            f"no such file; build the images (images/README.md) or use {EXAMPLE_MANIFEST}", file=source
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}", file=source) from None
    return parse_manifest(data, source)


def parse_manifest(data: Any, source: str) -> AmiManifest:
    """Like load_manifest, for already-parsed JSON; `source` names it in errors."""
    if not isinstance(data, dict) or not isinstance(data.get("builds"), list):
        raise ManifestError("expected an object with a 'builds' list (Packer manifest format)", file=source)
    if not data["builds"]:
        raise ManifestError("has no builds", file=source, key="builds")
    newest: dict[str, tuple[int, int, dict[str, str]]] = {}
    for index, build in enumerate(data["builds"]):
        variant, build_time, amis = _parse_build(build, source, f"builds[{index}]")
        # Packer appends builds, so on equal build_time the later entry is the newer one.
        if variant not in newest or (build_time, index) > newest[variant][:2]:
            newest[variant] = (build_time, index, amis)
    # Regions come from one build per variant only: mixing AMIs from different builds would give a
    # fleet whose regions run different images under one name.
    return AmiManifest(
        {(variant, region): ami for variant, (_, _, amis) in newest.items() for region, ami in amis.items()},
        source,
    )


def ami_for(manifest: Mapping[tuple[str, str], str], variant: str, region: str) -> str:
    """The AMI id of `variant` in `region`; raises ManifestError saying how to get one."""
    try:
        return manifest[(variant, region)]
    except KeyError:
        pass
    source = manifest.source if isinstance(manifest, AmiManifest) else "the image manifest"
    have = sorted(r for v, r in manifest if v == variant)
    known = f" (it has {variant} AMIs for {', '.join(have)})" if have else ""
    raise ManifestError(
        f"no AMI for variant {variant} in region {region} in {source}{known}; make sure {region} is in "
        f"regions in images/variables/common.pkrvars.hcl, then run `packer build "
        f"-var-file=variables/common.pkrvars.hcl -var-file=variables/{variant}.pkrvars.hcl .` in images/"
    ) from None


def _parse_build(build: Any, source: str, key: str) -> tuple[str, int, dict[str, str]]:
    if not isinstance(build, dict):
        raise ManifestError("expected an object", file=source, key=key)
    custom = build.get("custom_data")
    variant = custom.get("variant") if isinstance(custom, dict) else None
    if variant not in VARIANTS:
        raise ManifestError(
            f"must be one of {', '.join(VARIANTS)}, got {variant!r}",
            file=source,
            key=f"{key}.custom_data.variant",
        )
    build_time = build.get("build_time")
    if not isinstance(build_time, int) or isinstance(build_time, bool) or build_time < 0:
        raise ManifestError(f"must be Unix seconds, got {build_time!r}", file=source, key=f"{key}.build_time")
    return variant, build_time, _parse_artifact_id(build.get("artifact_id"), source, f"{key}.artifact_id")


def _parse_artifact_id(artifact: Any, source: str, key: str) -> dict[str, str]:
    if not isinstance(artifact, str) or not artifact:
        raise ManifestError(f"expected 'region:ami-id,...', got {artifact!r}", file=source, key=key)
    amis: dict[str, str] = {}
    for part in artifact.split(","):
        region, sep, ami = part.strip().partition(":")
        if not sep or not _REGION.match(region) or not _AMI_ID.match(ami):
            raise ManifestError(
                f"{part.strip()!r} is not 'region:ami-id' (ami- and 8 or 17 hex digits)", file=source, key=key
            )
        if region in amis:
            raise ManifestError(f"region {region} appears twice", file=source, key=key)
        amis[region] = ami
    return amis
