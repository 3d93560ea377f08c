"""The gateway's kernel files: the XFRM interface script (shellcheck, fake ip and sysctl) and the MSS clamping rules."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlinfra.render import kernel
from tests.render.vpn_views import policy_view, view


def test_xfrm_script_passes_shellcheck(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    script = tmp_path / "dlinfra-xfrm"
    script.write_text(kernel.render_xfrm_script(view()) or "")
    result = subprocess.run([require_tool("shellcheck"), str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def _run_script(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    """Run the rendered script with fake ip and sysctl that log their arguments; returns the log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    for tool in ("ip", "sysctl"):
        fake = bin_dir / tool
        # `ip link show` fails (no interface yet); `ip -o route get` names the uplink.
        fake.write_text(
            "#!/bin/bash\n"
            f'echo "{tool} $*" >> {log}\n'
            'if [[ "$*" == "link show"* ]]; then exit 1; fi\n'
            'if [[ "$*" == "-o route get"* ]]; then echo "$4 via 192.0.2.1 dev eth0 src 203.0.113.10"; fi\n'
        )
        fake.chmod(0o755)
    script = tmp_path / "dlinfra-xfrm"
    script.write_text(kernel.render_xfrm_script(view()) or "")
    script.chmod(0o755)
    result = subprocess.run(
        ["/bin/bash", str(script), *args],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", **(env or {})},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_xfrm_script_creates_each_tunnels_interface_with_the_customer_inside_address(tmp_path: Path) -> None:
    calls = _run_script(tmp_path, "start")
    assert "ip link add xfrm1 type xfrm dev eth0 if_id 1" in calls
    assert "ip link add xfrm2 type xfrm dev eth0 if_id 2" in calls
    # The customer side of 169.254.10.0/30 is .2 (AWS holds .1).
    assert "ip address replace 169.254.10.2/30 dev xfrm1" in calls
    assert "ip address replace 169.254.10.6/30 dev xfrm2" in calls
    assert "sysctl -q -w net.ipv4.conf.xfrm1.rp_filter=2" in calls
    assert f"ip link set dev xfrm1 mtu {kernel.TUNNEL_MSS + 40}" in calls
    # Created, never brought up here: only charon's updown does that, once the SA is installed.
    assert not [c for c in calls if c.endswith(" up")]


def test_xfrm_script_refuses_link_local_traffic_that_no_tunnel_carries(tmp_path: Path) -> None:
    calls = _run_script(tmp_path, "start")
    # Before the interfaces (and so before FRR or charon can send to an inside address): with a tunnel's
    # interface down, its /30 is gone and its BGP session's last segments would take the default route in clear.
    unreachable = "ip route replace unreachable 169.254.0.0/16 metric 4294967295"
    assert calls[0] == unreachable
    assert calls.count(unreachable) == 1
    # Stopping leaves it: without the interfaces, nothing link-local may leave at all.
    (tmp_path / "stop").mkdir()
    assert not [c for c in _run_script(tmp_path / "stop", "stop") if "route" in c]


@pytest.mark.parametrize(("verb", "state"), [("up-client", "up"), ("down-client", "down")])
def test_charon_updown_follows_the_sa_on_the_tunnels_interface(tmp_path: Path, verb: str, state: str) -> None:
    calls = _run_script(tmp_path, "updown", env={"PLUTO_VERB": verb, "PLUTO_IF_ID_OUT": "2"})
    assert calls == [f"ip link set dev xfrm2 {state}"]


def test_updown_ignores_other_connections(tmp_path: Path) -> None:
    assert _run_script(tmp_path, "updown", env={"PLUTO_VERB": "down-client", "PLUTO_IF_ID_OUT": "9"}) == []


def _nft_check(text: str, tmp_path: Path, require_tool: Callable[[str], str]) -> subprocess.CompletedProcess[str]:
    """nftables' own check (nft -c), in a new user and network namespace: no root, the host's rules untouched."""
    path = tmp_path / "dlinfra-mss.nft"
    path.write_text(text)
    argv = [require_tool("unshare"), "--user", "--map-root-user", "--net", require_tool("nft"), "-c", "-f", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("make", [view, policy_view])
def test_mss_rules_pass_nftables_check(make: Any, tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    text = kernel.render_nftables(make())
    assert text.count(f"tcp option maxseg size set {kernel.TUNNEL_MSS}") == 2
    result = _nft_check(text, tmp_path, require_tool)
    assert result.returncode == 0, result.stderr


def test_nftables_check_rejects_a_broken_rule(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    broken = kernel.render_nftables(view()).replace("maxseg size set", "maxseg size sett")
    assert _nft_check(broken, tmp_path, require_tool).returncode != 0
