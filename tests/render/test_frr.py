"""frr.conf: routes and BGP with AWS over the tunnels, iBGP with the hybrid nodes, and FRR's own checker."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlinfra.render import frr, kernel
from tests.render.vpn_views import bgp_view, policy_view, view


def test_a_policy_based_static_site_renders_no_frr_without_hybrid_pods() -> None:
    assert frr.render_frr(policy_view()) is None
    assert kernel.render_xfrm_script(policy_view()) is None


@pytest.mark.parametrize("make", [view, policy_view])
def test_a_static_site_with_hybrid_pods_runs_frr_for_its_nodes(make: Any) -> None:
    # Found by `dlinfra reach`: without it, nothing routes a static site's hybrid pods inside the site.
    text = frr.render_frr(make(pod_cidrs=("10.202.0.0/18",))) or ""
    assert "bgp listen range 10.200.0.0/20 peer-group HYBRID-NODES" in text
    assert "ip prefix-list DLINFRA-NODES seq 5 permit 10.202.0.0/18 ge 25" in text
    assert "169.254." not in text and "\n  network " not in text and "DLINFRA-AWS" not in text


def test_frr_peers_with_aws_directly_over_the_tunnel_interfaces() -> None:
    text = frr.render_frr(bgp_view()) or ""
    assert "router bgp 65101\n" in text
    # AWS holds the first host of each inside /30; the site's address sits on the tunnel's interface.
    for aws, interface in (("169.254.10.1", "xfrm1"), ("169.254.10.5", "xfrm2")):
        assert f" neighbor {aws} remote-as 64512\n" in text
        assert f" neighbor {aws} update-source {interface}\n" in text
        assert f" neighbor {aws} timers 10 30\n" in text
    # Directly connected: nothing that papers over a missing route.
    for trick in ("ebgp-multihop", "disable-connected-check", "interface lo", "\n ip address "):
        assert trick not in text
    assert "  network 10.200.0.0/20\n" in text and "  network 10.202.0.0/18\n" in text
    # ECMP over both tunnels, and AWS's routes into the kernel.
    assert " bgp bestpath as-path multipath-relax\n" in text and "  maximum-paths 2\n" in text
    assert "route-map DLINFRA-KERNEL permit 5\n match ip address prefix-list DLINFRA-AWS\n" in text


def test_frr_static_routes_use_both_tunnel_interfaces_at_equal_cost() -> None:
    text = frr.render_frr(view()) or ""
    for cidr in ("10.0.0.0/16", "10.1.0.0/16", "10.201.0.0/20"):
        assert f"ip route {cidr} xfrm1\nip route {cidr} xfrm2\n" in text
    assert "router bgp" not in text


@pytest.mark.parametrize("make", [view, bgp_view])
def test_traffic_for_aws_never_leaves_unencrypted_when_both_tunnels_are_down(make: Any) -> None:
    text = frr.render_frr(make()) or ""
    for cidr in ("10.0.0.0/16", "10.1.0.0/16", "10.201.0.0/20"):
        assert f"ip route {cidr} blackhole 250\n" in text


def test_policy_frr_peers_over_inside_addresses_on_lo() -> None:
    text = frr.render_frr(policy_view(routing="bgp")) or ""
    assert " neighbor 169.254.10.1 update-source 169.254.10.2\n" in text
    assert " neighbor 169.254.10.5 update-source 169.254.10.6\n" in text
    assert "maximum-paths" not in text


def test_frr_accepts_exactly_the_environments_networks() -> None:
    text = frr.render_frr(view(routing="bgp", remote_cidrs=("10.0.0.0/16", "10.9.9.9/32"))) or ""
    assert "ip prefix-list DLINFRA-AWS seq 5 permit 10.0.0.0/16\n" in text
    assert "ip prefix-list DLINFRA-AWS seq 10 permit 10.9.9.9/32\n" in text
    # No le/ge: a more specific route inside a VPC range (or a default route) is refused.
    assert not [line for line in text.splitlines() if "DLINFRA-AWS" in line and (" le " in line or " ge " in line)]


FRR_VARIANTS = {
    "route-bgp-hybrid": bgp_view,
    "route-bgp": lambda: view(routing="bgp"),
    "route-static": view,
    "route-static-hybrid": lambda: view(pod_cidrs=("10.202.0.0/18",)),
    "policy-bgp-hybrid": lambda: policy_view(routing="bgp", pod_cidrs=("10.202.0.0/18",)),
    "policy-static-hybrid": lambda: policy_view(pod_cidrs=("10.202.0.0/18",)),
}


@pytest.mark.parametrize("variant", sorted(FRR_VARIANTS))
def test_rendered_frr_conf_passes_frrs_own_checker(
    variant: str, tmp_path: Path, require_tool: Callable[[str], str]
) -> None:
    conf = tmp_path / "frr.conf"
    conf.write_text(frr.render_frr(FRR_VARIANTS[variant]()) or "")
    result = subprocess.run(
        [require_tool("vtysh"), "--dryrun", "--inputfile", str(conf)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_frrs_checker_rejects_a_broken_file(tmp_path: Path, require_tool: Callable[[str], str]) -> None:
    # The check above can fail: FRR 8.4's vtysh --dryrun exits non-zero on an unknown command.
    conf = tmp_path / "frr.conf"
    conf.write_text((frr.render_frr(bgp_view()) or "").replace("timers connect 5", "timers connnect 5"))
    result = subprocess.run(
        [require_tool("vtysh"), "--dryrun", "--inputfile", str(conf)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode != 0


def test_frr_peers_with_the_hybrid_nodes_over_ibgp_on_the_site_lan() -> None:
    text = frr.render_frr(bgp_view()) or ""
    assert " neighbor HYBRID-NODES remote-as 65101\n" in text  # the site's own ASN: iBGP
    assert " bgp listen range 10.200.0.0/20 peer-group HYBRID-NODES\n" in text
    assert " neighbor HYBRID-NODES timers 3 9\n" in text
    # Only blocks of the site's pod range no larger than a node's block; nothing sent back to the nodes.
    assert "ip prefix-list DLINFRA-NODES seq 5 permit 10.202.0.0/18 ge 25\n" in text
    assert "route-map DLINFRA-NODES-OUT deny 10\n" in text
    # What goes to AWS is unchanged: the LAN and the aggregate pod range, exactly.
    assert "ip prefix-list DLINFRA-SITE seq 10 permit 10.202.0.0/18\n" in text


def test_policy_frr_installs_only_node_routes_in_the_kernel() -> None:
    text = frr.render_frr(policy_view(routing="bgp", pod_cidrs=("10.202.0.0/18",))) or ""
    assert "bgp no-rib" not in text
    assert "ip protocol bgp route-map DLINFRA-KERNEL\n" in text
    assert "route-map DLINFRA-KERNEL permit 10\n match ip address prefix-list DLINFRA-NODES\n" in text
    assert "DLINFRA-KERNEL permit 5" not in text
    assert text.endswith("route-map DLINFRA-KERNEL deny 20\nexit\n")


def test_frr_without_pod_cidrs_has_no_node_peers() -> None:
    text = frr.render_frr(view(routing="bgp")) or ""
    assert "HYBRID-NODES" not in text and "DLINFRA-NODES" not in text
    assert "route-map DLINFRA-KERNEL permit 10" not in text
    assert "route-map DLINFRA-KERNEL deny 20\n" in text
