"""Which AWS resource types take `tags` (dlinfra/data/taggable.yaml), so that a rule asking need not import the
provider SDK module of every type; a type the table does not list is None (the caller reads the SDK)."""

from __future__ import annotations

import functools
from importlib import resources

import yaml

DATA_FILE = "data/taggable.yaml"


@functools.cache
def _table() -> dict[str, bool]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where PyYAML was built with it
    data = yaml.load(resources.files("dlinfra").joinpath(DATA_FILE).read_text(), Loader=loader)
    return {str(t): True for t in data["taggable"]} | {str(t): False for t in data["not_taggable"]}


def listed(type_token: str) -> bool | None:
    """Whether the type's inputs take `tags`, as the table says; None for a type it does not list."""
    return _table().get(type_token)
