"""Which input changes make a provider replace a resource rather than update it, for every type dlinfra emits.

The table is data (dlinfra/data/replacements.yaml), read from each provider's source: Terraform's `ForceNew` and
`RequiresReplace` for the bridged providers (pulumi-aws, pulumi-tls, pulumi-random), pulumi-kubernetes' own
table for Kubernetes kinds. Each entry names the file and commit it was read from. Paths are Pulumi input names;
a dotted path reaches inside an object (`vpcConfig.subnetIds`), and lists of objects are followed element by
element. A type the table lacks is an error, never a silent "update": the diff would mislead a reviewer.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from ruamel.yaml import YAML

from dlinfra.errors import DlinfraError

DATA_FILE = "data/replacements.yaml"
WHERE = f"dlinfra/{DATA_FILE}"


class ReplacementError(DlinfraError):
    """The replacement table is malformed or lacks a type a plan holds."""


class Condition(BaseModel):
    """When a change at a conditional path replaces the resource, in a form the diff can evaluate.

    decrease: the new value is lower (numbers, or versions like "2.15"); set-or-unset: the value appears or
    disappears (empty counts as unset); unset: it disappears; from-to: it changes from `from_` to `to`. `also`:
    any change replaces while another input has the given value (FSx SCRATCH_1 storage).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    when: Literal["decrease", "set-or-unset", "unset", "from-to"]
    why: str = Field(min_length=5)
    from_: Any = Field(default=None, alias="from")
    to: Any = None
    also: dict[str, Any] = Field(default_factory=dict)


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(min_length=10)
    replace_on: list[str]
    conditional: dict[str, str | Condition] = Field(default_factory=dict)
    note: str = ""


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int
    types: dict[str, _Entry]


@dataclass(frozen=True)
class Rule:
    """What replaces one resource type."""

    type: str
    source: str
    paths: tuple[str, ...]  # a change at any of these replaces the resource
    # path -> when a change there replaces it: text (the diff says it may) or a condition it evaluates
    conditional: Mapping[str, str | Condition] = field(default_factory=dict)
    note: str = ""

    def why(self, path: str) -> str:
        condition = self.conditional[path]
        return condition if isinstance(condition, str) else condition.why


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {} or value == ""


def _ordered(value: Any) -> tuple[Any, ...]:
    """A number or a version string as something comparable: 2.15 < 2.16 < 2.16.1."""
    if isinstance(value, (int, float)):
        return (float(value),)
    return tuple(int(part) if part.isdigit() else part for part in str(value).replace("-", ".").split("."))


def holds(condition: Condition, before: Any, after: Any, inputs: Mapping[str, Any]) -> bool:
    """Whether a change from `before` to `after` meets the condition (`inputs`: the resource's new inputs)."""
    if any(normal(at(inputs, p)) == v for p, v in condition.also.items()):
        return True
    if condition.when == "decrease":
        if before is None or after is None:
            return False
        try:
            return _ordered(after) < _ordered(before)
        except TypeError:
            return False
    if condition.when == "set-or-unset":
        return _empty(before) != _empty(after)
    if condition.when == "unset":
        return not _empty(before) and _empty(after)
    return bool(normal(before) == condition.from_ and normal(after) == condition.to)


def normal(value: Any) -> Any:
    """Values as compared (here and in the diff): the engine's floats equal their integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normal(v) for v in value]
    return value


def at(value: Any, path: str) -> Any:
    """The value at a dotted path; through a list of objects, the list of each element's value."""
    head, _, rest = path.partition(".")
    if isinstance(value, list):
        return [at(v, path) for v in value]
    if not isinstance(value, Mapping):
        return None
    inner = value.get(head)
    return at(inner, rest) if rest else inner


class Table:
    """The replacement rules of every known type."""

    def __init__(self, rules: Mapping[str, Rule], where: str = WHERE) -> None:
        self.rules = dict(rules)
        self.where = where

    def rule(self, type_: str) -> Rule:
        try:
            return self.rules[type_]
        except KeyError:
            raise ReplacementError(
                f"no replacement data for {type_}: add it with the input paths that force replacement and the "
                "provider source they were read from",
                file=self.where,
                key=f"types.{type_}",
            ) from None

    def missing(self, types: Iterable[str]) -> list[str]:
        return sorted({t for t in types if t not in self.rules})

    def require(self, types: Iterable[str], *, what: str = "the plans") -> None:
        """One error listing every type `types` holds that the table lacks."""
        missing = self.missing(types)
        if missing:
            raise ReplacementError(
                f"{what} hold types with no replacement data: {', '.join(missing)}. Add each to the table with the "
                "input paths that force replacement and the provider source they were read from",
                file=self.where,
                key="types",
            )

    def forced(
        self, type_: str, before: Mapping[str, Any], after: Mapping[str, Any], extra: Iterable[str] = ()
    ) -> tuple[list[str], list[str]]:
        """(paths whose change replaces the resource, conditional paths that changed) between two input sets.

        `extra` adds paths (Pulumi's replaceOnChanges option; "*" is every input).
        """
        rule = self.rule(type_)
        extra = list(extra)
        if "*" in extra:
            keys = sorted(set(before) | set(after))
            return [k for k in keys if normal(before.get(k)) != normal(after.get(k))], []
        paths = dict.fromkeys([*rule.paths, *extra])
        changed = [p for p in paths if normal(at(before, p)) != normal(at(after, p))]
        maybe = []
        for path, condition in rule.conditional.items():
            old, new = at(before, path), at(after, path)
            if path in paths or normal(old) == normal(new):
                continue
            if isinstance(condition, str):
                maybe.append(path)
            elif holds(condition, old, new, after):
                changed.append(path)
        return changed, maybe

    def forcing_held(self, type_: str, inputs: Mapping[str, Any], holds: Any, extra: Iterable[str] = ()) -> list[str]:
        """Paths whose value holds a replaced resource's identity (`holds(value)`) and whose change replaces."""
        rule = self.rule(type_)
        extra = list(extra)
        if "*" in extra:
            return sorted(k for k, v in inputs.items() if holds(v))
        return [p for p in dict.fromkeys([*rule.paths, *extra]) if holds(at(inputs, p))]


def parse(text: str, where: str = WHERE) -> Table:
    """The table from YAML text; ReplacementError naming the bad key."""
    try:
        data = _File.model_validate(YAML(typ="safe").load(text))
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise ReplacementError(
            f"{first['msg']} (got {json.dumps(first.get('input'), default=str)[:80]})", file=where, key=key
        ) from None
    rules = {}
    for type_, entry in data.types.items():
        for path in [*entry.replace_on, *entry.conditional]:
            if not path or any(not part for part in path.split(".")):
                raise ReplacementError(f"bad input path {path!r}", file=where, key=f"types.{type_}")
        rules[type_] = Rule(type_, entry.source, tuple(entry.replace_on), dict(entry.conditional), entry.note)
    return Table(rules, where)


@functools.cache
def table() -> Table:
    """The table shipped in dlinfra/data."""
    return parse(resources.files("dlinfra").joinpath(DATA_FILE).read_text())


def load(path: Path) -> Table:
    return parse(path.read_text(), str(path))
