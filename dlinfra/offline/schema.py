"""What inputs a provider resource accepts, read from the provider SDK's own typed Args classes.

The mock engine sees inputs as camelCase dicts. A key that the SDK knew was translated to camelCase; a
key it did not know (a typo, or snake_case inside a plain dict) arrives as written. Checking every key,
at every depth, against the SDK's input types makes such typos fail offline as they would for real.
"""

from __future__ import annotations

import collections.abc
import difflib
import functools
import importlib
import sys
import typing
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi import _types
from pulumi.runtime import rpc

SECRET_SIG = rpc._special_secret_sig  # noqa: SLF001 - the wire marker of a secret value
SIG_KEY = rpc._special_sig_key  # noqa: SLF001

# Inputs every resource of a package may carry besides its Args (set by the SDK, not the user).
_IMPLICIT = {"kubernetes": {"apiVersion", "kind"}}


@dataclass(frozen=True)
class Shape:
    """Expected structure of an input value: an object with known keys, a list, a map, or anything."""

    kind: str  # "object" | "list" | "map" | "any"
    fields: typing.Mapping[str, Shape] | None = None  # object: camelCase key -> shape
    item: Shape | None = None  # list and map: element shape
    type_name: str = ""


ANY = Shape("any")


class InputError(Exception):
    """Inputs the provider would not recognise."""


def is_secret(value: Any) -> bool:
    """True for a value wrapped as a secret on the wire."""
    return isinstance(value, dict) and value.get(SIG_KEY) == SECRET_SIG


@functools.cache
def resource_class(type_token: str) -> type | None:
    """The SDK class of a resource type token, via the package's registered resource modules."""
    pkg, mod, _ = type_token.split(":", 2)
    for module in rpc._RESOURCE_MODULES.get(f"{pkg}:{mod}", []):  # noqa: SLF001
        info = getattr(module, "mod_info", None)
        if info and type_token in info.get("classes", {}):
            return typing.cast(type, getattr(importlib.import_module(info["fqn"]), info["classes"][type_token]))
    return None


@functools.cache
def resource_shape(type_token: str) -> Shape | None:
    """Top-level input shape of a resource type; None when the type is not a provider resource we know."""
    cls = resource_class(type_token)
    if cls is None:
        return None
    module = sys.modules[cls.__module__]
    # The SDK names a resource's args `<Name>InitArgs` when `<Name>Args` is taken by a nested input type.
    args_cls = getattr(module, f"{cls.__name__}InitArgs", None) or getattr(module, f"{cls.__name__}Args", None)
    if args_cls is None:
        return None
    shape = _object_shape(args_cls)
    extra = _IMPLICIT.get(type_token.split(":", 1)[0], set())
    return Shape("object", {**(shape.fields or {}), **{k: ANY for k in extra}}, type_name=args_cls.__name__)


@functools.cache
def _object_shape(cls: type) -> Shape:
    fields: dict[str, Shape] = {}
    module = sys.modules.get(cls.__module__)
    # The SDK's hints name Output[T] as a forward reference outside the module's namespace.
    globalns = {"Output": pulumi.Output, "T": typing.TypeVar("T"), **(vars(module) if module else {})}
    for _py_name, pulumi_name, prop in _types._py_properties(cls):  # noqa: SLF001
        try:
            hint = typing.get_type_hints(prop.fget, globalns=globalns).get("return", Any)
        except Exception:  # noqa: BLE001 - an unresolvable forward reference only weakens the check
            hint = Any
        fields[pulumi_name] = _LazyShape(hint)  # type: ignore[assignment]
    return Shape("object", fields, type_name=cls.__name__)


class _LazyShape:
    """Resolve nested shapes on first use: SDK input types are deep and mostly never reached."""

    def __init__(self, hint: Any) -> None:
        self.hint = hint

    @functools.cached_property
    def shape(self) -> Shape:
        return _shape_of(self.hint)


def _shape_of(hint: Any) -> Shape:
    """Map a type hint (Input[...], Optional, Sequence, Mapping, input type) to a Shape."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or (origin is not None and str(origin) == "types.UnionType"):
        shapes = [_shape_of(a) for a in typing.get_args(hint) if a is not type(None)]
        for kind in ("object", "list", "map"):
            match = [s for s in shapes if s.kind == kind]
            if match:
                return match[0]
        return ANY
    if origin in (collections.abc.Awaitable,) or _is_output(origin):
        args = typing.get_args(hint)
        return _shape_of(args[0]) if args else ANY
    if origin in (list, tuple, collections.abc.Sequence):
        args = typing.get_args(hint)
        return Shape("list", item=_LazyShape(args[0]) if args else ANY)  # type: ignore[arg-type]
    if origin in (dict, collections.abc.Mapping):
        args = typing.get_args(hint)
        return Shape("map", item=_LazyShape(args[1]) if len(args) == 2 else ANY)  # type: ignore[arg-type]
    if isinstance(hint, type) and _types.is_input_type(hint):
        return _object_shape(hint)
    return ANY


def _is_output(origin: Any) -> bool:
    return getattr(origin, "__name__", "") == "Output" and getattr(origin, "__module__", "").startswith("pulumi")


def _resolve(shape: Any) -> Shape:
    return shape.shape if isinstance(shape, _LazyShape) else shape


def check_inputs(type_token: str, inputs: typing.Mapping[str, Any]) -> None:
    """Raise InputError listing every input key the resource type does not have, at any depth."""
    shape = resource_shape(type_token)
    if shape is None:
        return
    problems: list[str] = []
    _check(inputs, shape, "", problems)
    if problems:
        raise InputError(f"{type_token}: " + "; ".join(problems))


def _check(value: Any, shape: Shape, path: str, problems: list[str]) -> None:
    if is_secret(value):
        _check(value.get("value"), shape, path, problems)
        return
    if shape.kind == "object" and isinstance(value, dict):
        fields = shape.fields or {}
        for key, item in value.items():
            if key.startswith("__"):
                continue
            where = f"{path}.{key}" if path else key
            if key not in fields:
                close = difflib.get_close_matches(_camel(key), list(fields), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append(f"{where}: not an input of {shape.type_name}{hint}")
                continue
            _check(item, _resolve(fields[key]), where, problems)
    elif shape.kind == "list" and isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, _resolve(shape.item), f"{path}[{i}]", problems)
    elif shape.kind == "map" and isinstance(value, dict):
        for key, item in value.items():
            _check(item, _resolve(shape.item), f"{path}[{key!r}]", problems)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)
