"""Test markers, registered here so that these modules also run under --strict-markers; the XFRM guest."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from tests.integration.xfrm_vm import GuestVm, VmUnavailableError, guest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "vpn_peer: brings up two strongSwan daemons in network namespaces (root, kernel-libipsec; or in a qemu guest)",
    )


class _Guests:
    """The session's guest, booted once (a TCG boot takes ~15 s) and again only for a module that finds it stopped:
    a job that outlives its timeout stops the guest, and that failure stays its own module's."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack
        self._vm: GuestVm | None = None

    def live(self) -> GuestVm:
        if self._vm is None or not self._vm.alive:
            try:
                self._vm = self._stack.enter_context(guest())
            except VmUnavailableError as err:
                # Locally a machine without qemu or a guest kernel skips; in CI (CI=true) that is a failure.
                if os.environ.get("CI", "").lower() == "true":
                    pytest.fail(f"the XFRM guest cannot run in CI: {err}", pytrace=False)
                pytest.skip(f"the XFRM guest cannot run here: {err}")
            vm = self._vm
            print(f"\nxfrm guest: {vm.kernel.version}, {vm.accel}, booted in {vm.boot_seconds:.1f}s")
        return self._vm


@pytest.fixture(scope="session")
def _xfrm_guests() -> Iterator[_Guests]:
    with contextlib.ExitStack() as stack:
        yield _Guests(stack)


@pytest.fixture(scope="module")
def xfrm_guest(_xfrm_guests: _Guests) -> GuestVm:
    """A guest kernel with XFRM interfaces and ESP, shared by the session's modules while it runs."""
    return _xfrm_guests.live()
