"""Sets of IPv4 packets as binary decision diagrams: the algebra the reachability proof is done in.

A packet is (protocol, destination, source, destination port, source port): 8 + 32 + 32 + 16 + 16 bits, most
significant bit first, so an address prefix or a port range is a short chain of nodes. A set of packets is one
BDD node of a process-wide manager (`dd`, with CUDD when its extension is there): union, intersection and
difference are `|`, `&` and `& ~`, emptiness is a comparison, and `pick` gives one concrete member, which is
how a failure names the packet that is dropped. ICMP packets carry ports 0.

Chosen over interval sets and z3 (bench/reach_algebra.py, docs/reachability.md "Why BDDs"): network ACLs and
longest-prefix routing cut a flow's space into pieces no product of ranges describes, and one hop's question
costs z3 about 4 ms where the BDDs answer it in well under 0.2 ms.
"""

from __future__ import annotations

import ctypes
import functools
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

try:  # CUDD, compiled into dd's wheels; the pure-Python manager has the same interface
    from dd import cudd as _dd
except ImportError:  # pragma: no cover - only where no wheel with the extension exists
    from dd import autoref as _dd  # type: ignore[no-redef]

Field = Literal["proto", "dst", "src", "dport", "sport"]
FIELDS: Final[tuple[tuple[Field, int], ...]] = (("proto", 8), ("dst", 32), ("src", 32), ("dport", 16), ("sport", 16))
WIDTH: Final[Mapping[str, int]] = dict(FIELDS)
PROTOCOLS: Final[Mapping[str, int]] = {"icmp": 1, "tcp": 6, "udp": 17}
NAMES: Final[Mapping[int, str]] = {v: k for k, v in PROTOCOLS.items()}
Packets = Any  # a node of the manager (dd.cudd.Function)


@dataclass(frozen=True)
class Packet:
    """One concrete packet."""

    protocol: str
    src: ipaddress.IPv4Address
    dst: ipaddress.IPv4Address
    sport: int
    dport: int

    def flow(self) -> str:
        """`tcp/443`, `udp/53`, or `icmp`."""
        return self.protocol if self.protocol == "icmp" else f"{self.protocol}/{self.dport}"

    def text(self) -> str:
        """The whole packet: `10.2.0.10:32768 -> 10.2.16.4:443 tcp`."""
        if self.protocol == "icmp":
            return f"{self.src} -> {self.dst} icmp"
        return f"{self.src}:{self.sport} -> {self.dst}:{self.dport} {self.protocol}"

    def as_json(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "source": str(self.src),
            "source_port": self.sport,
            "destination": str(self.dst),
            "destination_port": self.dport,
        }


class _Space:
    """The manager, its variables, and cached predicates."""

    def __init__(self) -> None:
        self.bdd = _dd.BDD()
        self.vars: dict[str, list[str]] = {}
        for name, width in FIELDS:
            self.vars[name] = [f"{name}{i}" for i in range(width)]
            self.bdd.declare(*self.vars[name])
        self.nvars = sum(WIDTH.values())
        self.swap = {
            **{a: b for a, b in zip(self.vars["src"], self.vars["dst"], strict=True)},
            **{b: a for a, b in zip(self.vars["src"], self.vars["dst"], strict=True)},
            **{a: b for a, b in zip(self.vars["sport"], self.vars["dport"], strict=True)},
            **{b: a for a, b in zip(self.vars["sport"], self.vars["dport"], strict=True)},
        }

    @functools.cache  # noqa: B019 - one manager per process, kept for its life
    def prefix(self, field: Field, value: int, length: int) -> Packets:
        width = WIDTH[field]
        node = self.bdd.true
        for i in range(length):
            bit = self.bdd.var(self.vars[field][i])
            node &= bit if (value >> (width - 1 - i)) & 1 else ~bit
        return node

    @functools.cache  # noqa: B019
    def at_least(self, field: Field, low: int) -> Packets:
        node = self.bdd.true
        width = WIDTH[field]
        for i in reversed(range(width)):
            bit = self.bdd.var(self.vars[field][i])
            node = (bit & node) if (low >> (width - 1 - i)) & 1 else (bit | node)
        return node

    @functools.cache  # noqa: B019
    def at_most(self, field: Field, high: int) -> Packets:
        node = self.bdd.true
        width = WIDTH[field]
        for i in reversed(range(width)):
            bit = self.bdd.var(self.vars[field][i])
            node = (~bit | node) if (high >> (width - 1 - i)) & 1 else (~bit & node)
        return node

    @functools.cache  # noqa: B019
    def last_octet_at_least(self, field: Field, low: int) -> Packets:
        """Addresses whose last octet is `low` or more."""
        node = self.bdd.true
        for i in reversed(range(24, 32)):
            bit = self.bdd.var(self.vars[field][i])
            node = (bit & node) if (low >> (31 - i)) & 1 else (bit | node)
        return node


_SPACE = _Space()
# The manager lives as long as the process. CUDD's wrapper complains at exit about nodes still referenced (the
# constants and caches here, and any set a caller holds); one reference it never gives back keeps it from being
# torn down at interpreter shutdown, when the order in which objects go is arbitrary.
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_SPACE.bdd))
NOTHING: Final = _SPACE.bdd.false
EVERYTHING: Final = _SPACE.bdd.true


def net(field: Literal["src", "dst"], network: ipaddress.IPv4Network) -> Packets:
    """Packets whose `field` address is in `network`."""
    return _SPACE.prefix(field, int(network.network_address), network.prefixlen)


def nets(field: Literal["src", "dst"], networks: Iterable[ipaddress.IPv4Network]) -> Packets:
    node = NOTHING
    for network in networks:
        node |= net(field, network)
    return node


def ports(field: Literal["sport", "dport"], low: int, high: int) -> Packets:
    """Packets whose `field` port is in low..high (inclusive)."""
    if low <= 0 and high >= 65535:
        return EVERYTHING
    return _SPACE.at_least(field, max(low, 0)) & _SPACE.at_most(field, min(high, 65535))


def port_ranges(field: Literal["sport", "dport"], ranges: Iterable[tuple[int, int]]) -> Packets:
    node = NOTHING
    for low, high in ranges:
        node |= ports(field, low, high)
    return node


def protocol(name: str) -> Packets:
    """Packets of a protocol (`tcp`, `udp`, `icmp`, a number, or `-1` for all)."""
    if name in ("-1", "all"):
        return EVERYTHING
    number = PROTOCOLS.get(name)
    if number is None:
        try:
            number = int(name)
        except ValueError:
            return NOTHING
    return _SPACE.prefix("proto", number, 8)


def flow_space(
    protocol_name: str,
    sources: Packets,
    destinations: Packets,
    dports: Iterable[tuple[int, int]],
    sports: Iterable[tuple[int, int]],
) -> Packets:
    """Every packet of a flow: sources and destinations are address predicates (`net`, `nets`)."""
    node = protocol(protocol_name) & sources & destinations
    if protocol_name == "icmp":
        return node & ports("dport", 0, 0) & ports("sport", 0, 0)
    return node & port_ranges("dport", dports) & port_ranges("sport", sports)


def reply(packets: Packets) -> Packets:
    """The replies to `packets`: source and destination swapped, addresses and ports."""
    return _SPACE.bdd.let(_SPACE.swap, packets)


def forget(packets: Packets, fields: Iterable[Field]) -> Packets:
    """`packets` with `fields` free: every value of them for a packet whose other fields are in the set."""
    names = [v for f in fields for v in _SPACE.vars[f]]
    return _SPACE.bdd.exist(names, packets)


def for_every(packets: Packets, fields: Iterable[Field]) -> Packets:
    """The packets (other fields) that are in the set for every value of `fields`."""
    names = [v for f in fields for v in _SPACE.vars[f]]
    return _SPACE.bdd.forall(names, packets)


def size(packets: Packets) -> int:
    """How many packets the set holds."""
    return int(_SPACE.bdd.count(packets, nvars=_SPACE.nvars))


def field_size(packets: Packets, field: Field) -> int:
    """How many values of one field occur in the set."""
    others = [f for f, _ in FIELDS if f != field]
    return int(_SPACE.bdd.count(forget(packets, others), nvars=_SPACE.nvars)) >> (_SPACE.nvars - WIDTH[field])


def pick(packets: Packets) -> Packet | None:
    """One member of the set (None when it is empty), one a reader takes for a real packet where the set allows:
    a destination ending in .10 or more and a source in .20 or more (so the two differ within one subnet), or at
    least not in .0; the other bits as low as they can be."""
    if packets == NOTHING:
        return None
    for field, low in (("dst", 10), ("src", 20), ("dst", 1), ("src", 1)):
        preferred = packets & _SPACE.last_octet_at_least(field, low)  # type: ignore[arg-type]
        if preferred != NOTHING:
            packets = preferred
    care = {v for f, _ in FIELDS for v in _SPACE.vars[f]}
    bits = _SPACE.bdd.pick(packets, care_vars=care)
    values = {f: sum(1 << (w - 1 - i) for i, v in enumerate(_SPACE.vars[f]) if bits.get(v)) for f, w in FIELDS}
    return Packet(
        protocol=NAMES.get(values["proto"], str(values["proto"])),
        src=ipaddress.IPv4Address(values["src"]),
        dst=ipaddress.IPv4Address(values["dst"]),
        sport=values["sport"],
        dport=values["dport"],
    )


def of(packet: Packet) -> Packets:
    """The set holding exactly `packet`."""
    return (
        protocol(packet.protocol)
        & net("src", ipaddress.IPv4Network(packet.src))
        & net("dst", ipaddress.IPv4Network(packet.dst))
        & ports("sport", packet.sport, packet.sport)
        & ports("dport", packet.dport, packet.dport)
    )
