"""Helpers for the Chef tests: external tools that CI must have."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

import pytest

# Debian package that provides each tool CI needs for these tests.
APT_PACKAGES = {"ruby": "ruby", "erb": "ruby", "rubocop": "rubocop", "shellcheck": "shellcheck"}


@pytest.fixture
def require_tool() -> Callable[[str], str]:
    """Path of a command-line tool; skips when it is missing locally, fails when CI=true."""

    def require(tool: str) -> str:
        path = shutil.which(tool)
        if path is not None:
            return path
        message = f"{tool} is not installed (apt-get install {APT_PACKAGES.get(tool, tool)})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: in CI a check that cannot run is a failure")
        pytest.skip(message)

    return require
