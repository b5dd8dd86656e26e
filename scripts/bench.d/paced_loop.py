"""A busy loop paced as a drain beside a workload is: busy ON_MS ms, then
idle three times as long, for SECS s, with no database work at all (the harm
step's paced floor). Usage: paced_loop.py ON_MS SECS"""

import sys
import time

on, secs = float(sys.argv[1]) / 1000, float(sys.argv[2])
end = time.monotonic() + secs
while time.monotonic() < end:
    busy_until = time.monotonic() + on
    while time.monotonic() < busy_until:
        pass
    time.sleep(3 * on)
