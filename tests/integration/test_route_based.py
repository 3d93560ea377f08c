"""The route-based site gateway, as `dlinfra site render` writes it, against the AWS side, in a kernel with XFRM.

In the XFRM guest (tests/integration/xfrm_vm.py) three namespaces play the site LAN (a host that is also a
hybrid node, its pod address on lo), the site gateway, and AWS (both tunnel endpoints, the transit gateway's
BGP, and VPC addresses on lo), the gateway and AWS joined by a veth carrying TEST-NET-1 addresses. The
gateway runs every rendered file unmodified, each where the gateway cookbook installs it or loaded the way
the cookbook loads it: swanctl.conf, the strongswan.conf snippet (included last), dlinfra-xfrm at
/usr/local/sbin (a tmpfs in the site charon's own mount namespace; `start` before charon, as the systemd unit
does, and charon's updown), the sysctl and nftables files, and frr.conf through vtysh into zebra, staticd and
bgpd. The AWS side is tests/integration/aws_side/, written from AWS's documentation.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import shlex
import subprocess
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from dlinfra.model import hybrid_routing
from dlinfra.render.failover import failover_budget
from dlinfra.render.frr import render_frr
from dlinfra.render.kernel import XFRM_SCRIPT, render_nftables, render_sysctl, render_xfrm_script
from dlinfra.render.site_vpn import SiteVpnView, Tunnel
from dlinfra.render.strongswan import render_charon, render_swanctl
from tests.integration import aws_side
from tests.integration.strongswan_lab import (
    COMMAND_SECONDS,
    STOP_GRACE_SECONDS,
    WAIT_SECONDS,
    charon_conf,
    esp_states,
    is_up,
    parse_sas,
    private_run,
)
from tests.integration.xfrm_vm import GuestVm

pytestmark = pytest.mark.vpn_peer

AWS_OUTSIDE = {1: "192.0.2.1", 2: "192.0.2.5"}
SITE_OUTSIDE = "192.0.2.2"
INSIDE_CIDRS = {1: "169.254.10.0/30", 2: "169.254.10.4/30"}
PSKS = {1: "test.psk.tunnel1", 2: "test.psk.tunnel2"}
LAN, POD_RANGE = "10.128.0.0/20", "10.202.0.0/18"
VPCS = ("10.0.0.0/16", "10.1.0.0/16")
VPC_HOST = "10.0.0.10"  # on lo in the AWS namespace
# More VPC addresses on lo there: ECMP hashes each flow to a tunnel, on each side on its own; the failover test
# picks one whose two directions share a tunnel, so silencing it costs both sides' detection.
VPC_HOSTS = tuple(f"10.0.0.{n}" for n in range(10, 18))
# The site's default route: the internet beyond its uplink, played by the AWS namespace, which (as AWS's
# endpoints and any router would) takes only IKE and ESP for the tunnels' outside addresses and drops the rest.
ISP_ROUTER = "192.0.2.254"
# What must never leave the site's uplink unencrypted: the tunnels' inside addresses and AWS's networks.
CLEARTEXT_WATCH = ("169.254.0.0/16", *VPCS)
LAN_HOST = "10.128.0.20"  # the LAN namespace: a site host that is also a hybrid node
NODE_POD_BLOCK, POD_HOST = "10.202.0.128/25", "10.202.0.130"  # the node's pod block (Cilium), a pod on its lo
GATEWAY_LAN_IP = str(hybrid_routing.gateway_lan_ip(LAN))
CHARON_PLUGINS = "nonce openssl kdf kernel-netlink socket-default vici updown"
FRR_BIN = Path("/usr/lib/frr")
# Guest paths: unix sockets cannot live on the 9p share, so daemons keep theirs on the guest's tmpfs.
RUN = Path("/tmp/dlinfra-route")
SITE_FAILOVER_LIMIT = 30.0  # the gateway sends over the other tunnel within 30 s of an AWS endpoint going silent


def make_view(routing: str) -> SiteVpnView:
    tunnels = tuple(
        Tunnel(number=n, outside_ip=AWS_OUTSIDE[n], inside_cidr=INSIDE_CIDRS[n], preshared_key=PSKS[n]) for n in (1, 2)
    )
    return SiteVpnView(
        site="lab1",
        local_public_ip=SITE_OUTSIDE,
        lan_cidr=LAN,
        remote_cidrs=VPCS,
        tunnels=(tunnels[0], tunnels[1]),
        routing=routing,
        local_asn=65101,
        remote_asn=64512,
        pod_cidrs=(POD_RANGE,),
    )


def _cannot_run(reason: str) -> NoReturn:
    # In CI a check that cannot run is a failure, not a skip.
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"route-based vpn_peer check cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason)


# The shell every guest job starts with: strict mode, the lab's paths, and short names for its tools.
PRELUDE = f"""\
set -eu
export LC_ALL=C
run={RUN}
stop_grace={STOP_GRACE_SECONDS}
sw() {{
    side=$1; shift
    STRONGSWAN_CONF=$run/$side/strongswan.conf command swanctl "$@" --uri unix://$run/$side/charon.vici
}}
vty() {{ side=$1; shift; vtysh --vty_socket $run/frr-$side "$@"; }}
now() {{ date +%s.%N; }}
wait_until() {{
    limit=$1 what=$2; shift 2; i=0
    until eval "$*"; do
        i=$((i + 1))
        [ $i -lt $((limit * 5)) ] || {{ echo "timed out after ${{limit}}s waiting for $what" >&2; return 1; }}
        sleep 0.2
    done
}}
# A daemon in a namespace with a private /run; $! is the daemon's own PID (everything execs in place).
daemon() {{
    ns=$1 pidfile=$2 out=$3 prelude=$4; shift 4
    ip netns exec $ns unshare --mount --propagation private -- sh -c "$prelude" sh "$@" >$out 2>&1 </dev/null &
    echo $! > $pidfile
}}
# Whether PID $1 still runs: a zombie (state Z, waiting for PID 1 to reap it) has stopped.
alive() {{ [ -r /proc/$1/stat ] && [ "$(sed 's/.*) //' /proc/$1/stat 2>/dev/null | cut -c1)" != Z ]; }}
# Wait up to $1 seconds for every PID after it to stop; false if one still runs.
all_gone() {{
    limit=$1; shift; i=0
    while :; do
        left=; for p in "$@"; do ! alive $p || left="$left $p"; done
        [ -n "$left" ] || return 0
        i=$((i + 1)); [ $i -lt $((limit * 10)) ] || return 1
        sleep 0.1
    done
}}
# Stop the daemons whose pid files are named: SIGTERM to all, one wait for all, then SIGKILL (saying on stderr
# what each was doing) for any still running after $stop_grace seconds, so a stop is bounded however many
# files there are and whatever a daemon does with SIGTERM.
stop_pids() {{
    pids=
    for f in "$@"; do [ -e $f ] || continue; pids="$pids $(cat $f 2>/dev/null || :)"; rm -f $f; done
    [ -n "${{pids# }}" ] || return 0
    kill $pids 2>/dev/null || :
    ! all_gone $stop_grace $pids || return 0
    for p in $pids; do
        alive $p || continue
        echo "stop_pids: $p ($(cat /proc/$p/comm 2>/dev/null)) still runs ${{stop_grace}}s after SIGTERM:" \
            "$(grep '^State' /proc/$p/status 2>/dev/null), wchan $(cat /proc/$p/wchan 2>/dev/null); SIGKILL" >&2
        kill -KILL $p 2>/dev/null || :
    done
    all_gone {WAIT_SECONDS} $pids || {{ echo "stop_pids: still running after SIGKILL:$left" >&2; return 1; }}
}}
link_up() {{ ip -n $1 -o link show $2 | grep -q ',UP'; }}
# A counter of the test's own (see setup_script): $1 namespace, $2 counter name.
packets() {{
    ip netns exec $1 nft list counter inet dlinfra_probe $2 | sed -n 's/.*packets \\([0-9]*\\).*/\\1/p'
}}
# Echo requests that entered tunnel interface xfrm$1 at the site; echo replies AWS sent into xfrm$1.
echoes() {{ packets site echo$1; }}
replies() {{ packets aws reply$1; }}
"""


@dataclasses.dataclass
class RouteLab:
    vm: GuestVm
    config: Path  # on the share: the rendered files and the AWS side's
    routing: str = ""  # what FRR runs now: "static", "bgp" or "" (none)

    def sh(self, script: str, what: str, timeout: float = COMMAND_SECONDS) -> str:
        result = self.vm.run(PRELUDE + f"cfg={self.config}\n" + script, timeout=timeout)
        if result.returncode != 0:
            pytest.fail(f"{what} failed in the guest ({result.returncode}):\n{result.stdout}{result.stderr}\n"
                        f"{self.diagnostics()}", pytrace=False)  # fmt: skip
        return result.stdout

    def diagnostics(self) -> str:
        result = self.vm.run(
            f"run={RUN}\nfor f in $run/site/charon.log $run/aws/charon.log $run/frr-site/bgpd.log "
            '$run/frr-aws/bgpd.log $run/frr-site/zebra.log; do echo "--- $f"; tail -n 40 $f 2>/dev/null; done\n'
            "ip -n site -d link show; ip -n site route; ip -n aws route; ip -n site xfrm state | grep -c '^src'\n"
            'for side in site aws; do [ -S $run/frr-$side/bgpd.vty ] || continue; echo "--- $side bgp"\n'
            "vtysh --vty_socket $run/frr-$side -c 'show bgp summary' -c 'show bgp ipv4 unicast' || :; done",
            timeout=WAIT_SECONDS,
        )
        return result.stdout[-12000:]

    def json(self, script: str, what: str) -> Any:
        return json.loads(self.sh(script, what))

    def poll(self, what: str, probe: Callable[[], Any], seconds: float = WAIT_SECONDS) -> Any:
        """probe() until truthy; each probe is a guest job (a few tenths of a second under TCG)."""
        for _ in range(int(seconds)):
            if value := probe():
                return value
            self.sh("sleep 1", "sleep")
        pytest.fail(f"timed out after {seconds:.0f}s waiting for {what}\n{self.diagnostics()}", pytrace=False)

    def use(self, routing: str) -> None:
        """Run the site's frr.conf for this routing (and the AWS side's), replacing what ran before."""
        if self.routing == routing:
            return
        stop = "stop_pids $run/frr-*.pid\nrm -rf $run/frr-site $run/frr-aws\n"
        stop += "".join(f"ip -n aws route del {p} 2>/dev/null || :\n" for p in (LAN, POD_RANGE))
        start = self._frr("site", f"frr-{routing}.conf", ("zebra", "staticd", "bgpd"))
        if routing == "bgp":
            start = self._frr("aws", "aws/frr.conf", ("zebra", "bgpd")) + start
        else:
            # The VPN's static routes on the transit gateway: the site's ranges over both tunnels.
            start += "".join(
                f"ip -n aws route replace {p} nexthop dev xfrm1 nexthop dev xfrm2\n" for p in (LAN, POD_RANGE)
            )
        self.routing = ""
        # Stopping up to five daemons and starting five, each wait up to WAIT_SECONDS.
        self.sh(stop + start, f"starting FRR ({routing})", timeout=10 * WAIT_SECONDS)
        self.routing = routing

    @staticmethod
    def _frr(side: str, conf: str, daemons: tuple[str, ...]) -> str:
        d = f"$run/frr-{side}"
        lines = [f"mkdir -p {d} && chown frr:frr {d}"]
        for name in daemons:
            argv = f"{FRR_BIN / name} --vty_socket {d} -P 0 -f /dev/null -i {d}/{name}.pid --log file:{d}/{name}.log"
            lines += [
                f"daemon {side} $run/frr-{side}-{name}.pid {d}/{name}.out {shlex.quote(private_run())}"
                f" {argv} -z {d}/zserv.api",
                f"wait_until {WAIT_SECONDS} '{name} in {side}' '[ -S {d}/{name}.vty ]'",
            ]
        lines.append(f"vty {side} --inputfile $cfg/{conf}")
        return "\n".join(lines) + "\n"

    # --- what the tests look at ----------------------------------------------------------------------
    def sas(self, side: str) -> str:
        return self.sh(f"sw {side} --list-sas", f"swanctl --list-sas ({side})")

    def route(self, ns: str, prefix: str) -> dict[str, Any]:
        routes = self.json(f"ip -n {ns} -j route show exact {prefix}", f"ip route show {prefix}")
        return routes[0] if routes else {}

    def bgp(self, side: str, command: str) -> Any:
        return self.json(f"vty {side} -c {shlex.quote(command + ' json')}", command)

    def established(self) -> dict[str, str]:
        peers = self.bgp("site", "show bgp ipv4 unicast summary").get("peers", {})
        return {ip: peer["state"] for ip, peer in peers.items() if ip.startswith("169.254.")}

    def esp(self, ns: str) -> dict[tuple[str, str], tuple[int, int]]:
        return esp_states(self.sh(f"ip -n {ns} -s xfrm state", "ip xfrm state"))


def rendered_files(view: SiteVpnView) -> dict[str, str]:
    """Every file `dlinfra site render` writes for the gateway, by its name there (site_files.GATEWAY_FILES)."""
    xfrm, frr = render_xfrm_script(view), render_frr(view)
    assert xfrm is not None and frr is not None
    return {
        "swanctl.conf": render_swanctl(view),
        "strongswan-dlinfra.conf": render_charon(view),
        "sysctl-dlinfra-gateway.conf": render_sysctl(view),
        "dlinfra-mss.nft": render_nftables(view),
        "dlinfra-xfrm": xfrm,
        f"frr-{view.routing}.conf": frr,
    }


def setup_script(config: Path) -> str:
    """Namespaces, the AWS side's interfaces, both charons, and the tunnels up (the site initiates)."""
    script = XFRM_SCRIPT
    sbin = str(Path(script).parent)
    # In the site charon's own mount namespace: the rendered script at its rendered path, and its `start`
    # before charon, as the cookbook's systemd unit runs it.
    site_prelude = (
        f"mount -t tmpfs -o mode=0755,size=1m dlinfra-test-sbin {sbin} && cp {config}/dlinfra-xfrm {script} && "
        f"chmod 0755 {script} && {script} start && "
    )
    aws = [f"addr add {AWS_OUTSIDE[n]}/24 dev veth-aws" for n in (1, 2)]
    for n in (1, 2):
        # Down until the tunnel's CHILD_SA is installed: the AWS side's updown (aws_side/updown) follows it.
        aws += [
            f"link add xfrm{n} type xfrm dev veth-aws if_id {n}",
            f"addr add {ipaddress.IPv4Network(INSIDE_CIDRS[n])[1]}/30 dev xfrm{n}",
        ]
    aws += [
        f"addr add {host}/32 dev lo"
        for host in sorted({*VPC_HOSTS, *(str(ipaddress.IPv4Network(v)[10]) for v in VPCS)})
    ]
    batches = {
        "aws": [*aws, f"addr add {ISP_ROUTER}/24 dev veth-aws", "link set lo up", "link set veth-aws up"],
        "site": [
            f"addr add {SITE_OUTSIDE}/24 dev veth-site",
            f"addr add {GATEWAY_LAN_IP}/{ipaddress.IPv4Network(LAN).prefixlen} dev veth-lan",
            "link set lo up",
            "link set veth-site up",
            "link set veth-lan up",
            f"route add default via {ISP_ROUTER}",
            # What the node's Cilium would announce over iBGP (test_vpn_peer proves that session).
            f"route add {NODE_POD_BLOCK} via {LAN_HOST}",
        ],
        "lan": [
            f"addr add {LAN_HOST}/{ipaddress.IPv4Network(LAN).prefixlen} dev veth-node",
            f"addr add {POD_HOST}/32 dev lo",
            "link set lo up",
            "link set veth-node up",
            f"route add default via {GATEWAY_LAN_IP}",
        ],
    }
    lines = [
        "rm -rf $run && mkdir -p $run/site $run/aws",
        "modprobe -a xfrm_interface xfrm_user esp4 veth nf_tables",
        "for ns in site aws lan; do ip netns add $ns; done",
        "ip -n site link add veth-site type veth peer name veth-aws netns aws",
        "ip -n site link add veth-lan type veth peer name veth-node netns lan",
    ]
    for ns, commands in batches.items():
        lines += [f"ip -n {ns} -batch - <<EOF", *commands, "EOF"]
    lines += [
        # The gateway's kernel settings and MSS clamping, loaded as the cookbook loads them.
        "ip netns exec site sysctl -q -p $cfg/sysctl-dlinfra-gateway.conf",
        "ip netns exec site nft -f $cfg/dlinfra-mss.nft",
        # The test's own counters (not part of the gateway): echo requests entering each tunnel interface, and,
        # on the wire (the uplink's egress hook, after IPsec: postrouting also sees what ESP is about to carry),
        # every packet for a tunnel's inside address or AWS's networks that leaves unencrypted. ESP carries the
        # tunnels' packets to the AWS endpoints' outside addresses. Logged too, so that a failure can say what
        # leaked (namespaces log only with nf_log_all_netns).
        "sysctl -q -w net.netfilter.nf_log_all_netns=1",
        "ip netns exec site nft -f - <<EOF",
        "table inet dlinfra_probe {",
        "    counter echo1 {}",
        "    counter echo2 {}",
        "    chain postrouting {",
        "        type filter hook postrouting priority 0; policy accept;",
        '        oifname "xfrm1" icmp type echo-request counter name "echo1"',
        '        oifname "xfrm2" icmp type echo-request counter name "echo2"',
        "    }",
        "}",
        "table netdev dlinfra_wire {",
        "    counter cleartext {}",
        "    chain egress {",
        '        type filter hook egress device "veth-site" priority 0; policy accept;',
        f"        ip daddr {{ {', '.join(CLEARTEXT_WATCH)} }}"
        ' counter name "cleartext" log prefix "dlinfra-cleartext: "',
        "    }",
        "}",
        "EOF",
        # AWS's side of the internet: echo replies leaving AWS into each tunnel (which tunnel AWS's return
        # traffic takes), and nothing but IKE and ESP for its endpoints accepted from the uplink.
        "ip netns exec aws nft -f - <<EOF",
        "table inet dlinfra_probe {",
        "    counter reply1 {}",
        "    counter reply2 {}",
        "    chain postrouting {",
        "        type filter hook postrouting priority 0; policy accept;",
        '        oifname "xfrm1" icmp type echo-reply counter name "reply1"',
        '        oifname "xfrm2" icmp type echo-reply counter name "reply2"',
        "    }",
        "    chain edge {",
        "        type filter hook prerouting priority -200; policy accept;",
        f'        iifname "veth-aws" ip daddr != {{ {AWS_OUTSIDE[1]}, {AWS_OUTSIDE[2]} }} drop',
        "    }",
        "}",
        "EOF",
        "for side in site aws; do cp $cfg/$side/strongswan.conf $run/$side/; done",
        "export STRONGSWAN_CONF=$run/aws/strongswan.conf",
        f"daemon aws $run/charon-aws.pid $run/aws/charon.out {shlex.quote(private_run())} /usr/lib/ipsec/charon",
        "export STRONGSWAN_CONF=$run/site/strongswan.conf",
        f"daemon site $run/charon-site.pid $run/site/charon.out {shlex.quote(private_run(site_prelude))}"
        " /usr/lib/ipsec/charon",
        "unset STRONGSWAN_CONF",
        f"wait_until {WAIT_SECONDS} charons '[ -S $run/site/charon.vici ] && [ -S $run/aws/charon.vici ]'",
        "sw aws --load-all --noprompt --file $cfg/aws/swanctl.conf >/dev/null",
        "sw site --load-all --noprompt --file $cfg/swanctl.conf >/dev/null",
        f"wait_until {WAIT_SECONDS} 'both tunnels' '[ $(sw site --list-sas | grep -c INSTALLED) -ge 2 ]'",
        f"wait_until {WAIT_SECONDS} 'xfrm1 and xfrm2 up on both sides' "
        "'link_up site xfrm1 && link_up site xfrm2 && link_up aws xfrm1 && link_up aws xfrm2'",
    ]
    return "\n".join(lines) + "\n"


def write_config(config: Path) -> None:
    views = {routing: make_view(routing) for routing in ("static", "bgp")}
    static, bgp = (rendered_files(v) for v in views.values())
    # Only frr.conf depends on the routing; one charon and one set of interfaces serve both.
    assert {k: v for k, v in static.items() if not k.startswith("frr")} == {
        k: v for k, v in bgp.items() if not k.startswith("frr")
    }
    for name, text in {**static, **bgp}.items():
        (config / name).write_text(text)
    (config / "swanctl.conf").chmod(0o600)
    (config / "dlinfra-xfrm").chmod(0o755)
    for side in ("site", "aws"):
        (config / side).mkdir()
    run = RUN
    (config / "site" / "strongswan.conf").write_text(
        charon_conf(
            CHARON_PLUGINS,
            run / "site/charon.vici",
            run / "site/charon.log",
            include=config / "strongswan-dlinfra.conf",
        )
    )
    aws = config / "aws"
    (aws / "aws-strongswan.conf").write_text(aws_side.strongswan_conf())
    (aws / "strongswan.conf").write_text(
        charon_conf(
            CHARON_PLUGINS, run / "aws/charon.vici", run / "aws/charon.log", include=aws / "aws-strongswan.conf"
        )
    )
    # The AWS side's updown hook, on the share (the guest sees the host's root, but not its /tmp).
    (aws / "updown").write_text(aws_side.updown_script())
    (aws / "updown").chmod(0o755)
    for n in (1, 2):
        text = aws_side.swanctl_conf(
            number=n, aws_outside=AWS_OUTSIDE[n], site_outside=SITE_OUTSIDE, psk=PSKS[n], updown=aws / "updown"
        )
        (aws / f"tunnel{n}.conf").write_text(text)
    (aws / "swanctl.conf").write_text("".join(f"include {aws}/tunnel{n}.conf\n" for n in (1, 2)))
    view = views["bgp"]
    (aws / "frr.conf").write_text(
        aws_side.frr_conf(
            aws_asn=view.remote_asn,
            site_asn=view.local_asn,
            inside_cidrs=[INSIDE_CIDRS[1], INSIDE_CIDRS[2]],
            networks=VPCS,
        )
    )


@pytest.fixture(scope="module")
def lab(xfrm_guest: GuestVm) -> Iterator[RouteLab]:
    for daemon in ("zebra", "staticd", "bgpd"):
        if not os.access(FRR_BIN / daemon, os.X_OK):
            _cannot_run(f"{FRR_BIN / daemon} not found (apt: frr)")
    config = xfrm_guest.share / "route-based"
    config.mkdir()
    write_config(config)
    lab = RouteLab(xfrm_guest, config)
    try:
        # Three waits, each up to WAIT_SECONDS, and the steps between them.
        lab.sh(setup_script(config), "bringing up the lab", timeout=4 * WAIT_SECONDS)
        yield lab
    finally:
        stopped = xfrm_guest.run(
            PRELUDE + "stop_pids $run/*.pid\nfor ns in site aws lan; do ip netns delete $ns 2>/dev/null || :; done\n",
            timeout=COMMAND_SECONDS,
        )
        if stopped.stderr:  # a daemon that needed SIGKILL: worth seeing, not the test's failure
            warnings.warn(f"stopping the route-based lab: {stopped.stderr.strip()}", stacklevel=1)
        stopped.check("stopping the route-based lab")


def test_stop_pids_kills_what_ignores_sigterm_and_names_it(tmp_path: Path) -> None:
    """The lab's teardown is bounded: a daemon that ignores SIGTERM gets SIGKILL after the grace, and stderr says
    which; one that stops on SIGTERM goes quietly. Runs on the host: stop_pids is plain sh."""
    script = (
        PRELUDE.replace(f"run={RUN}", f"run={tmp_path}").replace(f"stop_grace={STOP_GRACE_SECONDS}", "stop_grace=1")
        + """sh -c 'trap "" TERM; exec sleep 600' & echo $! > $run/stubborn.pid
sleep 600 & echo $! > $run/polite.pid
stubborn=$(cat $run/stubborn.pid) polite=$(cat $run/polite.pid)
stop_pids $run/*.pid
! kill -0 $stubborn 2>/dev/null && ! kill -0 $polite 2>/dev/null && ls $run
"""
    )
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=COMMAND_SECONDS, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # both pid files removed
    [line] = done.stderr.splitlines()
    assert "(sleep) still runs 1s after SIGTERM" in line and line.endswith("SIGKILL")


def site_inside(n: int) -> str:
    return str(ipaddress.IPv4Network(INSIDE_CIDRS[n])[2])


def aws_inside(n: int) -> str:
    return str(ipaddress.IPv4Network(INSIDE_CIDRS[n])[1])


# --- 1. both tunnels up, each on its own interface -------------------------------------------------------
def test_both_tunnels_are_up_each_bound_to_its_xfrm_interface(lab: RouteLab) -> None:
    for side, prefix in (("site", "aws-tunnel"), ("aws", "aws-peer-tunnel")):
        text = lab.sas(side)
        sas = {ike.name: ike for ike in parse_sas(text)}
        assert set(sas) == {f"{prefix}1", f"{prefix}2"}, text
        for ike in sas.values():
            assert is_up(ike), text
            (child,) = ike.children
            assert (child.local_ts, child.remote_ts) == (("0.0.0.0/0",), ("0.0.0.0/0",)), text
    # One SA pair per tunnel, both directions bound to the tunnel's if_id.
    states = lab.esp("site")
    assert {pair: if_id for pair, (if_id, _) in states.items()} == {
        **{(SITE_OUTSIDE, AWS_OUTSIDE[n]): n for n in (1, 2)},
        **{(AWS_OUTSIDE[n], SITE_OUTSIDE): n for n in (1, 2)},
    }, states
    # The interfaces dlinfra-xfrm created, brought up by charon's updown through the rendered path.
    for n in (1, 2):
        (link,) = lab.json(f"ip -n site -j -d address show dev xfrm{n}", f"ip address show xfrm{n}")
        assert "UP" in link["flags"] and link["mtu"] == 1422, link
        assert int(str(link["linkinfo"]["info_data"]["if_id"]), 0) == n, link
        assert [(a["local"], a["prefixlen"]) for a in link["addr_info"] if a["family"] == "inet"] == [
            (site_inside(n), 30)
        ], link
    rp = lab.sh("ip netns exec site sysctl -n net.ipv4.conf.xfrm1.rp_filter net.ipv4.conf.xfrm2.rp_filter", "sysctl")
    assert rp.split() == ["2", "2"], rp


# --- 2-4. routing over both tunnels, and traffic through the kernel's ESP ----------------------------------
def wait_for_ecmp(lab: RouteLab) -> None:
    def ecmp() -> bool:
        # The kernel keeps a nexthop whose interface went down in a multipath route, flagged dead.
        return all(
            sorted(
                h.get("dev", "") for h in lab.route("site", vpc).get("nexthops", []) if "dead" not in h.get("flags", [])
            )
            == ["xfrm1", "xfrm2"]
            for vpc in VPCS
        )

    lab.poll("both tunnels as equal-cost nexthops for every VPC", ecmp)


def wait_for_bgp(lab: RouteLab) -> None:
    both = {aws_inside(1): "Established", aws_inside(2): "Established"}
    lab.poll("BGP established with both AWS inside addresses", lambda: lab.established() == both)


def ping_through_esp(lab: RouteLab, ns: str, source: str, destination: str) -> None:
    before = lab.esp("site")
    out = lab.sh(
        f"ip netns exec {ns} ping -n -c 3 -i 0.2 -W 5 -w {WAIT_SECONDS} -I {source} {destination} || :",
        f"ping {destination}",
    )
    assert " 0% packet loss" in out, f"ping {source} -> {destination}:\n{out}\n{lab.diagnostics()}"
    after = lab.esp("site")

    def carried(direction: str) -> int:
        pairs = [p for p in after if (p[0] if direction == "out" else p[1]) == SITE_OUTSIDE]
        return sum(after[p][1] - before.get(p, (0, 0))[1] for p in pairs)

    # Three echo requests one way and three replies the other, through the kernel's ESP SAs.
    assert carried("out") >= 3 and carried("in") >= 3, (before, after)


@pytest.mark.parametrize("routing", ["static", "bgp"])
def test_both_tunnels_carry_routes_and_traffic(lab: RouteLab, routing: str) -> None:
    lab.use(routing)
    if routing == "bgp":
        wait_for_bgp(lab)
        view = make_view("bgp")
        site_ranges = {view.lan_cidr, *view.pod_cidrs}

        def aws_learned() -> dict[str, list[str]]:
            table = lab.bgp("aws", "show bgp ipv4 unicast").get("routes", {})
            return {
                prefix: sorted(p["peerId"] for p in paths if p.get("peerId", "(unspec)") != "(unspec)")
                for prefix, paths in table.items()
            }

        both_sites = sorted([site_inside(1), site_inside(2)])
        learned = lab.poll(
            "AWS to learn the site's ranges over both tunnels",
            lambda: (got := aws_learned()) and all(got.get(p) == both_sites for p in site_ranges) and got,
        )
        # AWS learned the LAN and the pod range and nothing else, though the site's own BGP table holds more
        # (the VPC routes it learned from AWS): the export filter, not an empty table, kept them back.
        assert {p for p, peers in learned.items() if peers} == site_ranges, learned
        site_table = lab.bgp("site", "show bgp ipv4 unicast").get("routes", {})
        assert set(VPCS) <= set(site_table), site_table
        for n in (1, 2):
            sent = lab.bgp("site", f"show bgp ipv4 unicast neighbors {aws_inside(n)} advertised-routes")
            assert set(sent.get("advertisedRoutes", {})) == site_ranges, sent
    wait_for_ecmp(lab)
    for vpc in VPCS:
        route = lab.route("site", vpc)
        hops = sorted((h["dev"], h.get("gateway")) for h in route["nexthops"])
        if routing == "bgp":
            assert route["protocol"] == "bgp" and hops == [("xfrm1", aws_inside(1)), ("xfrm2", aws_inside(2))], route
        else:
            assert route["protocol"] == "static" and hops == [("xfrm1", None), ("xfrm2", None)], route
    print(f"\n{routing}: {VPCS[0]} via {lab.sh(f'ip -n site route show {VPCS[0]}', 'ip route').strip()}")
    # A site LAN host to a VPC address; a VPC address to a hybrid pod behind the gateway.
    ping_through_esp(lab, "lan", LAN_HOST, VPC_HOST)
    ping_through_esp(lab, "aws", VPC_HOST, POD_HOST)


# --- 5-6. an AWS endpoint goes silent, then returns ----------------------------------------------------------
def _first_reply_after(after: str, output: str) -> str:
    """Shell: the `ping -D` timestamp of the first reply later than `after`, a shell word, in `output`."""
    return (
        f"awk -v after={after} '/^\\[[0-9.]+\\] [0-9]+ bytes from/ "
        f'{{ ts = substr($1, 2, length($1) - 2) + 0; if (ts > after + 1) {{ printf "%.3f", ts; exit }} }}\' {output}'
    )


# Shell: true while the route for $2 in namespace $1 has a live nexthop through interface $3 (a multipath route
# keeps a nexthop whose interface went down, marked dead); aws_via: AWS's route back to the LAN, through xfrm$1.
AWS_VIA = (
    "via() { ip -n $1 -o route show exact $2 | sed 's/nexthop/\\n/g' | grep -E \"dev $3( |$)\" | grep -qv dead; }\n"
    f"aws_via() {{ via aws {LAN} xfrm$1; }}\n"
)
# Shell: the time of the first event in namespace $1's link monitor that shows interface $2 down.
LINK_DOWN_AT = r"""link_down_at() {
    sed -n "s/^\[\([^]]*\)\] [0-9]*: $2@[^:]*: <\([^>]*\)>.*/\1 \2/p" $run/links-$1.txt |
        while read -r ts flags; do
            case ",$flags," in *,UP,*) ;; *) date -d "$ts" +%s.%N; break ;; esac
        done
}
"""
# Shell: true once at least $2 seconds have passed since time $1.
LATER = "later() { awk -v t=$1 -v s=$2 -v now=$(now) 'BEGIN { exit !(now - t > s) }'; }\n"


def flow_script() -> str:
    """For each VPC address in turn, until one fits: which tunnel the LAN's echo requests to it take (the site's
    ECMP hash) and which tunnel AWS's replies take (AWS's hash, or its BGP best path)."""
    return f"""\
for host in {" ".join(VPC_HOSTS)}; do
    e1=$(echoes 1) e2=$(echoes 2) r1=$(replies 1) r2=$(replies 2)
    ip netns exec lan ping -n -q -c 5 -i 0.2 -W 2 $host >/dev/null || :
    site=0 aws=0
    [ $(( $(echoes 1) - e1 )) -lt 5 ] || site=1
    [ $(( $(echoes 2) - e2 )) -lt 5 ] || site=2
    [ $(( $(replies 1) - r1 )) -lt 5 ] || aws=1
    [ $(( $(replies 2) - r2 )) -lt 5 ] || aws=2
    echo "$host $site $aws"
    [ $site -eq 0 ] || [ $site -ne $aws ] || break
done
"""


def silence_script(silent: int, host: str) -> str:
    """The AWS endpoint of tunnel `silent` stops answering (AWS's endpoint maintenance) while the LAN pings `host`,
    a VPC address whose requests and replies both cross that tunnel.

    Records, on the guest's clock: the silence, the site's tunnel interface going down (charon's DPD gave up),
    the first echo request into the other tunnel, AWS's route back to the LAN leaving the silent tunnel, AWS's
    tunnel interface going down (its DPD gave up), and the first reply more than a second after the silence
    (one that cannot have crossed the silent tunnel).
    """
    other = 3 - silent
    ip = AWS_OUTSIDE[silent]
    return f"""\
{AWS_VIA}{LINK_DOWN_AT}
ip netns exec lan ping -n -D -O -i 0.2 -W 1 -w 300 {host} > $run/failover-ping.txt 2>&1 </dev/null &
echo $! > $run/ping.pid
# Each side's link events, with the kernel's times: when its DPD gave up, to the millisecond.
for ns in site aws; do
    ip -n $ns -ts monitor link > $run/links-$ns.txt 2>&1 </dev/null &
    echo $! > $run/monitor-$ns.pid
done
sleep 2
base=$(echoes {other})
# Every packet to or from the endpoint's address is dropped, before IPsec and after it: IKE, ESP and BGP.
ip netns exec aws nft -f - <<END
table inet dlinfra_silence {{
    chain pre {{ type filter hook prerouting priority -300; policy accept; ip daddr {ip} drop; }}
    chain post {{ type filter hook postrouting priority -300; policy accept; ip saddr {ip} drop; }}
}}
END
# The silence begins when nft returns (loading it takes a while under TCG).
silent_at=$(now)
down= moved= aws_moved= aws_down= resumed=
end=$(( $(date +%s) + {WAIT_SECONDS} ))
while [ $(date +%s) -lt $end ]; do
    # Each time is read just before its own check: one round of checks takes a second or more under TCG.
    [ -n "$down" ] || {{ t=$(now); link_up site xfrm{silent} || down=$t; }}
    [ -n "$moved" ] || {{ t=$(now); [ "$(echoes {other})" -lt $((base + 3)) ] || moved=$t; }}
    [ -n "$aws_moved" ] || {{ t=$(now); aws_via {silent} || aws_moved=$t; }}
    [ -n "$aws_down" ] || {{ t=$(now); link_up aws xfrm{silent} || aws_down=$t; }}
    [ -n "$resumed" ] || resumed=$({_first_reply_after("$silent_at", "$run/failover-ping.txt")})
    [ -z "$down" ] || [ -z "$moved" ] || [ -z "$aws_moved" ] || [ -z "$aws_down" ] || [ -z "$resumed" ] || break
    sleep 0.2
done
stop_pids $run/monitor-site.pid $run/monitor-aws.pid
site_dpd=$(link_down_at site xfrm{silent}) aws_dpd=$(link_down_at aws xfrm{silent})
echo "silent_at=$silent_at down=$down moved=$moved aws_moved=$aws_moved aws_down=$aws_down resumed=$resumed" \
    "site_dpd=$site_dpd aws_dpd=$aws_dpd"
"""


def recovery_script(silent: int, routing: str) -> str:
    """The endpoint answers again; records the tunnel's interfaces up (both sides), its BGP session, ECMP at the
    site and AWS's route back through the tunnel again, echo requests into it again (if the flow's hash takes it
    back there); then stops the ping and prints its summary."""
    peer = aws_inside(silent)
    bgp_check = (
        f"! vty site -c 'show bgp neighbors {peer} json' | grep -q '\"bgpState\": *\"Established\"' || bgp=$t"
        if routing == "bgp"
        else "bgp=$t"
    )
    return f"""\
{LATER}{AWS_VIA}
base=$(echoes {silent})
returned_at=$(now)
ip netns exec aws nft delete table inet dlinfra_silence
up= aws_up= bgp= ecmp= aws_back= back=
end=$(( $(date +%s) + {WAIT_SECONDS} ))
while [ $(date +%s) -lt $end ]; do
    # Each time is read just before its own check: one round of checks takes a second or more under TCG.
    [ -n "$up" ] || {{ t=$(now); ! link_up site xfrm{silent} || up=$t; }}
    [ -n "$aws_up" ] || {{ t=$(now); ! link_up aws xfrm{silent} || aws_up=$t; }}
    [ -n "$bgp" ] || [ -z "$up" ] || {{ t=$(now); {bgp_check}; }}
    [ -n "$ecmp" ] || {{ t=$(now); ! via site {VPCS[0]} xfrm1 || ! via site {VPCS[0]} xfrm2 || ecmp=$t; }}
    [ -n "$aws_back" ] || {{ t=$(now); ! aws_via {silent} || aws_back=$t; }}
    [ -n "$back" ] || {{ t=$(now); [ "$(echoes {silent})" -lt $((base + 3)) ] || back=$t; }}
    [ -z "$up" ] || [ -z "$aws_up" ] || [ -z "$bgp" ] || [ -z "$ecmp" ] || [ -z "$aws_back" ] || [ -z "$back" ] ||
        break
    # The flow's hash may keep it on the other tunnel: then "back" stays empty, which is no failure.
    [ -z "$ecmp" ] || [ -z "$aws_back" ] || ! later "$ecmp" 10 || break
    sleep 0.2
done
stop_pids $run/ping.pid
echo "returned_at=$returned_at up=$up aws_up=$aws_up bgp=$bgp ecmp=$ecmp aws_back=$aws_back back=$back"
tail -n 2 $run/failover-ping.txt
"""


def _times(line: str) -> dict[str, float | None]:
    fields = dict(item.split("=", 1) for item in line.split())
    return {k: (float(v) if re.fullmatch(r"[0-9.]+", v) else None) for k, v in fields.items()}


def _since(times: dict[str, float | None], key: str, start: str) -> float:
    value, origin = times[key], times[start]
    assert value is not None and origin is not None, f"{key} was never seen: {times}"
    return value - origin


def cleartext(lab: RouteLab) -> tuple[int, str]:
    """Packets for an inside address or AWS's networks that left the site's uplink unencrypted, and their log."""
    out = lab.sh("ip netns exec site nft list counter netdev dlinfra_wire cleartext", "the cleartext counter")
    count = int(re.findall(r"packets (\d+)", out)[0])
    log = lab.sh("dmesg | grep dlinfra-cleartext | tail -n 20 || :", "kernel log") if count else ""
    return count, log


@pytest.mark.parametrize("routing", ["static", "bgp"])
def test_failover_when_an_aws_endpoint_goes_silent_then_recovery(lab: RouteLab, routing: str) -> None:
    view = make_view(routing)
    budget = failover_budget(render_charon(view), render_swanctl(view), render_frr(view))
    assert budget.routing == routing
    lab.use(routing)
    if routing == "bgp":
        wait_for_bgp(lab)
    wait_for_ecmp(lab)
    leaked_before, _ = cleartext(lab)
    # ECMP hashes each direction of a flow on its own; the test silences a tunnel that carries both directions
    # of its flow, so the end-to-end figure is the worse of the two sides' detection.
    lines = lab.sh(flow_script(), "finding a flow whose two directions share a tunnel").strip().splitlines()
    host, site_tunnel, aws_tunnel = lines[-1].split()
    if site_tunnel == "0" or site_tunnel != aws_tunnel:
        pytest.fail(f"no VPC address whose requests and replies share a tunnel: {lines}", pytrace=False)
    silent, other = int(site_tunnel), 3 - int(site_tunnel)
    log_lines = int(lab.sh("wc -l < $run/site/charon.log", "log size"))
    aws_log_lines = int(lab.sh("wc -l < $run/aws/charon.log", "log size"))

    out = lab.sh(silence_script(silent, host), "silencing an AWS endpoint")
    t = _times(out.strip().splitlines()[-1])
    if not all(t[k] for k in ("down", "moved", "aws_moved", "aws_down", "resumed", "site_dpd", "aws_dpd")):
        pytest.fail(f"no failover within {WAIT_SECONDS} s:\n{out}\n{lab.diagnostics()}", pytrace=False)
    # Polled: moved (echo requests through the other tunnel), aws_moved (AWS's route back); each lags by up to a
    # round of checks, a second or more under TCG. From the ping's own times: resumed. From the kernel's link
    # events: site_dpd and aws_dpd, when each side's DPD took its tunnel interface down.
    moved, aws_moved, resumed, site_dpd, aws_dpd = (
        _since(t, k, "silent_at") for k in ("moved", "aws_moved", "resumed", "site_dpd", "aws_dpd")
    )
    report = (
        f"{routing}: AWS endpoint of tunnel {silent} silent ({host}'s requests and replies both on it): the site's "
        f"DPD took xfrm{silent} down after {site_dpd:.1f} s, echo requests through tunnel {other} seen after "
        f"{moved:.1f} s (worst case {budget.site:.1f} s); AWS's DPD took its xfrm{silent} down after {aws_dpd:.1f} s, "
        f"its route back left tunnel {silent} (seen) after {aws_moved:.1f} s (worst case {budget.aws:.1f} s); "
        f"replies (end to end) after {resumed:.1f} s (worst case {budget.end_to_end:.1f} s)"
    )
    print(f"\n{report}")
    # charon ran the rendered retransmission schedule: 3 retransmissions, not strongSwan's default 5; the AWS
    # side gave up as its DPD timeout says (aws_side/strongswan.conf: 2 retransmissions, 10 s apart).
    log = lab.sh(f"tail -n +{log_lines + 1} $run/site/charon.log", "site log")
    assert re.search(rf"<aws-tunnel{silent}\|\d+> giving up after 3 retransmits", log), log[-3000:]
    aws_log = lab.sh(f"tail -n +{aws_log_lines + 1} $run/aws/charon.log", "aws log")
    assert re.search(rf"<aws-peer-tunnel{silent}\|\d+> giving up after 2 retransmits", aws_log), aws_log[-3000:]
    # Not one packet for a tunnel's inside address or AWS's networks left the uplink unencrypted while the tunnel
    # was silent, nor when its interface went down and its BGP session ended.
    leaked, leaks = cleartext(lab)
    assert leaked == leaked_before == 0, f"{leaked - leaked_before} packets left in clear:\n{leaks}\n{report}"
    # Each side's DPD gives up when failover.py says it does (plus a second or two of a loaded TCG guest; on AWS's
    # side also the test charon's whole-second clock: AWS's own granularity is not published), and never early.
    site_dpd_worst = budget.dpd_delay + budget.clock_granularity + budget.ike_give_up
    aws_dpd_worst = budget.aws_dpd_idle + budget.aws_dpd_timeout
    assert site_dpd_worst - 3 <= site_dpd <= site_dpd_worst + 2, report
    assert aws_dpd_worst - 3 <= aws_dpd <= aws_dpd_worst + 1 + 2, report
    # Each side moves within its budget, plus the guest's polling.
    assert budget.site <= SITE_FAILOVER_LIMIT and moved <= budget.site + 3 and moved <= SITE_FAILOVER_LIMIT, report
    assert aws_moved <= budget.aws + 1 + 3 and resumed <= budget.end_to_end + 1 + 3, report
    if routing == "static":
        # Nothing but AWS's DPD tells a static VPN that a tunnel is gone: its return traffic moves with it, and
        # replies resume only then.
        assert budget.aws == aws_dpd_worst and aws_moved >= aws_dpd - 0.5 and resumed >= aws_dpd - 0.5, report
    else:
        # With BGP, AWS's hold timer (from the last keepalive it got) moves it first.
        assert budget.bgp_hold is not None
        assert aws_moved <= budget.bgp_hold + 3 < aws_dpd, report

    out = lab.sh(recovery_script(silent, routing), "the endpoint returning")
    lines = out.strip().splitlines()
    r = _times(next(line for line in lines if line.startswith("returned_at=")))
    if not all(r[k] for k in ("up", "aws_up", "bgp", "ecmp", "aws_back")):
        pytest.fail(f"tunnel {silent} did not come back as it should:\n{out}\n{lab.diagnostics()}", pytrace=False)
    up, aws_up, bgp, ecmp, aws_back = (_since(r, k, "returned_at") for k in ("up", "aws_up", "bgp", "ecmp", "aws_back"))
    back = f", echo requests through it again after {_since(r, 'back', 'returned_at'):.1f} s" if r["back"] else ""
    recovery = (
        f"endpoint back: tunnel {silent} up after {up:.1f} s (AWS's side {aws_up:.1f} s)"
        + (f", its BGP session after {bgp:.1f} s" if routing == "bgp" else "")
        + f", ECMP at the site after {ecmp:.1f} s, AWS's route back through it after {aws_back:.1f} s{back}; "
        f"ping: {lines[-2] if len(lines) > 1 else ''}"
    )
    print(recovery)
    # The site retries all along (dpd_action restart, keyingtries 0): a retransmission of its next attempt gets
    # through within the longest retransmission interval, then BGP's connect-retry timer (5 s) brings the session.
    assert up <= budget.ike_give_up + 5 and bgp <= up + 15 and aws_back <= max(up, aws_up) + 15, recovery
    # Nor when it came back.
    leaked, leaks = cleartext(lab)
    assert leaked == leaked_before == 0, f"{leaked - leaked_before} packets left in clear:\n{leaks}\n{report}"


# --- 7. AWS-initiated rekeys -----------------------------------------------------------------------------
REKEY_SCRIPT = f"""\
ip netns exec lan ping -n -i 0.1 -W {WAIT_SECONDS} -c 100 {VPC_HOST} > $run/rekey-ping.txt 2>&1 </dev/null &
pid=$!
sleep 1
# AWS rekeys on its own schedule (rekey margin and fuzz); here both tunnels' CHILD_SAs and IKE_SAs at once.
for n in 1 2; do
    sw aws --rekey --child aws-peer-tunnel$n >/dev/null
    sw aws --rekey --ike aws-peer-tunnel$n >/dev/null
done
wait $pid || :
tail -n 2 $run/rekey-ping.txt
"""


def test_aws_initiated_rekeys_lose_no_packets(lab: RouteLab) -> None:
    lab.use("bgp")
    wait_for_bgp(lab)
    wait_for_ecmp(lab)
    log_lines = int(lab.sh("wc -l < $run/site/charon.log", "log size"))
    out = lab.sh(REKEY_SCRIPT, "pinging across AWS-initiated rekeys")
    log = lab.sh(f"tail -n +{log_lines + 1} $run/site/charon.log", "site log")
    print(f"\nAWS-initiated IKE and CHILD rekeys of both tunnels during 100 pings: {out.strip().splitlines()[0]}")
    assert "100 packets transmitted, 100 received, 0% packet loss" in out, out
    for n in (1, 2):
        assert re.search(rf"IKE_SA aws-tunnel{n}\[\d+\] rekeyed", log), log[-3000:]
        assert re.search(rf"CHILD_SA aws-tunnel{n}\{{\d+\}} established", log), log[-3000:]
    # Rekeying replaces SAs without charon's updown, so the interfaces and the routes through them stay.
    assert lab.established() == {aws_inside(1): "Established", aws_inside(2): "Established"}
