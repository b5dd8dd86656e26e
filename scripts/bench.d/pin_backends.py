#!/usr/bin/env python3
"""Moves the daemon's database backends to the daemon's core, for the harm
step's spare-core mode (HARM_PIN=1 in scripts/bench.d/harm.sh).

usage: pin_backends.py READY POSTMASTER_PID CPU DB BEFORE_PID...

Creates the file READY once it is polling (start the daemon after that: a
backend that ran before would have run on the callers' core). Every 5 ms,
each child of the postmaster that serves a client on DB
(process title "postgres: postgres DB ...") and is not one of BEFORE (the
callers' backends, there before the daemon started) is pinned to CPU. The
postmaster and the callers stay where the harness put them; a new backend
inherits the postmaster's core and runs there until it is moved, at most
about 5 ms. Runs until killed.
"""
import os
import sys
import time

POLL_S = 0.005


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def title(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return ""


def main():
    ready, postmaster, cpu, db = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    seen = {int(p) for p in sys.argv[5:]}
    prefix = f"postgres: postgres {db} "
    open(ready, "w").close()
    while True:
        for pid in children(postmaster):
            if pid in seen:
                continue
            if title(pid).startswith(prefix):
                seen.add(pid)
                try:
                    os.sched_setaffinity(pid, {cpu})
                except OSError:
                    pass
        time.sleep(POLL_S)


if __name__ == "__main__":
    main()
