"""The Helm charts the Platform installs, pinned in dlinfra/data/addons.yaml: the table, read and checked once."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dlinfra.errors import DlinfraError

ADDONS_FILE = "dlinfra/data/addons.yaml"
SYSTEM_NAMESPACE = "kube-system"  # most charts install here; it exists already, so Helm must not create it


class AddonSpec(BaseModel):
    """One pinned Helm chart from dlinfra/data/addons.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chart: str  # chart name in `repository`, or a full oci:// reference
    repository: str | None = None  # classic Helm repository URL; None for OCI charts
    # One exact version: no ranges, no pre-releases. Some repositories (eks-charts) spell versions with a
    # leading "v"; pin them exactly as the repository index does.
    version: str = Field(pattern=r"^v?\d+\.\d+\.\d+$")
    namespace: str
    verified: str  # where the pin was checked
    image_tags: Mapping[str, str] = Field(default_factory=dict)  # Kubernetes minor -> image tag
    image_registries: Mapping[str, str] = Field(default_factory=dict)  # AWS region -> registry host of the image

    @model_validator(mode="after")
    def _source(self) -> AddonSpec:
        oci = self.chart.startswith("oci://")
        if oci == (self.repository is not None):
            raise ValueError("give either an oci:// chart, or a chart name with a repository URL")
        if self.repository is not None and not self.repository.startswith("https://"):
            raise ValueError(f"repository {self.repository!r}: use an https:// URL")
        return self


ADDONS = (
    "nvidia-device-plugin",
    "dcgm-exporter",
    "cluster-autoscaler",
    "aws-node-termination-handler",
    "kueue",
    "cilium",
    "aws-efa-k8s-device-plugin",
    "node-local-dns",
)


@functools.cache
def load_addons() -> Mapping[str, AddonSpec]:
    """The pinned charts; DlinfraError naming the file and key when an entry is malformed or missing."""
    raw = yaml.safe_load(resources.files("dlinfra").joinpath("data/addons.yaml").read_text(encoding="utf-8"))
    if not isinstance(raw, Mapping):
        raise DlinfraError("expected a mapping of add-on name -> chart", file=ADDONS_FILE)
    out: dict[str, AddonSpec] = {}
    for name in ADDONS:
        if name not in raw:
            raise DlinfraError(
                "missing: every add-on the Platform installs needs a pinned chart", file=ADDONS_FILE, key=name
            )
    for name, spec in raw.items():
        if name not in ADDONS:
            raise DlinfraError(f"unknown add-on; known: {', '.join(ADDONS)}", file=ADDONS_FILE, key=str(name))
        try:
            out[name] = AddonSpec.model_validate(spec)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}" for e in exc.errors())
            raise DlinfraError(problems, file=ADDONS_FILE, key=str(name)) from None
    return out


def image_registry(addon: str, region: str) -> str:
    """The registry an add-on's image is pulled from in a region (the region's own, through the ECR endpoint)."""
    registries = load_addons()[addon].image_registries
    if region not in registries:
        raise DlinfraError(
            f"no image registry pinned for region {region} (pinned: {', '.join(sorted(registries))})",
            file=ADDONS_FILE,
            key=f"{addon}.image_registries",
        )
    return registries[region]
