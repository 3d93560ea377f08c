"""The MIG unit's script (dlinfra_gpu/templates/mig-layout.sh.erb) run against a fake nvidia-smi, a scratch sysfs and
a stubbed systemctl: mode already on, on after a reset, no reset offered (one reboot, or the user data's), and a boot
after that reboot with the mode still pending (fails, no second reboot)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlinfra.model import gpu_sharing
from tests.chef.test_cookbooks import render

LAYOUT = "14:0,19:2,19:3,9:4"
BUSES = ["00000000:10:1C.0", "00000000:10:1D.0"]

# nvidia-smi as the script calls it, over a JSON state: each GPU's bus id and current/pending MIG mode; whether the
# driver applies a new mode by itself (`applies`), whether `-r` works, and whether `-mig 1` fails on a GPU already on.
FAKE_NVIDIA_SMI = """#!/usr/bin/env python3
import json, os, sys
path = os.environ["FAKE_SMI_STATE"]
with open(path) as f:
    state = json.load(f)
args = sys.argv[1:]
with open(path + ".log", "a") as log:
    log.write(" ".join(args) + "\\n")
gpus = state["gpus"]
if args == ["--query-gpu=index,pci.bus_id,mig.mode.current,mig.mode.pending", "--format=csv,noheader"]:
    for i, g in enumerate(gpus):
        print(f"{i}, {g['bus']}, {g['current']}, {g['pending']}")
elif args == ["--query-gpu=index", "--format=csv,noheader"]:
    print("\\n".join(str(i) for i in range(len(gpus))))
elif len(args) == 4 and args[0] == "-i" and args[2:] == ["-mig", "1"]:
    g = gpus[int(args[1])]
    if g["current"] == "Enabled" and state["fails_when_on"]:
        sys.exit(6)
    g["pending"] = "Enabled"
    g["current"] = "Enabled" if state["applies"] else g["current"]
elif args[:2] == ["-r", "-i"]:
    if not state["reset_works"]:
        sys.exit(3)
    for g in gpus:
        if g["bus"] in args[2].split(","):
            g["current"] = g["pending"]
elif args[:1] != ["mig"]:
    sys.exit(f"unexpected arguments {args}")
with open(path, "w") as f:
    json.dump(state, f)
"""
STUB = '#!/bin/sh\necho "$(basename "$0") $*" >>"$STUB_LOG"\ncase "$*" in is-active*) exit 3 ;; esac\n'


def _sysfs(root: Path, *, reset: bool) -> None:
    """Two A100s (3D controllers) with or without a reset file, and an NVSwitch without one (not a GPU: ignored)."""
    devices = root / "sys/bus/pci/devices"
    for address, cls, has_reset in (("0000:10:1c.0", "0x030200", reset), ("0000:10:1d.0", "0x030200", reset),
                                    ("0000:c0:00.0", "0x068000", False)):  # fmt: skip
        dev = devices / address
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x10de\n")
        (dev / "class").write_text(f"{cls}\n")
        if has_reset:
            (dev / "reset").write_text("")


def _run(
    tmp_path: Path, ruby: str, *, mode: str, reset: bool, applies: bool = False, reset_works: bool = True,
    marker: bool = False, deferred: bool = False,
) -> tuple[subprocess.CompletedProcess[str], list[str], list[str], Path]:  # fmt: skip
    root, bin_dir = tmp_path / "root", tmp_path / "bin"
    bin_dir.mkdir()
    _sysfs(root, reset=reset)
    layout = root / gpu_sharing.MIG_LAYOUT_PATH.lstrip("/")
    layout.parent.mkdir(parents=True)
    layout.write_text(f"{LAYOUT}\n")
    if marker:  # the reboot this instance already took
        (root / gpu_sharing.MIG_REBOOT_MARKER.lstrip("/")).parent.mkdir(parents=True)
        (root / gpu_sharing.MIG_REBOOT_MARKER.lstrip("/")).write_text("2026-11-29T18:00:00Z\n")
    defer = root / gpu_sharing.MIG_DEFER_REBOOT.lstrip("/")
    if deferred:  # the user data started the unit on the node's first boot
        defer.parent.mkdir(parents=True)
        defer.write_text("")
    state = tmp_path / "smi.json"
    pending = "Enabled" if mode == "on" else "Disabled"
    gpus = [{"bus": bus, "current": pending, "pending": pending} for bus in BUSES]
    state.write_text(json.dumps({"gpus": gpus, "applies": applies, "reset_works": reset_works, "fails_when_on": True}))
    for name, body in (("nvidia-smi", FAKE_NVIDIA_SMI), ("systemctl", STUB), ("modprobe", STUB)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "mig-layout"
    script.write_text(
        render(
            ruby,
            "dlinfra_gpu/templates/mig-layout.sh.erb",
            layout=gpu_sharing.MIG_LAYOUT_PATH,
            reboot_marker=gpu_sharing.MIG_REBOOT_MARKER,
            defer_reboot=gpu_sharing.MIG_DEFER_REBOOT,
        )
    )
    log = tmp_path / "stubs.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DLINFRA_ROOT": str(root),
           "FAKE_SMI_STATE": str(state), "STUB_LOG": str(log)}  # fmt: skip
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False)
    smi_calls = Path(f"{state}.log").read_text().splitlines()
    stub_calls = log.read_text().splitlines() if log.exists() else []
    return done, smi_calls, stub_calls, root


def _created(smi_calls: list[str]) -> list[str]:
    return [c for c in smi_calls if "-cgi" in c]


ALL_GPUS = [f"mig -i {i} -cgi {LAYOUT} -C" for i in range(len(BUSES))]
MARKER = gpu_sharing.MIG_REBOOT_MARKER.lstrip("/")


@pytest.mark.chef
def test_mode_already_on_is_left_alone(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    # `nvidia-smi -mig 1` on a GPU already on fails in this fake: the script must not call it (MIG mode persists).
    done, smi, stubs, _ = _run(tmp_path, require_tool("ruby"), mode="on", reset=False)
    assert done.returncode == 0, done.stderr
    assert not [c for c in smi if "-mig 1" in c or c.startswith("-r")]
    assert _created(smi) == ALL_GPUS and "systemctl reboot" not in stubs


@pytest.mark.chef
@pytest.mark.parametrize("applies", [True, False], ids=["driver-resets", "script-resets"])
def test_mode_turned_on_by_the_driver_or_a_reset_of_those_gpus(
    applies: bool, tmp_path: Path, require_tool: Callable[[str], str]
) -> None:
    done, smi, stubs, root = _run(tmp_path, require_tool("ruby"), mode="off", reset=True, applies=applies)
    assert done.returncode == 0, done.stderr
    assert [c for c in smi if "-mig 1" in c] == ["-i 0 -mig 1", "-i 1 -mig 1"]
    resets = [c for c in smi if c.startswith("-r")]
    assert resets == ([] if applies else [f"-r -i {','.join(BUSES)}"])  # by bus id, as mig-parted does
    # nvidia_drm out of the reset's way and loaded again after it (mig-parted's README, "Known Issues").
    drm = [line for line in stubs if line.startswith("modprobe") and "nvidia_drm" in line]
    assert drm == ([] if applies else ["modprobe -r nvidia_drm", "modprobe nvidia_drm"])
    assert _created(smi) == ALL_GPUS and "systemctl reboot" not in stubs and not (root / MARKER).exists()


@pytest.mark.chef
@pytest.mark.parametrize("deferred", [False, True], ids=["at-boot", "first-boot-user-data"])
def test_no_reset_offered_reboots_once(deferred: bool, tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    done, smi, stubs, root = _run(tmp_path, require_tool("ruby"), mode="off", reset=False, deferred=deferred)
    assert done.returncode == 0, done.stderr
    assert (root / MARKER).exists()  # the one reboot is taken
    assert not [c for c in smi if c.startswith("-r")] and _created(smi) == []
    defer = root / gpu_sharing.MIG_DEFER_REBOOT.lstrip("/")
    if deferred:  # the user data reboots, once the node's join is written
        assert "systemctl reboot" not in stubs and defer.read_text() == "reboot\n"
    else:
        assert "systemctl reboot" in stubs


@pytest.mark.chef
def test_still_pending_after_the_reboot_fails(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    """The marker of the reboot this instance took, and the mode still pending: fail, no second reboot."""
    done, smi, stubs, root = _run(tmp_path, require_tool("ruby"), mode="off", reset=False, marker=True)
    assert done.returncode == 1
    assert "not rebooting again" in done.stderr and "systemctl reboot" not in stubs
    assert _created(smi) == [] and (root / MARKER).exists()


@pytest.mark.chef
def test_on_after_the_reboot_clears_the_marker(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    done, smi, _, root = _run(tmp_path, require_tool("ruby"), mode="on", reset=False, marker=True)
    assert done.returncode == 0, done.stderr
    assert _created(smi) == ALL_GPUS and not (root / MARKER).exists()


@pytest.mark.chef
def test_a_reset_that_does_not_take_reboots_once(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    """A reset offered but without effect (NVIDIA/gpu-operator#1606, NVIDIA/mig-parted#9): the one marked reboot,
    not a failure that would only replace the node with one that fails alike."""
    kwargs: dict[str, Any] = {"mode": "off", "reset": True, "reset_works": False}
    done, smi, stubs, root = _run(tmp_path, require_tool("ruby"), **kwargs)
    assert done.returncode == 0, done.stderr
    assert "needs a GPU reset this machine does not offer: rebooting once" in done.stderr
    assert _created(smi) == [] and "systemctl reboot" in stubs
    assert (root / gpu_sharing.MIG_REBOOT_MARKER.lstrip("/")).is_file()


def test_a_reset_that_does_not_take_after_the_reboot_fails(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    kwargs: dict[str, Any] = {"mode": "off", "reset": True, "reset_works": False, "marker": True}
    done, smi, stubs, _ = _run(tmp_path, require_tool("ruby"), **kwargs)
    assert done.returncode == 1 and "still pending on 00000000:10:1C.0,00000000:10:1D.0 after the reboot" in done.stderr
    assert _created(smi) == [] and "systemctl reboot" not in stubs
