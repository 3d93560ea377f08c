"""docs/site-onboarding.md and `dlinfra site add|render` say the same thing: every command render prints is in the
guide, word for word, the guide names every file render writes, and it applies the stacks `site add` lists."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlinfra.cli import main as cli
from dlinfra.ops import onboarding, site_files
from tests import reference
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT

GUIDE = ROOT / site_files.ONBOARDING_GUIDE


def _guide() -> str:
    return GUIDE.read_text()


def _missing(commands: list[str]) -> list[str]:
    text = _guide()
    return [c for c in commands if c not in text]


GATEWAY_ROUTE = ("swanctl", "frr", "charon", "sysctl", "nftables", "xfrm", "node")


@pytest.mark.parametrize(
    "roles",
    [
        pytest.param((*GATEWAY_ROUTE, "nodeadm", "gpu-node"), id="gpu-site"),
        pytest.param(GATEWAY_ROUTE, id="route-site-without-gpus"),
        pytest.param(("swanctl", "frr", "charon", "sysctl", "nftables", "node"), id="policy-bgp-site"),
        pytest.param(("swanctl", "charon", "sysctl", "nftables", "node"), id="policy-static-site-without-gpus"),
    ],
)
def test_every_install_step_is_in_the_guide(roles: tuple[str, ...], tmp_path: Path) -> None:
    names = {
        "swanctl": "swanctl.conf",
        **site_files.GATEWAY_FILES,
        "node": "site-gateway.json",
        "nodeadm": "nodeadm.yaml",
        "gpu-node": "site-gpu-node.json",
    }
    files = {role: tmp_path / names[role] for role in roles}
    steps = site_files.install_steps(files)
    commands = [c for step in steps for c in step.commands]
    assert _missing(commands) == []
    # The variants differ where they should: no vtysh without FRR, no interfaces without route-based tunnels,
    # no GPU machine steps without a NodeConfig.
    assert any("vtysh" in c for c in commands) == ("frr" in roles)
    assert ("ip -d link show type xfrm" in commands) == ("xfrm" in roles)
    assert any("site-gpu-node.json" in c for c in commands) == ("nodeadm" in roles)


def test_site_render_prints_only_what_the_guide_shows(tmp_path: Path) -> None:
    """The real command, on the reference fleet's BGP site with GPU machines, from exported stack outputs."""
    outputs = tmp_path / "prod-us-west-2.outputs.json"
    outputs.write_text(json.dumps(reference.runs()["prod-us-west-2"].outputs))
    out_dir = tmp_path / "sjc1"
    argv = ["site", "render", "sjc1", "--fleet", str(REFERENCE_FLEET), "--lock", str(REFERENCE_LOCK)]
    proc = subprocess.run(
        [sys.executable, "-m", "dlinfra", *argv, "--outputs", str(outputs), "--out", str(out_dir)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Next steps"))
    assert site_files.ONBOARDING_GUIDE in lines[start]
    commands = [line.strip() for line in lines[start + 1 :] if line.startswith("    ")]
    assert len(commands) >= 9  # gateway, GPU machines and the cluster check
    assert _missing(commands) == []
    written = sorted(p.name for p in out_dir.iterdir())
    assert written == sorted(
        [
            "swanctl.conf",
            *site_files.GATEWAY_FILES.values(),
            "site-gateway.json",
            "nodeadm.yaml",
            "site-gpu-node.json",
            site_files.GPU_EXPECTATION_FILE,
        ]
    )
    text = _guide()
    assert [name for name in written if f"`{name}`" not in text] == []


def test_the_guide_names_the_versions_the_cookbooks_and_images_use() -> None:
    text = _guide()
    cinc = (ROOT / "images" / "variables" / "common.pkrvars.hcl").read_text()
    version = next(line.split('"')[1] for line in cinc.splitlines() if line.startswith("cinc_version"))
    assert f"sudo bash /tmp/install-cinc.sh -v {version}" in text
    assert f"chef_version: {version}" in (ROOT / "chef" / "kitchen.yml").read_text()
    assert "- name: ubuntu-24.04" in (ROOT / "chef" / "kitchen.yml").read_text() and "Ubuntu 24.04 LTS" in text
    assert f"`{site_files.CHEF_REPO_DIR}`" in text


def test_the_guide_applies_the_stacks_site_add_lists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Section 2's `pulumi up` lines are what `site add` prints for the guide's own command, run on the reference
    fleet without that site."""
    block = _guide().split("Steps 1, 2 and 4")[1].split("```sh\n")[1].split("```")[0].splitlines()
    command = shlex.split(block[0])
    assert command[:5] == [".venv/bin/python", "-m", "dlinfra", "site", "add"]
    site = command[5]
    fleet, lock = tmp_path / "fleet.yaml", tmp_path / "cidr-lock.yaml"
    shutil.copy(REFERENCE_FLEET, fleet)
    shutil.copy(REFERENCE_LOCK, lock)
    onboarding.remove_site(fleet, lock, site, release=True)
    capsys.readouterr()
    assert cli.main([*command[3:], "--fleet", str(fleet), "--lock", str(lock)]) == 0
    printed = re.findall(r"^\s+\d+\. (pulumi up --stack .*)$", capsys.readouterr().out, re.MULTILINE)
    guide = [line for line in block if line.startswith("pulumi up --stack")]
    assert len(guide) >= 5  # the other regions and the in-cluster stacks, not only the home and global stacks
    assert [" ".join(line.split()) for line in guide] == [" ".join(line.split()) for line in printed]
