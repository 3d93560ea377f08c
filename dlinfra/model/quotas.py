"""AWS service quotas and Kubernetes limits as data (dlinfra/data/quotas.yaml), and the values a fleet says its
accounts have raised them to. Pure (no pulumi): `dlinfra check` counts the plans against them."""

from __future__ import annotations

import datetime
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from dlinfra.errors import DlinfraError

TABLE_PATH = "dlinfra/data/quotas.yaml"
# Service Quotas codes look like L-F678F1CE (AWS Service Quotas User Guide, "Service Quotas terminology").
CODE_PATTERN = r"^L-[0-9A-F]{8}$"
NEAR = 0.8  # a count at or above this share of its quota is reported as approaching it

Per = Literal[
    "region",
    "vpc",
    "route-table",
    "security-group",
    "network-interface",
    "transit-gateway",
    "client-vpn-endpoint",
    "client-vpn-association",
    "cluster",
    "subnet",
    "build-project",
    "role",
]
# Which instances a vCPU quota counts: On-Demand (reservations included) or Spot.
Market = Literal["on-demand", "spot"]


class QuotaTableError(DlinfraError):
    """The quota table itself is malformed (a bug in dlinfra, not in the fleet file)."""


class Quota(BaseModel):
    """One quota or limit: its figure, whether it can be raised and where that was read."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str  # stable name; findings are `limit-<key>`
    name: str  # as the source page (and the Service Quotas console) names it
    # Service Quotas service code, or Kubernetes' own
    service: Literal["vpc", "ec2", "eks", "lambda", "codebuild", "iam", "kubernetes"]
    code: str | None = Field(pattern=CODE_PATTERN)  # Service Quotas code; None: none to request
    default: int | None = Field(ge=0)  # AWS's default (0: none until raised); None: the counted thing's own size
    adjustable: bool
    per: Per  # what one count covers
    source: str = Field(min_length=10)  # page title and address
    note: str = ""
    # vCPU quotas only: the instance families they count (a regular expression matched against the whole family,
    # "p5" of p5.48xlarge), and which instances (on-demand or spot).
    families: str | None = None
    market: Market | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Quota:
        if self.code is not None and not self.adjustable:
            raise ValueError("code: only an adjustable quota has a code to request an increase with")
        if self.service == "kubernetes" and self.code is not None:
            raise ValueError("code: Kubernetes' limits are not AWS service quotas")
        if "https://" not in self.source:
            raise ValueError("source: name the page and its address")
        if (self.families is None) != (self.market is None):
            raise ValueError("families and market: a vCPU quota gives both, any other quota neither")
        if self.families is not None:
            try:
                re.compile(self.families)
            except re.error as exc:
                raise ValueError(f"families: not a regular expression: {exc}") from None
        return self

    def counts_family(self, family: str) -> bool:
        """Whether this vCPU quota counts instances of a family ("p5", "m7i")."""
        return self.families is not None and re.fullmatch(self.families, family) is not None

    def request_hint(self, wanted: int) -> str:
        """How to raise it to `wanted`, or why it cannot be."""
        if not self.adjustable:
            return "not adjustable: change the plan"
        if self.code is None:
            return "adjustable through AWS Support (no Service Quotas code)"
        return (
            f"adjustable: request an increase (Service Quotas {self.service}/{self.code}: aws service-quotas "
            f"request-service-quota-increase --service-code {self.service} --quota-code {self.code} "
            f"--desired-value {wanted}), then write the value AWS applied in the fleet "
            f"(quotas: {{{self.code}: {wanted}}}, or regions.<region>.quotas)"
        )


@dataclass(frozen=True)
class QuotaTable:
    """Every quota dlinfra counts, and the date their pages were read."""

    read_on: datetime.date
    quotas: Mapping[str, Quota]

    def codes(self) -> frozenset[str]:
        """The Service Quotas codes a fleet may give raised values for."""
        return frozenset(q.code for q in self.quotas.values() if q.code)


def parse_table(text: str, source: str = TABLE_PATH) -> QuotaTable:
    """Parse a quota table; errors name `source` and the entry."""
    try:
        raw: Any = YAML(typ="safe").load(text)
    except YAMLError as exc:
        raise QuotaTableError(f"not valid YAML: {exc}", file=source) from None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("quotas"), Mapping) or not raw["quotas"]:
        raise QuotaTableError("expected `read_on` and a mapping `quotas` of key -> quota", file=source)
    if not isinstance(raw.get("read_on"), datetime.date):
        raise QuotaTableError("read_on: the date the pages were read (YYYY-MM-DD)", file=source)
    quotas: dict[str, Quota] = {}
    for key, spec in raw["quotas"].items():
        if not isinstance(spec, Mapping) or not re.fullmatch(r"[a-z][a-z0-9-]+", str(key)):
            raise QuotaTableError("expected a lower-case key and a mapping of fields", file=source, key=str(key))
        try:
            quotas[str(key)] = Quota(key=str(key), **spec)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'entry'}: {err['msg'].removeprefix('Value error, ')}"
                for err in exc.errors()
            )
            raise QuotaTableError(problems, file=source, key=f"quotas.{key}") from None
    return QuotaTable(read_on=raw["read_on"], quotas=MappingProxyType(quotas))


@functools.cache
def table() -> QuotaTable:
    """The quota table shipped with dlinfra (loaded once)."""
    return parse_table(resources.files("dlinfra").joinpath("data/quotas.yaml").read_text(encoding="utf-8"))


def unknown_code_problem(code: str) -> str:
    """Why a fleet may not give a value for `code`, or "" when it may."""
    known = table().codes()
    if code in known:
        return ""
    if not re.fullmatch(CODE_PATTERN, code):
        return f"{code!r} is not a Service Quotas code (L- and 8 hex digits, e.g. L-F678F1CE)"
    return f"{code} is not a quota dlinfra counts; known: {', '.join(sorted(known))} ({TABLE_PATH})"


# Raised quotas in a fleet: Service Quotas code -> the value Service Quotas shows as applied in the account.
QuotaValues = Mapping[str, Annotated[int, Field(ge=1)]]


def check_codes(values: QuotaValues) -> QuotaValues:
    """`values` when each key is a code dlinfra counts; ValueError naming the first that is not."""
    for code in values:
        problem = unknown_code_problem(code)
        if problem:
            raise ValueError(problem)
    return values


def applied(
    quota: Quota, region: str, fleet_values: QuotaValues, region_values: Mapping[str, QuotaValues]
) -> tuple[int | None, bool]:
    """The value a quota has in a region: the region's raised value, else the fleet's, else AWS's default; and
    whether it was raised."""
    if quota.code is not None:
        for values in (region_values.get(region, {}), fleet_values):
            if quota.code in values:
                return values[quota.code], True
    return quota.default, False
