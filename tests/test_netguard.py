"""The network guard (tests/netguard.py): a test that reaches past loopback fails, even when the code it runs
swallows the refusal; loopback, AF_UNIX and address literals stay allowed."""

from __future__ import annotations

import os
import socket

import pytest

from tests import netguard
from tests.conftest import ROOT

INNER_TESTS = """
import socket

import pytest


def test_connects_to_test_net():
    socket.create_connection(("192.0.2.1", 80), timeout=1)  # refused at once: no wait


def test_swallows_the_refusal():
    try:
        socket.create_connection(("192.0.2.1", 443), timeout=1)  # refused at once: no wait
    except OSError:
        pass  # what boto3's instance-metadata probe does with a refused connection


def test_sends_a_datagram():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(b"x", ("198.51.100.7", 53))
        except OSError:
            pass


def test_resolves_a_name():
    with pytest.raises(OSError):
        socket.getaddrinfo("example.com", 443)


def test_stays_on_loopback():
    with socket.create_server(("127.0.0.1", 0)) as server:
        socket.create_connection(server.getsockname()[:2], timeout=60).close()
"""


def test_a_test_that_reaches_the_network_fails(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest('pytest_plugins = ["tests.netguard"]\n')
    pytester.makepyfile(test_inner=INNER_TESTS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=4)
    result.stdout.fnmatch_lines(
        [
            "*tried to reach the network: connect 192.0.2.1:80",
            "*tried to reach the network: connect 192.0.2.1:443",
            "*tried to reach the network: sendto 198.51.100.7:53",
            "*tried to reach the network: resolve 'example.com'",
            "FAILED test_inner.py::test_connects_to_test_net*",
            "FAILED test_inner.py::test_swallows_the_refusal*",
            "FAILED test_inner.py::test_sends_a_datagram*",
            "FAILED test_inner.py::test_resolves_a_name*",
        ]
    )


def test_the_guard_refuses_before_anything_is_sent() -> None:
    try:
        with pytest.raises(netguard.ForeignNetworkError, match=r"192\.0\.2\.1:80"):
            socket.create_connection(("192.0.2.1", 80), timeout=1)  # refused at once: no wait
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock, pytest.raises(netguard.ForeignNetworkError):
            sock.connect_ex(("2001:db8::1", 80, 0, 0))
        assert netguard.ATTEMPTS == ["connect 192.0.2.1:80", "connect 2001:db8::1:80"]
    finally:
        netguard.ATTEMPTS.clear()  # tried on purpose: this test is the one place that may


def test_loopback_unix_sockets_and_literals_are_allowed() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        socket.create_connection(server.getsockname()[:2], timeout=60).close()
    if socket.has_ipv6:
        try:
            server6 = socket.create_server(("::1", 0), family=socket.AF_INET6)
        except OSError:
            server6 = None  # no IPv6 loopback on this machine
        if server6 is not None:
            with server6:
                socket.create_connection(server6.getsockname()[:2], timeout=60).close()
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x")
        assert right.recv(1) == b"x"
    assert socket.getaddrinfo("192.0.2.1", 80)  # a literal is answered without asking anyone
    assert socket.getaddrinfo("localhost", 80)
    assert netguard.ATTEMPTS == []


def test_the_suite_runs_with_instance_metadata_disabled() -> None:
    assert os.environ["AWS_EC2_METADATA_DISABLED"] == "true"


def test_ci_disables_instance_metadata_for_every_process_it_starts() -> None:
    assert "\nexport AWS_EC2_METADATA_DISABLED=true\n" in (ROOT / ".ci" / "test").read_text()
