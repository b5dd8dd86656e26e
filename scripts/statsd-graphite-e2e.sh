#!/usr/bin/env bash
# End to end, for real: lease-sweeper -> Etsy StatsD (graphite backend, tags)
# -> Graphite carbon-cache -> whisper files, all on 127.0.0.1.
#
# What it does, in a temp dir that is removed afterwards:
#   1. installs the Etsy StatsD daemon (npm `statsd`, 0.9.0: the release that
#      reads DogStatsD `|#k:v` tags and hands them to Graphite as `;k=v`) and
#      Graphite's carbon + whisper (PyPI, in a venv);
#   2. starts a throwaway PostgreSQL (initdb; Unix socket only, no TCP),
#      migrates it with `lease-sweeper migrate`, and plays lock server:
#      6 leases that expire, 1 that expires and is taken over before any
#      sweep, 2 that stay held (+ the taker's) = 7 expiries, 3 held;
#   3. starts carbon-cache (tags enabled; a stub tag database records the
#      tag registrations graphite-web would receive) and statsd (1 s flush,
#      graphite backend, non-legacy namespace);
#   4. runs `lease-sweeper run` until all 7 lease_expired lines are out,
#      stops it with SIGTERM (must exit 0);
#   5. reads the whisper files back with whisper-fetch and checks:
#      lock.lease.expired;backend=pg  -> stats.counters.lock.lease.expired.count;backend=pg
#                                        sums to exactly 7;
#      lock.held.current;backend=pg   -> stats.gauges.lock.held.current;backend=pg
#                                        reads 3, and statsd lists it as a gauge.
#
# Usage: scripts/statsd-graphite-e2e.sh
#   LEASE_SWEEPER_BIN=path   binary to test (default: cargo build, debug)
#   STATSD_VERSION=0.9.0 CARBON_VERSION=1.1.10 WHISPER_VERSION=1.1.10
#   E2E_KEEP=1               keep the temp dir (logs, whisper files)
# Needs: node + npm, python3 (venv), PostgreSQL server binaries, psql; root
# runs PostgreSQL as the `postgres` user. Not part of `cargo test`/CI (it
# installs from npm and PyPI). See docs/operations.md and docs/metrics-and-logs.md.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

STATSD_VERSION="${STATSD_VERSION:-0.9.0}"
CARBON_VERSION="${CARBON_VERSION:-1.1.10}"
WHISPER_VERSION="${WHISPER_VERSION:-1.1.10}"
EXPECTED_EXPIRED=7
EXPECTED_HELD=3
COUNTER_SERIES='stats.counters.lock.lease.expired.count;backend=pg'
RATE_SERIES='stats.counters.lock.lease.expired.rate;backend=pg'
GAUGE_SERIES='stats.gauges.lock.held.current;backend=pg'

WORK="$(mktemp -d /tmp/lease-sweeper-e2e.XXXXXX)"
chmod 0755 "$WORK" # PostgreSQL runs as another user below
PIDS=()
PG_CTL=""
PG_DATA="$WORK/pg/data"
AS_PG=()

say() { printf '==> %s\n' "$*"; }
fail() {
    printf 'FAIL: %s\n' "$*" >&2
    for log in "$WORK"/*.log; do
        [ -f "$log" ] && { echo "--- $log (last 15 lines)"; tail -n 15 "$log"; } >&2
    done
    exit 1
}
cleanup() {
    set +e
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null
    done
    if [ -n "$PG_CTL" ] && [ -f "$PG_DATA/postmaster.pid" ]; then
        "${AS_PG[@]}" "$PG_CTL" -D "$PG_DATA" -m immediate -w stop >/dev/null 2>&1
    fi
    if [ "${E2E_KEEP:-0}" = 1 ]; then
        echo "kept $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
    local deadline=$(( $(date +%s) + $1 )) what=$2
    shift 2
    until "$@"; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "timed out waiting for $what"
        sleep 0.2
    done
}

# ---- 1. installs ---------------------------------------------------------------
say "installing statsd@$STATSD_VERSION (npm) and carbon==$CARBON_VERSION whisper==$WHISPER_VERSION (PyPI venv)"
npm install --silent --no-audit --no-fund --ignore-scripts --prefix "$WORK/statsd" "statsd@$STATSD_VERSION" >"$WORK/npm.log" 2>&1 \
    || fail "npm install statsd"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "carbon==$CARBON_VERSION" "whisper==$WHISPER_VERSION" >"$WORK/pip.log" 2>&1 \
    || fail "pip install carbon whisper"
PY="$WORK/venv/bin/python"

if [ -z "${LEASE_SWEEPER_BIN:-}" ]; then
    say "building lease-sweeper"
    cargo build --quiet --bin lease-sweeper
    LEASE_SWEEPER_BIN="$REPO/target/debug/lease-sweeper"
fi
"$LEASE_SWEEPER_BIN" --version

# ---- 2. PostgreSQL -------------------------------------------------------------
PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
[ -x "$PG_BIN/initdb" ] || PG_BIN="$(pg_config --bindir 2>/dev/null || true)"
[ -x "$PG_BIN/initdb" ] || fail "PostgreSQL server binaries not found (Debian: postgresql-15)"
PG_CTL="$PG_BIN/pg_ctl"
mkdir -p "$WORK/pg/sock"
if [ "$(id -u)" = 0 ]; then
    chown -R postgres: "$WORK/pg"
    AS_PG=(runuser -u postgres --)
fi
say "starting a throwaway PostgreSQL ($PG_BIN)"
"${AS_PG[@]}" "$PG_BIN/initdb" -D "$PG_DATA" -U postgres -A trust --no-sync >"$WORK/initdb.log" 2>&1 \
    || fail "initdb"
"${AS_PG[@]}" "$PG_CTL" -D "$PG_DATA" -w -l "$WORK/pg/postgres.log" \
    -o "-c listen_addresses='' -c unix_socket_directories='$WORK/pg/sock' -c fsync=off" start >/dev/null \
    || fail "pg_ctl start: $(cat "$WORK/pg/postgres.log")"
export LOCKDB_URL="postgres://postgres@localhost/postgres?host=$WORK/pg/sock"
psql_q() { psql "$LOCKDB_URL" -v ON_ERROR_STOP=1 -qAtX -c "$1"; }

"$LEASE_SWEEPER_BIN" migrate 2>"$WORK/migrate.log" || fail "lease-sweeper migrate"

say "playing lock server: 6 leases expire, 1 expires and is taken over, 2 stay held"
psql_q "SELECT count(lock_acquire('e2e:expiring:' || i, 'worker-' || i, 300)) FROM generate_series(1, 6) AS i" >/dev/null
psql_q "SELECT count(lock_acquire('e2e:held:' || i, 'worker-held', 3600000)) FROM generate_series(1, 2) AS i" >/dev/null
psql_q "SELECT lock_acquire('e2e:stolen', 'worker-dead', 300)" >/dev/null
sleep 0.6
stolen=$(psql_q "SELECT lock_acquire('e2e:stolen', 'worker-new', 3600000)")
[ -n "$stolen" ] || fail "the takeover did not happen"
[ "$(psql_q 'SELECT count(*) FROM lock_expiry_outbox')" = 1 ] || fail "no takeover recorded"

# ---- 3. carbon-cache and statsd ------------------------------------------------
CARBON_LINE_PORT=$(free_port)
CARBON_PICKLE_PORT=$(free_port)
CARBON_QUERY_PORT=$(free_port)
TAGDB_PORT=$(free_port)
STATSD_PORT=$(free_port)
STATSD_MGMT_PORT=$(free_port)
G="$WORK/graphite"
mkdir -p "$G/conf" "$G/storage/whisper" "$G/storage/lists" "$G/log" "$G/run"
cat >"$G/conf/carbon.conf" <<EOF
[cache]
STORAGE_DIR = $G/storage
LOCAL_DATA_DIR = $G/storage/whisper
WHITELISTS_DIR = $G/storage/lists
LOG_DIR = $G/log
PID_DIR = $G/run
ENABLE_LOGROTATION = False
USER =
MAX_CACHE_SIZE = inf
MAX_UPDATES_PER_SECOND = inf
MAX_CREATES_PER_MINUTE = inf
LINE_RECEIVER_INTERFACE = 127.0.0.1
LINE_RECEIVER_PORT = $CARBON_LINE_PORT
ENABLE_UDP_LISTENER = False
PICKLE_RECEIVER_INTERFACE = 127.0.0.1
PICKLE_RECEIVER_PORT = $CARBON_PICKLE_PORT
CACHE_QUERY_INTERFACE = 127.0.0.1
CACHE_QUERY_PORT = $CARBON_QUERY_PORT
LOG_UPDATES = False
LOG_CREATES = True
# Tagged series (name;tag=value) are stored under _tagged/ and registered
# with graphite-web's tag database at GRAPHITE_URL (here: a stub).
ENABLE_TAGS = True
TAG_HASH_FILENAMES = False
GRAPHITE_URL = http://127.0.0.1:$TAGDB_PORT
EOF
# One archive at 1 s resolution: each statsd flush is one point, so the sum
# of the points is the counter's total.
cat >"$G/conf/storage-schemas.conf" <<'EOF'
[e2e]
pattern = .*
retentions = 1s:1h
EOF
cat >"$G/conf/storage-aggregation.conf" <<'EOF'
[e2e]
pattern = .*
xFilesFactor = 0
aggregationMethod = sum
EOF

# Stand-in for graphite-web's /tags/tagMultiSeries: records what carbon registers.
cat >"$WORK/tagdb.py" <<'EOF'
import re, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
# carbon posts multipart/form-data (urllib3 `fields`): one `path` per series.
FIELD = re.compile(rb'name="path"\r\n\r\n(.*?)\r\n', re.S)
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(sys.argv[2], "a") as f:
            for path in FIELD.findall(body):
                f.write(path.decode() + "\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"[]")
    def log_message(self, *args):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
EOF
python3 "$WORK/tagdb.py" "$TAGDB_PORT" "$WORK/tagdb-registered.txt" >"$WORK/tagdb.log" 2>&1 &
PIDS+=($!)

say "starting carbon-cache on 127.0.0.1:$CARBON_LINE_PORT"
GRAPHITE_ROOT="$G" "$WORK/venv/bin/carbon-cache.py" --config="$G/conf/carbon.conf" --debug start \
    >"$WORK/carbon.log" 2>&1 &
PIDS+=($!)
wait_for 30 "carbon-cache to listen" grep -q "CarbonReceiverFactory starting on $CARBON_LINE_PORT" "$WORK/carbon.log"

cat >"$WORK/statsd-config.js" <<EOF
{
  address: "127.0.0.1",
  port: $STATSD_PORT,
  mgmt_address: "127.0.0.1",
  mgmt_port: $STATSD_MGMT_PORT,
  flushInterval: 1000,
  dumpMessages: true,
  backends: ["./backends/graphite"],
  graphiteHost: "127.0.0.1",
  graphitePort: $CARBON_LINE_PORT,
  graphite: { legacyNamespace: false, globalPrefix: "stats", prefixCounter: "counters", prefixGauge: "gauges" }
}
EOF
say "starting statsd $STATSD_VERSION on udp://127.0.0.1:$STATSD_PORT (graphite backend)"
(cd "$WORK/statsd/node_modules/statsd" && exec node stats.js "$WORK/statsd-config.js") >"$WORK/statsd.log" 2>&1 &
PIDS+=($!)
wait_for 30 "statsd to start" grep -q "server is up" "$WORK/statsd.log"

# ---- 4. the daemon -------------------------------------------------------------
say "running lease-sweeper run"
started=$(date +%s)
STATSD_HOST=127.0.0.1 STATSD_PORT=$STATSD_PORT "$LEASE_SWEEPER_BIN" run >"$WORK/sweeper.log" 2>&1 &
SWEEPER_PID=$!
PIDS+=($SWEEPER_PID)
lines() { grep -c 'level=warn message=lease_expired' "$WORK/sweeper.log" || true; }
all_lines_out() { [ "$(lines)" -ge "$EXPECTED_EXPIRED" ]; }
wait_for 30 "$EXPECTED_EXPIRED lease_expired lines" all_lines_out
sleep 3 # a few more sweeps: gauges, and any (wrong) extra counts
kill -TERM "$SWEEPER_PID"
set +e
wait "$SWEEPER_PID"
code=$?
set -e
grep -E 'message=(starting|sweeper_started|lease_expired|shutdown_requested|sweeper_stopped)' "$WORK/sweeper.log" | sed 's/^/    /'
[ "$code" = 0 ] || fail "lease-sweeper exited $code after SIGTERM"
[ "$(lines)" = "$EXPECTED_EXPIRED" ] || fail "$(lines) lease_expired lines, expected $EXPECTED_EXPIRED"
say "statsd received (dumpMessages):"
grep -E 'lock\.' "$WORK/statsd.log" | sed 's/^/    /' | head -n 8

# ---- 5. read Graphite back -----------------------------------------------------
whisper_file() { "$PY" -c 'import os,sys; from carbon.util import TaggedSeries as T; print(os.path.join(sys.argv[1], T.encode(T.parse(sys.argv[2]).path, os.sep) + ".wsp"))' "$G/storage/whisper" "$1"; }
# Sum and last value of a series' points since the daemon started.
fetch() { "$WORK/venv/bin/whisper-fetch.py" --from="$started" --json "$1" \
    | "$PY" -c 'import json,sys; v=[x for x in json.load(sys.stdin)["values"] if x is not None]; print(int(sum(v)), int(v[-1]) if v else "none", len(v))'; }
COUNTER_FILE=$(whisper_file "$COUNTER_SERIES")
GAUGE_FILE=$(whisper_file "$GAUGE_SERIES")
counter_complete() { [ -f "$COUNTER_FILE" ] && [ "$(fetch "$COUNTER_FILE" | cut -d' ' -f1)" -ge "$EXPECTED_EXPIRED" ]; }
wait_for 20 "carbon to write $COUNTER_SERIES" counter_complete
read -r total _ points < <(fetch "$COUNTER_FILE")
wait_for 20 "carbon to write $GAUGE_SERIES" test -f "$GAUGE_FILE"
read -r _ gauge gauge_points < <(fetch "$GAUGE_FILE")
gauges_listed=$("$PY" - "$STATSD_MGMT_PORT" <<'EOF'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"gauges\n"); s.settimeout(2); out = b""
try:
    while b"END" not in out:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
except socket.timeout:
    pass
s.sendall(b"quit\n")
print(out.decode())
EOF
)

say "whisper files under $G/storage/whisper:"
(cd "$G/storage/whisper" && find . -name '*.wsp' | grep -E 'lock|queue' | sort | sed 's/^/    /')
# carbon registers tags in batches after writing; give it a moment.
registered() { grep -qx "$COUNTER_SERIES" "$WORK/tagdb-registered.txt" 2>/dev/null; }
deadline=$(( $(date +%s) + 10 ))
until registered || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.2; done
say "series carbon registered with the tag database:"
grep -E 'lock\.' "$WORK/tagdb-registered.txt" 2>/dev/null | sort -u | sed 's/^/    /' || true

ok=1
if [ "$total" = "$EXPECTED_EXPIRED" ]; then
    say "OK   lock.lease.expired;backend=pg: $COUNTER_SERIES sums to $total over $points points (expected $EXPECTED_EXPIRED)"
else
    say "FAIL lock.lease.expired;backend=pg: $COUNTER_SERIES sums to $total, expected $EXPECTED_EXPIRED"; ok=0
fi
rate_file=$(whisper_file "$RATE_SERIES")
[ -f "$rate_file" ] && say "OK   $RATE_SERIES exists (per-second rate)" || { say "FAIL no $RATE_SERIES"; ok=0; }
if [ "$gauge" = "$EXPECTED_HELD" ]; then
    say "OK   lock.held.current;backend=pg: $GAUGE_SERIES reads $gauge over $gauge_points points (expected $EXPECTED_HELD)"
else
    say "FAIL lock.held.current;backend=pg: $GAUGE_SERIES reads $gauge, expected $EXPECTED_HELD"; ok=0
fi
if grep -q "'lock.held.current;backend=pg'" <<<"$gauges_listed"; then
    say "OK   statsd's management interface lists lock.held.current;backend=pg among its gauges"
else
    say "FAIL statsd does not list lock.held.current;backend=pg as a gauge: $gauges_listed"; ok=0
fi
if [ -e "$(whisper_file 'stats.counters.lock.held.current.count;backend=pg')" ]; then
    say "FAIL lock.held.current also landed as a counter"; ok=0
fi
if registered; then
    say "OK   carbon registered $COUNTER_SERIES with the tag database"
else
    say "FAIL carbon did not register $COUNTER_SERIES as a tagged series"; ok=0
fi
[ "$ok" = 1 ] || fail "Graphite does not show what the daemon sent"
say "PASS: StatsD -> carbon -> whisper carries lock.lease.expired;backend=pg = $EXPECTED_EXPIRED and lock.held.current;backend=pg = $EXPECTED_HELD"
