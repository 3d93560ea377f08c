"""A MIG pool's user data run against stubs: the layout applied before the check and the join, and, where the unit asks
for the reboot a VM without GPU reset needs, the join written without the kubelet started, then the reboot."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from components import nodepool
from dlinfra.model import gpu_health, gpu_sharing

# The unit's answer when the new MIG mode needs a reboot on the node's first boot (mig-layout.sh.erb reboot_once).
SYSTEMCTL = """#!/bin/sh
echo "$*" >>"$CALLS"
if [ "$*" = "start {unit}" ] && [ "$NEEDS_REBOOT" = 1 ]; then echo reboot >"$DEFER"; fi
exit 0
"""


def _run(tmp_path: Path, *, needs_reboot: bool) -> tuple[list[list[str]], list[str], Path]:
    text = nodepool.render_user_data(
        pool="notebooks", cluster_name="c", region="us-west-2", labels={"dlinfra.io/pool": "notebooks"},
        taints=(), max_pods=737, cluster_dns=("169.254.20.10",),
        gpu_expectation='{"instance_types":{"p4de.24xlarge":{"gpu_count":8}}}', mig_layout="14:0,19:2,19:3,9:4",
    )  # fmt: skip
    bin_dir, units = tmp_path / "bin", tmp_path / "units"
    bin_dir.mkdir()
    units.mkdir()
    for unit in (gpu_sharing.MIG_UNIT, gpu_health.CHECK_UNIT):  # the image's unit files (Chef writes them)
        (units / unit).write_text("[Unit]\n")
    calls, joins, defer = tmp_path / "systemctl.calls", tmp_path / "joins", tmp_path / "run" / "defer"
    (bin_dir / "systemctl").write_text(SYSTEMCTL.format(unit=gpu_sharing.MIG_UNIT))
    join = bin_dir / "dlinfra-node-join"
    join.write_text(f'#!/bin/sh\necho "$*" >>{joins}\n')
    for tool in (bin_dir / "systemctl", join):
        tool.chmod(0o755)
    script = tmp_path / "user-data.sh"
    script.write_text(
        text.replace("/usr/local/sbin/dlinfra-node-join", str(join))
        .replace("/etc/systemd/system/", f"{units}/")
        .replace(gpu_health.EXPECT_PATH, str(tmp_path / "expect.json"))
        .replace(gpu_sharing.MIG_LAYOUT_PATH, str(tmp_path / "etc" / "mig-layout"))
        .replace(gpu_sharing.MIG_DEFER_REBOOT, str(defer))
    )
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(calls), "DEFER": str(defer)}
    env["NEEDS_REBOOT"] = "1" if needs_reboot else "0"
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert not defer.exists()  # the user data's request lasts only while it runs the unit
    return [line.split() for line in joins.read_text().splitlines()], calls.read_text().splitlines(), tmp_path


@pytest.mark.parametrize("needs_reboot", [False, True], ids=["reset-or-on", "vm-needs-reboot"])
def test_a_mig_node_joins_and_reboots_only_when_its_mode_needs_it(tmp_path: Path, needs_reboot: bool) -> None:
    joins, systemctl, root = _run(tmp_path, needs_reboot=needs_reboot)
    assert (root / "etc" / "mig-layout").read_text() == "14:0,19:2,19:3,9:4\n"
    assert (root / "expect.json").exists()  # the check finds its expectation after the reboot too
    (join,) = joins
    taints = join[join.index("--register-with-taints") + 1]
    assert taints == "{}={}:{}".format(*gpu_health.BURN_IN_TAINT)  # registered with the burn-in taint either way
    if needs_reboot:
        # The check, the kubelet and the unit are enabled: they run after the reboot, the unit first.
        assert systemctl == [f"start {gpu_sharing.MIG_UNIT}", "stop kubelet", "reboot"]
        assert "--no-start" in join
    else:
        assert systemctl == [f"start {gpu_sharing.MIG_UNIT}", f"start --no-block {gpu_health.CHECK_UNIT}"]
        assert "--no-start" not in join
