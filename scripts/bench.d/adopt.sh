# shellcheck shell=bash
# The adopt step (sourced by scripts/bench; uses its helpers): what
# `migrate` costs a lock server that runs while the sidecar adopts it.
#
# A database whose lock server was made by its own migration as its own
# owner role (tests/it/adopt/lock_server.sql: its own columns, sequence,
# trigger and history) with ADOPT_LEASES live leases. pgbench plays its
# callers: tryInsert, extend and deleteIfOwner (adopt_lock_server.pgbench)
# at ADOPT_RATE/s (-R, 4 clients) for ADOPT_SECS s, with per-transaction
# logs. Three runs, each on a fresh copy of the same seed:
#   none     the load alone;
#   migrate  `lease-sweeper migrate` (a superuser) starts ADOPT_AT s in;
#   blocked  the same, while a lock-server transaction that has written to
#            lock_entry stays open for 3 s from 1 s before migrate starts:
#            migrate's trigger lock waits at most 100 ms at a time, so the
#            callers must not queue behind it for longer.
# Reported per run: the callers' p50/p99/max latency (schedule lag
# included) over the whole run and over the window from migrate's start to
# 1 s after its end (the same seconds in `none`), failed transactions, and
# migrate's wall time and lock tries.

ADOPT_RATE=${BENCH_ADOPT_RATE:-1000}
if ((QUICK)); then
    ADOPT_LEASES=20000 ADOPT_SECS=12 ADOPT_AT=4
else
    ADOPT_LEASES=${BENCH_ADOPT_LEASES:-200000} ADOPT_SECS=${BENCH_ADOPT_SECS:-20} ADOPT_AT=8
fi

# adopt_stats LOGS FROM TO: count, p50, p99, max (ms) of the transactions
# pgbench logged in LOGS that started between FROM and TO (epoch s).
adopt_stats() {
    cat $1 | python3 -c '
import sys
lo, hi = float(sys.argv[1]), float(sys.argv[2])
xs = []
for line in sys.stdin:
    f = line.split()
    # client_id transaction_no time script_no time_epoch time_us [schedule_lag]
    t = int(f[4]) + int(f[5]) / 1e6
    if lo <= t <= hi:
        xs.append(int(f[2]) / 1000)
xs.sort()
if not xs:
    print("0|-|-|-")
else:
    q = lambda p: xs[min(len(xs) - 1, round((len(xs) - 1) * p))]
    print(f"{len(xs)}|{q(0.5):.2f}|{q(0.99):.2f}|{xs[-1]:.2f}")
' "$2" "$3"
}

adopt_run() { # adopt_run VARIANT
    local variant=$1 db=adopt_$1 pgout=$WORK/adopt.$1.out t0 pgb rc=0 m0 m1 tries blocker=""
    createdb "$db" adopt_seed
    rm -f "$WORK"/adopt."$variant".log*
    t0=$(now)
    (cd "$WORK" && "$PG_BIN/pgbench" -n -M prepared -c 4 -j 2 -R "$ADOPT_RATE" -T "$ADOPT_SECS" \
        -l --log-prefix="adopt.$variant.log" -f "$HERE/adopt_lock_server.pgbench" \
        -U adopt_owner "$db" >"$pgout" 2>&1) &
    pgb=$!
    PIDS+=("$pgb")
    m0=$(calc "$t0 + $ADOPT_AT")
    if [[ $variant == blocked ]]; then
        sleep "$(calc "x = $m0 - 1 - $(now); if (x < 0) 0 else x")"
        $PSQL -X -q -d "$db" -c "BEGIN; UPDATE lock_entry SET holder_host = 'long' WHERE lock_key = 'seed-1'; SELECT pg_sleep(3); COMMIT" >/dev/null &
        blocker=$!
    fi
    if [[ $variant != none ]]; then
        sleep "$(calc "x = $m0 - $(now); if (x < 0) 0 else x")"
        m0=$(now)
        LOCKDB_URL=$(url "$db") "$BIN" migrate >"$WORK/adopt.$variant.migrate" 2>&1 \
            || { echo "bench: adopt: migrate failed:" >&2; cat "$WORK/adopt.$variant.migrate" >&2; }
        m1=$(now)
        tries=$(grep -o 'lockTries=[0-9]*' "$WORK/adopt.$variant.migrate" | cut -d= -f2)
    else
        m1=$(calc "$m0 + ${ADOPT_MIGRATE_SECS:-0.5}")
        tries=—
    fi
    [[ -n $blocker ]] && wait "$blocker"
    wait "$pgb" || rc=$?
    ((rc == 0)) || { echo "bench: adopt: pgbench exit $rc" >&2; tail -5 "$pgout" >&2; }
    local all window failed
    all=$(adopt_stats "$WORK/adopt.$variant.log*" 0 9999999999)
    window=$(adopt_stats "$WORK/adopt.$variant.log*" "$m0" "$(calc "$m1 + 1")")
    failed=$(grep -o 'number of failed transactions: [0-9]*' "$pgout" | awk '{print $5}')
    [[ $variant == none ]] || ADOPT_MIGRATE_SECS=$(calc "$m1 - $m0")
    row "$variant" "${all//|/ | }" "${window//|/ | }" "${failed:-0}" \
        "$([[ $variant == none ]] && echo — || fmt "$(calc "$m1 - $m0")")" "${tries:-—}"
    $PSQL -X -q -c "DROP DATABASE $db" >/dev/null
}

bench_adopt() {
    [[ -x $PG_BIN/pgbench ]] || { echo "bench: adopt needs pgbench in $PG_BIN" >&2; return 1; }
    log "adopt: a lock server's own schema, $ADOPT_LEASES live leases, its calls at $ADOPT_RATE/s through migrate"
    $PSQL -X -q -c "DROP ROLE IF EXISTS adopt_owner" -c "CREATE ROLE adopt_owner LOGIN" >/dev/null 2>&1 || true
    createdb adopt_seed
    $PSQL -X -q -d adopt_seed -c "GRANT CREATE ON SCHEMA public TO adopt_owner" >/dev/null
    $PSQL -X -q -d adopt_seed -U adopt_owner -v ON_ERROR_STOP=1 -f "$ROOT/tests/it/adopt/lock_server.sql" >/dev/null
    $PSQL -X -q -d adopt_seed -U adopt_owner -c "
        INSERT INTO lock_entry (lock_key, owner_id, token, acquired_at, expires_at, lease_version)
        SELECT 'seed-' || g, 'holder-' || (g % 64), nextval('ls_fencing_seq'), now(), now() + interval '1 day', 1
          FROM generate_series(1, $ADOPT_LEASES) AS g" -c "VACUUM ANALYZE" >/dev/null
    header "Adopt: the lock server's own statements (tryInsert, extend, deleteIfOwner) at $ADOPT_RATE/s by pgbench -R for $ADOPT_SECS s, $ADOPT_LEASES live leases; \`migrate\` at $ADOPT_AT s (blocked: behind a lock-server transaction holding lock_entry for 3 s)" \
        "run" "calls" "p50 ms" "p99 ms" "max ms" "calls in migrate's window" "p50 ms" "p99 ms" "max ms" "failed" "migrate s" "lock tries"
    adopt_run migrate
    adopt_run none
    adopt_run blocked
    $PSQL -X -q -c "DROP DATABASE adopt_seed" >/dev/null
}
