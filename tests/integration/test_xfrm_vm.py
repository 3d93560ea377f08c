"""Route-based IPsec in a real kernel: two charons bind their SAs to XFRM interfaces by if_id.

In the guest kernel (tests/integration/xfrm_vm.py), two namespaces are joined by a veth carrying
TEST-NET-1 addresses (RFC 5737); each holds an XFRM interface and a charon with kernel-netlink, so the
kernel does ESP. Each namespace's lo address is routed over its XFRM interface, and a ping between them
must cross the ESP SAs that charon negotiated with 0.0.0.0/0 selectors: only the route decides what
enters the tunnel.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.integration.strongswan_lab import (
    PRIVATE_RUN,
    STOP_GRACE_SECONDS,
    WAIT_SECONDS,
    charon_conf,
    esp_states,
    is_up,
    parse_sas,
)
from tests.integration.xfrm_vm import GuestVm

pytestmark = pytest.mark.vpn_peer

IF_ID = 42
PSK = "test.psk.xfrm"
# side: (veth address, lo address standing for the network behind it)
SIDES = {"left": ("192.0.2.1", "10.1.0.1"), "right": ("192.0.2.2", "10.2.0.1")}
# The kernel does ESP here, so kernel-netlink installs the SAs and policies; no kernel-libipsec.
PLUGINS = "nonce openssl kdf kernel-netlink socket-default vici"
# Route-based: charon must not route the 0.0.0.0/0 selectors itself; the XFRM interface routes do.
CHARON_EXTRA = "    install_routes = no"
# Sockets and logs live on the guest's tmpfs (a unix socket cannot be bound on the 9p share).
GUEST_RUN = Path("/tmp/dlinfra-xfrm-smoke")


def swanctl_conf(side: str, peer: str) -> str:
    local_addr, remote_addr = SIDES[side][0], SIDES[peer][0]
    start = "start" if side == "left" else "none"
    return f"""\
connections {{
    xfrm {{
        local_addrs = {local_addr}
        remote_addrs = {remote_addr}
        local {{
            auth = psk
            id = {side}
        }}
        remote {{
            auth = psk
            id = {peer}
        }}
        children {{
            net {{
                local_ts = 0.0.0.0/0
                remote_ts = 0.0.0.0/0
                if_id_in = {IF_ID}
                if_id_out = {IF_ID}
                start_action = {start}
            }}
        }}
    }}
}}
secrets {{
    ike-xfrm {{
        id-1 = left
        id-2 = right
        secret = {PSK}
    }}
}}
"""


def wait_until(condition: str, what: str) -> str:
    """Shell that polls condition every 0.1 s and fails the script after WAIT_SECONDS."""
    fail = f"{{ echo 'timed out after {WAIT_SECONDS}s waiting for {what}' >&2; exit 1; }}"
    return f"i=0; until {condition}; do i=$((i + 1)); [ $i -lt {WAIT_SECONDS * 10} ] || {fail}; sleep 0.1; done"


def guest_script(config: Path, out: Path) -> str:
    """The guest's side: namespaces, XFRM interfaces, charons, SA, ping; results copied to out."""
    q = shlex.quote
    lines = [
        "set -eu",
        f"config={q(str(config))} out={q(str(out))} run={GUEST_RUN}",
        "rm -rf $run && mkdir $run",
        # Guest uptime at each step, for a slow run (TCG) to show where its time went.
        "mark() { echo \"$(cut -d' ' -f1 /proc/uptime) $*\" >> $out/timing.txt; }",
        "mark start",
        # Stop what we started, by PID, and keep every log, whatever happens.
        "cleanup() {",
        # SIGTERM, then SIGKILL after a grace: a charon that ignores SIGTERM must not hold the guest's job.
        "    pids=$(cat $run/*.pid 2>/dev/null || :)",
        '    [ -z "$pids" ] || {',
        "        kill $pids 2>/dev/null || :",
        f"        ( sleep {STOP_GRACE_SECONDS}; kill -KILL $pids 2>/dev/null ) & watchdog=$!",
        "        wait $pids 2>/dev/null || :",
        "        kill $watchdog 2>/dev/null || :",
        "    }",
        "    for side in left right; do cp $run/$side/charon.log $out/charon-$side.log 2>/dev/null || :; done",
        "    cp $run/*.out $out/ 2>/dev/null || :",
        "    for side in left right; do ip netns delete $side 2>/dev/null || :; done",
        "}",
        "trap cleanup EXIT",
        "modprobe -a xfrm_interface xfrm_user esp4 veth && mark modules",
        "ip netns add left && ip netns add right",
        "ip -n left link add veth0 type veth peer name veth0 netns right",
    ]
    for side, (veth_ip, lo_ip) in SIDES.items():
        peer_lo = next(lo for other, (_, lo) in SIDES.items() if other != side)
        # One ip per namespace: each exec is slow under TCG.
        lines += [
            f"ip -n {side} -batch - <<EOF",
            f"addr add {veth_ip}/24 dev veth0",
            f"addr add {lo_ip}/32 dev lo",
            "link set lo up",
            "link set veth0 up",
            f"link add xfrm1 type xfrm dev lo if_id {IF_ID}",
            "link set xfrm1 up",
            f"route add {peer_lo}/32 dev xfrm1 src {lo_ip}",
            "EOF",
            f"mkdir $run/{side} && cp $config/{side}/* $run/{side}/",
            # ip netns exec, unshare and sh exec in place: $! is charon's own PID.
            f"STRONGSWAN_CONF=$run/{side}/strongswan.conf ip netns exec {side} unshare --mount"
            f" --propagation private -- sh -c {q(PRIVATE_RUN)} sh /usr/lib/ipsec/charon"
            f" >$run/{side}.out 2>&1 </dev/null &",
            f"echo $! > $run/{side}.pid",
        ]
    lines += [
        'swanctl() { side=$1; shift; STRONGSWAN_CONF=$run/$side/strongswan.conf command swanctl "$@"'
        " --uri unix://$run/$side/charon.vici; }",
        "mark namespaces",
        wait_until("[ -S $run/left/charon.vici ] && [ -S $run/right/charon.vici ]", "charon to start"),
        "mark charons",
        "swanctl right --load-all --noprompt --file $run/right/swanctl.conf >/dev/null",
        "swanctl left --load-all --noprompt --file $run/left/swanctl.conf >/dev/null",
        wait_until("swanctl left --list-sas | grep -q INSTALLED", "an INSTALLED CHILD_SA"),
        "mark child_sa",
        f"ip netns exec left ping -n -c 3 -i 0.2 -W 5 -w {WAIT_SECONDS} -I {SIDES['left'][1]} {SIDES['right'][1]}"
        " > $out/ping.txt"
        " || echo $? > $out/ping.failed",
        "mark ping",
        "for side in left right; do",
        "    swanctl $side --list-sas > $out/sas-$side.txt",
        "    ip -n $side -s xfrm state > $out/xfrm-state-$side.txt",
        "    ip -n $side -s xfrm policy > $out/xfrm-policy-$side.txt",
        "    ip -n $side -s link show xfrm1 > $out/link-$side.txt",
        "done",
        "mark done",
    ]
    return "\n".join(lines) + "\n"


def _link_packets(text: str, direction: str) -> int:
    """Packets from `ip -s link show` output: the line after the RX: or TX: header."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{direction}:"))
    return int(lines[header + 1].split()[1])


def test_ping_crosses_esp_bound_to_xfrm_interfaces(xfrm_guest: GuestVm) -> None:
    work = xfrm_guest.share / "xfrm-smoke"
    config, out = work / "config", work / "out"
    out.mkdir(parents=True)
    for side, peer in (("left", "right"), ("right", "left")):
        (config / side).mkdir(parents=True)
        run = GUEST_RUN / side
        conf = charon_conf(PLUGINS, run / "charon.vici", run / "charon.log", CHARON_EXTRA)
        (config / side / "strongswan.conf").write_text(conf)
        (config / side / "swanctl.conf").write_text(swanctl_conf(side, peer))

    # Two waits and a ping, each up to WAIT_SECONDS, and the steps between them.
    result = xfrm_guest.run(guest_script(config, out), timeout=WAIT_SECONDS * 4)
    logs = "\n".join(f"--- {p.name} ---\n{p.read_text()[-3000:]}" for p in sorted(out.glob("*.log")))
    if (out / "timing.txt").exists():
        print(f"\nguest uptime per step:\n{(out / 'timing.txt').read_text()}")
    assert result.returncode == 0, f"guest script failed ({result.returncode}):\n{result.stderr}\n{logs}"

    def read(name: str) -> str:
        return (out / name).read_text()

    assert not (out / "ping.failed").exists(), f"ping over xfrm1 failed:\n{read('ping.txt')}\n{logs}"
    assert " 0% packet loss" in read("ping.txt"), read("ping.txt")

    for side in SIDES:
        (ike,) = parse_sas(read(f"sas-{side}.txt"))
        assert is_up(ike), read(f"sas-{side}.txt")
        (child,) = ike.children
        assert (child.local_ts, child.remote_ts) == (("0.0.0.0/0",), ("0.0.0.0/0",)), read(f"sas-{side}.txt")
        assert child.protocol.startswith("ESP:"), read(f"sas-{side}.txt")

        # Both directions' ESP SAs carry the interface's if_id, and the kernel counted the pings
        # through them: three echo requests one way and three replies the other, nothing else (IKE
        # stays outside the tunnel, the 0.0.0.0/0 selectors notwithstanding).
        mine, peer = SIDES[side][0], next(veth for other, (veth, _) in SIDES.items() if other != side)
        states = esp_states(read(f"xfrm-state-{side}.txt"))
        assert states == {(mine, peer): (IF_ID, 3), (peer, mine): (IF_ID, 3)}, read(f"xfrm-state-{side}.txt")
        link = read(f"link-{side}.txt")
        assert (_link_packets(link, "RX"), _link_packets(link, "TX")) == (3, 3), link
