"""Sites: networks in the plan, `site add|remove|render` and `vpn profile` end to end in a temp repo."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlinfra.cli import network as cli_network
from dlinfra.errors import DlinfraError
from dlinfra.model import planner, sites, stackroles
from dlinfra.model.fleet.load import load_fleet
from dlinfra.offline import engine
from dlinfra.ops import site_files
from tests import reference
from tests.conftest import REFERENCE_FLEET, REFERENCE_LOCK, ROOT


@dataclass
class Run:
    code: int
    out: str
    err: str


@dataclass
class Repo:
    """A temp copy of the reference fleet and lock, and a CLI runner working on it."""

    root: Path
    run: Callable[..., Run]

    @property
    def fleet(self) -> Path:
        return self.root / "fleet.yaml"

    @property
    def lock(self) -> Path:
        return self.root / "cidr-lock.yaml"

    def snapshot(self) -> tuple[bytes, bytes]:
        return self.fleet.read_bytes(), self.lock.read_bytes()


def _parser() -> argparse.ArgumentParser:
    """The CLI as dlinfra.cli builds it: a common parent with --fleet/--lock, commands from register()."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--fleet", default="fleet.yaml", type=Path)
    common.add_argument("--lock", default=None, type=Path)
    parser = argparse.ArgumentParser(prog="dlinfra")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.set_defaults(handlers=cli_network.register(sub, common))
    return parser


@pytest.fixture
def repo(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Repo:
    shutil.copy(REFERENCE_FLEET, tmp_path / "fleet.yaml")
    shutil.copy(REFERENCE_LOCK, tmp_path / "cidr-lock.yaml")
    monkeypatch.chdir(tmp_path)

    def run(*argv: str) -> Run:
        capsys.readouterr()
        args = _parser().parse_args(argv)
        try:
            code = args.handlers[args.command](args)
        except DlinfraError as exc:  # what dlinfra.cli.main does
            print(f"error: {exc}", file=__import__("sys").stderr)
            code = 2
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return Repo(tmp_path, run)


# --- the plan's view of sites ------------------------------------------------------------------------
def test_environment_networks_and_site_remotes() -> None:
    loaded = load_fleet(REFERENCE_FLEET)
    plan = planner.plan(loaded, planner.load_lock(REFERENCE_LOCK))
    nets = sites.environment_networks(loaded.fleet, plan, "prod")
    assert [d.key for d in nets] == [
        "vpc-us-west-2",
        "vpc-us-east-1",
        "vpc-eu-west-1",
        "lan-sjc1",
        "pods-sjc1",
        "lan-ams1",
        "pods-ams1",
    ]
    assert {d.key: d.region for d in nets}["lan-ams1"] == "eu-west-1"
    remote = sites.site_remote_cidrs(loaded.fleet, plan, "sjc1")
    assert sites.site_lan(plan, "sjc1") not in remote and sites.site_pods(plan, "sjc1") not in remote
    assert sites.site_lan(plan, "ams1") in remote and plan.vpc("prod", "us-west-2") in remote
    assert sites.environment_networks(loaded.fleet, plan, "staging") == [
        sites.Destination("vpc-us-west-2", plan.vpc("staging", "us-west-2"), "us-west-2")
    ]


# --- site add: bad input ------------------------------------------------------------------------------
BASE = ["nyc1", "--region", "us-east-1", "--public-ip", "8.8.4.4", "--asn", "65103"]


def _with(**changes: str | None) -> list[str]:
    argv = list(BASE)
    for flag, value in changes.items():
        option = "--" + flag.replace("_", "-")
        if option in argv:
            i = argv.index(option)
            del argv[i : i + 2]
        if value is not None:
            argv += [option, value]
    return argv


@pytest.mark.parametrize(
    ("argv", "key", "message"),
    [
        pytest.param(["sjc1", *BASE[1:]], "sites.sjc1", "already exists", id="duplicate-site"),
        pytest.param(_with(public_ip="10.1.2.3"), "sites.nyc1.public_ip", "not a public address", id="private-ip"),
        pytest.param(_with(public_ip="100.64.0.9"), "sites.nyc1.public_ip", "not a public address", id="cgnat-ip"),
        pytest.param(_with(public_ip="240.0.0.1"), "sites.nyc1.public_ip", "not a public address", id="reserved-ip"),
        pytest.param(_with(public_ip="1.2.3"), "sites.nyc1.public_ip", "not an IPv4 address", id="malformed-ip"),
        pytest.param(
            _with(public_ip="64.62.140.17"),
            "sites.nyc1.public_ip",
            "already site 'sjc1'",
            id="ip-of-another-site",
        ),
        pytest.param(_with(asn="4294967296"), "sites.nyc1.asn", "out of range", id="asn-out-of-range"),
        pytest.param(_with(asn="0"), "sites.nyc1.asn", "out of range", id="asn-zero"),
        pytest.param(_with(asn="23456"), "sites.nyc1.asn", "reserved ASN", id="asn-reserved"),
        pytest.param(_with(asn="7224"), "sites.nyc1.asn", "reserved by AWS in us-east-1", id="asn-aws-reserved"),
        pytest.param(_with(asn="64513"), "sites.nyc1.asn", "transit gateway's own ASN", id="asn-is-tgw-asn"),
        pytest.param(
            _with(region="ap-south-1"),
            "sites.nyc1.region",
            "not a region of environment 'prod'",
            id="unknown-region",
        ),
        pytest.param(
            _with(environment="staging", region="eu-west-1"),
            "sites.nyc1.region",
            "not a region of environment 'staging'",
            id="region-not-in-environment",
        ),
        pytest.param(_with(environment="dev"), "sites.nyc1.environment", "unknown environment", id="unknown-env"),
        pytest.param(_with(lan="10.1.16.0/20"), "sites.nyc1.lan", "overlaps", id="lan-overlaps-vpc"),
        pytest.param(_with(lan="10.200.8.0/21"), "sites.nyc1.lan", "overlaps", id="lan-overlaps-site"),
        pytest.param(_with(lan="10.4.26.0/24"), "sites.nyc1.lan", "overlaps", id="lan-overlaps-client-vpn"),
        pytest.param(_with(lan="11.0.0.0/20"), "sites.nyc1.lan", "RFC 1918", id="lan-not-private"),
        pytest.param(_with(lan="10.50.0.1/20"), "sites.nyc1.lan", "host bits", id="lan-host-bits"),
        pytest.param(_with(gpu_nodes="-1"), "sites.nyc1.gpu_nodes", "greater than or equal to 0", id="gpu-nodes"),
        pytest.param(["Bad_Name", *BASE[1:]], "sites.Bad_Name", "not a valid name", id="bad-name"),
        # NFS: the GPU machines mount it on the site's LAN, allocated (10.4.32.0/20 with this lock) or given.
        pytest.param(
            [*BASE, "--nfs", "10.60.0.5:/tank:/data"],
            "sites.nyc1.nfs[0].server",
            "10.60.0.5 (--nfs 10.60.0.5:/tank:/data) is outside the site's LAN 10.4.32.0/20",
            id="nfs-outside-allocated-lan",
        ),
        pytest.param(
            [*_with(lan="10.60.0.0/20"), "--nfs", "10.60.0.5:/a:/a", "--nfs", "10.61.0.5:/b:/b"],
            "sites.nyc1.nfs[1].server",
            "10.61.0.5 (--nfs 10.61.0.5:/b:/b) is outside the site's LAN 10.60.0.0/20",
            id="nfs-outside-given-lan",
        ),
        pytest.param(
            [*_with(lan="10.60.0.0/20"), "--nfs", "10.60.15.255:/a:/a"],
            "sites.nyc1.nfs[0].server",
            "is the network or broadcast address of the site's LAN 10.60.0.0/20",
            id="nfs-on-broadcast-address",
        ),
        # The SSM activation: AWS takes an expiry at most 30 days ahead, and only a site with GPU machines has one.
        pytest.param(
            [*BASE, "--gpu-nodes", "2", "--activation-expiry", "31d"],
            "sites.nyc1.activation_expiry",
            "more than 30 days ahead",
            id="activation-expiry-too-far",
        ),
        pytest.param(
            [*BASE, "--gpu-nodes", "2", "--activation-expiry", "2026-01-01T00:00:00Z"],
            "sites.nyc1.activation_expiry",
            "2026-01-01T00:00:00Z has passed",
            id="activation-expiry-passed",
        ),
        pytest.param(
            [*BASE, "--gpu-nodes", "2", "--activation-expiry", "2030-01-01T00:00:00"],
            "sites.nyc1.activation_expiry",
            "has no time zone",
            id="activation-expiry-without-zone",
        ),
        pytest.param(
            [*BASE, "--activation-expiry", "14d"],
            "sites.nyc1.activation_expiry",
            "no GPU machines",
            id="activation-expiry-without-gpus",
        ),
    ],
)
def test_site_add_rejects_bad_input_and_writes_nothing(repo: Repo, argv: list[str], key: str, message: str) -> None:
    before = repo.snapshot()
    result = repo.run("site", "add", *argv)
    assert result.code == 2, result
    assert result.err.count("error:") == 1 and "Traceback" not in result.err
    assert f"{key}: " in result.err and message in result.err, result.err
    assert repo.fleet.name in result.err
    assert repo.snapshot() == before
    assert sorted(p.name for p in repo.root.iterdir()) == [
        "cidr-lock.yaml",
        "fleet.yaml",
    ]  # no temp files left


@pytest.mark.parametrize("days", [1, 14, 30])
def test_site_add_writes_the_activation_expiry_days_ahead(repo: Repo, days: int) -> None:
    start = datetime.datetime.now(datetime.UTC)
    result = repo.run("site", "add", *BASE, "--gpu-nodes", "2", "--activation-expiry", f"{days}d")
    assert result.code == 0, result.err
    expiry = load_fleet(repo.fleet).fleet.sites["nyc1"].activation_expiry
    assert expiry is not None
    ahead = expiry - start
    assert datetime.timedelta(days=days, minutes=-1) < ahead <= datetime.timedelta(days=days)


def test_site_add_refuses_an_expiry_that_is_no_instant(capsys: pytest.CaptureFixture[str], repo: Repo) -> None:
    with pytest.raises(SystemExit):
        repo.run("site", "add", *BASE, "--gpu-nodes", "2", "--activation-expiry", "next week")
    assert "--activation-expiry: 'next week' is neither a UTC instant" in capsys.readouterr().err


def test_site_add_needs_a_complete_lock(repo: Repo) -> None:
    text = repo.lock.read_text()
    repo.lock.write_text("\n".join(line for line in text.splitlines() if "site-lan/ams1" not in line) + "\n")
    before = repo.snapshot()
    result = repo.run("site", "add", *BASE)
    assert result.code == 2 and "dlinfra cidr --update" in result.err
    assert repo.snapshot() == before


# --- site add, preview, render: end to end -----------------------------------------------------------
def test_site_add_then_preview_then_render(repo: Repo, tmp_path: Path) -> None:
    old_fleet, old_lock = repo.fleet.read_text(), planner.load_lock(repo.lock).allocations
    result = repo.run("site", "add", *_with(lan="10.60.0.0/20"), "--bgp", "--gpu-nodes", "4")
    assert result.code == 0, result.err
    # The fleet file keeps every byte it had and gains the site at the end of sites:.
    new_fleet = repo.fleet.read_text()
    lines = new_fleet.splitlines()
    at = lines.index("  nyc1:  # added by `dlinfra site add`")
    added = lines[at : at + 8]
    assert added == [
        "  nyc1:  # added by `dlinfra site add`",
        "    region: us-east-1",
        "    environment: prod",
        "    public_ip: 8.8.4.4",
        "    asn: 65103",
        "    routing: bgp",
        "    lan: 10.60.0.0/20",
        "    gpu_nodes: 4",
    ]
    assert lines[:at] + lines[at + 8 :] == old_fleet.splitlines()
    assert new_fleet.index("nyc1:") < new_fleet.index("\nteams:")
    lock = planner.load_lock(repo.lock).allocations
    assert set(lock) - set(old_lock) == {
        "site-lan/nyc1",
        "hybrid-pods/nyc1",
        "tunnel/nyc1/1",
        "tunnel/nyc1/2",
    }
    assert all(lock[k] == v for k, v in old_lock.items())
    assert str(lock["site-lan/nyc1"]) == "10.60.0.0/20"
    for step in (
        "pulumi up --stack prod-us-east-1",
        "pulumi up --stack prod-global",
        "dlinfra site render nyc1",
    ):
        assert step in result.out
    assert result.out.index("--stack prod-us-east-1 ") < result.out.index("--stack prod-global")

    # Preview every stack of the new fleet: the site is on us-east-1's TGW and routed from the others.
    fleet = load_fleet(repo.fleet).fleet
    config = {"dlinfra:fleet": str(repo.fleet), "dlinfra:lock": str(repo.lock)}
    prod = [role for role in stackroles.roles(fleet) if role.environment == "prod"]
    runs = {r.role.name: r for r in engine.run_all(ROOT, prod, project="dlinfra", config=config)}
    home = runs["prod-us-east-1"]
    assert "nyc1" in home.outputs["site_vpns"]
    lan_routes = [
        r
        for r in runs["prod-global"].resources
        if r.type == "aws:ec2transitgateway/route:Route" and r.inputs["destinationCidrBlock"] == "10.60.0.0/20"
    ]
    assert len(lan_routes) == 2  # us-west-2 and eu-west-1 reach it through their peering with us-east-1
    keys = [t["preshared_key"] for t in home.outputs["site_vpns"]["nyc1"]["tunnels"]]

    # Render from the offline run, and from a `pulumi stack output --json --show-secrets` file.
    out_dir = tmp_path / "render"
    rendered = repo.run("site", "render", "nyc1", "--offline", "--out", str(out_dir))
    assert rendered.code == 0, rendered.err
    # BGP: AWS moves when its hold timer runs out, before its DPD would.
    assert "  from AWS within 30.0 s (its 30 s BGP hold timer; its DPD would take about 40 s)\n" in rendered.out
    assert "  both ways within 30.0 s\n" in rendered.out
    swanctl = out_dir / "swanctl.conf"
    assert stat.S_IMODE(swanctl.stat().st_mode) == 0o600
    text = swanctl.read_text()
    assert all(f'secret = "{k}"' in text for k in keys)
    tunnels = home.outputs["site_vpns"]["nyc1"]["tunnels"]
    assert all(f"remote_addrs = {t['outside_address']}" in text for t in tunnels)
    assert (out_dir / "frr.conf").exists() and "neighbor 169.254" in (out_dir / "frr.conf").read_text()
    node = json.loads((out_dir / "site-gateway.json").read_text())
    assert node["run_list"] == ["role[site-gateway]"]
    assert node["dlinfra"]["site"]["swanctl_conf"] == "/etc/dlinfra/site/swanctl.conf"
    assert node["dlinfra_gateway"] == {
        "routing": "bgp",
        "swanctl_source": "/etc/dlinfra/site/swanctl.conf",
        "frr": True,
        "frr_source": "/etc/dlinfra/site/frr.conf",
        "charon_source": "/etc/dlinfra/site/strongswan-dlinfra.conf",
        "sysctl_source": "/etc/dlinfra/site/sysctl-dlinfra-gateway.conf",
        "nftables_source": "/etc/dlinfra/site/dlinfra-mss.nft",
        "xfrm_source": "/etc/dlinfra/site/dlinfra-xfrm",
        "tunnel_mode": "route",
    }
    node_text = (out_dir / "site-gateway.json").read_text()
    printed = rendered.out + rendered.err
    for key in keys:
        assert key not in node_text and key not in printed
        assert key not in json.dumps(home.plan("dlinfra"))

    # The site's GPU machines: a nodeadm NodeConfig holding the SSM activation, and their Chef node JSON.
    activation = home.outputs["hybrid_activations"]["nyc1"]
    nodeadm = out_dir / "nodeadm.yaml"
    assert stat.S_IMODE(nodeadm.stat().st_mode) == 0o600
    config = yaml.safe_load(nodeadm.read_text())
    assert config["spec"]["hybrid"]["ssm"] == {"activationId": activation["id"], "activationCode": activation["code"]}
    assert config["spec"]["cluster"] == {"name": home.outputs["cluster_name"], "region": "us-east-1"}
    # Pods on the site's machines ask the node's NodeLocal DNS cache first, kube-dns while it restarts.
    assert config["spec"]["kubelet"]["config"]["clusterDNS"] == home.outputs["cluster_dns"]
    assert home.outputs["cluster_dns"][0] == "169.254.20.10"
    gpu_node = json.loads((out_dir / "site-gpu-node.json").read_text())
    assert gpu_node["run_list"] == ["role[site-gpu-node]"]
    assert activation["code"] not in printed and activation["code"] not in json.dumps(gpu_node)
    assert activation["code"] not in json.dumps(home.plan("dlinfra"))

    outputs_file = tmp_path / "prod-us-east-1.json"
    outputs_file.write_text(json.dumps(home.outputs))
    again = repo.run("site", "render", "nyc1", "--outputs", str(outputs_file), "--out", str(tmp_path / "again"))
    assert again.code == 0, again.err
    assert (tmp_path / "again" / "swanctl.conf").read_text() == text


def test_static_site_routes_aws_statically_and_peers_only_with_its_hybrid_nodes(repo: Repo, tmp_path: Path) -> None:
    result = repo.run("site", "render", "ams1", "--offline", "--out", str(tmp_path / "ams1"))
    assert result.code == 0, result.err
    assert sorted(p.name for p in (tmp_path / "ams1").iterdir()) == [
        "dlinfra-mss.nft",
        "dlinfra-xfrm",
        "frr.conf",
        "gpu-expect.json",
        "nodeadm.yaml",
        "site-gateway.json",
        "site-gpu-node.json",
        "strongswan-dlinfra.conf",
        "swanctl.conf",
        "sysctl-dlinfra-gateway.conf",
    ]
    assert stat.S_IMODE((tmp_path / "ams1" / "dlinfra-xfrm").stat().st_mode) == 0o755
    # A static VPN leaves AWS nothing but its dead-peer detection: about 40 s, not a BGP hold time.
    assert (
        "tunnels: route-based, static routing; when an AWS endpoint goes silent, traffic leaves its tunnel\n"
        "  from the gateway within 25.2 s (DPD probe after 10 s, charon gives up 14.2 s later)\n"
        "  from AWS after about 40 s (AWS's DPD: a keep-alive after about 10 s of silence, the gateway dead 30 s later;"
        " a static VPN has nothing faster)\n"
        "  both ways after about 40 s\n"
    ) in result.out
    frr = (tmp_path / "ams1" / "frr.conf").read_text()
    # BGP only with the nodes; AWS's networks through both tunnel interfaces, statically.
    assert "bgp listen range" in frr and "169.254." not in frr
    assert re.search(r"^ip route \S+ xfrm1\nip route \S+ xfrm2$", frr, re.MULTILINE)
    node = json.loads((tmp_path / "ams1" / "site-gateway.json").read_text())
    assert node["dlinfra_gateway"] == {
        "routing": "static",
        "swanctl_source": "/etc/dlinfra/site/swanctl.conf",
        "frr": True,
        "frr_source": "/etc/dlinfra/site/frr.conf",
        "charon_source": "/etc/dlinfra/site/strongswan-dlinfra.conf",
        "sysctl_source": "/etc/dlinfra/site/sysctl-dlinfra-gateway.conf",
        "nftables_source": "/etc/dlinfra/site/dlinfra-mss.nft",
        "xfrm_source": "/etc/dlinfra/site/dlinfra-xfrm",
        "tunnel_mode": "route",
    }


# --- site render: bad outputs ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def usw2_outputs() -> dict[str, Any]:
    """What `pulumi stack output --json --show-secrets` gives for prod-us-west-2 (offline)."""
    return reference.runs()["prod-us-west-2"].outputs


def _masked(o: dict[str, Any]) -> None:
    o["site_vpns"] = "[secret]"


def _masked_key(o: dict[str, Any]) -> None:
    o["site_vpns"]["sjc1"]["tunnels"][0]["preshared_key"] = "[secret]"


def _other_stack(o: dict[str, Any]) -> None:
    o["region"] = "us-east-1"


def _stale(o: dict[str, Any]) -> None:
    o["site_vpns"]["sjc1"]["asn"] = 65999


def _no_site(o: dict[str, Any]) -> None:
    o["site_vpns"] = {}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            _masked,
            "site_vpns: the value is masked; export the outputs with `pulumi stack output --json --show-secrets`",
        ),
        (_masked_key, "site_vpns.sjc1.tunnels.preshared_key: the value is masked"),
        (_other_stack, "outputs of stack prod-us-east-1, but prod-us-west-2 is needed"),
        (_stale, "site_vpns.sjc1: the stack outputs disagree with the fleet on asn"),
        (
            _no_site,
            "site_vpns.sjc1: no VPN for site 'sjc1' in the outputs: run `pulumi up --stack prod-us-west-2`",
        ),
    ],
)
def test_site_render_refuses_bad_outputs(
    repo: Repo, usw2_outputs: dict[str, Any], change: Callable[[dict[str, Any]], None], message: str
) -> None:
    outputs = json.loads(json.dumps(usw2_outputs))
    change(outputs)
    (repo.root / "outputs.json").write_text(json.dumps(outputs))
    result = repo.run("site", "render", "sjc1", "--outputs", "outputs.json", "--out", "out")
    assert result.code == 2
    assert message in result.err, result.err
    assert not (repo.root / "out").exists()


def test_site_render_unknown_site_and_unreadable_outputs(repo: Repo) -> None:
    result = repo.run("site", "render", "nyc9", "--outputs", "missing.json")
    assert result.code == 2 and "sites.nyc9: no site 'nyc9' in the fleet (sites: sjc1, ams1)" in result.err
    (repo.root / "bad.json").write_text("[secret]")
    result = repo.run("site", "render", "sjc1", "--outputs", "bad.json")
    assert result.code == 2 and "bad.json: not JSON" in result.err


# --- site remove ----------------------------------------------------------------------------------------
def test_site_remove_keeps_allocations_reserved(repo: Repo) -> None:
    lock_before = repo.lock.read_bytes()
    result = repo.run("site", "remove", "ams1")
    assert result.code == 0, result.err
    assert "ams1" not in load_fleet(repo.fleet).fleet.sites
    assert repo.lock.read_bytes() == lock_before
    assert "kept 4 allocation(s) reserved" in result.out and "site-lan/ams1" in result.out
    assert "pulumi up --stack prod-eu-west-1" in result.out
    plan = planner.plan(load_fleet(repo.fleet), planner.load_lock(repo.lock))
    assert set(plan.orphans) == {"site-lan/ams1", "hybrid-pods/ams1", "tunnel/ams1/1", "tunnel/ams1/2"}
    # The blank line that separates sites: from teams: stays.
    assert "gpu_model: H100\n    nfs:" in repo.fleet.read_text() and "\n\nteams:" in repo.fleet.read_text()


def test_site_remove_release_then_add_restores_the_files(repo: Repo) -> None:
    before = repo.snapshot()
    assert repo.run("site", "add", *BASE).code == 0
    result = repo.run("site", "remove", "nyc1", "--release")
    assert result.code == 0, result.err
    assert "released 4 allocation(s)" in result.out
    assert repo.snapshot() == before


def test_removing_a_site_the_quotas_need_is_refused(repo: Repo) -> None:
    # Without both sites prod's 512 guaranteed GPUs no longer fit: the fleet left behind would fail preview.
    assert repo.run("site", "remove", "sjc1").code == 0
    before = repo.snapshot()
    result = repo.run("site", "remove", "ams1")
    assert result.code == 2 and "teams: team GPU quotas add up to 512" in result.err
    assert repo.snapshot() == before


def test_removing_every_site_leaves_an_empty_mapping(repo: Repo) -> None:
    repo.fleet.write_text(repo.fleet.read_text().replace("gpu_quota: 256", "gpu_quota: 128"))  # fits without sites
    assert repo.run("site", "remove", "sjc1").code == 0
    assert repo.run("site", "remove", "ams1").code == 0
    assert "\nsites: {}\n" in repo.fleet.read_text()
    assert load_fleet(repo.fleet).fleet.sites == {}
    assert repo.run("site", "add", *BASE).code == 0
    assert list(load_fleet(repo.fleet).fleet.sites) == ["nyc1"]


def test_site_remove_unknown(repo: Repo) -> None:
    before = repo.snapshot()
    result = repo.run("site", "remove", "nyc9")
    assert result.code == 2 and "sites.nyc9: no site 'nyc9'" in result.err
    assert repo.snapshot() == before


# --- vpn profile ----------------------------------------------------------------------------------------
def test_vpn_profile_federated_offline(repo: Repo, usw2_outputs: dict[str, Any]) -> None:
    # prod signs in through SAML: one profile for everyone, no key in it.
    result = repo.run("vpn", "profile", "--region", "us-west-2", "--offline", "--out", "laptop.ovpn")
    assert result.code == 0, result.err
    profile = repo.root / "laptop.ovpn"
    assert stat.S_IMODE(profile.stat().st_mode) == 0o600
    text = profile.read_text()
    assert "auth-federate" in text.splitlines() and "<key>" not in text and "PRIVATE KEY" not in text
    assert "verify-x509-name dlinfra-prod-usw2-client-vpn-server name" in text
    host = usw2_outputs["client_vpn_dns_name"].removeprefix("*.")
    assert any(line.startswith("remote ") and line.endswith(f".{host} 443") for line in text.splitlines())
    result = repo.run("vpn", "profile", "--region", "us-west-2", "--offline", "--user", "alice")
    assert result.code == 2 and "drop --user" in result.err


def test_vpn_profile_per_person(repo: Repo) -> None:
    staging = reference.runs()["staging-us-west-2"].outputs
    base = ["vpn", "profile", "--environment", "staging", "--region", "us-west-2", "--offline"]
    result = repo.run(*base, "--user", "alice")
    assert result.code == 0, result.err
    text = (repo.root / "build" / "vpn" / "staging-us-west-2-alice.ovpn").read_text()
    alice, bob = staging["client_vpn_users"]["alice"], staging["client_vpn_users"]["bob"]
    assert f"<key>\n{alice['key_pem']}</key>" in text and f"<cert>\n{alice['cert_pem']}</cert>" in text
    assert bob["key_pem"] not in text and bob["cert_pem"] not in text
    assert "PRIVATE KEY" not in result.out + result.err
    for argv, message in (((), "--user NAME is required"), (("--user", "mallory"), "--user 'mallory' is not listed")):
        result = repo.run(*base, *argv)
        assert result.code == 2 and message in result.err and "environments.staging.client_vpn.users" in result.err


def test_vpn_profile_refuses_masked_key_and_missing_endpoint(repo: Repo) -> None:
    outputs = dict(reference.runs()["staging-us-west-2"].outputs, client_vpn_users="[secret]")
    (repo.root / "o.json").write_text(json.dumps(outputs))
    base = ["vpn", "profile", "--environment", "staging", "--region", "us-west-2", "--outputs", "o.json"]
    result = repo.run(*base, "--user", "alice")
    assert result.code == 2 and "client_vpn_users: the value is masked" in result.err
    assert not (repo.root / "build").exists()
    text = repo.fleet.read_text().replace("      users: [alice, bob]\n", "")
    text = text.replace(
        "    client_vpn:                 # one certificate per person: removing a name revokes it\n", ""
    )
    prod, staging = text.split("\n  staging:\n")  # staging's dev boxes go with its VPN, their only way in
    staging = re.sub(r"\n    dev_boxes:.*\n(?: {6,}.*\n)+", "\n", staging)
    repo.fleet.write_text(prod + "\n  staging:\n" + staging)
    result = repo.run(*base)
    assert result.code == 2 and "environments.staging.client_vpn: no client_vpn" in result.err
    result = repo.run("vpn", "profile", "--region", "ap-south-1", "--outputs", "o.json")
    assert result.code == 2 and "'ap-south-1' is not a region of environment 'prod'" in result.err


@pytest.mark.parametrize("site", ["sjc1", "ams1"])
def test_node_json_golden(usw2_outputs: dict[str, Any], site: str, tmp_path: Path) -> None:
    """The rendered Chef node JSON files are stable (the offline outputs are deterministic)."""
    fleet = load_fleet(REFERENCE_FLEET).fleet
    home = sites.stack_of(fleet, site)
    outputs = usw2_outputs if home == "prod-us-west-2" else reference.runs()[home].outputs
    rendered = site_files.render_site(fleet, site, outputs, tmp_path, source="offline")
    golden_dir = Path(__file__).parent.parent / "render" / "golden"
    for role in ("node", "gpu-node", "gpu-expect"):
        text = rendered.files[role].read_text()
        golden = golden_dir / f"{site}-{rendered.files[role].name}"
        if os.environ.get("UPDATE_GOLDEN") == "1":
            golden.write_text(text)
        assert text == golden.read_text()


def test_a_policy_based_site_gets_its_selectors_and_no_xfrm_interfaces(
    usw2_outputs: dict[str, Any], tmp_path: Path
) -> None:
    fleet = load_fleet(REFERENCE_FLEET).fleet
    policy = fleet.sites["sjc1"].model_copy(update={"tunnel_mode": "policy"})
    fleet = fleet.model_copy(update={"sites": {**fleet.sites, "sjc1": policy}})
    rendered = site_files.render_site(fleet, "sjc1", usw2_outputs, tmp_path, source="offline")
    assert "xfrm" not in rendered.files
    swanctl = rendered.files["swanctl"].read_text()
    assert "if_id" not in swanctl and "0.0.0.0/0" not in swanctl
    assert f"local_ts = {rendered.view.lan_cidr}," in swanctl
    assert "install_routes = yes" in rendered.files["charon"].read_text()
    node = json.loads(rendered.files["node"].read_text())
    assert node["dlinfra_gateway"]["tunnel_mode"] == "policy" and "xfrm_source" not in node["dlinfra_gateway"]
