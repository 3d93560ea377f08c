"""Test markers, registered here so that these modules also run under --strict-markers; the XFRM guest."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.integration.xfrm_vm import GuestVm, VmUnavailableError, guest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "vpn_peer: brings up two strongSwan daemons in network namespaces (root, kernel-libipsec; or in a qemu guest)",
    )


@pytest.fixture(scope="session")
def xfrm_guest() -> Iterator[GuestVm]:
    """One guest kernel with XFRM interfaces and ESP for the whole session (a TCG boot takes ~15 s).

    Locally a machine without qemu or a guest kernel skips; in CI (CI=true) that is a failure.
    """
    try:
        with guest() as vm:
            print(f"\nxfrm guest: {vm.kernel.version}, {vm.accel}, booted in {vm.boot_seconds:.1f}s")
            yield vm
    except VmUnavailableError as err:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the XFRM guest cannot run in CI: {err}", pytrace=False)
        pytest.skip(f"the XFRM guest cannot run here: {err}")
