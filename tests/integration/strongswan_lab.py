"""What the strongSwan tests share, on this machine's kernel or in the XFRM guest: charon's config, a
private /run for each daemon, and `swanctl --list-sas` parsed."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path


def private_run(prelude: str = "") -> str:
    """sh -c text that mounts a private /run, runs prelude (shell ending in `&& `), then becomes "$@".

    ip netns exec, unshare and sh all exec in place, so the PID a launcher gets is the daemon's own and its
    pid files cannot clash with the host's; the prelude's mounts stay in the daemon's own mount namespace.
    """
    return f'mount -t tmpfs -o mode=0755,size=4m dlinfra-test-run /run && {prelude}exec "$@"'


PRIVATE_RUN = private_run()

# The longest any one wait for an event may last before a test gives up: a daemon starting, an SA, a log line, a
# BGP session, a route, a guest job's step. Every wait polls and returns as soon as the event happens, so a green
# run is no slower for it; the bound only sets how long a broken run takes to fail. It must hold on a loaded machine
# (two shared cores, qemu's TCG) where what takes a second alone can take tens: a 5 s bound once failed a correct
# run there. Measured figures (failover times) are asserted as figures with their documented ranges, not as waits.
WAIT_SECONDS = 120
# A command that itself waits up to WAIT_SECONDS (swanctl --terminate --timeout, a guest job with one wait).
COMMAND_SECONDS = 2 * WAIT_SECONDS
# A daemon told to stop (SIGTERM) gets this long before SIGKILL: charon and FRR stop in well under a second alone,
# a few seconds under TCG on a loaded machine, and the wait returns as soon as they have (tests/test_waits.py: no
# wait under 60 s). One that ignored SIGTERM once held a teardown past its bound, and the guest (shared by every
# module) was stopped with it.
STOP_GRACE_SECONDS = 60


def charon_conf(plugins: str, socket: Path, log: Path, extra: str = "", include: Path | None = None) -> str:
    """strongswan.conf for one test charon: only these plugins, its own vici socket and log file.

    extra: more `charon { }` settings, one per line, indented by four spaces. include: a strongswan.conf
    snippet (the site's rendered strongswan-dlinfra.conf) read last, so its settings win.
    """
    last = f"\ninclude {include}\n" if include is not None else "\n"
    return f"""\
charon {{
    load_modular = no
    load = {plugins}
    # A lost IKE packet (charon can drop a reply that races its own SA teardown) then costs the
    # test one second rather than the default four.
    retransmit_timeout = 1.0
{extra}
    plugins {{
        vici {{
            socket = unix://{socket}
        }}
    }}
    filelog {{
        test {{
            path = {log}
            time_format = %T
            ike_name = yes
            flush_line = yes
            default = 1
        }}
    }}
}}
swanctl {{
    # Pre-shared keys need no credential plugins; a short list keeps swanctl quiet.
    load = nonce
}}{last}"""


@dataclasses.dataclass
class ChildSa:
    name: str
    state: str
    protocol: str
    local_ts: tuple[str, ...] = ()
    remote_ts: tuple[str, ...] = ()
    packets_out: int = 0


@dataclasses.dataclass
class IkeSa:
    name: str
    unique_id: int
    state: str
    algorithms: str = ""
    children: list[ChildSa] = dataclasses.field(default_factory=list)


_IKE_LINE = re.compile(r"^(?P<name>[\w.-]+): #(?P<id>\d+), (?P<state>[A-Z_]+), IKEv2")
_CHILD_LINE = re.compile(r"^  (?P<name>[\w.-]+): #\d+, reqid \d+, (?P<state>[A-Z_]+), [\w-]+, (?P<proto>\S+)")
_ALGORITHMS_LINE = re.compile(r"^  (?P<alg>[A-Z][A-Z0-9_]*-\d+/[A-Z0-9_/-]+)$")
_COUNTER_LINE = re.compile(r"^    out +\w+, +\d+ bytes, +(?P<packets>\d+) packets")
_TS_LINE = re.compile(r"^    (?P<side>local|remote) +(?P<ts>.+)$")


def parse_sas(text: str) -> list[IkeSa]:
    """IKE_SAs with their CHILD_SAs, from `swanctl --list-sas` output."""
    sas: list[IkeSa] = []
    ike: IkeSa | None = None
    child: ChildSa | None = None
    for line in text.splitlines():
        if m := _IKE_LINE.match(line):
            ike, child = IkeSa(name=m["name"], unique_id=int(m["id"]), state=m["state"]), None
            sas.append(ike)
        elif ike is None:
            continue
        elif m := _CHILD_LINE.match(line):
            child = ChildSa(name=m["name"], state=m["state"], protocol=m["proto"])
            ike.children.append(child)
        elif child is None and (m := _ALGORITHMS_LINE.match(line)):
            ike.algorithms = m["alg"]
        elif child is not None and (m := _COUNTER_LINE.match(line)):
            child.packets_out = int(m["packets"])
        elif child is not None and (m := _TS_LINE.match(line)):
            setattr(child, f"{m['side']}_ts", tuple(m["ts"].split()))
    return sas


def is_up(ike: IkeSa) -> bool:
    return ike.state == "ESTABLISHED" and any(c.state == "INSTALLED" for c in ike.children)


def esp_states(text: str) -> dict[tuple[str, str], tuple[int, int]]:
    """(source, destination) -> (if_id, packets carried) of each ESP state in `ip -s xfrm state`."""
    states = {}
    for block in re.split(r"(?m)^(?=src )", text):
        if m := re.match(r"src (\S+) dst (\S+)\n\s+proto esp ", block):
            if_id = re.search(r"if_id (0x[0-9a-f]+|\d+)", block)
            current = re.search(r"lifetime current:\n\s+\d+\(bytes\), (\d+)\(packets\)", block)
            states[m[1], m[2]] = (int(if_id[1], 0) if if_id else 0, int(current[1]) if current else 0)
    return states
