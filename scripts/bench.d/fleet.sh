#!/usr/bin/env bash
# A fleet of daemons through one PgBouncer onto one PostgreSQL: every expiry
# reported once, and the database CPU an idle fleet costs. Not part of CI or
# the tests.
#
#   scripts/bench.d/fleet.sh --bin target/release/lease-sweeper
#   scripts/bench.d/fleet.sh --daemons 50 --expire 5000 --direct 0   # smaller
#
# What it does, in order, all on this machine (Unix sockets and loopback):
#   1. a throwaway PostgreSQL 15 (scripts/bench.d/pg.sh, max_connections
#      raised to fit the direct run) and PgBouncer in transaction mode in
#      front of it (pool_mode=transaction, default_pool_size=--pool,
#      max_client_conn=max(5 x daemons + 50, 250): three connections each,
#      five while one drains alone), both as the `postgres`
#      user when run as root;
#   2. `lease-sweeper migrate` directly (sqlx's migrator holds a session
#      advisory lock, which transaction pooling breaks), then --leases live
#      leases (deadlines an hour away, load_leases.sql), VACUUM ANALYZE;
#   3. baseline: the database's CPU with no daemon, over --idle-secs;
#   4. --daemons `lease-sweeper run` through PgBouncer, each with its own
#      stdout/stderr file, all pushing StatsD to one loopback listener
#      (udp_count.py); waits until PgBouncer counts 3 clients per daemon
#      (the lock sweep, the job reaper, the horizon check);
#   5. idle: the CPU of every PostgreSQL process (utime+stime from
#      /proc/<pid>/stat; the postmaster's cutime+cstime covers backends that
#      exited) and of PgBouncer over --idle-secs, per daemon per second;
#   6. expiry: --expire leases expiring steadily over --expire-secs
#      (fleet_expiring.sql, 5 s lead), waits until all are gone and counted,
#      then checks: exactly --expire lease_expired lines over all stdout
#      files, as many distinct lockKey+token, none outside the wave, zero
#      sweep_failed / job_reap_failed / panics, every daemon alive; then
#      SIGTERM to all, each must exit 0; overdueMillis p50/p99/max
#      (overdue_stats.py) and the StatsD lock.lease.expired total;
#   7. direct (unless --direct 0): PgBouncer stopped, --direct daemons
#      straight to PostgreSQL, the same idle measurement, SIGTERM, exit 0.
# Prints a Markdown table (also appended to --results FILE) and the command
# that reproduces it. Exits 1 when a check fails (after printing the table).
# Everything it started is stopped and its work directory removed on any
# exit (trap), unless --keep.
#
# Options:
#   --bin PATH         binary to run (default target/release/lease-sweeper;
#                      not built here)
#   --daemons N        daemons through PgBouncer (default 200)
#   --pool N           PgBouncer default_pool_size (default 20)
#   --leases N         live leases (default 100000)
#   --expire N         leases in the expiry wave (default 20000)
#   --expire-secs S    seconds the wave is spread over (default 10)
#   --idle-secs S      idle measurement window (default 30)
#   --direct N         daemons in the direct idle run (default 80; 0 skips it)
#   --results FILE     also append the table to FILE
#   --keep             keep the work directory (every daemon's stdout, logs)
# From scripts/bench, as its `fleet` step (its table lands in results.md):
#   wants pgbouncer && "$HERE/fleet.sh" --bin "$BIN" --results "$RESULTS"
# (with --quick, e.g. --daemons 50 --expire 5000 --idle-secs 10 --direct 20).
# Environment: PG_BINDIR (server binaries), FLEET_WORK (work directory).
# Needs: bash, python3, bc, PostgreSQL server binaries with contrib,
# pgbouncer (/usr/sbin/pgbouncer or on PATH), ps.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/scripts/bench.d
# shellcheck source=pg.sh
source "$HERE/pg.sh"

BIN=$ROOT/target/release/lease-sweeper DAEMONS=200 POOL=20 LEASES=100000
EXPIRE=20000 EXPIRE_SECS=10 IDLE_SECS=30 DIRECT=80 RESULTS_FILE= KEEP=0
ARGS=("$@")
while (($#)); do
    case $1 in
    --bin) BIN=$(realpath "$2"); shift ;;
    --daemons) DAEMONS=$2; shift ;;
    --pool) POOL=$2; shift ;;
    --leases) LEASES=$2; shift ;;
    --expire) EXPIRE=$2; shift ;;
    --expire-secs) EXPIRE_SECS=$2; shift ;;
    --idle-secs) IDLE_SECS=$2; shift ;;
    --direct) DIRECT=$2; shift ;;
    --results) RESULTS_FILE=$(realpath "$2"); shift ;;
    --keep) KEEP=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fleet: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[[ -x $BIN ]] || { echo "fleet: no binary at $BIN (cargo build --release, or --bin PATH)" >&2; exit 2; }
if [[ -x /usr/sbin/pgbouncer ]]; then PGBOUNCER=/usr/sbin/pgbouncer; else
    PGBOUNCER=$(command -v pgbouncer) || { echo "fleet: pgbouncer not found (Debian: apt-get install pgbouncer)" >&2; exit 2; }
fi

log() { printf '[fleet %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
now() { date +%s.%N; }
calc() { echo "$*" | bc -l; }
fmt() { printf "%.${2:-2}f" "$1"; }
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
HZ=$(getconf CLK_TCK)
LOADS=()
load_now() { cut -d' ' -f1-3 /proc/loadavg; }

# Three connections a daemon (the lock sweep, the job reaper, the horizon
# check), two more while its lock sweep drains alone (a second walker, the
# writer of the lines).
CLIENTS_EACH=3
DRAINING_EXTRA=2
# Room for the direct run's daemons, PgBouncer's pool and the harness's own
# psql.
MAXCONN=$(((CLIENTS_EACH + DRAINING_EXTRA) * DIRECT + POOL + 20))
for i in "${!PG_BENCH_SETTINGS[@]}"; do
    [[ ${PG_BENCH_SETTINGS[i]} == max_connections=* ]] && PG_BENCH_SETTINGS[i]=max_connections=$MAXCONN
done
MAXCLIENT=$(((CLIENTS_EACH + DRAINING_EXTRA) * DAEMONS + 50))
((MAXCLIENT >= 250)) || MAXCLIENT=250

WORK=${FLEET_WORK:-$(mktemp -d /tmp/lease-fleet.XXXXXX)}
mkdir -p "$WORK"
chmod 755 "$WORK"
RESULTS=$WORK/results.md
: >"$RESULTS"
DPIDS=() LPID= BPID= RPID= FAILED=0

# alive PID: running and not a zombie (kill -0 succeeds on an unreaped child).
alive() {
    local s
    s=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) || return 1
    [[ -n $s && $s != Z ]]
}
# stop_daemons: SIGTERM to every daemon in DPIDS, up to 30 s for all to go,
# then each one's exit code; sets EXIT_OK, EXIT_BAD (pid:code list), HUNG.
stop_daemons() {
    local p deadline rc
    for p in "${DPIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    deadline=$(($(date +%s) + 30))
    HUNG=0
    for p in "${DPIDS[@]}"; do
        while alive "$p" && (($(date +%s) < deadline)); do sleep 0.05; done
        if alive "$p"; then HUNG=$((HUNG + 1)); kill -KILL "$p" 2>/dev/null || true; fi
    done
    EXIT_OK=0 EXIT_BAD=
    for p in "${DPIDS[@]}"; do
        wait "$p" && rc=0 || rc=$?
        if ((rc == 0)); then EXIT_OK=$((EXIT_OK + 1)); else EXIT_BAD+=" $p:$rc"; fi
    done
    DPIDS=()
}
stop_bouncer() {
    [[ -n $BPID ]] || return 0
    kill -TERM "$BPID" 2>/dev/null || true
    local i
    for i in $(seq 100); do kill -0 "$BPID" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$BPID" 2>/dev/null || true
    BPID=
    [[ -n $RPID ]] && { wait "$RPID" 2>/dev/null || true; } # the runuser that started it
    RPID=
}
cleanup() {
    local p
    for p in "${DPIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    [[ -n $LPID ]] && kill -KILL "$LPID" 2>/dev/null || true
    stop_bouncer
    pg_stop
    if ((KEEP)); then log "artifacts kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

row() {
    printf '|' | tee -a "$RESULTS"
    local c
    for c in "$@"; do printf ' %s |' "$c" | tee -a "$RESULTS"; done
    echo | tee -a "$RESULTS"
}
# verdict CONDITION: sets V to ok, or to **FAILED** and makes the exit code 1.
# (Not in a $(…): FAILED must survive.)
verdict() {
    if eval "$1"; then V=ok; else V="**FAILED**"; FAILED=1; fi
}
# goal X LIMIT: sets V to met / not met (a goal, not a correctness check).
goal() { if (($(echo "$1 <= $2" | bc))); then V=met; else V="not met"; fi; }

# ---------------------------------------------------------------- CPU
# proc_ticks PID [1]: utime+stime (with 1: + cutime+cstime, the reaped
# children's) in clock ticks; 0 when the process is gone. The comm field may
# hold spaces, so fields are counted after its closing parenthesis.
proc_ticks() {
    local s
    s=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
    awk -v c="${2:-0}" '{print $12 + $13 + (c ? $14 + $15 : 0)}' <<<"$s"
}
# pg_ticks: every PostgreSQL process of the cluster: the postmaster with its
# reaped children, plus each live child (backends, autovacuum, checkpointer,
# walwriter, …).
pg_ticks() {
    local pm p t
    pm=$(head -1 "$PG_DIR/data/postmaster.pid")
    t=$(proc_ticks "$pm" 1)
    for p in $(ps --ppid "$pm" -o pid=); do t=$((t + $(proc_ticks "$p"))); done
    echo "$t"
}
daemon_ticks() {
    local p t=0
    for p in "${DPIDS[@]}"; do t=$((t + $(proc_ticks "$p"))); done
    echo "$t"
}
# transactions the server finished in database fleet (committed + rolled
# back; the statistics are flushed within a second, so a window's count is
# exact to about a second's worth at either end)
pg_xacts() {
    "$PG_BIN/psql" -X -Atq -d fleet -c "SELECT pg_stat_force_next_flush()" \
        -c "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'fleet'" | tail -1
}
# measure SECS: CPU over a window; sets M_EL (s), M_PG, M_BOUNCER, M_DAEMONS
# (ticks), M_XACTS (server transactions in the window, the harness's two
# counting ones excluded).
measure() {
    local t0 t1 p0 p1 b0=0 b1=0 d0 d1 x0 x1
    x0=$(pg_xacts)
    t0=$(now) p0=$(pg_ticks) d0=$(daemon_ticks)
    [[ -n $BPID ]] && b0=$(proc_ticks "$BPID")
    sleep "$1"
    t1=$(now) p1=$(pg_ticks) d1=$(daemon_ticks)
    [[ -n $BPID ]] && b1=$(proc_ticks "$BPID")
    x1=$(pg_xacts)
    M_EL=$(calc "$t1 - $t0") M_PG=$((p1 - p0)) M_BOUNCER=$((b1 - b0)) M_DAEMONS=$((d1 - d0))
    M_XACTS=$((x1 - x0 - 2))
}
# ms of CPU per second of window (per N when given)
ms_per_s() { calc "$1 * 1000 / $HZ / $M_EL / ${2:-1}"; }

# ---------------------------------------------------------------- set-up
log "work directory $WORK; binary $BIN; load $(load_now)"
pg_start "$WORK/pg"
PSQL=$PG_BIN/psql
DIRECT_URL="postgres://postgres@localhost:5432/fleet?host=$PG_DIR"
"$PSQL" -X -q -c "CREATE DATABASE fleet"
LOCKDB_URL=$DIRECT_URL "$BIN" migrate >"$WORK/migrate.out" 2>"$WORK/migrate.err" \
    || { cat "$WORK/migrate.err" >&2; exit 1; }
log "loading $LEASES live leases"
"$PSQL" -X -q -d fleet -v n="$LEASES" -v past=false -v spread=0 -v lead=0 -f "$HERE/load_leases.sql"
"$PSQL" -X -q -d fleet -c "VACUUM ANALYZE" -c CHECKPOINT
"$PSQL" -X -q -d fleet -c "CREATE EXTENSION IF NOT EXISTS pg_prewarm" \
    -c "SELECT pg_prewarm(c) FROM unnest(ARRAY['lock_entry', 'lock_entry_pkey', 'lock_entry_expiry_idx']::regclass[]) AS c" \
    >/dev/null 2>&1 || log "pg_prewarm unavailable; the first sweeps warm the cache instead"

# PgBouncer as the server's user, on a free loopback port, admin console for
# `postgres` (SHOW POOLS / SHOW STATS).
BDIR=$WORK/pgbouncer
mkdir -p "$BDIR"
BPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo '"postgres" ""' >"$BDIR/userlist.txt"
cat >"$BDIR/pgbouncer.ini" <<INI
[databases]
fleet = host=$PG_DIR port=5432 dbname=fleet user=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $BPORT
unix_socket_dir =
auth_type = trust
auth_file = $BDIR/userlist.txt
admin_users = postgres
pidfile = $BDIR/pgbouncer.pid
logfile = $BDIR/pgbouncer.log
pool_mode = transaction
default_pool_size = $POOL
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = $MAXCLIENT
server_reset_query =
log_connections = 0
log_disconnections = 0
INI
chmod 644 "$BDIR"/*
[[ $(id -u) == 0 ]] && chown -R postgres: "$BDIR"
# runuser's PAM session resets the soft descriptor limit (to 1024 here);
# PgBouncer needs one per client and per server connection.
FDS=$((MAXCLIENT + POOL + 100))
pg_as bash -c 'ulimit -n "$1" && exec "$2" "$3"' fleet "$FDS" "$PGBOUNCER" "$BDIR/pgbouncer.ini" >"$BDIR/stderr" 2>&1 &
RPID=$!
for _ in $(seq 200); do
    [[ -s $BDIR/pgbouncer.pid ]] && "$PSQL" -X -Atq -h 127.0.0.1 -p "$BPORT" -U postgres pgbouncer -c "SHOW VERSION" >/dev/null 2>&1 && break
    sleep 0.05
done
BPID=$(cat "$BDIR/pgbouncer.pid" 2>/dev/null) || { cat "$BDIR/stderr" "$BDIR/pgbouncer.log" >&2; exit 1; }
BOUNCER_VERSION=$("$PSQL" -X -Atq -h 127.0.0.1 -p "$BPORT" -U postgres pgbouncer -c "SHOW VERSION")
BOUNCER_URL="postgres://postgres@127.0.0.1:$BPORT/fleet"
admin() { "$PSQL" -X -Atq -F' ' -h 127.0.0.1 -p "$BPORT" -U postgres pgbouncer -c "$1"; }
# clients PgBouncer holds for database fleet (active + waiting)
bouncer_clients() { admin "SHOW POOLS" | awk '$1 == "fleet" {s += $3 + $4} END {print s + 0}'; }
# total_xact_count total_wait_time(us) for database fleet
bouncer_stats() { admin "SHOW STATS" | awk '$1 == "fleet" {print $2, $8}'; }

# StatsD listener for every daemon; reached_at when the wave is counted.
"$(command -v python3)" "$HERE/udp_count.py" "$WORK/statsd.port" "$WORK/statsd.json" "$EXPIRE" &
LPID=$!
for _ in $(seq 100); do [[ -s $WORK/statsd.port ]] && break; sleep 0.05; done
SPORT=$(cat "$WORK/statsd.port")

# start_fleet N URL TAG: N daemons, stdout/stderr to $WORK/TAG/<i>.out/.err.
start_fleet() {
    local i
    mkdir -p "$WORK/$3"
    for ((i = 0; i < $1; i++)); do
        LOCKDB_URL=$2 STATSD_HOST=127.0.0.1 STATSD_PORT=$SPORT \
            "$BIN" run >"$WORK/$3/$i.out" 2>"$WORK/$3/$i.err" &
        DPIDS+=($!)
    done
}
count_alive() {
    local p n=0
    for p in "${DPIDS[@]}"; do alive "$p" && n=$((n + 1)); done
    echo "$n"
}
# grep_count PATTERN DIR: matching lines over every stdout and stderr file
grep_count() { cat "$2"/*.out "$2"/*.err | grep -c -- "$1" || true; }

# What the fleet's held-lease recount costs the server (once per
# HELD_COUNT_MAX_AGE, 3 s, for the whole fleet), in CPU, not wall time (the machine
# may be loaded): 50 count(*) in one session, no daemon running, the
# cluster's CPU before and after (one connection start included, /50).
c0=$(pg_ticks)
for _ in $(seq 50); do echo "SELECT count(*) FROM lock_entry;"; done | "$PSQL" -X -Atq -d fleet >/dev/null
sleep 0.2 # the postmaster reaps the backend; its CPU moves to cutime
COUNT_MS=$(calc "($(pg_ticks) - $c0) * 1000 / $HZ / 50")

# ---------------------------------------------------------------- baseline
log "baseline: no daemon, ${IDLE_SECS} s"
LOADS+=("baseline $(load_now)")
measure "$IDLE_SECS"
BASE_PG=$(ms_per_s "$M_PG")

# ---------------------------------------------------------------- fleet
log "starting $DAEMONS daemons through PgBouncer (pool $POOL, max_client_conn $MAXCLIENT)"
T_START=$(now)
start_fleet "$DAEMONS" "$BOUNCER_URL" bouncer
deadline=$(($(date +%s) + 180))
while (($(bouncer_clients) < CLIENTS_EACH * DAEMONS)); do
    if (($(date +%s) > deadline)); then
        log "only $(bouncer_clients) of $((CLIENTS_EACH * DAEMONS)) clients reached PgBouncer after 180 s; $(count_alive) daemons alive"
        break
    fi
    sleep 0.5
done
CONNECTED_S=$(calc "$(now) - $T_START")
CLIENTS=$(bouncer_clients)
log "$CLIENTS clients in PgBouncer after $(fmt "$CONNECTED_S" 1) s; $(count_alive) alive; letting the start-up pass"
# Every daemon's first sweeps (and first held-lease recount) are start-up
# work, not idle work: wait one recount interval before measuring.
sleep 11
log "idle through PgBouncer: ${IDLE_SECS} s"
LOADS+=("idle via PgBouncer $(load_now)")
ALIVE_IDLE0=$(count_alive)
measure "$IDLE_SECS"
IDLE_PG=$(ms_per_s "$M_PG") IDLE_PG_PER=$(ms_per_s "$M_PG" "$DAEMONS")
M_IDLE_PG_MS=$(calc "$M_PG * 1000 / $HZ")
IDLE_BOUNCER=$(ms_per_s "$M_BOUNCER") IDLE_DAEMONS_PER=$(ms_per_s "$M_DAEMONS" "$DAEMONS")
IDLE_EL=$M_EL IDLE_XACTS=$M_XACTS
ALIVE_IDLE1=$(count_alive)

# ---------------------------------------------------------------- expiry
log "expiry: $EXPIRE leases over $EXPIRE_SECS s (5 s lead)"
LOADS+=("expiry $(load_now)")
read -r X0 W0 < <(bouncer_stats)
T_WAVE=$(now)
"$PSQL" -X -q -d fleet -v n="$EXPIRE" -v spread="$EXPIRE_SECS" -v lead=5 -f "$HERE/fleet_expiring.sql"
deadline=$(($(date +%s) + 5 + EXPIRE_SECS + 120))
while :; do
    left=$("$PSQL" -X -Atq -d fleet -c "SELECT count(*) FROM lock_entry WHERE lock_key LIKE 'fleet/%'")
    lines=$(cat "$WORK"/bouncer/*.out | grep -c ' message=lease_expired ' || true)
    reached=$(json "$WORK/statsd.json" "d['reached_at'] or ''" 2>/dev/null || true)
    ((left == 0 && lines >= EXPIRE)) && [[ -n $reached ]] && break
    if (($(date +%s) > deadline)); then log "expiry wave not done: $left left, $lines lines, StatsD reached: ${reached:-no}"; break; fi
    sleep 0.5
done
WAVE_S=$(calc "$(now) - $T_WAVE")
read -r X1 W1 < <(bouncer_stats)
XACTS=$((X1 - X0)) WAIT_MS=$(calc "($W1 - $W0) / 1000")
LOADS+=("after expiry $(load_now)")
ALIVE_END=$(count_alive)
LIVE_LEFT=$("$PSQL" -X -Atq -d fleet -c "SELECT count(*) FROM lock_entry WHERE lock_key NOT LIKE 'fleet/%'")

D=$WORK/bouncer
cat "$D"/*.out >"$WORK/all.out"
EXPIRED_LINES=$(grep -c ' message=lease_expired ' "$WORK/all.out" || true)
FOREIGN=$(grep ' message=lease_expired ' "$WORK/all.out" | grep -vc ' lockKey=fleet/' || true)
ST=$(python3 "$HERE/overdue_stats.py" "$WORK/all.out")
UNIQUE=$(json /dev/stdin "d['unique']" <<<"$ST")
DUPS=$((EXPIRED_LINES - UNIQUE))
# -1 when there is no line at all (and then the checks fail on the count).
P50=$(json /dev/stdin "d['p50'] if d['count'] else -1" <<<"$ST")
P99=$(json /dev/stdin "d['p99'] if d['count'] else -1" <<<"$ST")
PMAX=$(json /dev/stdin "d['max'] if d['count'] else -1" <<<"$ST")
SWEEP_FAILED=$(grep_count 'message=sweep_failed' "$D")
JOB_FAILED=$(grep_count 'message=job_reap_failed' "$D")
ERRORS=$(cat "$D"/*.out "$D"/*.err | grep -c 'level=error' || true)
PANICS=$(grep_count 'panicked' "$D")
REPORTERS=$(for f in "$D"/*.out; do grep -c ' message=lease_expired ' "$f" || true; done | awk '$1 > 0 {n++} END {print n + 0}')

log "stopping the fleet (SIGTERM)"
stop_daemons
B_EXIT_OK=$EXIT_OK B_EXIT_BAD=$EXIT_BAD B_HUNG=$HUNG
# The daemons flush StatsD on the way out; then the listener's final count.
kill -TERM "$LPID"
wait "$LPID" || true
LPID=
STATSD_EXPIRED=$(json "$WORK/statsd.json" "sum(v for k, v in d['counters'].items() if k.split('|')[0] == 'lock.lease.expired')")
BOUNCER_ERRORS=$(grep -c -i 'error\|warning' "$BDIR/pgbouncer.log" || true)
BOUNCER_FDS=$(grep -o 'kernel file descriptor limit: .*' "$BDIR/pgbouncer.log" | head -1)
stop_bouncer

# ---------------------------------------------------------------- direct
if ((DIRECT > 0)); then
    "$(command -v python3)" "$HERE/udp_count.py" "$WORK/statsd.port2" "$WORK/statsd2.json" &
    LPID=$!
    for _ in $(seq 100); do [[ -s $WORK/statsd.port2 ]] && break; sleep 0.05; done
    SPORT=$(cat "$WORK/statsd.port2")
    # The wave's dead rows and stale statistics out of the way first, so no
    # autovacuum lands in the window.
    "$PSQL" -X -q -d fleet -c "VACUUM ANALYZE"
    log "starting $DIRECT daemons directly"
    start_fleet "$DIRECT" "$DIRECT_URL" direct
    deadline=$(($(date +%s) + 180))
    direct_clients() { "$PSQL" -X -Atq -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lease-sweeper'"; }
    while (($(direct_clients) < CLIENTS_EACH * DIRECT)) && (($(date +%s) < deadline)); do sleep 0.5; done
    sleep 11
    log "idle direct: ${IDLE_SECS} s"
    LOADS+=("idle direct $(load_now)")
    measure "$IDLE_SECS"
    DIRECT_PG=$(ms_per_s "$M_PG") DIRECT_PG_PER=$(ms_per_s "$M_PG" "$DIRECT") DIRECT_XACTS=$M_XACTS DIRECT_EL=$M_EL
    DIRECT_ALIVE=$(count_alive)
    DIRECT_FAILED=$(( $(grep_count 'message=sweep_failed' "$WORK/direct") + $(grep_count 'message=job_reap_failed' "$WORK/direct") ))
    stop_daemons
    D_EXIT_OK=$EXIT_OK D_EXIT_BAD=$EXIT_BAD
    kill -TERM "$LPID"; wait "$LPID" || true; LPID=
fi

# ---------------------------------------------------------------- report
{
    echo
    echo "### Fleet: $DAEMONS daemons through one PgBouncer ($BOUNCER_VERSION, transaction pooling, default_pool_size $POOL), $LEASES live leases"
    echo
    echo "- $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); $("$PSQL" -X -Atc 'SHOW server_version') (fsync off, max_connections $MAXCONN); $("$BIN" --version)"
    echo "- load (1/5/15 min) during the run: $(IFS=';'; echo "${LOADS[*]}")"
    echo
} | tee -a "$RESULTS"
row check measured expected verdict
row --- --- --- ---
verdict '((ALIVE_END == DAEMONS && ALIVE_IDLE0 == DAEMONS))'
row "daemons alive (start of idle / end of idle / end of expiry)" "$ALIVE_IDLE0 / $ALIVE_IDLE1 / $ALIVE_END" "$DAEMONS" "$V"
verdict '((CLIENTS == CLIENTS_EACH * DAEMONS))'
row "PgBouncer clients after start-up" "$CLIENTS (in $(fmt "$CONNECTED_S" 1) s)" "$((CLIENTS_EACH * DAEMONS))" "$V"
verdict '((EXPIRED_LINES == EXPIRE))'
row "lease_expired lines (all stdout files)" "$EXPIRED_LINES" "$EXPIRE" "$V"
verdict '((UNIQUE == EXPIRE))'
row "distinct lockKey+token" "$UNIQUE" "$EXPIRE" "$V"
verdict '((DUPS == 0))'
row "duplicates" "$DUPS" 0 "$V"
verdict '((FOREIGN == 0))'
row "lines for a live lease" "$FOREIGN" 0 "$V"
verdict '((LIVE_LEFT == LEASES))'
row "live leases left" "$LIVE_LEFT" "$LEASES" "$V"
verdict '((STATSD_EXPIRED == EXPIRE))'
row "StatsD lock.lease.expired" "$STATSD_EXPIRED" "$EXPIRE" "$V"
verdict '((SWEEP_FAILED + JOB_FAILED + ERRORS + PANICS == 0))'
row "sweep_failed / job_reap_failed / level=error / panics" "$SWEEP_FAILED / $JOB_FAILED / $ERRORS / $PANICS" "0 / 0 / 0 / 0" "$V"
verdict '((B_EXIT_OK == DAEMONS))'
row "exit 0 after SIGTERM" "$B_EXIT_OK${B_EXIT_BAD:+ (others:$B_EXIT_BAD)}; $B_HUNG hung > 30 s" "$DAEMONS" "$V"
verdict '((P99 >= 0 && P99 <= 1100))'
row "overdueMillis p50 / p99 / max" "$P50 / $P99 / $PMAX ms" "p99 ≤ 1100 ms" "$V"
row "daemons that reported an expiry" "$REPORTERS" "" ""
row "wave: insert to all swept and counted" "$(fmt "$WAVE_S" 1) s" "$((5 + EXPIRE_SECS)) s + lag" ""
row "PgBouncer queue wait, during the wave" "$(fmt "$(calc "$WAIT_MS / $((XACTS > 0 ? XACTS : 1))")" 3) ms per transaction ($XACTS transactions, $(fmt "$WAIT_MS" 0) ms waited in all)" "" ""
row "PgBouncer log errors/warnings" "$BOUNCER_ERRORS" "" "${BOUNCER_FDS:-}"
row "database CPU, no daemon" "$(fmt "$BASE_PG" 2) ms/s" "" ""
goal "$IDLE_PG_PER" 0.2
row "database CPU, $DAEMONS idle via PgBouncer" "$(fmt "$IDLE_PG" 1) ms/s = **$(fmt "$IDLE_PG_PER" 3) ms/s per daemon**" "goal ≤ 0.2 ms/s per daemon" "$V"
row "server transactions, $DAEMONS idle via PgBouncer" "$(fmt "$(calc "$IDLE_XACTS / $IDLE_EL / $DAEMONS")" 2) per daemon per s; $(fmt "$(calc "$M_IDLE_PG_MS / $((IDLE_XACTS > 0 ? IDLE_XACTS : 1))")" 3) ms database CPU each" "" "held recount (count(*) at $LEASES leases): $(fmt "$COUNT_MS" 1) ms of CPU, once per 3 s for the whole fleet (shared count) = $(fmt "$(calc "$COUNT_MS / 3 / $DAEMONS")" 4) ms/s per daemon"
row "PgBouncer CPU, idle" "$(fmt "$IDLE_BOUNCER" 1) ms/s ($(fmt "$(calc "$IDLE_BOUNCER / $DAEMONS")" 3) per daemon)" "" ""
row "daemon CPU, idle" "$(fmt "$IDLE_DAEMONS_PER" 3) ms/s per daemon ($(fmt "$(calc "$IDLE_DAEMONS_PER * $DAEMONS")" 1) ms/s in all)" "" ""
if ((DIRECT > 0)); then
    goal "$DIRECT_PG_PER" 0.2
    row "database CPU, $DIRECT idle direct" "$(fmt "$DIRECT_PG" 1) ms/s = **$(fmt "$DIRECT_PG_PER" 3) ms/s per daemon**" "goal ≤ 0.2 ms/s per daemon" "$V"
    verdict '((DIRECT_ALIVE == DIRECT && DIRECT_FAILED == 0 && D_EXIT_OK == DIRECT))'
    row "server transactions, $DIRECT idle direct" "$(fmt "$(calc "$DIRECT_XACTS / $DIRECT_EL / $DIRECT")" 2) per daemon per s; $(fmt "$(calc "$DIRECT_PG * $DIRECT_EL / $((DIRECT_XACTS > 0 ? DIRECT_XACTS : 1))")" 3) ms database CPU each" "" ""
    row "direct: alive / failures / exit 0" "$DIRECT_ALIVE / $DIRECT_FAILED / $D_EXIT_OK${D_EXIT_BAD:+ (others:$D_EXIT_BAD)}" "$DIRECT / 0 / $DIRECT" "$V"
fi
{
    echo
    echo "Idle windows: ${IDLE_SECS} s (measured $(fmt "$IDLE_EL" 1) s), CPU = utime+stime of every PostgreSQL process from /proc (1/$HZ s ticks)."
    echo "Reproduce: \`scripts/bench.d/fleet.sh ${ARGS[*]}\`"
} | tee -a "$RESULTS"
[[ -n $RESULTS_FILE ]] && cat "$RESULTS" >>"$RESULTS_FILE"
if ((FAILED)); then
    log "a check FAILED (see the table)"
    if ((!KEEP)); then
        log "first errors:"
        cat "$WORK"/bouncer/*.out "$WORK"/bouncer/*.err 2>/dev/null | grep 'level=error\|panicked' | head -5 >&2 || true
    fi
    exit 1
fi
log "done"
