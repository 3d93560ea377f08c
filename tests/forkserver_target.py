"""A program for tests/test_forkserver.py to serve: each command says what it was given and what it saw."""

from __future__ import annotations

import datetime
import os
import resource
import sys
import time

calls = 0  # each command must see 0: it runs in a fresh fork of the server, not after the previous command


def main(argv: list[str]) -> int:
    global calls
    calls += 1
    mode = argv[0] if argv else ""
    if mode == "crash":
        raise RuntimeError("the command crashed")
    if mode == "sleep":
        print(f"sleeping {os.getpid()}", flush=True)
        time.sleep(float(argv[1]))
        return 0
    if mode == "workers":  # a command that started a process of its own, as a preview starts its workers
        import subprocess

        worker = subprocess.Popen(["sleep", "600"])
        print(f"sleeping {os.getpid()} {worker.pid}", flush=True)
        time.sleep(600)
        return 0
    if mode == "exit":
        sys.exit(int(argv[1]))
    if mode == "settings":  # what a process inherits besides its environment
        mask = os.umask(0)
        os.umask(mask)
        files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        print(f"umask={mask:o} nofile={files} nice={os.nice(0)} hour={datetime.datetime.now().hour}")
        return 0
    if mode == "mixed":  # stdout and stderr to one file: the order a reader sees
        for n in range(3):
            print(f"out {n}")
            print(f"err {n}", file=sys.stderr)
        return 0
    text = sys.stdin.read()
    print(f"argv={argv} cwd={os.getcwd()} calls={calls} color={os.environ.get('TARGET_COLOR')} stdin={text.strip()}")
    print("to stderr", file=sys.stderr)
    return int(argv[1]) if len(argv) > 1 else 0
