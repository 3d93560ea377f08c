"""The rendered site configuration against a real strongSwan (and FRR) that plays AWS, in network namespaces.

Two namespaces are joined by a veth carrying TEST-NET-1 addresses (RFC 5737); the site LAN and VPC
stand-ins are addresses on each namespace's lo and never leave it, and neither namespace has a
default route. Each daemon runs with a private /run and its own config, sockets and log, and is
stopped by the PID we started. This kernel has no ESP, VTI or XFRM interfaces, so charon does IPsec in
user space (kernel-libipsec over /dev/net/tun), which cannot bind SAs to interfaces: these tests run the
policy-based rendering (tunnel_mode: policy), and check of the route-based one only that charon loads it.
The AWS side is tests/integration/aws_side/, written from AWS's documentation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest

from components.charts import cilium
from dlinfra.model import hybrid_routing
from dlinfra.render.failover import failover_budget
from dlinfra.render.frr import render_frr
from dlinfra.render.kernel import XFRM_SCRIPT
from dlinfra.render.site_vpn import SiteVpnView, Tunnel
from dlinfra.render.strongswan import render_charon, render_swanctl
from tests.integration import aws_side
from tests.integration.strongswan_lab import (
    COMMAND_SECONDS,
    WAIT_SECONDS,
    IkeSa,
    charon_conf,
    is_up,
    parse_sas,
    private_run,
)

pytestmark = pytest.mark.vpn_peer

CHARON = Path("/usr/lib/ipsec/charon")
LIBIPSEC_PLUGIN = Path("/usr/lib/ipsec/plugins/libstrongswan-kernel-libipsec.so")
FRR_BIN = Path("/usr/lib/frr")
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])

# TEST-NET-1 on the veth. One namespace plays both AWS tunnel endpoints.
AWS_TUNNEL_IPS = {1: "192.0.2.1", 2: "192.0.2.5"}
SITE_IP = "192.0.2.2"
# Stand-ins inside the view's RFC 1918 ranges; they exist only on lo inside the namespaces.
SITE_LAN_HOST = "10.128.0.1"
VPC_HOST = "10.0.0.10"  # host 10 of the first remote CIDR (the lab fixture adds one per CIDR)
PSKS = {1: "test.psk.tunnel1", 2: "test.psk.tunnel2"}
TUNNELS = ("aws-tunnel1", "aws-tunnel2")

# swanctl --terminate waits this long for the SA to go, and fails the command when it has not.
TERMINATE_SECONDS = str(WAIT_SECONDS)
# What an IKEv2 PSK tunnel over libipsec needs, and no more: strongSwan 5.9.8 moved IKE's PRF+ into
# kdf; kernel-libipsec does ESP, kernel-netlink the routes and addresses.
CHARON_PLUGINS = "nonce openssl kdf kernel-libipsec kernel-netlink socket-default vici updown"

T = TypeVar("T")


def make_view(routing: str = "static", tunnel_mode: str = "policy") -> SiteVpnView:
    """The site as the test sees it: every outside address is a namespace address on the veth."""
    tunnels = tuple(
        Tunnel(number=n, outside_ip=AWS_TUNNEL_IPS[n], inside_cidr=cidr, preshared_key=PSKS[n])
        for n, cidr in ((1, "169.254.10.0/30"), (2, "169.254.10.4/30"))
    )
    return SiteVpnView(
        site="lab1",
        local_public_ip=SITE_IP,
        lan_cidr="10.128.0.0/20",
        remote_cidrs=("10.0.0.0/16", "10.1.0.0/16"),
        tunnels=(tunnels[0], tunnels[1]),
        routing=routing,
        local_asn=65101,
        remote_asn=64512,
        tunnel_mode=tunnel_mode,
    )


def aws_peer(view: SiteVpnView, number: int, *, psk: str | None = None) -> str:
    """The AWS side of one tunnel (aws_side/swanctl.conf), listening on that tunnel's namespace address."""
    return aws_side.swanctl_conf(
        number=number, aws_outside=AWS_TUNNEL_IPS[number], site_outside=SITE_IP, psk=psk or PSKS[number]
    )


# --- environment --------------------------------------------------------------------------------
def _tool(name: str) -> str:
    return shutil.which(name, path=SEARCH_PATH) or name


def _missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, TUN devices)"
    if not Path("/dev/net/tun").exists():
        return "no /dev/net/tun, which kernel-libipsec needs"
    if not os.access(CHARON, os.X_OK):
        return f"{CHARON} not found (apt: strongswan-charon)"
    if not LIBIPSEC_PLUGIN.exists():
        return f"{LIBIPSEC_PLUGIN} not found (apt: libcharon-extra-plugins)"
    for tool, package in (
        ("swanctl", "strongswan-swanctl"),
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("unshare", "util-linux"),
        ("mount", "mount"),
    ):
        if shutil.which(tool, path=SEARCH_PATH) is None:
            return f"{tool} not found (apt: {package})"
    return None


def _cannot_run(reason: str) -> NoReturn:
    # In CI a check that cannot run is a failure, not a skip.
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"vpn_peer check cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _require_frr() -> None:
    try:
        pwd.getpwnam("frr")
    except KeyError:
        _cannot_run("no frr user, which FRR's daemons run as (apt: frr)")
    for daemon in ("zebra", "bgpd"):
        if not os.access(FRR_BIN / daemon, os.X_OK):
            _cannot_run(f"{FRR_BIN / daemon} not found (apt: frr)")
    if shutil.which("vtysh", path=SEARCH_PATH) is None:
        _cannot_run("vtysh not found (apt: frr)")


def _run(*argv: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
        check=check,
        env={"PATH": SEARCH_PATH, "LC_ALL": "C", **(env or {})},
    )


def _wait_for(what: str, probe: Callable[[], T | None], diagnostics: Callable[[], str] = str) -> T:
    """Poll probe until it returns something truthy, for at most WAIT_SECONDS."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not (value := probe()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {WAIT_SECONDS:.0f}s waiting for {what}\n{diagnostics()}", pytrace=False)
        time.sleep(0.05)
    return value


def ping(ns: str, source: str, destination: str) -> subprocess.CompletedProcess[str]:
    """Three pings from source to destination inside ns, bounded in time."""
    argv = ["ip", "netns", "exec", ns, "ping", "-n", "-c", "3", "-i", "0.2", "-W", "5", "-w", str(WAIT_SECONDS)]
    return _run(*argv, "-I", source, destination, check=False)


# --- namespaces ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Lab:
    site_ns: str
    aws_ns: str


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """Two namespaces joined by a veth; the pid in their names keeps concurrent runs apart."""
    reason = _missing_prerequisite()
    if reason:
        _cannot_run(reason)
    tag = f"dlvpn{os.getpid()}"
    site, aws = f"{tag}-site", f"{tag}-aws"
    view = make_view()
    created: list[str] = []
    try:
        try:
            for ns in (site, aws):
                _run("ip", "netns", "add", ns)
                created.append(ns)
            # Both ends are created inside the namespaces: the host's interfaces are never touched.
            _run(
                "ip",
                "-n",
                site,
                "link",
                "add",
                "veth-site",
                "type",
                "veth",
                "peer",
                "name",
                "veth-aws",
                "netns",
                aws,
            )
            _run("ip", "-n", site, "addr", "add", f"{SITE_IP}/24", "dev", "veth-site")
            _run("ip", "-n", site, "addr", "add", f"{SITE_LAN_HOST}/32", "dev", "lo")
            for address in AWS_TUNNEL_IPS.values():
                _run("ip", "-n", aws, "addr", "add", f"{address}/24", "dev", "veth-aws")
            # kernel-libipsec routes each selector from a local address inside it, so the AWS side
            # holds one address in every remote CIDR (real AWS has whole VPCs there).
            for cidr in view.remote_cidrs:
                _run("ip", "-n", aws, "addr", "add", f"{ipaddress.IPv4Network(cidr)[10]}/32", "dev", "lo")
            for tunnel in view.tunnels:
                _run("ip", "-n", aws, "addr", "add", f"{tunnel.aws_inside_ip}/32", "dev", "lo")
            for ns, veth in ((site, "veth-site"), (aws, "veth-aws")):
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                _run("ip", "-n", ns, "link", "set", veth, "up")
        except subprocess.CalledProcessError as err:
            _cannot_run(f"cannot build network namespaces: {' '.join(err.cmd)}: {err.stderr.strip()}")
        yield Lab(site_ns=site, aws_ns=aws)
    finally:
        for ns in created:
            _run("ip", "netns", "delete", ns, check=False)


# --- daemons ------------------------------------------------------------------------------------
class Daemon:
    """A process started in a namespace with a private /run; stopped by its own PID, never by name."""

    def __init__(
        self, ns: str, argv: list[str], output: Path, env: dict[str, str] | None = None, prelude: str = ""
    ) -> None:
        """prelude: shell commands run in the daemon's private mount namespace before it starts (ending in &&)."""
        self.name = Path(argv[0]).name
        self.output = output
        launcher = ["ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private", "--"]
        with output.open("wb") as out:
            self.process = subprocess.Popen(
                [*launcher, "sh", "-c", private_run(prelude), "sh", *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={"PATH": SEARCH_PATH, "LC_ALL": "C", **(env or {})},
            )

    def wait_ready(self, ready: Callable[[], bool]) -> None:
        def probe() -> bool:
            if self.process.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.process.returncode}:\n{self.output.read_text()}")
            return ready()

        _wait_for(f"{self.name} to start", probe, self.output.read_text)
        comm = Path(f"/proc/{self.process.pid}/comm").read_text().strip()
        assert comm == self.name[:15], f"PID {self.process.pid} is {comm!r}, not {self.name}: not ours to stop"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=WAIT_SECONDS)


class Charon(Daemon):
    """charon with kernel-libipsec and its own strongswan.conf, vici socket and log file."""

    def __init__(self, ns: str, directory: Path, rendered: str | None = None, prelude: str = "") -> None:
        """rendered: a strongswan.conf snippet (the site's strongswan-dlinfra.conf), included last so it wins."""
        directory.mkdir(parents=True)
        self.directory = directory
        self.conf = directory / "strongswan.conf"
        self.socket = directory / "charon.vici"
        self.log = directory / "charon.log"
        include = None
        if rendered is not None:
            include = directory / "rendered.conf"
            include.write_text(rendered)
        self.conf.write_text(charon_conf(CHARON_PLUGINS, self.socket, self.log, include=include))
        env = {"STRONGSWAN_CONF": str(self.conf)}
        super().__init__(ns, [str(CHARON)], directory / "charon.out", env, prelude)
        self.wait_ready(self.socket.exists)

    def swanctl(self, *args: str) -> str:
        argv = [_tool("swanctl"), *args, "--uri", f"unix://{self.socket}"]
        result = _run(*argv, check=False, env={"STRONGSWAN_CONF": str(self.conf)})
        if result.returncode != 0:
            pytest.fail(f"swanctl {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        return result.stdout

    def load(self, *configs: str) -> None:
        """Replace every loaded connection and secret with these swanctl.conf files, as a gateway would."""
        main = self.directory / "swanctl.conf"
        files = [main] if len(configs) == 1 else [self.directory / f"part{i}.conf" for i in range(len(configs))]
        for path, text in zip(files, configs, strict=True):
            path.touch(mode=0o600)  # it holds keys, like the real file on a gateway
            path.write_text(text)
        if len(configs) > 1:
            main.write_text("".join(f"include {path}\n" for path in files))
        self.swanctl("--load-all", "--noprompt", "--file", str(main))

    def sas(self) -> list[IkeSa]:
        return parse_sas(self.swanctl("--list-sas"))

    def up(self, name: str) -> IkeSa | None:
        """The tunnel's IKE_SA if it is ESTABLISHED with an INSTALLED CHILD_SA."""
        return next((ike for ike in self.sas() if ike.name == name and is_up(ike)), None)

    def all_up(self, *names: str) -> dict[str, IkeSa] | None:
        found = {name: self.up(name) for name in names}
        return {n: ike for n, ike in found.items() if ike is not None} if all(found.values()) else None

    def packets_out(self, name: str) -> int:
        """Packets the tunnel's installed CHILD_SAs have sent."""
        ike = self.up(name)
        return sum(c.packets_out for c in ike.children if c.state == "INSTALLED") if ike else 0

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


@contextlib.contextmanager
def charons(lab: Lab, directory: Path, view: SiteVpnView | None = None) -> Iterator[tuple[Charon, Charon]]:
    """(site, aws) charons, stopped again whatever happens; the site's runs the view's rendered charon settings."""
    started: list[Charon] = []
    try:
        started.append(Charon(lab.site_ns, directory / "site", render_charon(view or make_view())))
        started.append(Charon(lab.aws_ns, directory / "aws", aws_side.strongswan_conf()))
        yield started[0], started[1]
    finally:
        for charon in started:
            charon.stop()


def logs(site: Charon, aws: Charon) -> str:
    return f"--- site log ---\n{site.log_text()[-4000:]}\n--- aws log ---\n{aws.log_text()[-4000:]}"


def wait_up(site: Charon, aws: Charon, *names: str) -> dict[str, IkeSa]:
    what = f"{', '.join(names)} ESTABLISHED with an INSTALLED CHILD_SA"
    return _wait_for(what, lambda: site.all_up(*names), lambda: logs(site, aws))


def wait_for_log(site: Charon, aws: Charon, pattern: str) -> None:
    regex = re.compile(pattern)
    _wait_for(f"site log line /{pattern}/", lambda: regex.search(site.log_text()), lambda: logs(site, aws))


def bring_up(site: Charon, aws: Charon, view: SiteVpnView) -> dict[str, IkeSa]:
    """AWS first, so the site's start_action meets a ready responder; the site initiates on load."""
    aws.load(aws_peer(view, 1), aws_peer(view, 2))
    site.load(render_swanctl(view))
    return wait_up(site, aws, *TUNNELS)


# --- strongSwan ---------------------------------------------------------------------------------
def test_rendered_site_config_brings_up_both_tunnels_and_carries_traffic(lab: Lab, tmp_path: Path) -> None:
    view = make_view()
    with charons(lab, tmp_path) as (site, aws):
        sas = bring_up(site, aws, view)
        for name in TUNNELS:
            # The first choice of the AWS_* constants wins on both phases.
            assert sas[name].algorithms == "AES_GCM_16-256/PRF_HMAC_SHA2_384/ECP_384"
            (child,) = sas[name].children
            assert child.protocol == "ESP:AES_GCM_16-256"
            assert child.local_ts == (view.lan_cidr,)
            assert child.remote_ts == view.remote_cidrs
        result = ping(lab.site_ns, SITE_LAN_HOST, VPC_HOST)
        assert result.returncode == 0, result.stdout + result.stderr
        assert sum(site.packets_out(name) for name in TUNNELS) >= 3
        for text in (site.log_text(), aws.log_text(), site.output.read_text(), aws.output.read_text()):
            assert PSKS[1] not in text and PSKS[2] not in text


def test_site_reopens_a_tunnel_that_aws_closes(lab: Lab, tmp_path: Path) -> None:
    with charons(lab, tmp_path) as (site, aws):
        before = bring_up(site, aws, make_view())
        aws.swanctl("--terminate", "--ike", "aws-peer-tunnel2", "--timeout", TERMINATE_SECONDS)

        def reopened() -> dict[str, IkeSa] | None:
            sas = site.all_up(*TUNNELS)
            return sas if sas and sas["aws-tunnel2"].unique_id != before["aws-tunnel2"].unique_id else None

        # close_action = start: the site re-creates the tunnel at once, as a new IKE_SA.
        after = _wait_for("tunnel 2 to come back as a new IKE_SA", reopened, lambda: logs(site, aws))
        assert after["aws-tunnel1"].unique_id == before["aws-tunnel1"].unique_id


def test_traffic_moves_to_the_other_tunnel_when_one_stays_down(lab: Lab, tmp_path: Path) -> None:
    view = make_view()
    with charons(lab, tmp_path) as (site, aws):
        bring_up(site, aws, view)
        assert ping(lab.site_ns, SITE_LAN_HOST, VPC_HOST).returncode == 0
        # Both tunnels hold the same selectors; strongSwan sends through one of them.
        carrying = 1 if site.packets_out("aws-tunnel1") >= 3 else 2
        other = 3 - carrying
        assert site.packets_out(f"aws-tunnel{carrying}") >= 3
        # AWS loses that tunnel for good: its endpoint forgets the tunnel and closes the SA, so the
        # site's attempt to reopen it is refused.
        aws.load(aws_peer(view, other))
        aws.swanctl("--terminate", "--ike", f"aws-peer-tunnel{carrying}", "--timeout", TERMINATE_SECONDS)
        wait_for_log(site, aws, rf"<aws-tunnel{carrying}\|\d+> received NO_PROPOSAL_CHOSEN")
        assert site.up(f"aws-tunnel{carrying}") is None
        before = site.packets_out(f"aws-tunnel{other}")
        result = ping(lab.site_ns, SITE_LAN_HOST, VPC_HOST)
        assert result.returncode == 0, result.stdout + result.stderr
        assert site.packets_out(f"aws-tunnel{other}") >= before + 3


_REPLY = re.compile(r"^\[(?P<ts>\d+\.\d+)\] \d+ bytes from ")


def first_reply_after(output: Path, after: float) -> float | None:
    """Wall-clock time of the first ping reply later than `after`, from `ping -D` output."""
    for line in output.read_text().splitlines():
        if (m := _REPLY.match(line)) and float(m["ts"]) > after:
            return float(m["ts"])
    return None


def test_traffic_fails_over_when_an_aws_endpoint_goes_silent(lab: Lab, tmp_path: Path) -> None:
    """AWS's endpoint maintenance: the endpoint of the carrying tunnel stops answering, without a word."""
    view = make_view()
    budget = failover_budget(render_charon(view), render_swanctl(view), render_frr(view))
    with charons(lab, tmp_path, view) as (site, aws):
        bring_up(site, aws, view)
        assert ping(lab.site_ns, SITE_LAN_HOST, VPC_HOST).returncode == 0
        carrying = 1 if site.packets_out("aws-tunnel1") >= 3 else 2
        other = 3 - carrying
        silent = AWS_TUNNEL_IPS[carrying]
        output = tmp_path / "ping.out"
        argv = ["ip", "netns", "exec", lab.site_ns, "ping", "-n", "-D", "-O", "-i", "0.2", "-W", "1",
                "-w", str(COMMAND_SECONDS), "-I", SITE_LAN_HOST, VPC_HOST]  # fmt: skip
        with output.open("w") as out:
            pinger = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={"PATH": SEARCH_PATH})
        try:
            time.sleep(1.0)
            baseline = site.packets_out(f"aws-tunnel{other}")
            # The endpoint goes silent: its address leaves the AWS namespace, so nothing answers there. The
            # other endpoint's address is a secondary of the same /24, which the kernel would delete with it.
            sysctl = ["ip", "netns", "exec", lab.aws_ns, "sysctl", "-q", "-w"]
            _run(*sysctl, "net.ipv4.conf.veth-aws.promote_secondaries=1")
            silent_at = time.time()
            _run("ip", "-n", lab.aws_ns, "addr", "del", f"{silent}/24", "dev", "veth-aws")
            deadline = time.monotonic() + budget.end_to_end + WAIT_SECONDS
            # The site's side: its packets leave through the other tunnel (the IPsec policies moved to its SA).
            while site.packets_out(f"aws-tunnel{other}") < baseline + 3:
                if time.monotonic() > deadline:
                    pytest.fail(f"the site kept sending into the dead tunnel\n{logs(site, aws)}")
                time.sleep(0.1)
            site_moved = time.time() - silent_at
            # End to end: replies come back too once AWS's side has cleared the dead tunnel (its DPD timeout: a
            # static site, so nothing else tells AWS).
            # A reply a second after the silence began cannot have crossed the dead tunnel.
            while (resumed := first_reply_after(output, silent_at + 1.0)) is None:
                if time.monotonic() > deadline or pinger.poll() is not None:
                    pytest.fail(f"traffic did not resume\n{output.read_text()[-300:]}\n{logs(site, aws)}")
                time.sleep(0.1)
        finally:
            pinger.terminate()
            pinger.wait(timeout=WAIT_SECONDS)
        end_to_end = resumed - silent_at
        print(f"\nAWS endpoint {silent} silent: the site sends through tunnel {other} after {site_moved:.1f} s "
              f"(rendered worst case {budget.site:.1f} s = dpd_delay {budget.dpd_delay:.0f} s + 1 s clock + "
              f"IKE give-up {budget.ike_give_up:.1f} s); replies resume after {end_to_end:.1f} s "
              f"(AWS's DPD: worst case {budget.aws:.1f} s)")  # fmt: skip
        # The rendered retransmission schedule is what charon ran (3 retransmissions, not the default 5).
        assert re.search(rf"<aws-tunnel{carrying}\|\d+> giving up after 3 retransmits", site.log_text()), logs(
            site, aws
        )
        # Polling swanctl for the counters adds a few tenths of a second (more on a loaded machine).
        assert site_moved <= 30 and site_moved <= budget.site + 2 and budget.site <= 30
        # AWS's DPD, plus the test charon's whole-second clock and the few seconds the lab's polling adds.
        assert end_to_end <= budget.end_to_end + 1 + 3
        # The endpoint returns: the site, still retrying (dpd_action restart, keyingtries 0), reopens the tunnel.
        returned_at = time.monotonic()
        _run("ip", "-n", lab.aws_ns, "addr", "add", f"{silent}/24", "dev", "veth-aws")
        while site.up(f"aws-tunnel{carrying}") is None:
            if time.monotonic() - returned_at > budget.ike_give_up + WAIT_SECONDS:
                pytest.fail(f"tunnel {carrying} did not come back\n{logs(site, aws)}")
            time.sleep(0.2)
        print(f"tunnel {carrying} back {time.monotonic() - returned_at:.1f} s after its endpoint returned")
        assert ping(lab.site_ns, SITE_LAN_HOST, VPC_HOST).returncode == 0


def test_aws_initiated_rekeys_lose_no_packets(lab: Lab, tmp_path: Path) -> None:
    view = make_view()
    with charons(lab, tmp_path, view) as (site, aws):
        bring_up(site, aws, view)
        output = tmp_path / "ping.out"
        argv = ["ip", "netns", "exec", lab.site_ns, "ping", "-n", "-D", "-i", "0.1", "-W", str(WAIT_SECONDS),
                "-c", "60", "-I", SITE_LAN_HOST, VPC_HOST]  # fmt: skip
        with output.open("w") as out:
            pinger = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={"PATH": SEARCH_PATH})
        try:
            time.sleep(1.0)
            # AWS rekeys on its own schedule (rekey margin and fuzz); here, both tunnels' IKE and CHILD_SAs at once.
            for n in (1, 2):
                aws.swanctl("--rekey", "--child", f"aws-peer-tunnel{n}")
                aws.swanctl("--rekey", "--ike", f"aws-peer-tunnel{n}")
            pinger.wait(timeout=WAIT_SECONDS)
        finally:
            if pinger.poll() is None:
                pinger.terminate()
                pinger.wait(timeout=WAIT_SECONDS)
        text = output.read_text()
        assert "60 packets transmitted, 60 received, 0% packet loss" in text, text[-500:]
        # Each tunnel's IKE_SA was rekeyed in place and its CHILD_SA replaced by a new one, all while the
        # pings above crossed without loss.
        log = site.log_text()
        for n in (1, 2):
            assert re.search(rf"IKE_SA aws-tunnel{n}\[\d+\] rekeyed", log), log[-3000:]
            assert len(re.findall(rf"CHILD_SA aws-tunnel{n}\{{\d+\}} established", log)) >= 2, log[-3000:]
        assert site.all_up(*TUNNELS) is not None


def test_route_based_rendering_drives_the_interface_hook_with_each_tunnels_if_id(lab: Lab, tmp_path: Path) -> None:
    """kernel-libipsec cannot bind SAs to XFRM interfaces, so there are no interfaces here: this shows that charon
    takes the route-based swanctl.conf unmodified, brings both tunnels up with 0.0.0.0/0 selectors, and runs the
    rendered updown command with the tunnel's if_id as its SAs come and go (what dlinfra-xfrm relies on)."""
    view = make_view(tunnel_mode="route")
    calls = tmp_path / "updown.log"
    recorder = tmp_path / "recorder.sh"
    recorder.write_text(f'#!/bin/sh\necho "$1 $PLUTO_VERB $PLUTO_IF_ID_OUT" >> {calls}\n')
    recorder.chmod(0o755)
    # The rendered path, in the site charon's own mount namespace only: the host's /usr/local/sbin is untouched.
    sbin = str(Path(XFRM_SCRIPT).parent)
    prelude = f"mount -t tmpfs -o mode=0755,size=1m dlinfra-test-sbin {sbin} && cp {recorder} {XFRM_SCRIPT} && "
    site = aws = None
    try:
        site = Charon(lab.site_ns, tmp_path / "site", render_charon(view), prelude)
        aws = Charon(lab.aws_ns, tmp_path / "aws", aws_side.strongswan_conf())
        sas = bring_up(site, aws, view)
        for name in TUNNELS:
            (child,) = sas[name].children
            assert child.local_ts == ("0.0.0.0/0",) and child.remote_ts == ("0.0.0.0/0",)
        _wait_for("updown for both tunnels", lambda: calls.exists() and len(calls.read_text().splitlines()) >= 2)
        assert sorted(calls.read_text().splitlines()) == ["updown up-client 1", "updown up-client 2"]
        # AWS closes tunnel 2: its interface goes down. (Its return is the VM harness's to show: without if_id,
        # kernel-libipsec routes everything into tunnel 1's 0.0.0.0/0 SA, IKE to endpoint 2 included.)
        aws.swanctl("--terminate", "--ike", "aws-peer-tunnel2", "--timeout", TERMINATE_SECONDS)
        _wait_for("tunnel 2's down event", lambda: len(calls.read_text().splitlines()) >= 3, lambda: logs(site, aws))
        assert calls.read_text().splitlines()[2] == "updown down-client 2"
    finally:
        for charon in (site, aws):
            if charon is not None:
                charon.stop()


def test_wrong_preshared_key_fails_authentication(lab: Lab, tmp_path: Path) -> None:
    view = make_view()
    with charons(lab, tmp_path) as (site, aws):
        aws.load(aws_peer(view, 1, psk="wrong.psk.tunnel1"), aws_peer(view, 2))
        site.load(render_swanctl(view))
        wait_for_log(site, aws, r"<aws-tunnel1\|\d+> received AUTHENTICATION_FAILED notify error")
        # The other tunnel, with the right key, comes up beside the failing one.
        wait_up(site, aws, "aws-tunnel2")
        assert not [sa for sa in site.sas() if sa.name == "aws-tunnel1" and sa.state == "ESTABLISHED"]
        assert "wrong.psk.tunnel1" not in site.log_text() + aws.log_text()


def test_proposal_mismatch_fails_with_no_proposal_chosen(lab: Lab, tmp_path: Path) -> None:
    view = make_view()
    with charons(lab, tmp_path) as (site, aws):
        # An AWS side configured outside dlinfra's proposal set: AES-128, SHA-1, DH group 14.
        outside = re.sub(r"(?m)^(\s+)proposals = .*$", r"\1proposals = aes128-sha1-modp2048", aws_peer(view, 1))
        assert "proposals = aes128-sha1-modp2048\n" in outside
        aws.load(outside, aws_peer(view, 2))
        site.load(render_swanctl(view))
        wait_for_log(site, aws, r"<aws-tunnel1\|\d+> received NO_PROPOSAL_CHOSEN notify error")
        wait_up(site, aws, "aws-tunnel2")
        assert not [sa for sa in site.sas() if sa.name == "aws-tunnel1" and sa.state == "ESTABLISHED"]


# --- FRR / BGP ----------------------------------------------------------------------------------
@pytest.mark.parametrize("routing", ["bgp", "static"])
def test_rendered_frr_conf_passes_frr_dry_run(tmp_path: Path, routing: str) -> None:
    _require_frr()
    conf = tmp_path / "frr.conf"
    # A static site still runs FRR for its hybrid nodes' pod routes.
    text = render_frr(dataclasses.replace(make_view(routing), pod_cidrs=("10.202.0.0/18",)))
    assert text is not None
    conf.write_text(text)
    result = _run(_tool("vtysh"), "--dryrun", "--inputfile", str(conf), check=False)
    assert result.returncode == 0, result.stdout + result.stderr


class Frr:
    """zebra (optional) and bgpd in a namespace, configured through vtysh as FRR's own service does.

    The daemons drop to the frr user, so their sockets, pid files and logs live in a directory that
    user owns (tmp_path is root-only); stop() removes it again.
    """

    def __init__(self, ns: str, config: str, *, with_zebra: bool) -> None:
        self.directory = d = Path(tempfile.mkdtemp(prefix=f"{ns}-frr-"))
        shutil.chown(d, "frr", "frr")
        self.daemons: list[Daemon] = []
        zserv = ["-z", str(d / "zserv.api")]
        try:
            daemons = [("zebra", zserv)] if with_zebra else []
            daemons.append(("bgpd", zserv if with_zebra else ["--no_zebra"]))
            for name, extra in daemons:
                argv = [str(FRR_BIN / name), "--vty_socket", str(d), "-P", "0", "-f", "/dev/null",
                        "-i", str(d / f"{name}.pid"), "--log", f"file:{d / name}.log", *extra]  # fmt: skip
                daemon = Daemon(ns, argv, d / f"{name}.out")
                self.daemons.append(daemon)
                daemon.wait_ready((d / f"{name}.vty").exists)
            (d / "frr.conf").write_text(config)
            self.vtysh("--inputfile", str(d / "frr.conf"))
        except BaseException:
            self.stop()
            raise

    def vtysh(self, *args: str) -> str:
        result = _run(_tool("vtysh"), "--vty_socket", str(self.directory), *args, check=False)
        if result.returncode != 0:
            pytest.fail(f"vtysh {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result.stdout

    def routes(self) -> dict[str, list[str]]:
        """Prefixes in the BGP table, each with the peers it came from (none when originated here)."""
        table = json.loads(self.vtysh("-d", "bgpd", "-c", "show bgp ipv4 unicast json")).get("routes", {})
        return {
            prefix: sorted(p["peerId"] for p in paths if p.get("peerId", "(unspec)") != "(unspec)")
            for prefix, paths in table.items()
        }

    def diagnostics(self) -> str:
        log = self.directory / "bgpd.log"
        return self.vtysh("-d", "bgpd", "-c", "show bgp summary") + (log.read_text()[-3000:] if log.exists() else "")

    def stop(self) -> None:
        for daemon in self.daemons:
            daemon.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def aws_bgp_config(view: SiteVpnView) -> str:
    """The transit gateway's side of BGP, played by a plain bgpd (AWS's config is not ours to render)."""
    lines = [
        f"router bgp {view.remote_asn}",
        f" bgp router-id {AWS_TUNNEL_IPS[1]}",
        " no bgp ebgp-requires-policy",
        " no bgp network import-check",
    ]
    for t in view.tunnels:
        peer = t.site_inside_ip
        lines += [
            f" neighbor {peer} remote-as {view.local_asn}",
            f" neighbor {peer} update-source {t.aws_inside_ip}",
            f" neighbor {peer} disable-connected-check",
            f" neighbor {peer} timers 10 30",
            # Retry every second rather than after FRR's 120 s default, to keep the test short.
            f" neighbor {peer} timers connect 1",
        ]
    lines += [
        " address-family ipv4 unicast",
        *(f"  network {c}" for c in view.remote_cidrs),
        " exit-address-family",
    ]
    return "\n".join(lines) + "\n"


def test_bgp_runs_over_both_tunnels_inside_addresses(lab: Lab, tmp_path: Path) -> None:
    _require_frr()
    view = make_view("bgp")
    site_ips = sorted(t.site_inside_ip for t in view.tunnels)
    aws_ips = sorted(t.aws_inside_ip for t in view.tunnels)
    frrs: list[Frr] = []
    try:
        # FRR first, as at boot: zebra puts the site's inside addresses on lo (frr.conf says so),
        # and the tunnels' selectors need them in place.
        site_frr = Frr(lab.site_ns, render_frr(view) or "", with_zebra=True)
        frrs.append(site_frr)
        aws_frr = Frr(lab.aws_ns, aws_bgp_config(view), with_zebra=False)
        frrs.append(aws_frr)
        with charons(lab, tmp_path) as (site, aws):
            sas = bring_up(site, aws, view)
            for tunnel in view.tunnels:
                (child,) = sas[f"aws-tunnel{tunnel.number}"].children
                assert f"{tunnel.site_inside_ip}/32" in child.local_ts
                assert f"{tunnel.aws_inside_ip}/32" in child.remote_ts
            _wait_for(
                "BGP over both tunnels: the site LAN at AWS and the VPCs at the site, each via both peers",
                lambda: (
                    aws_frr.routes().get(view.lan_cidr) == site_ips
                    and all(site_frr.routes().get(c) == aws_ips for c in view.remote_cidrs)
                ),
                lambda: f"--- aws ---\n{aws_frr.diagnostics()}\n--- site ---\n{site_frr.diagnostics()}",
            )
            # The site announces its own prefix and nothing else.
            assert set(aws_frr.routes()) == {view.lan_cidr, *view.remote_cidrs}
            # BGP's transport really is the tunnel: each inside pair pings, and so does the LAN.
            for tunnel in view.tunnels:
                result = ping(lab.site_ns, tunnel.site_inside_ip, tunnel.aws_inside_ip)
                assert result.returncode == 0, result.stdout + result.stderr
            assert ping(lab.site_ns, SITE_LAN_HOST, VPC_HOST).returncode == 0
    finally:
        for frr in frrs:
            frr.stop()


# --- hybrid nodes: Cilium's BGP to the site gateway -----------------------------------------------
# A third namespace plays one hybrid node on the site LAN: its pod block is carved from the view's pod
# range, and its "pod" is an address on its lo.
HYBRID_POD_RANGE = "10.202.0.0/18"
NODE_LAN_IP = "10.128.0.20"
NODE_POD_BLOCK = "10.202.0.128/25"
NODE_POD_IP = "10.202.0.130"
# kernel-libipsec routes each local selector from a local address inside it (see the lab fixture), so the
# gateway namespace holds one stand-in address in the pod range, outside the node's block, while the test runs.
GATEWAY_POD_STAND_IN = "10.202.0.1"
# What a node must not get through: another range, the site's whole aggregate, and the LAN itself.
ROGUE_PREFIXES = ("10.203.0.0/25", HYBRID_POD_RANGE, "10.128.0.0/24")


def make_hybrid_view() -> SiteVpnView:
    return dataclasses.replace(make_view("bgp"), pod_cidrs=(HYBRID_POD_RANGE,))


def node_speaker_config(site: str, asn: int, gateway_ip: str, announce: tuple[str, ...]) -> str:
    """Cilium's side of the session, played by bgpd, with the numbers of the declared CiliumBGP* objects."""
    (instance,) = cilium.cilium_bgp_cluster_config_spec(site, asn, gateway_ip)["bgpInstances"]
    (peer,) = instance["peers"]
    timers = cilium.cilium_bgp_peer_config_spec(site)["timers"]
    address = peer["peerAddress"]
    lines = [
        f"router bgp {instance['localASN']}",
        f" bgp router-id {NODE_LAN_IP}",
        " no bgp network import-check",
        f" neighbor {address} remote-as {peer['peerASN']}",
        f" neighbor {address} timers {timers['keepAliveTimeSeconds']} {timers['holdTimeSeconds']}",
        f" neighbor {address} timers connect 1",
        " address-family ipv4 unicast",
        *(f"  network {prefix}" for prefix in announce),
        " exit-address-family",
    ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def hybrid_node(lab: Lab, gateway_ip: str) -> Iterator[str]:
    """A node namespace joined to the site namespace by a veth on the site LAN; removed again afterwards."""
    node = lab.site_ns.replace("-site", "-node")
    lan = ipaddress.IPv4Network(make_view().lan_cidr)
    try:
        _run("ip", "netns", "add", node)
        _run("ip", "-n", lab.site_ns, "link", "add", "veth-lan", "type", "veth", "peer", "name", "veth-node",
             "netns", node)  # fmt: skip
        _run("ip", "-n", lab.site_ns, "addr", "add", f"{gateway_ip}/{lan.prefixlen}", "dev", "veth-lan")
        _run("ip", "-n", node, "addr", "add", f"{NODE_LAN_IP}/{lan.prefixlen}", "dev", "veth-node")
        # This kernel has no dummy interfaces: the pod's address sits on the node's lo, as the LAN host does.
        _run("ip", "-n", node, "addr", "add", f"{NODE_POD_IP}/32", "dev", "lo")
        for ns, link in ((lab.site_ns, "veth-lan"), (node, "veth-node"), (node, "lo")):
            _run("ip", "-n", ns, "link", "set", link, "up")
        # The node's default route is its site gateway, as on a real site LAN.
        _run("ip", "-n", node, "route", "add", "default", "via", gateway_ip)
        # The gateway forwards between the tunnels and the LAN.
        _run("ip", "netns", "exec", lab.site_ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        _run("ip", "-n", lab.site_ns, "addr", "add", f"{GATEWAY_POD_STAND_IN}/32", "dev", "lo")
        yield node
    finally:
        _run("ip", "-n", lab.site_ns, "addr", "del", f"{GATEWAY_POD_STAND_IN}/32", "dev", "lo", check=False)
        _run("ip", "-n", lab.site_ns, "link", "delete", "veth-lan", check=False)
        _run("ip", "netns", "delete", node, check=False)


def kernel_route(ns: str, prefix: str) -> dict[str, str] | None:
    """The main table's route for exactly this prefix, if the kernel has one."""
    result = _run("ip", "-n", ns, "-j", "route", "show", "table", "main", "exact", prefix)
    routes = json.loads(result.stdout or "[]")
    return routes[0] if routes else None


def test_gateway_learns_node_pod_blocks_and_carries_vpc_traffic_to_the_pod(lab: Lab, tmp_path: Path) -> None:
    _require_frr()
    view = make_hybrid_view()
    gateway_ip = str(hybrid_routing.gateway_lan_ip(view.lan_cidr))
    frrs: list[Frr] = []
    with hybrid_node(lab, gateway_ip) as node:
        try:
            # The gateway runs the rendered frr.conf as is; the node announces its block and the rogue prefixes.
            site_frr = Frr(lab.site_ns, render_frr(view) or "", with_zebra=True)
            frrs.append(site_frr)
            announce = (NODE_POD_BLOCK, *ROGUE_PREFIXES)
            node_frr = Frr(node, node_speaker_config(view.site, view.local_asn, gateway_ip, announce),
                           with_zebra=False)  # fmt: skip
            frrs.append(node_frr)
            aws_frr = Frr(lab.aws_ns, aws_bgp_config(view), with_zebra=False)
            frrs.append(aws_frr)

            def diagnostics() -> str:
                return f"--- site ---\n{site_frr.diagnostics()}\n--- node ---\n{node_frr.diagnostics()}"

            _wait_for(
                "the node's pod block in the gateway's kernel, via the node",
                lambda: (kernel_route(lab.site_ns, NODE_POD_BLOCK) or {}).get("gateway") == NODE_LAN_IP,
                diagnostics,
            )
            route = kernel_route(lab.site_ns, NODE_POD_BLOCK) or {}
            assert route["protocol"] == "bgp" and route["dev"] == "veth-lan", route
            assert site_frr.routes()[NODE_POD_BLOCK] == [NODE_LAN_IP]
            # The negative: the same session offered prefixes outside what the node may claim; the
            # gateway kept none of them, neither in BGP nor in the kernel.
            assert set(announce) <= set(node_frr.routes())
            for prefix in ROGUE_PREFIXES:
                assert prefix not in site_frr.routes() or NODE_LAN_IP not in site_frr.routes()[prefix], prefix
                assert kernel_route(lab.site_ns, prefix) is None, prefix
            with charons(lab, tmp_path) as (site, aws):
                bring_up(site, aws, view)
                aws_ips = sorted(t.aws_inside_ip for t in view.tunnels)
                # AWS hears the aggregate pod range, never the node's block.
                expected_at_aws = {view.lan_cidr, HYBRID_POD_RANGE, *view.remote_cidrs}
                _wait_for(
                    "BGP over both tunnels: the VPCs at the site, the LAN and the aggregate pod range at AWS",
                    lambda: (
                        all(site_frr.routes().get(c) == aws_ips for c in view.remote_cidrs)
                        and set(aws_frr.routes()) >= expected_at_aws
                    ),
                    diagnostics,
                )
                assert set(aws_frr.routes()) == expected_at_aws
                # AWS's routes stay out of the kernel's main table: the IPsec policies carry that traffic.
                for cidr in view.remote_cidrs:
                    assert kernel_route(lab.site_ns, cidr) is None, cidr
                before = site.packets_out("aws-tunnel1") + site.packets_out("aws-tunnel2")
                # From a VPC address through the tunnel to the pod, and the replies back.
                result = ping(lab.aws_ns, VPC_HOST, NODE_POD_IP)
                assert result.returncode == 0, result.stdout + result.stderr
                assert site.packets_out("aws-tunnel1") + site.packets_out("aws-tunnel2") >= before + 3
        finally:
            for frr in frrs:
                frr.stop()
