#!/usr/bin/env python3
"""One psql session running one statement on a schedule, beside a daemon
(the bench's poll sessions and its connection sampler).

usage: paced_sql.py INTERVAL MAX_SECS STOPFILE OUTFILE DB SQL

Starts `$PSQL -XAtq -v ON_ERROR_STOP=1 -d DB` (application_name from
PGAPPNAME, as psql reads it), sends SQL every INTERVAL s, start to start,
waiting for each result before the next (a slow statement delays the next
one instead of queueing behind it), and appends each result's first line to
OUTFILE. Stops when STOPFILE exists, after MAX_SECS s, or when psql exits
(an error stops it: ON_ERROR_STOP); it always ends by itself. SQL must return
exactly one row of one column.
"""
import os
import subprocess
import sys
import time

interval, max_secs = float(sys.argv[1]), float(sys.argv[2])
stopfile, outfile, db, sql = sys.argv[3:7]
psql = os.environ.get("PSQL", "psql")

p = subprocess.Popen([psql, "-XAtq", "-v", "ON_ERROR_STOP=1", "-d", db],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
end = time.monotonic() + max_secs
nxt = time.monotonic()
with open(outfile, "a", encoding="utf-8") as out:
    while not os.path.exists(stopfile) and time.monotonic() < end:
        try:
            p.stdin.write(sql.rstrip().rstrip(";") + ";\n")
            p.stdin.flush()
        except (BrokenPipeError, OSError):
            break
        line = p.stdout.readline()
        if not line:
            break
        out.write(line)
        out.flush()
        nxt += interval
        pause = nxt - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            nxt = time.monotonic()
try:
    p.stdin.close()
except OSError:
    pass
try:
    p.wait(timeout=10)
except subprocess.TimeoutExpired:
    p.kill()
    p.wait()
