"""The lab's own catalog: instance types and prices declared beside the fleet, over the tables dlinfra ships.

`catalog.yaml` beside the fleet file (optional) has two sections, each in the layout of its packaged table:

    instance_types:        # as dlinfra/data/instance_types.yaml: every field, validated the same way
      g6e.12xlarge: {vcpus: 48, memory_gib: 384, gpus: 4, gpu_model: L40S, ...}
    prices:                # as dlinfra/data/prices.yaml's `prices`: unit, source, and a price per region
      ec2/g6e.12xlarge: {unit: instance-hour, source: https://aws.amazon.com/ec2/pricing/on-demand/,
                         regions: {us-west-2: {usd: 10.49}}}

An entry of the lab's replaces the packaged entry of the same name. Loading the fleet loads its catalog first
(dlinfra.model.fleet.load), so pools are validated against the merged table in every command and stack program.
A stack's cached plan (dlinfra.offline.cache) is keyed by the types its environment's pools use (`used`): a new
type for one pool makes only its environment's stacks run again, and a price none (prices are read by `cost`),
where a change to the packaged tables (code) makes every stack run again.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from dlinfra.errors import FleetError
from dlinfra.model import gpu_health, instances
from dlinfra.model.fleet.schema import Fleet

CATALOG_FILE = "catalog.yaml"  # beside the fleet file
SECTIONS = ("instance_types", "prices")


@dataclass(frozen=True)
class Catalog:
    """A lab's catalog as read and validated; empty when the fleet has none."""

    path: Path | None = None
    instance_types: Mapping[str, instances.InstanceType] = field(default_factory=dict)
    prices: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # key -> entry as in prices.yaml
    digest: str = ""  # sha256 of the file's text; "" without a file


EMPTY = Catalog()
_installed: list[Catalog] = [EMPTY]


def beside(fleet_path: Path) -> Path:
    return fleet_path.parent / CATALOG_FILE


def load(path: Path) -> Catalog:
    """Read and validate a catalog file; FleetError naming the file and key. A missing file is an empty catalog."""
    if not path.is_file():
        return EMPTY
    where = str(path)
    text = path.read_text(encoding="utf-8")
    try:
        data: Any = YAML(typ="safe").load(text)
    except YAMLError as exc:
        raise FleetError(f"not valid YAML: {exc}", file=where) from None
    data = data or {}
    if not isinstance(data, Mapping):
        raise FleetError("expected a mapping with instance_types and/or prices", file=where)
    unknown = sorted(str(k) for k in data if k not in SECTIONS)
    if unknown:
        raise FleetError(f"unknown section(s) {', '.join(unknown)}; a catalog has {', '.join(SECTIONS)}", file=where)
    types: Mapping[str, instances.InstanceType] = {}
    raw_types = data.get("instance_types") or {}
    if raw_types:
        try:
            types = instances.parse_entries(raw_types)
        except instances.InstanceTableError as exc:
            raise FleetError(exc.detail, file=where, key=f"instance_types.{exc.key}" if exc.key else None) from None
        for name, spec in types.items():
            _check_type(name, spec, where)
    prices = _prices(data.get("prices") or {}, where)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return Catalog(path=path, instance_types=types, prices=MappingProxyType(prices), digest=digest)


NAME = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")  # <family>.<size>, as EC2 names its types


def _check_type(name: str, spec: instances.InstanceType, where: str) -> None:
    """What the packaged table's tests hold it to, and what a launch needs, for one of the lab's types."""
    at = f"instance_types.{name}"
    if not NAME.match(name):
        raise FleetError("not an EC2 instance type name (<family>.<size>, e.g. g6e.xlarge)", file=where, key=at)
    if spec.offered_in is None:
        # The packaged table may leave it unknown; a lab's type must say, or a pool could be planned where AWS
        # does not sell it (aws ec2 describe-instance-type-offerings --location-type region).
        raise FleetError("say where AWS sells it: offered_in, a list of regions", file=where, key=f"{at}.offered_in")
    if spec.architecture != "x86_64":
        # The images manifest has one AMI per variant (cpu, gpu), built for x86_64: an arm64 type would be launched
        # from an x86_64 AMI, which EC2 refuses.
        raise FleetError(
            "only x86_64 types: the node images (images/, the manifest) are built for x86_64",
            file=where,
            key=f"{at}.architecture",
        )
    if spec.gpus:
        models = gpu_health.table().models
        if spec.gpu_model is None or spec.gpu_model not in models:
            known = ", ".join(sorted(models))
            raise FleetError(
                f"GPU model {spec.gpu_model!r} is not one the GPU health check knows ({known}): it expects each "
                "model's products and figures (dlinfra/data/gpu_models.yaml)",
                file=where,
                key=f"{at}.gpu_model",
            )
        products = models[spec.gpu_model].products
        if spec.gpu_product is None or spec.gpu_product not in products:
            raise FleetError(
                f"gpu_product must be one of {spec.gpu_model}'s products: {', '.join(products)}",
                file=where,
                key=f"{at}.gpu_product",
            )


def _prices(raw: Any, where: str) -> dict[str, Mapping[str, Any]]:
    """The price entries, checked as the packaged table's are read: unit, source, and a usd number per region."""
    if not isinstance(raw, Mapping):
        raise FleetError("expected a mapping of price key -> entry", file=where, key="prices")
    out: dict[str, Mapping[str, Any]] = {}
    for key, entry in raw.items():
        at = f"prices.{key}"
        if not isinstance(entry, Mapping):
            raise FleetError("expected {unit, source, regions}", file=where, key=at)
        for name in ("unit", "source"):
            if not isinstance(entry.get(name), str) or not entry[name]:
                raise FleetError("missing or not a string", file=where, key=f"{at}.{name}")
        regions = entry.get("regions")
        if not isinstance(regions, Mapping) or not regions:
            raise FleetError("expected a mapping of region -> {usd}", file=where, key=f"{at}.regions")
        for region, row in regions.items():
            usd = row.get("usd") if isinstance(row, Mapping) else None
            if isinstance(usd, bool) or not isinstance(usd, (int, float)) or usd < 0:
                raise FleetError("expected a price of 0 or more", file=where, key=f"{at}.regions.{region}.usd")
        out[str(key)] = entry
    return out


def install(catalog: Catalog) -> None:
    """Make `catalog` the one every table lookup merges over the packaged tables (the last fleet loaded)."""
    _installed[0] = catalog
    instances.use_lab_types(catalog.instance_types)


def installed() -> Catalog:
    return _installed[0]


def used(catalog: Catalog, fleet: Fleet, environment: str) -> dict[str, Any]:
    """The catalog's instance types an environment's pools use, as data: what its stacks' plans can depend on.
    (Prices are read by `cost` from the plans; no plan holds one.)"""
    wanted = {t for pool in fleet.environments[environment].node_pools.values() for t in pool.instance_types}
    return {n: t.model_dump(mode="json") for n, t in sorted(catalog.instance_types.items()) if n in wanted}


def merged_prices(packaged: Mapping[str, Any], lab: Mapping[str, Any]) -> dict[str, Any]:
    """The lab's price entries over the packaged ones: a lab entry's regions replace those regions only (a
    negotiated rate in one region keeps the list price elsewhere), its unit and source describe its regions."""
    out = dict(packaged)
    for key, entry in lab.items():
        ours = {
            region: {"unverified": False, "note": "", **row, "source": entry["source"]}
            for region, row in entry["regions"].items()
        }
        known = packaged.get(key)
        if known is None:
            out[key] = {**entry, "regions": ours}
        else:  # the packaged entry's regions keep their source; the lab's rows say theirs
            out[key] = {**known, "regions": {**known["regions"], **ours}}
    return out
