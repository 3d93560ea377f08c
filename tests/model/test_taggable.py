"""dlinfra/data/taggable.yaml answers what the installed provider SDK answers, for every AWS type dlinfra emits."""

from __future__ import annotations

import importlib

import pytest

from dlinfra.model import replacement, taggable
from dlinfra.offline import schema

AWS_TYPES = sorted(t for t in replacement.table().rules if t.startswith("aws:"))


def test_the_table_lists_every_aws_type_dlinfra_emits() -> None:
    assert [t for t in AWS_TYPES if taggable.listed(t) is None] == []
    assert sorted(taggable._table()) == AWS_TYPES, "a type dlinfra no longer emits is stale: remove it"


@pytest.mark.parametrize("type_token", AWS_TYPES)
def test_each_answer_is_the_sdks(type_token: str) -> None:
    importlib.import_module("pulumi_aws")  # registers its resource modules, which load lazily
    shape = schema.resource_shape(type_token)
    assert shape is not None, f"{type_token}: the installed pulumi_aws has no such resource"
    assert taggable.listed(type_token) == ("tags" in (shape.fields or {})), (
        f"{type_token}: the SDK's Args class {'has' if 'tags' in (shape.fields or {}) else 'has no'} `tags` input; "
        "update dlinfra/data/taggable.yaml"
    )


def test_a_type_not_listed_is_none() -> None:
    assert taggable.listed("aws:ec2/notAType:NotAType") is None
