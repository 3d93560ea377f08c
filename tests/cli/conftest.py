"""The lab the example tests share: one scratch clone of the reference fleet, so only the first preview runs stacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.examples_lab import make_lab


@pytest.fixture(scope="session")
def example_lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_lab(tmp_path_factory.mktemp("lab"))
