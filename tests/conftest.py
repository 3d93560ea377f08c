"""Shared fixtures: the reference fleet as data, and a way to write a modified copy of it."""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings

from dlinfra.errors import FleetError
from dlinfra.model.fleet.load import load_fleet

# No test reaches the network: sockets may only reach loopback, and boto3 never asks instance metadata.
pytest_plugins = ["tests.netguard", "pytester"]

ROOT = Path(__file__).resolve().parent.parent
# Tests read a frozen copy of the reference fleet, never the lab's own fleet.yaml,
# so a lab that edits its fleet keeps a green suite.
FIXTURES = ROOT / "tests" / "fixtures"
REFERENCE_FLEET = FIXTURES / "fleet.yaml"
REFERENCE_LOCK = FIXTURES / "cidr-lock.yaml"
# Hypothesis fails an example that runs over its deadline (200 ms by default): on a busy machine that fails correct
# code. Examples here may take as long as they take; how many run is bounded by each test's max_examples.
settings.register_profile("dlinfra", deadline=None)
settings.load_profile("dlinfra")

# Cluster-version support checks depend on the date: the suite runs on a pinned one, so it stays green as the
# calendar moves (dlinfra.model.eks.today reads it).
TEST_TODAY = "2026-11-22"


@pytest.fixture(scope="session", autouse=True)
def pinned_today() -> Iterator[str]:
    previous = os.environ.get("DLINFRA_TODAY")
    os.environ["DLINFRA_TODAY"] = TEST_TODAY
    yield TEST_TODAY
    if previous is None:
        os.environ.pop("DLINFRA_TODAY", None)
    else:
        os.environ["DLINFRA_TODAY"] = previous


@pytest.fixture(scope="session", autouse=True)
def no_warm_servers() -> Iterator[Path]:
    """Commands run in their own process (DLINFRA_SERVER=off), whatever servers the developer has running, and the
    servers a test starts (tests/cli/test_server.py) live in a folder of this session's, stopped at its end."""
    import tempfile

    from dlinfra.cli import server

    saved = {name: os.environ.get(name) for name in ("DLINFRA_SERVER", "XDG_RUNTIME_DIR")}
    with tempfile.TemporaryDirectory(prefix="dlts") as folder:  # short: a socket path has at most 107 bytes
        os.environ["DLINFRA_SERVER"] = "off"
        os.environ["XDG_RUNTIME_DIR"] = folder
        yield Path(folder)
        server.stop_all()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def reference_data() -> dict[str, Any]:
    """The reference fleet as plain data (do not mutate: use write_fleet)."""
    return yaml.safe_load(REFERENCE_FLEET.read_text())


@pytest.fixture
def write_fleet(tmp_path: Path, reference_data: dict[str, Any]) -> Callable[..., Path]:
    """Write a changed copy of the reference fleet (and its lock) into tmp_path; returns the fleet path."""

    def write(
        change: Callable[[dict[str, Any]], Any] | None = None, *, lock: bool = True, text: str | None = None
    ) -> Path:
        path = tmp_path / "fleet.yaml"
        if text is not None:
            path.write_text(text)
        else:
            data = copy.deepcopy(reference_data)
            if change is not None:
                change(data)
            path.write_text(yaml.safe_dump(data, sort_keys=False))
        if lock:
            shutil.copy(REFERENCE_LOCK, tmp_path / "cidr-lock.yaml")
        return path

    return write


@pytest.fixture
def fleet_error(write_fleet: Callable[..., Path]) -> Callable[..., str]:
    """The text of the one FleetError that a changed copy of the reference fleet gets; it names the file."""

    def refused(change: Callable[[dict[str, Any]], Any]) -> str:
        path = write_fleet(change)
        with pytest.raises(FleetError) as info:
            load_fleet(path)
        text = str(info.value)
        assert str(path) in text and "Traceback" not in text, text
        return text

    return refused


# Debian package that provides each external tool the tests drive (.ci/setup installs them).
APT_PACKAGES = {
    "ruby": "ruby", "erb": "ruby", "rubocop": "rubocop", "shellcheck": "shellcheck", "packer": "packer",
    "vtysh": "frr", "nft": "nftables", "unshare": "util-linux",
}  # fmt: skip


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
