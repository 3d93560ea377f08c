"""Test markers, registered here so that these modules also run under --strict-markers."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "vpn_peer: brings up two strongSwan daemons in network namespaces (root, kernel-libipsec)",
    )
