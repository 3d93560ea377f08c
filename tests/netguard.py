"""A pytest plugin: no test sends a packet anywhere but loopback.

Every socket this process opens may connect or send only to AF_UNIX paths and loopback addresses, and resolve
only address literals and localhost. Anything else is refused at once (so nothing leaves the machine), recorded,
and fails the test that tried it, even where the code under test swallowed the error (boto3's instance-metadata
probe does). The strongSwan and FRR tests reach their network namespaces from their own processes (charon,
vtysh, `ip netns exec`), never from this one, so the guard does not get in their way.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable, Generator
from typing import Any

import pytest

# Refused attempts of the current test phase: "<call> <address>".
ATTEMPTS: list[str] = []
_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


class ForeignNetworkError(ConnectionRefusedError):
    """Raised instead of opening a connection to, or sending to, a host other than this one."""


def _address(host: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address a host literal names (an IPv6 scope id dropped), or None for a name."""
    text = host.decode(errors="replace") if isinstance(host, bytes) else str(host)
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


def _local_host(host: Any) -> bool:
    """True for loopback addresses (IPv4-mapped ones too), localhost and the wildcard."""
    if host in (None, "", b""):
        return True
    address = _address(host)
    if address is None:
        name = (host.decode(errors="replace") if isinstance(host, bytes) else str(host)).lower()
        return name in _LOCAL_NAMES or name.endswith(".localhost")
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _check(sock: socket.socket, call: str, address: Any) -> None:
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(address, tuple):
        return  # AF_UNIX paths, netlink and the like stay on this machine
    if not _local_host(address[0]):
        ATTEMPTS.append(f"{call} {address[0]}:{address[1]}")
        raise ForeignNetworkError(f"tests may not reach {address[0]}:{address[1]} (tests/netguard.py)")


_ORIGINAL: dict[str, Callable[..., Any]] = {}


def _guarded_connect(self: socket.socket, address: Any) -> Any:
    _check(self, "connect", address)
    return _ORIGINAL["connect"](self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> Any:
    _check(self, "connect", address)
    return _ORIGINAL["connect_ex"](self, address)


def _guarded_sendto(self: socket.socket, data: Any, *args: Any) -> Any:
    _check(self, "sendto", args[-1])  # sendto(data, address) or sendto(data, flags, address)
    return _ORIGINAL["sendto"](self, data, *args)


def _guarded_sendmsg(self: socket.socket, buffers: Any, *args: Any) -> Any:
    if len(args) >= 3 and args[2] is not None:  # sendmsg(buffers, ancdata, flags, address)
        _check(self, "sendmsg", args[2])
    return _ORIGINAL["sendmsg"](self, buffers, *args)


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    # A name lookup asks a DNS server; literals and localhost are answered without one.
    if not (_local_host(host) or _address(host) is not None):
        ATTEMPTS.append(f"resolve {host!r}")
        raise socket.gaierror(socket.EAI_NONAME, f"tests may not resolve {host!r} (tests/netguard.py)")
    return _ORIGINAL["getaddrinfo"](host, *args, **kwargs)


def install() -> None:
    """Guard every socket of this process (idempotent)."""
    if _ORIGINAL:
        return
    for name, guarded in (
        ("connect", _guarded_connect),
        ("connect_ex", _guarded_connect_ex),
        ("sendto", _guarded_sendto),
        ("sendmsg", _guarded_sendmsg),
    ):
        _ORIGINAL[name] = getattr(socket.socket, name)
        setattr(socket.socket, name, guarded)
    _ORIGINAL["getaddrinfo"] = socket.getaddrinfo
    socket.getaddrinfo = _guarded_getaddrinfo  # type: ignore[assignment]


def uninstall() -> None:
    for name in ("connect", "connect_ex", "sendto", "sendmsg"):
        if name in _ORIGINAL:
            setattr(socket.socket, name, _ORIGINAL.pop(name))
    if "getaddrinfo" in _ORIGINAL:
        socket.getaddrinfo = _ORIGINAL.pop("getaddrinfo")  # type: ignore[assignment]


def pytest_configure(config: pytest.Config) -> None:
    # boto3 asks the instance metadata service (169.254.169.254) for credentials and region when it finds none
    # elsewhere; the tests' machines are not EC2 instances, and no test may depend on one (.ci/test sets it too).
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    install()


def pytest_unconfigure(config: pytest.Config) -> None:
    uninstall()


def _fail_on_attempts(phase: str) -> Generator[None, None, None]:
    start = len(ATTEMPTS)
    try:
        return (yield)
    finally:
        tried = ATTEMPTS[start:]
        del ATTEMPTS[start:]
        if tried:
            pytest.fail(f"the test's {phase} tried to reach the network: {'; '.join(tried)}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _fail_on_attempts("setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _fail_on_attempts("call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _fail_on_attempts("teardown"))
