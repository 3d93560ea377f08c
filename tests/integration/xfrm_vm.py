"""A Linux guest with XFRM interfaces and ESP in the kernel, for tests this machine's kernel cannot run.

The host kernel may lack XFRM interfaces, ESP and VTI (the CI and development machines do). The guest is
Debian's stock kernel (linux-image-amd64) under qemu, KVM when it works, else TCG. Its initramfs holds
only busybox and the modules that mount the host's root over virtio-9p, read-only; the guest then
switches into that root, with tmpfs on the few places that must be writable, so the host's own binaries
(charon, swanctl, FRR, iproute2, ping, Python) run in the guest unmodified. The guest has no network
device: tests build their networks in namespaces inside it, and the host's networking is never touched.

Tests talk to the guest through a share: a host directory under /tmp, mounted writable at the same path
in the guest, so a path a test writes is valid on both sides. A small agent (PID 1 in the guest) runs each
job's script as root and writes its exit status, stdout and stderr next to it. One boot serves a whole
test session; qemu is started and stopped by its own PID.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

BUSYBOX = Path("/bin/busybox")  # busybox-static: runs in the initramfs, which has no libc
QEMU = "qemu-system-x86_64"
# TCG on two idle shared cores boots in ~7 s, many times that on a loaded machine; this bound only catches a hung
# boot (tests/integration/strongswan_lab.py: WAIT_SECONDS says why waits are generous).
BOOT_SECONDS = 300.0
# A guest that was told to power off, or a qemu sent a signal, gets this long to exit.
EXIT_SECONDS = 60.0
SHARE_TAG, ROOT_TAG = "share", "hostroot"
# What the initramfs loads to mount the host's root; everything else the guest loads itself, with the
# host's modprobe, from the host's /lib/modules/<version> (the linux-image package installs it there).
INITRAMFS_MODULES = ("virtio_pci", "9pnet_virtio", "9p")
# Writable tmpfs over the read-only host root (/var/run is a symlink to /run on Debian). Not /root or
# /var/lib: they hold what the host runs (pyenv's Python lives in /root/.pyenv here); HOME is /tmp.
TMPFS_DIRS = ("/run", "/tmp", "/var/tmp", "/var/log")


class VmUnavailableError(Exception):
    """The guest cannot run here; the message says what is missing and which package provides it."""


@dataclasses.dataclass(frozen=True)
class GuestKernel:
    version: str
    vmlinuz: Path
    modules: Path  # /lib/modules/<version>


@dataclasses.dataclass(frozen=True)
class VmResult:
    returncode: int
    stdout: str
    stderr: str

    def check(self, what: str) -> VmResult:
        if self.returncode != 0:
            raise AssertionError(f"{what} failed in the guest ({self.returncode}):\n{self.stdout}{self.stderr}")
        return self


# --- kernel and initramfs ----------------------------------------------------------------------------
def find_guest_kernel(boot: Path = Path("/boot"), lib_modules: Path = Path("/lib/modules")) -> GuestKernel:
    """The newest installed kernel whose modules include XFRM interfaces, ESP and virtio-9p."""
    needed = ("xfrm_interface", "esp4", "9p", "9pnet_virtio", "virtio_pci", "veth")
    candidates = []
    for vmlinuz in boot.glob("vmlinuz-*"):
        version = vmlinuz.name.removeprefix("vmlinuz-")
        dep = lib_modules / version / "modules.dep"
        if dep.exists() and all(name in _module_paths(dep) for name in needed):
            candidates.append(GuestKernel(version, vmlinuz, lib_modules / version))
    if not candidates:
        raise VmUnavailableError(f"no kernel in {boot} with modules for {', '.join(needed)} (apt: linux-image-amd64)")
    return max(candidates, key=lambda k: _version_key(k.version))


def _version_key(version: str) -> tuple[int, ...]:
    numbers = "".join(c if c.isdigit() else " " for c in version).split()
    return tuple(int(n) for n in numbers)


def _module_paths(modules_dep: Path) -> dict[str, list[str]]:
    """Module name -> its path and its dependencies' paths (relative to the modules directory), in load order."""
    table: dict[str, list[str]] = {}
    for line in modules_dep.read_text().splitlines():
        path, _, deps = line.partition(":")
        name = Path(path).name.split(".ko")[0].replace("-", "_")
        # modules.dep lists dependencies nearest first; they load in reverse, the module itself last.
        table[name] = [*reversed(deps.split()), path]
    return table


def initramfs_modules(kernel: GuestKernel, names: tuple[str, ...] = INITRAMFS_MODULES) -> list[str]:
    """The module files the initramfs loads, dependencies first, each once."""
    table = _module_paths(kernel.modules / "modules.dep")
    ordered: list[str] = []
    for name in names:
        if name not in table:
            raise VmUnavailableError(f"kernel {kernel.version} has no module {name}")
        ordered.extend(path for path in table[name] if path not in ordered)
    return ordered


def _init_script(modules: list[str]) -> str:
    insmods = "\n".join(f"insmod /modules/{Path(m).name}" for m in modules)
    tmpfs = "\n".join(f"mount -t tmpfs -o mode=0755 vm-tmpfs /newroot{d}" for d in TMPFS_DIRS)
    opts = "trans=virtio,version=9p2000.L,msize=262144"
    return f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
{insmods}
share=$(sed -n 's/.*vm.share=\\([^ ]*\\).*/\\1/p' /proc/cmdline)
mkdir -p /newroot
mount -t 9p -o ro,{opts},cache=loose {ROOT_TAG} /newroot
{tmpfs}
mkdir -p /newroot$share
mount -t 9p -o {opts} {SHARE_TAG} /newroot$share
umount /proc /sys
echo "vm: switching to the host root, agent $share/.vm/agent.sh"
exec switch_root /newroot /bin/bash $share/.vm/agent.sh $share
"""


# The agent: bash as PID 1 in the host's root. Job N is ready when .vm/N/script exists in the share and
# is done when .vm/N/status does (written last, by rename, so the host never reads half of it). It waits
# with read -t on a FIFO nobody writes: a sleep without a fork, which costs much under TCG.
AGENT = """\
share=$1
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp LC_ALL=C
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
ln -sf /proc/self/fd /dev/fd
ip link set lo up
mkfifo /run/vm-agent-tick && exec 3<>/run/vm-agent-tick
touch "$share/.vm/booted"
n=1
while :; do
    job="$share/.vm/$n"
    while [ ! -e "$job/script" ]; do
        [ -e "$share/.vm/poweroff" ] && echo o > /proc/sysrq-trigger
        read -r -t 0.05 -u 3 || :
    done
    (cd "$job" && exec sh ./script </dev/null >stdout 2>stderr)
    echo $? > "$job/status.tmp" && mv "$job/status.tmp" "$job/status"
    n=$((n + 1))
done
"""


def _cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive (the initramfs format) of (path, mode, content) entries."""
    out = io.BytesIO()

    def pad() -> None:
        out.write(b"\0" * (-out.tell() % 4))

    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out.write(b"070701" + "".join(f"{f:08x}" for f in fields).encode() + encoded)
        pad()
        out.write(data)
        pad()
    return out.getvalue()


def build_initramfs(kernel: GuestKernel, dest: Path) -> Path:
    if not BUSYBOX.exists():
        raise VmUnavailableError(f"{BUSYBOX} not found (apt: busybox-static)")
    modules = initramfs_modules(kernel)
    directory, regular, executable = 0o040755, 0o100644, 0o100755
    entries = [(d, directory, b"") for d in ("bin", "dev", "proc", "sys", "modules", "newroot")]
    entries += [
        ("bin/busybox", executable, BUSYBOX.read_bytes()),
        ("init", executable, _init_script(modules).encode()),
    ]
    entries += [(f"modules/{Path(m).name}", regular, (kernel.modules / m).read_bytes()) for m in modules]
    dest.write_bytes(_cpio_newc(entries))
    return dest


# --- the guest -----------------------------------------------------------------------------------------
def _kvm_usable() -> bool:
    """KVM when /dev/kvm is usable and the CPU shows hardware virtualization.

    Without vmx or svm (a VM that exposes /dev/kvm but no nested virtualization, as on this project's
    Firecracker machines) qemu's KVM guest either aborts setting MSRs or never prints a line.
    """
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    flags = {
        f for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags") for f in line.split()
    }
    return bool(flags & {"vmx", "svm"})


class GuestVm:
    """One booted guest. run() executes a shell script in it as root; stop() ends qemu by its PID."""

    def __init__(self, share: Path, kernel: GuestKernel, accel: str) -> None:
        self.share = share
        self.kernel = kernel
        self.accel = accel
        self.console = share / ".vm" / "console.log"
        self.boot_seconds = 0.0
        self._jobs = 0
        self._process: subprocess.Popen[bytes] | None = None

    @classmethod
    def boot(cls, share: Path, accel: str | None = None) -> GuestVm:
        """Boot a guest sharing `share`; accel is "kvm" or "tcg".

        The default is $DLINFRA_VM_ACCEL when set, else KVM when it can work here (_kvm_usable), else TCG.
        """
        if shutil.which(QEMU) is None:
            raise VmUnavailableError(f"{QEMU} not found (apt: qemu-system-x86)")
        if not str(share.resolve()).startswith("/tmp/"):
            raise ValueError(f"share {share} is not under /tmp: the guest mounts it at the same path, on a tmpfs")
        kernel = find_guest_kernel()
        accel = accel or os.environ.get("DLINFRA_VM_ACCEL") or ("kvm" if _kvm_usable() else "tcg")
        if accel not in ("kvm", "tcg"):
            raise ValueError(f"DLINFRA_VM_ACCEL={accel!r}: expected kvm or tcg")
        vm = cls(share.resolve(), kernel, accel)
        try:
            vm._start()
        except BaseException:
            vm.stop()
            raise
        return vm

    def _start(self) -> None:
        control = self.share / ".vm"
        control.mkdir(parents=True)
        (control / "agent.sh").write_text(AGENT)
        initrd = build_initramfs(self.kernel, control / "initramfs.cpio")
        # Under TCG the crypto self-tests (at boot and on the first ESP SA's algorithms) and jitterentropy's
        # start (the DRBG behind ESP's IV generators seeds from the kernel's RNG without it, outside FIPS
        # mode) each cost seconds; they prove nothing about the configs under test.
        speedups = "cryptomgr.notests=1 modprobe.blacklist=jitterentropy_rng"
        cmdline = f"console=ttyS0 panic=-1 quiet {speedups} vm.share={self.share}"
        argv = [
            QEMU,
            *("-accel", self.accel),
            *("-cpu", "max" if self.accel == "tcg" else "host"),
            *("-m", "1024", "-smp", "2"),
            *("-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"),
            *("-serial", f"file:{self.console}"),
            *("-kernel", str(self.kernel.vmlinuz), "-initrd", str(initrd), "-append", cmdline),
            *("-virtfs", f"local,path=/,mount_tag={ROOT_TAG},security_model=none,readonly=on,multidevs=remap"),
            *("-virtfs", f"local,path={self.share},mount_tag={SHARE_TAG},security_model=none"),
        ]
        started = time.monotonic()
        with (control / "qemu.out").open("wb") as out:
            self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        self._wait("the guest to boot", control / "booted", BOOT_SECONDS)
        self.boot_seconds = time.monotonic() - started

    def _wait(self, what: str, path: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self._process is None or self._process.poll() is not None:
                code = None if self._process is None else self._process.returncode
                raise VmUnavailableError(f"qemu exited ({code}) waiting for {what}\n{self.diagnostics()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.diagnostics()}")
            time.sleep(0.05)

    def diagnostics(self) -> str:
        parts = []
        for name in ("qemu.out", "console.log"):
            path = self.share / ".vm" / name
            text = path.read_text(errors="replace") if path.exists() else "(none)"
            parts.append(f"--- {name} ---\n{text[-6000:]}")
        return "\n".join(parts)

    def run(self, script: str, timeout: float = 240.0) -> VmResult:
        """Run script with sh in the guest, as root, in a fresh job directory (its working directory)."""
        self._jobs += 1
        job = self.share / ".vm" / str(self._jobs)
        job.mkdir()
        (job / "script.tmp").write_text(script)
        (job / "script.tmp").rename(job / "script")  # the agent never sees half a script
        try:
            self._wait(f"job {self._jobs}", job / "status", timeout)
        except TimeoutError as err:
            # Whether the agent took the job at all: it creates stdout when it starts the script.
            started = "started" if (job / "stdout").exists() else "never started"
            self.stop()  # the agent is stuck in the script; this guest serves no further job
            raise TimeoutError(
                f"{err} (the agent {started} it)\n"
                f"--- stdout ---\n{_read(job / 'stdout')}\n--- stderr ---\n{_read(job / 'stderr')}"
            ) from None
        return VmResult(int((job / "status").read_text()), _read(job / "stdout"), _read(job / "stderr"))

    @property
    def alive(self) -> bool:
        """Whether the guest still runs: run() stops it when a job outlives its timeout."""
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        (self.share / ".vm" / "poweroff").touch()
        try:
            process.wait(timeout=EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=EXIT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=EXIT_SECONDS)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@contextlib.contextmanager
def guest(accel: str | None = None) -> Iterator[GuestVm]:
    """A booted guest with a fresh share under /tmp, stopped and removed afterwards."""
    share = Path(tempfile.mkdtemp(prefix="dlinfra-vm-", dir="/tmp"))
    try:
        vm = GuestVm.boot(share, accel)
        try:
            yield vm
        finally:
            vm.stop()
    finally:
        shutil.rmtree(share, ignore_errors=True)
