#!/usr/bin/env python3
"""Figures for the harm step of scripts/bench (scripts/bench.d/harm.sh).

usage:
  harm_stats.py window LOGFILE MESSAGE
      -> JSON {count, first, last}: how many `message=MESSAGE` lines the
         daemon's stdout has, and the epoch seconds of the first and last
         (their `ts=` field, millisecond resolution, UTC).
  harm_stats.py latency START END PGBENCH_LOG...
      -> JSON {n, p50, p99, max, lag_p99, lag_max} in milliseconds, over
         the transactions of pgbench's per-transaction logs (-l) that
         started in [START, END] (epoch seconds).

A pgbench -l line is `client_id transaction_no time script_no time_epoch
time_us [schedule_lag]`; time_epoch.time_us is when the transaction ended
and, under --rate, `time` counts from its scheduled start, so it includes
the schedule lag (the wait behind transactions that ran late) and
end - time is the scheduled start. The latency reported is that `time`:
what a caller on a fixed schedule sees, lag included.
"""
import datetime
import json
import sys


def window(path, message):
    needle = " message=" + message + " "
    count, first, last = 0, None, None
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        for line in f:
            if needle not in line or not line.startswith("ts="):
                continue
            ts = line[3:].split(" ", 1)[0]
            t = datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ")
            t = t.replace(tzinfo=datetime.timezone.utc).timestamp()
            count += 1
            first = t if first is None else min(first, t)
            last = t if last is None else max(last, t)
    return {"count": count, "first": first, "last": last}


def pct(vals, p):
    if not vals:
        return None
    return vals[min(len(vals) - 1, int(round(p / 100 * (len(vals) - 1))))]


def latency(start, end, paths):
    lat, lag = [], []
    for path in paths:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 6:
                    continue
                took = int(fields[2])
                ended = int(fields[4]) + int(fields[5]) / 1e6
                began = ended - took / 1e6
                if start <= began <= end:
                    lat.append(took / 1000)
                    if len(fields) > 6:
                        lag.append(int(fields[6]) / 1000)
    lat.sort()
    lag.sort()
    return {"n": len(lat), "p50": pct(lat, 50), "p99": pct(lat, 99),
            "max": pct(lat, 100), "lag_p99": pct(lag, 99), "lag_max": pct(lag, 100)}


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "window":
        print(json.dumps(window(sys.argv[2], sys.argv[3])))
    elif len(sys.argv) >= 5 and sys.argv[1] == "latency":
        print(json.dumps(latency(float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:])))
    else:
        sys.exit(__doc__)
