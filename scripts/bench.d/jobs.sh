# shellcheck shell=bash
# The job-reaper benchmark (sourced by scripts/bench; uses its helpers).
#
# Ours: fn_job_reap_stale_leases_apply draining $JOBS stale jobs (4/5 reset
# with backoff, 1/5 dead-lettered, the JSON report built), called from psql
# at the largest limit the function accepts and at the daemon's batch, and
# the daemon itself (lines written, counts pushed). Peers: each rescues the
# same number of stale jobs through its own rescue step, in its own schema
# on the same cluster, installed into $PEER_DIR only (never by CI).

PEER_DIR=${BENCH_PEERS:-$WORK/peers}

# time_psql DB SQL...: seconds for psql to run the statements, output dropped.
time_psql() {
    local db=$1 t0 t1
    shift
    t0=$(now)
    "$PSQL" -X -q -At -v ON_ERROR_STOP=1 -d "$db" "$@" >/dev/null
    t1=$(now)
    calc "$t1 - $t0"
}

jobs_row() { # name seconds note
    row "$1" "$(fmt "$2")" "$(fmt "$(calc "$2 * 1000000 / $JOBS")" 1)" "$3"
}

jobs_ours() {
    log "jobs: seeding $JOBS stale jobs"
    createdb seed_jobs
    migrate seed_jobs
    $PSQL -X -q -d seed_jobs -v n="$JOBS" -f "$HERE/load_jobs.sql" >/dev/null
    $PSQL -X -q -c CHECKPOINT
    header "Job reaper: $JOBS stale jobs (4/5 reset with backoff, 1/5 dead-lettered)" \
        "who / rescue step" "seconds" "µs per job" "does"
    local limit s calls check
    for limit in 10000 1000; do
        createdb jobs_ours seed_jobs
        $PSQL -X -q -d jobs_ours -c "VACUUM ANALYZE" >/dev/null
        calls=$((JOBS / limit + 1))
        s=$(time_psql jobs_ours -c "$(for ((i = 0; i < calls; i++)); do
            echo "SELECT fn_job_reap_stale_leases_apply('bench', $limit);"
        done)")
        check=$($PSQL -X -At -d jobs_ours -c "SELECT count(*) FILTER (WHERE state = 'retry_waiting') || ' reset, ' || count(*) FILTER (WHERE state = 'dead_letter') || ' dead-lettered, ' || (SELECT count(*) FROM job_dead_letter) || ' in job_dead_letter, ' || count(*) FILTER (WHERE state = 'leased') || ' left' FROM job_queue")
        jobs_row "ours: fn_job_reap_stale_leases_apply, psql, limit $limit ($calls calls)" "$s" "backoff, dead letter, JSON report per action; $check"
        log "jobs ours limit $limit: $s s ($check)"
    done

    # The row-returning alternative (apply_rows.sql), same seed. (The
    # single-UPDATE rewrite measured here before is now the product function.)
    createdb jobs_ours seed_jobs
    $PSQL -X -q -d jobs_ours -c "VACUUM ANALYZE" -f "$HERE/apply_rows.sql" >/dev/null
    calls=$((JOBS / 10000 + 1))
    s=$(time_psql jobs_ours -c "$(for ((i = 0; i < calls; i++)); do echo "SELECT * FROM bench_job_reap_apply_rows('bench', 10000);"; done)")
    check=$($PSQL -X -At -d jobs_ours -c "SELECT count(*) FILTER (WHERE state = 'retry_waiting') || ' reset, ' || count(*) FILTER (WHERE state = 'dead_letter') || ' dead-lettered, ' || count(*) FILTER (WHERE state = 'leased') || ' left' FROM job_queue")
    jobs_row "alternative: bench_job_reap_apply_rows, psql, limit 10000 ($calls calls)" "$s" "one row per action instead of the JSON document; $check"
    log "jobs bench_job_reap_apply_rows: $s s ($check)"

    # The daemon: every action as a job_lease_expired line, counts pushed.
    createdb jobs_daemon seed_jobs
    $PSQL -X -q -d jobs_daemon -c "VACUUM ANALYZE" >/dev/null
    start_listener jobs "$JOBS" queue.lease.reaped
    local out=$WORK/jobs.daemon.log t0 reached deadline=$(($(date +%s) + 600))
    t0=$(now)
    start_daemon jobs_daemon "$out"
    while :; do
        reached=$([[ -s $LRESULT ]] && json "$LRESULT" "d['reached_at'] or ''" || true)
        [[ -n $reached ]] && break
        if (($(date +%s) > deadline)) || ! kill -0 "$DPID" 2>/dev/null; then
            echo "bench: the daemon did not reap the jobs (see $out)" >&2
            reached=
            break
        fi
        sleep 0.05
    done
    stop_pid "$DPID"
    stop_pid "$LPID"
    if [[ -n $reached ]]; then
        jobs_row "ours: the daemon (lines to a file, counts to StatsD)" "$(calc "$reached - $t0")" \
            "$(grep -c ' message=job_lease_expired ' "$out") job_lease_expired lines; counts $(json "$LRESULT" "{k: v for k, v in d['counters'].items() if k.startswith('queue.lease.reaped')}")"
    fi
    ((KEEP)) || rm -f "$out"
    $PSQL -X -q -c "DROP DATABASE jobs_ours" -c "DROP DATABASE jobs_daemon"
}

# ------------------------------------------------------------ apalis-postgres
peer_apalis() {
    command -v cargo >/dev/null || { row "apalis-postgres" "-" "-" "not run: no cargo"; return; }
    local src=$PEER_DIR/apalis bin
    mkdir -p "$src"
    cp -r "$HERE/apalis/Cargo.toml" "$HERE/apalis/src" "$src/"
    log "jobs: building the apalis-postgres driver (crates.io) in $src"
    if ! (cd "$src" && CARGO_TARGET_DIR=$PEER_DIR/apalis-target cargo build --release --quiet) >"$PEER_DIR/apalis.build.log" 2>&1; then
        row "apalis-postgres 1.0.0 reenqueue_orphaned" "-" "-" "not run: build failed ($(tail -1 "$PEER_DIR/apalis.build.log"))"
        return
    fi
    bin=$PEER_DIR/apalis-target/release/apalis-bench-driver
    createdb peer_apalis
    "$bin" setup "$(url peer_apalis)"
    # A dead worker (no heartbeat for an hour) holding $JOBS running jobs.
    $PSQL -X -q -d peer_apalis -v ON_ERROR_STOP=1 -v n="$JOBS" <<'SQL'
INSERT INTO apalis.workers (id, worker_type, storage_name, layers, last_seen)
VALUES ('dead-worker', 'bench', 'PostgresStorage', '', now() - interval '1 hour');
INSERT INTO apalis.jobs (job, id, job_type, status, attempts, max_attempts, run_at, lock_at, lock_by)
SELECT convert_to(json_build_object('order', g, 'customer', 'c-' || (g % 997))::text, 'UTF8'),
       'bench-' || g, 'bench', 'Running', g % 5, 5, now() - interval '1 hour',
       now() - interval '1 hour', 'dead-worker'
  FROM generate_series(1, :n) AS g;
VACUUM ANALYZE apalis.jobs;
SQL
    local res
    res=$("$bin" rescue "$(url peer_apalis)" bench 60)
    jobs_row "apalis-postgres 1.0.0 reenqueue_orphaned (one statement)" "$(cut -d' ' -f2 <<<"$res" | cut -d= -f2)" \
        "back to Pending, attempts+1; no backoff, no dead letter, no per-job report; $(cut -d' ' -f1 <<<"$res")"
    $PSQL -X -q -c "DROP DATABASE peer_apalis"
}

# ------------------------------------------------------------ graphile-worker
peer_graphile() {
    command -v npm >/dev/null || { row "graphile-worker" "-" "-" "not run: no npm"; return; }
    local dir=$PEER_DIR/node
    mkdir -p "$dir"
    [[ -d $dir/node_modules/graphile-worker ]] || {
        log "jobs: npm install graphile-worker pg-boss in $dir"
        (cd "$dir" && npm init -y >/dev/null && npm install --no-audit --no-fund graphile-worker pg-boss >"$PEER_DIR/npm.log" 2>&1) \
            || { row "graphile-worker" "-" "-" "not run: npm install failed"; return; }
    }
    local ver
    ver=$(node -p "require('$dir/node_modules/graphile-worker/package.json').version")
    createdb peer_graphile
    (cd "$dir" && npx graphile-worker -c "$(url peer_graphile)" --schema-only >/dev/null 2>&1) \
        || { row "graphile-worker $ver" "-" "-" "not run: schema install failed"; return; }
    $PSQL -X -q -At -d peer_graphile -v ON_ERROR_STOP=1 -v n="$JOBS" >/dev/null <<'SQL'
SELECT count(*) FROM graphile_worker.add_jobs((
    SELECT array_agg(ROW('bench', json_build_object('order', g, 'customer', 'c-' || (g % 997)),
                         NULL, NULL, 5, NULL, NULL, NULL)::graphile_worker.job_spec)
      FROM generate_series(1, :n) AS g));
UPDATE graphile_worker._private_jobs SET locked_at = now() - interval '5 hours', locked_by = 'dead-worker', attempts = 1;
VACUUM ANALYZE graphile_worker._private_jobs;
SQL
    # graphile-worker's own reset statement (resetLockedAt), its text taken
    # from the installed package by calling it with a client that records it.
    local stmt s n
    stmt=$(cd "$dir" && node -e "
require('graphile-worker/dist/sql/resetLockedAt').resetLockedAt(
  {escapedWorkerSchema: 'graphile_worker', workerSchema: 'graphile_worker',
   resolvedPreset: {worker: {preparedStatements: false, useNodeTime: false}}},
  {withRetries: async (f) => f({query: async (q) => console.log(q.text)})})") \
        || { row "graphile-worker $ver" "-" "-" "not run: its resetLockedAt could not be read"; return; }
    echo "$stmt" >"$PEER_DIR/graphile.reset.sql"
    s=$(time_psql peer_graphile -c "$stmt")
    n=$($PSQL -X -At -d peer_graphile -c "SELECT count(*) FROM graphile_worker._private_jobs WHERE locked_at IS NULL")
    jobs_row "graphile-worker $ver reset of locked jobs (its SQL, psql)" "$s" "unlock only (attempts were counted at claim); no backoff, no dead letter, no report; $n unlocked"
    $PSQL -X -q -c "DROP DATABASE peer_graphile"
}

# ------------------------------------------------------------ pg-boss
peer_pgboss() {
    command -v node >/dev/null || { row "pg-boss" "-" "-" "not run: no node"; return; }
    local dir=$PEER_DIR/node
    [[ -d $dir/node_modules/pg-boss ]] || {
        mkdir -p "$dir"
        (cd "$dir" && npm init -y >/dev/null && npm install --no-audit --no-fund pg-boss >"$PEER_DIR/npm-pgboss.log" 2>&1) \
            || { row "pg-boss" "-" "-" "not run: npm install failed"; return; }
    }
    local ver res
    ver=$(node -p "require('$dir/node_modules/pg-boss/package.json').version")
    createdb peer_pgboss
    cp "$HERE/pgboss.mjs" "$dir/"
    if res=$(cd "$dir" && node pgboss.mjs "$PG_DIR" peer_pgboss "$JOBS" 2>"$PEER_DIR/pgboss.err"); then
        jobs_row "pg-boss $ver maintain(): the supervise pass (expire, archive, drop)" "$(json /dev/stdin "d['seconds']" <<<"$res")" \
            "retry with backoff, dead-letter queue after the last retry, no per-job report; $(json /dev/stdin "d['states']" <<<"$res")"
    else
        row "pg-boss $ver" "-" "-" "not run: $(tail -1 "$PEER_DIR/pgboss.err")"
    fi
    $PSQL -X -q -c "DROP DATABASE peer_pgboss"
}

# ------------------------------------------------------------ procrastinate
peer_procrastinate() {
    local venv=$PEER_DIR/venv ver res
    [[ -x $venv/bin/python ]] || {
        log "jobs: pip install procrastinate into $venv"
        python3 -m venv "$venv" && "$venv/bin/pip" install -q 'procrastinate[psycopg]' psycopg-binary >"$PEER_DIR/pip.log" 2>&1 \
            || { row "procrastinate" "-" "-" "not run: pip install failed"; return; }
    }
    ver=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('procrastinate'))")
    createdb peer_procrastinate
    if res=$("$venv/bin/python" "$HERE/procrastinate_rescue.py" "host=$PG_DIR dbname=peer_procrastinate user=postgres" "$JOBS" 2>"$PEER_DIR/procrastinate.err"); then
        jobs_row "procrastinate $ver stalled jobs: get_stalled_jobs + retry_job each" "$(json /dev/stdin "d['seconds']" <<<"$res")" \
            "back to todo one job per call; no backoff (retry_at now), no dead letter, no report; $(json /dev/stdin "d['states']" <<<"$res")"
    else
        row "procrastinate $ver" "-" "-" "not run: $(tail -1 "$PEER_DIR/procrastinate.err")"
    fi
    $PSQL -X -q -c "DROP DATABASE peer_procrastinate"
}

jobs_main() {
    mkdir -p "$PEER_DIR"
    jobs_ours
    if ((PEERS)); then
        peer_apalis
        peer_graphile
        peer_pgboss
        peer_procrastinate
    fi
}
