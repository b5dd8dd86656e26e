#!/usr/bin/env python3
"""StatsD listener for the benchmark: counts what the daemon pushes.

usage: udp_count.py PORTFILE RESULTFILE [TARGET [METRIC]]

Binds 127.0.0.1 on a free port (written to PORTFILE), sums every counter
line by name (`name:N|c|#tags`), keeps the last value of each gauge, and
notes the wall time (time.time()) at which METRIC (default
`lock.lease.expired`, all tags summed) first reached TARGET. Writes RESULTFILE (JSON) when that happens, on SIGUSR1,
and on SIGTERM/SIGINT, after which it exits. One datagram per sweep is
what the daemon sends while idle, so `datagrams` also counts sweeps.
"""
import json
import signal
import socket
import sys
import time

portfile, resultfile = sys.argv[1], sys.argv[2]
target = int(sys.argv[3]) if len(sys.argv) > 3 else 0
metric = sys.argv[4] if len(sys.argv) > 4 else "lock.lease.expired"

sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
sock.bind(("127.0.0.1", 0))
with open(portfile + ".tmp", "w") as f:
    f.write(str(sock.getsockname()[1]))
import os
os.replace(portfile + ".tmp", portfile)

counters, gauges = {}, {}
state = {"datagrams": 0, "lines": 0, "first": None, "last": None,
         "reached_at": None, "counters": counters, "gauges": gauges,
         "malformed": 0}


def dump():
    with open(resultfile + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(resultfile + ".tmp", resultfile)


stopping = []


def stop(*_):
    # Only set a flag: the loop below notices it within 0.2 s, dumps and
    # exits (raising from a handler that may interrupt dump() is fragile).
    stopping.append(True)


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGUSR1, lambda *_: dump())
sock.settimeout(0.2)

while not stopping:
    try:
        data = sock.recv(65535)
    except (socket.timeout, InterruptedError):
        continue
    now = time.time()
    state["datagrams"] += 1
    state["first"] = state["first"] or now
    state["last"] = now
    for line in data.decode("utf-8", "replace").split("\n"):
        if not line:
            continue
        state["lines"] += 1
        try:
            name, rest = line.split(":", 1)
            fields = rest.split("|")
            value, kind = fields[0], fields[1]
            tags = next((f[1:] for f in fields[2:] if f.startswith("#")), "")
            key = name + ("|" + tags if tags else "")
            if kind == "c":
                counters[key] = counters.get(key, 0) + int(value)
            elif kind == "g":
                gauges[key] = float(value)
        except (ValueError, IndexError):
            state["malformed"] += 1
    if target and state["reached_at"] is None:
        total = sum(v for k, v in counters.items() if k.split("|")[0] == metric)
        if total >= target:
            state["reached_at"] = now
            dump()
dump()
