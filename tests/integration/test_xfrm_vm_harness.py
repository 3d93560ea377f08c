"""The XFRM guest's harness without booting it: which kernel, which modules in which order, the archive."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.xfrm_vm import GuestKernel, VmUnavailableError, _cpio_newc, find_guest_kernel, initramfs_modules

MODULES_DEP = """\
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko
kernel/drivers/virtio/virtio.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/net/9p/9pnet.ko:
kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio.ko
kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/netfs/netfs.ko
kernel/fs/netfs/netfs.ko:
kernel/net/xfrm/xfrm_interface.ko: kernel/net/ipv4/tunnel4.ko
kernel/net/ipv4/tunnel4.ko:
kernel/net/ipv4/esp4.ko:
kernel/drivers/net/veth.ko:
"""


def _kernel(tmp_path: Path, version: str, dep: str = MODULES_DEP) -> GuestKernel:
    (tmp_path / "boot").mkdir(exist_ok=True)
    (tmp_path / "boot" / f"vmlinuz-{version}").write_bytes(b"")
    modules = tmp_path / "lib" / "modules" / version
    modules.mkdir(parents=True)
    (modules / "modules.dep").write_text(dep)
    return GuestKernel(version, tmp_path / "boot" / f"vmlinuz-{version}", modules)


def test_initramfs_loads_dependencies_first_and_each_once(tmp_path: Path) -> None:
    kernel = _kernel(tmp_path, "6.1.0-9-amd64")
    assert [Path(m).name for m in initramfs_modules(kernel)] == [
        "virtio.ko",
        "virtio_pci_modern_dev.ko",
        "virtio_pci.ko",
        "9pnet.ko",
        "9pnet_virtio.ko",
        "netfs.ko",
        "9p.ko",
    ]


def test_the_newest_kernel_with_xfrm_interfaces_is_chosen(tmp_path: Path) -> None:
    _kernel(tmp_path, "6.1.0-9-amd64")
    _kernel(tmp_path, "6.1.0-10-amd64")  # newer, though it sorts first as text
    no_xfrm = "".join(line + "\n" for line in MODULES_DEP.splitlines() if "xfrm" not in line)
    _kernel(tmp_path, "6.1.0-11-amd64", no_xfrm)
    chosen = find_guest_kernel(tmp_path / "boot", tmp_path / "lib" / "modules")
    assert chosen.version == "6.1.0-10-amd64"


def test_no_suitable_kernel_names_the_package(tmp_path: Path) -> None:
    (tmp_path / "boot").mkdir()
    with pytest.raises(VmUnavailableError, match=r"xfrm_interface.*apt: linux-image-amd64"):
        find_guest_kernel(tmp_path / "boot", tmp_path / "lib" / "modules")


def test_cpio_archive_unpacks_with_cpio(tmp_path: Path) -> None:
    archive = _cpio_newc([("bin", 0o040755, b""), ("bin/tool", 0o100755, b"#!/bin/sh\necho hi\n")])
    if shutil.which("cpio") is None:  # initramfs-tools, which linux-image-amd64 needs, brings it
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("cpio not found in CI (apt: cpio)", pytrace=False)
        pytest.skip("cpio not found (apt: cpio)")
    subprocess.run(["cpio", "-idm", "--quiet"], input=archive, cwd=tmp_path, check=True)
    tool = tmp_path / "bin" / "tool"
    assert tool.read_bytes() == b"#!/bin/sh\necho hi\n"
    assert tool.stat().st_mode & 0o777 == 0o755
