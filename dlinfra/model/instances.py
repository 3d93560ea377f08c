"""EC2 instance types as data (dlinfra/data/instance_types.yaml): CPU, memory, GPUs, EFA, network cards.

Pure planning code (no pulumi): pools are validated against it, autoscaler node templates read it.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from dlinfra.errors import DlinfraError

TABLE_PATH = "dlinfra/data/instance_types.yaml"


class InstanceTableError(DlinfraError):
    """The instance-type table itself is malformed (a bug in dlinfra, not in the fleet file)."""


class UnknownInstanceType(DlinfraError, KeyError):  # noqa: N818 - the name the planning API promises
    """An instance type that is not in the table; the message suggests close matches."""

    def __str__(self) -> str:
        # KeyError would quote the message as a repr; people should read it as written.
        return str(self.args[0]) if self.args else ""


class InstanceType(BaseModel):
    """One EC2 instance type's figures (see the header of instance_types.yaml for their sources)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # e.g. "p5.48xlarge"
    vcpus: int = Field(gt=0)
    memory_gib: int = Field(gt=0)  # system memory, GiB
    gpus: int = Field(ge=0)  # NVIDIA GPUs; 0 for CPU types
    gpu_model: str | None  # short name: H100, H200, A100, A10G, L4; None for CPU types
    gpu_memory_gib: int = Field(ge=0)  # memory of one GPU, GiB; 0 for CPU types
    # NVML product name of its GPUs (nvmlDeviceGetName: "NVIDIA H100 80GB HBM3"); None for CPU types. One of the
    # model's products in gpu_models.yaml (tests/model/test_gpu_health.py holds the two tables together).
    gpu_product: str | None = None
    efa_interfaces: int = Field(ge=0)  # maximum EFA interfaces; 0 when EFA is unsupported
    network_cards: int = Field(ge=1)  # maximum network cards
    nvswitch: bool  # NVSwitch fabric: Fabric Manager must run before CUDA works
    max_pods: int | None = Field(default=None, gt=0)  # VPC CNI pods per node without prefix delegation
    max_enis: int = Field(gt=0)  # interfaces the VPC CNI attaches (network card 0; vpc_ip_resource_limit.go)
    ipv4_per_eni: int = Field(gt=1)  # IPv4 addresses per interface, its primary included
    architecture: Literal["x86_64", "arm64"]
    # Regions AWS sells it in (of the regions dlinfra knows); None: not established, assumed everywhere.
    offered_in: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> InstanceType:
        has_gpu = self.gpus > 0
        if has_gpu != (self.gpu_model is not None) or has_gpu != (self.gpu_memory_gib > 0):
            raise ValueError("gpus, gpu_model and gpu_memory_gib must be all set (GPU type) or all empty")
        if has_gpu != bool(self.gpu_product):
            raise ValueError("gpu_product: the NVML product name of a GPU type's GPUs, and only of a GPU type's")
        if self.nvswitch and self.gpus < 8:
            raise ValueError("nvswitch: only 8-GPU HGX boards have an NVSwitch fabric")
        # EC2 attaches at most one EFA per network card.
        if self.efa_interfaces > self.network_cards:
            raise ValueError(
                f"efa_interfaces ({self.efa_interfaces}) cannot exceed network_cards ({self.network_cards})"
            )
        # The VPC CNI's max pods: every interface's secondary addresses, plus two host-network pods (eni-max-pods.txt
        # is generated this way from vpc_ip_resource_limit.go in aws/amazon-vpc-cni-k8s).
        derived = self.max_enis * (self.ipv4_per_eni - 1) + 2
        if self.max_pods is not None and self.max_pods != derived:
            raise ValueError(
                f"max_pods ({self.max_pods}) must be max_enis * (ipv4_per_eni - 1) + 2 = {derived}, as the VPC CNI "
                "computes it"
            )
        return self

    @property
    def vpc_cni_addresses(self) -> int:
        """Subnet addresses a node holds once the VPC CNI has attached every interface (secondary-IP mode)."""
        return self.max_enis * self.ipv4_per_eni

    @property
    def efa_supported(self) -> bool:
        """True when at least one EFA interface can be attached."""
        return self.efa_interfaces > 0

    @property
    def total_gpu_memory_gib(self) -> int:
        """GPU memory of the whole instance, GiB."""
        return self.gpus * self.gpu_memory_gib

    @property
    def family(self) -> str:
        """The part before the dot: "p5" for p5.48xlarge."""
        return self.name.split(".", 1)[0]


def parse_table(text: str, source: str = TABLE_PATH) -> Mapping[str, InstanceType]:
    """Parse an instance-type table (YAML mapping of name -> figures); errors name `source` and the type."""
    try:
        raw: Any = YAML(typ="safe").load(text)
    except YAMLError as exc:
        raise InstanceTableError(f"not valid YAML: {exc}", file=source) from None
    return parse_entries(raw, source)


def parse_entries(raw: Any, source: str = TABLE_PATH) -> Mapping[str, InstanceType]:
    """Instance types from parsed data (name -> figures); errors name `source` and the type's key."""
    if not isinstance(raw, Mapping) or not raw:
        raise InstanceTableError("expected a mapping of instance type name -> figures", file=source)
    table: dict[str, InstanceType] = {}
    for name, spec in raw.items():
        if not isinstance(spec, Mapping):
            raise InstanceTableError("expected a mapping of figures", file=source, key=str(name))
        try:
            table[str(name)] = InstanceType(name=str(name), **spec)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'entry'}: {err['msg']}" for err in exc.errors()
            )
            raise InstanceTableError(problems, file=source, key=str(name)) from None
    return MappingProxyType(table)


@functools.cache
def packaged_types() -> Mapping[str, InstanceType]:
    """The instance types dlinfra ships, in table order (loaded once)."""
    text = resources.files("dlinfra").joinpath("data/instance_types.yaml").read_text(encoding="utf-8")
    return parse_table(text)


_lab: list[Mapping[str, InstanceType]] = [MappingProxyType({})]


def use_lab_types(types: Mapping[str, InstanceType]) -> None:
    """Merge the lab's own types (dlinfra.model.catalog) over the packaged ones from now on; {} for none."""
    if dict(types) != dict(_lab[0]):
        _lab[0] = MappingProxyType(dict(types))
        _merged.cache_clear()


@functools.cache
def _merged() -> Mapping[str, InstanceType]:
    return MappingProxyType({**packaged_types(), **_lab[0]}) if _lab[0] else packaged_types()


def all_types() -> Mapping[str, InstanceType]:
    """Every known instance type: the packaged table with the lab's catalog over it, in table order."""
    return _merged()


def lookup(name: str) -> InstanceType:
    """The figures of `name`; raises UnknownInstanceType naming close matches."""
    table = all_types()
    try:
        return table[name]
    except KeyError:
        pass
    close = difflib.get_close_matches(name, table.keys(), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else f"known families: {_families(table)}"
    raise UnknownInstanceType(
        f"unknown instance type {name!r}; {hint} (add it to catalog.yaml beside the fleet, docs/catalog.md)"
    ) from None


def offered(name: str, region: str) -> bool:
    """Whether `name` is sold in `region`, as far as the table knows (unknown: assumed yes)."""
    spec = lookup(name)
    return spec.offered_in is None or region in spec.offered_in


def is_gpu(name: str) -> bool:
    """True when `name` has NVIDIA GPUs; raises UnknownInstanceType for unknown types."""
    return lookup(name).gpus > 0


def _families(table: Mapping[str, InstanceType]) -> str:
    return ", ".join(sorted({t.family for t in table.values()}))
