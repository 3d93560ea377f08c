"""A green suite on a busy machine: every wait for an event in the tests has a generous bound.

A wait polls and returns when its event happens, so a generous bound costs a green run nothing; a tight one fails
correct code when the machine is loaded (issue 21: a 5 s swanctl --timeout failed a route-based test once under
load). This reads every test module for bounds written as numbers and refuses any under the floor; bounds written
as tests.integration.strongswan_lab.WAIT_SECONDS (or a multiple) pass by construction. Measured figures, such as
failover times, are asserted against their documented ranges and are not waits: they are not matched here.
"""

from __future__ import annotations

import re
from pathlib import Path

import hypothesis

from tests.conftest import ROOT
from tests.integration import strongswan_lab, xfrm_vm

FLOOR = 60  # seconds: the shortest bound a wait may have

# Each pattern captures a bound in seconds, as written in Python or in the shell the tests send to a guest.
BOUNDS = {
    "timeout=N": re.compile(r"\btimeout=(\d+(?:\.\d+)?)\b(?!\s*\*)"),
    "--timeout N": re.compile(r"""["']--timeout["'],\s*["'](\d+)["']|--timeout (\d+)"""),
    "time.monotonic() + N": re.compile(r"monotonic\(\)\s*\+\s*(\d+(?:\.\d+)?)\b"),
    "date +%s + N": re.compile(r"date \+%s\s*\)\s*\+\s*(\d+)"),
    "wait_until N": re.compile(r"wait_until (\d+)\b"),
    "ping -w N": re.compile(r"""\s-w (\d+)\b|["']-w["'],\s*["'](\d+)["']"""),
    "poll(..., N)": re.compile(r"\.poll\([^()]*(?:\([^()]*\)[^()]*)*,\s*(\d+(?:\.\d+)?)\)"),
    "_SECONDS = N": re.compile(r"^\s*[A-Z_]*SECONDS\s*=\s*(\d+(?:\.\d+)?)\b(?!\s*\*)", re.MULTILINE),
}
# A line that says so is no wait: a connection the network guard refuses before anything is sent.
NOT_A_WAIT = "# refused at once: no wait"
# A shell loop of `sleep 0.1` steps, bounded by a count: the bound is the count over ten.
TENTHS = re.compile(r"\$i -lt (\d+) \].*sleep 0\.1")


def _line_of(text: str, position: int) -> tuple[int, str]:
    """The 1-based number and the text of the line holding position."""
    start = text.rfind("\n", 0, position) + 1
    end = text.find("\n", position)
    return text.count("\n", 0, position) + 1, text[start : end if end >= 0 else len(text)]


def tight_bounds(text: str) -> list[str]:
    """Each bound in text below FLOOR seconds, as 'line N: what'."""
    found = []
    for what, pattern in BOUNDS.items():
        for match in pattern.finditer(text):
            number, line = _line_of(text, match.start())
            seconds = float(next(g for g in match.groups() if g is not None))
            if seconds < FLOOR and NOT_A_WAIT not in line:
                found.append(f"line {number}: {what} with {seconds:g} s")
    for match in TENTHS.finditer(text):
        if int(match[1]) / 10 < FLOOR:
            found.append(f"line {_line_of(text, match.start())[0]}: a loop of {match[1]} x 0.1 s")
    return found


def test_the_scan_sees_each_kind_of_bound() -> None:
    # Guard the scan itself: each way a tight bound was written before is caught, and the generous forms are not.
    tight = """
        process.wait(timeout=5)
        aws.swanctl("--terminate", "--ike", "x", "--timeout", "5")
        deadline = time.monotonic() + 45
        end=$(( $(date +%s) + 30 ))
        "wait_until 30 charons '[ -S x ]'"
        ping -n -c 3 -i 0.2 -W 2 -w 8 -I a b
        argv = ["ping", "-W", "2", "-w", "5"]
        lab.poll("BGP", lambda: lab.established() == both, 30)
        WAIT_SECONDS = 10.0
        while kill -0 $pid && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
    """
    assert len(tight_bounds(tight)) == 10, tight_bounds(tight)
    generous = """
        process.wait(timeout=WAIT_SECONDS)
        aws.swanctl("--terminate", "--ike", "x", "--timeout", TERMINATE_SECONDS)
        deadline = time.monotonic() + WAIT_SECONDS
        end=$(( $(date +%s) + {WAIT_SECONDS} ))
        ping -n -c 3 -W 5 -w {WAIT_SECONDS} -I a b
        lab.poll("BGP", lambda: lab.established() == both)
        WAIT_SECONDS = 120
        COMMAND_SECONDS = 2 * WAIT_SECONDS
        self.sh(script, "x", timeout=10 * WAIT_SECONDS)
        timeout=300,
        socket.create_connection(("192.0.2.1", 80), timeout=1)  # refused at once: no wait
    """
    assert tight_bounds(generous) == []


def test_every_wait_in_the_tests_has_a_generous_bound() -> None:
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path == Path(__file__).resolve():
            continue
        offenders += [f"{path.relative_to(ROOT)}: {found}" for found in tight_bounds(path.read_text())]
    assert offenders == [], "\n".join(offenders)


def test_the_shared_bounds_hold_on_a_loaded_machine() -> None:
    assert strongswan_lab.WAIT_SECONDS >= FLOOR
    assert strongswan_lab.COMMAND_SECONDS > strongswan_lab.WAIT_SECONDS  # a command that waits outlasts its wait
    assert xfrm_vm.BOOT_SECONDS >= FLOOR and xfrm_vm.EXIT_SECONDS >= FLOOR


def test_hypothesis_examples_have_no_deadline() -> None:
    # Hypothesis's default deadline (200 ms an example) fails correct code on a busy machine.
    assert hypothesis.settings().deadline is None
