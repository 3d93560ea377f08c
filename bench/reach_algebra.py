"""Why the reachability proof uses BDDs: one hop of it asked 1000 times, as BDD operations (dd with CUDD, what
dlinfra/checks/reach/packets.py uses) and as z3 satisfiability queries.

The question: the replies of a flow (a /18 subnet to a /20, tcp/443 from the Linux ephemeral ports) through a
four-rule network ACL (first match, implicit deny) and a longest-prefix split over ten routes; is any packet
dropped, and which one? Interval sets alone cannot answer it: an ACL's first match cuts the space into pieces
that no product of ranges describes.

Usage: .venv/bin/python bench/reach_algebra.py. z3 is not a dependency of dlinfra: install z3-solver to compare
(`.venv/bin/pip install z3-solver`); without it only the BDD figure is printed.
Measured 2026-11-29 on the 2-core machine, twice: BDD 0.066 and 0.175 ms per question (the second while other
work ran), z3 4.37 and 4.25 ms (z3-solver 5.4.1): 25 to 65 times slower.
"""

from __future__ import annotations

import project_python

project_python.use_project_python()  # first: `python bench/<this>.py` works with any Python on the PATH

import ipaddress
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dlinfra.checks.reach import packets as pk

N = ipaddress.IPv4Network
ACL = [
    (N("10.2.0.0/18"), 443, 443, True),
    (N("10.2.0.0/16"), 0, 1023, False),
    (N("0.0.0.0/0"), 49152, 65535, True),
    (N("10.0.0.0/8"), 1024, 65535, True),
]
ROUTES = [N(f"10.{i}.0.0/16") for i in range(10)]
QUESTIONS = 1000


def ends(k: int) -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    return N(f"10.2.{(k % 4) * 64}.0/18"), N(f"10.{k % 10}.0.0/20")


def with_bdds(k: int) -> Any:
    src, dst = ends(k)
    replies = pk.reply(pk.flow_space("tcp", pk.net("src", src), pk.net("dst", dst), [(443, 443)], [(32768, 60999)]))
    remaining, passed = replies, pk.NOTHING
    for cidr, low, high, allow in ACL:
        match = pk.net("src", cidr) & pk.ports("dport", low, high)
        if allow:
            passed |= remaining & match
        remaining &= ~match
    routed = passed & pk.net("dst", ROUTES[k % 10])
    return pk.pick(replies & ~routed)


def with_z3(k: int) -> Any:
    import z3

    src_addr, dst_addr, port = z3.BitVecs("s d p", 32)
    src, dst = ends(k)

    def inside(v: Any, n: ipaddress.IPv4Network) -> Any:
        return (v & int(n.netmask)) == int(n.network_address)

    replies = z3.And(inside(src_addr, dst), inside(dst_addr, src), z3.ULE(32768, port), z3.ULE(port, 60999))
    matched, allowed = z3.BoolVal(False), z3.BoolVal(False)
    for cidr, low, high, allow in ACL:
        match = z3.And(inside(src_addr, cidr), z3.ULE(low, port), z3.ULE(port, high))
        if allow:
            allowed = z3.Or(allowed, z3.And(match, z3.Not(matched)))
        matched = z3.Or(matched, match)
    solver = z3.Solver()
    solver.add(replies, z3.Not(z3.And(allowed, inside(dst_addr, ROUTES[k % 10]))))
    return solver.model() if solver.check() == z3.sat else None


def timed(name: str, question: Callable[[int], Any]) -> None:
    started = time.perf_counter()
    for k in range(QUESTIONS):
        question(k)
    print(f"{name:16} {1000 * (time.perf_counter() - started) / QUESTIONS:.3f} ms per question")


def main() -> int:
    timed("BDD (dd, CUDD)", with_bdds)
    try:
        import z3  # noqa: F401
    except ImportError:
        print("z3 (SMT)         not installed (pip install z3-solver to compare)")
        return 0
    timed("z3 (SMT)", with_z3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
