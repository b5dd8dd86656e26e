#!/usr/bin/env python3
"""Percentiles of overdueMillis over the lease_expired lines of a log.

usage: overdue_stats.py LOGFILE  -> JSON {count, p50, p90, p99, max, min,
keys_unique}. Lines are logfmt; only `message=lease_expired` lines count.
"""
import json
import sys

vals, keys = [], set()
with open(sys.argv[1], "r", encoding="utf-8", errors="replace") as f:
    for line in f:
        if " message=lease_expired " not in line:
            continue
        od = line.split(" overdueMillis=", 1)[1].split(" ", 1)[0]
        key = line.split(" lockKey=", 1)[1].split(" ", 1)[0]
        tok = line.split(" token=", 1)[1].split(" ", 1)[0]
        vals.append(int(od))
        keys.add((key, tok))
vals.sort()


def pct(p):
    if not vals:
        return None
    return vals[min(len(vals) - 1, int(round(p / 100 * (len(vals) - 1))))]


print(json.dumps({"count": len(vals), "unique": len(keys), "min": pct(0),
                  "p50": pct(50), "p90": pct(90), "p99": pct(99), "max": pct(100)}))
