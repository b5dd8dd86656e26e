# shellcheck shell=bash
# The churn step (sourced by scripts/bench; uses its helpers): whether the
# daemon and the tables stay bounded when leases never stop expiring.
#
# pgbench plays lock-server callers acquiring leases of 1 to 3 s through
# lock_acquire at $CHURN_RATE/s (-R, Poisson arrivals) for $CHURN_SECS s,
# none released (churn.pgbench: a fresh key each time, so every acquire
# gets a token and every lease ends as an expiry), on a fresh database
# under the stock autovacuum settings (the cluster's, pg.sh; no per-table
# setting but what the migrations set). The release daemon sweeps from
# before the load starts, stdout to a file, StatsD to a listener.
#
# Read at the end of the first $CHURN_MARK s and at the end of the load
# (churn_stats.sql): the daemon's VmRSS (/proc), lock_entry's total and
# index bytes, the rows and bytes of every side table, and autovacuum runs
# (pg_stat_user_tables). After the load, once the last lease has expired
# and been swept: every lease reported once (lease_expired lines = leases
# acquired = pgbench's processed transactions = tokens drawn; owner/token
# pairs unique).
#
# Goals, between the mark and the end: RSS grows by at most 1 MiB;
# lock_entry with its indexes by at most 1.5×; side tables bounded (a few
# rows, not growing with the run); every expiry reported exactly once.
#
# BENCH_CHURN_RATE (default 3000), BENCH_CHURN_SECS (180; 30 with --quick)
# and BENCH_CHURN_MARK (60; 10 with --quick) set the load.

CHURN_RATE=${BENCH_CHURN_RATE:-3000}
if ((QUICK)); then
    CHURN_SECS=${BENCH_CHURN_SECS:-30} CHURN_MARK=${BENCH_CHURN_MARK:-10}
else
    CHURN_SECS=${BENCH_CHURN_SECS:-180} CHURN_MARK=${BENCH_CHURN_MARK:-60}
fi
CHURN_CLIENTS=8 CHURN_THREADS=2
# A transaction scheduled this late is skipped (and counted as skipped), so
# pgbench's report says whether it kept the rate on a loaded machine.
CHURN_LATENCY_LIMIT_MS=1000
# How long the leases still live when the load ends may take to expire and
# be reported (their longest lease is 3 s).
CHURN_SETTLE_SECS=60

# churn_read DB FILE: one reading (churn_stats.sql) plus the daemon's VmRSS,
# as name|value lines in FILE.
churn_read() {
    {
        echo "daemon.vmrss_kib|$(status_kib "$DPID" VmRSS)"
        $PSQL -X -At -d "$1" -v ON_ERROR_STOP=1 -f "$HERE/churn_stats.sql"
    } >"$2"
}
# churn_get FILE NAME: one value of a reading.
churn_get() { awk -F'|' -v k="$2" '$1 == k {print $2}' "$1"; }
mib() { fmt "$(calc "$1 / 1048576")" 2; }

bench_churn() {
    [[ -x $PG_BIN/pgbench ]] || { echo "bench: churn needs pgbench in $PG_BIN" >&2; return 1; }
    local db=churn out=$WORK/churn.log pgout=$WORK/churn.pgbench.out
    log "churn: leases of 1-3 s acquired at $CHURN_RATE/s for $CHURN_SECS s, none released"
    createdb "$db"
    migrate "$db"
    prepare "$db"
    start_listener churn
    start_daemon "$db" "$out"
    # The daemon's sweep connection is up before the load starts.
    local i
    for i in $(seq 200); do
        [[ $($PSQL -X -Atc "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lease-sweeper' AND datname = '$db'") -gt 0 ]] && break
        kill -0 "$DPID" 2>/dev/null || { echo "bench: churn: the daemon exited (see $out.err)" >&2; tail -5 "$out.err" >&2; return 1; }
        sleep 0.05
    done
    local t0 pgb rc=0 load
    load=$(cut -d' ' -f1 /proc/loadavg)
    t0=$(now)
    "$PG_BIN/pgbench" -n -M prepared -c "$CHURN_CLIENTS" -j "$CHURN_THREADS" -R "$CHURN_RATE" \
        -L "$CHURN_LATENCY_LIMIT_MS" -T "$CHURN_SECS" -f "$HERE/churn.pgbench" "$db" >"$pgout" 2>&1 &
    pgb=$!
    PIDS+=("$pgb")
    sleep "$(calc "x = $t0 + $CHURN_MARK - $(now); if (x < 0) 0 else x")"
    churn_read "$db" "$WORK/churn.mark"
    log "churn: read at ${CHURN_MARK} s"
    wait "$pgb" || rc=$?
    churn_read "$db" "$WORK/churn.end"
    log "churn: load over after $(fmt "$(calc "$(now) - $t0")" 1) s"
    if ((rc != 0)) || grep -q 'aborted\|error' "$pgout"; then
        echo "bench: churn: pgbench failed (exit $rc):" >&2
        tail -8 "$pgout" >&2
        return 1
    fi
    local acquired failed skipped late lag tokens
    acquired=$(awk '/^number of transactions actually processed:/ {print $6}' "$pgout" | cut -d/ -f1)
    failed=$(awk '/^number of failed transactions:/ {print $5}' "$pgout")
    skipped=$(awk '/^number of transactions skipped:/ {print $5}' "$pgout")
    late=$(awk '/^number of transactions above the/ {print $(NF - 1)}' "$pgout")
    lag=$(sed -n 's/^rate limit schedule lag: avg //p' "$pgout")
    tokens=$($PSQL -X -At -d "$db" -c "SELECT last_value FROM lock_fencing_token_seq")
    # Every lease still live at the end expires within 3 s; wait for the
    # lines to catch up with the leases (and the tables to empty).
    local deadline=$(($(date +%s) + CHURN_SETTLE_SECS)) lines=0 left
    while :; do
        lines=$(grep -c ' message=lease_expired ' "$out" || true)
        left=$($PSQL -X -At -d "$db" -c "SELECT (SELECT count(*) FROM lock_entry) + (SELECT count(*) FROM lock_reap_handoff)")
        ((lines >= acquired && left == 0)) && break
        (($(date +%s) > deadline)) && { log "churn: $lines lines of $acquired after ${CHURN_SETTLE_SECS} s, $left rows left"; break; }
        sleep 0.5
    done
    local rss_mark rss_end
    rss_mark=$(churn_get "$WORK/churn.mark" daemon.vmrss_kib) rss_end=$(churn_get "$WORK/churn.end" daemon.vmrss_kib)
    local st unique_pairs twice
    st=$(awk '/ message=lease_expired / {
            o = $0; sub(/.* ownerId=/, "", o); sub(/ .*/, "", o)
            t = $0; sub(/.* token=/, "", t); sub(/ .*/, "", t)
            r = $0; sub(/.* reapedBy=/, "", r); sub(/ .*/, "", r)
            n[o " " t]++; by[r]++
         }
         END {
            u = 0; d = 0
            for (k in n) { u++; if (n[k] > 1) d++ }
            s = ""; for (k in by) s = s (s ? ", " : "") k " " by[k]
            print u "|" d "|" s
         }' "$out")
    unique_pairs=${st%%|*} twice=$(cut -d'|' -f2 <<<"$st")
    local reaped_by=${st##*|}
    stop_pid "$DPID"
    stop_pid "$LPID"
    local counted
    counted=$(json "$LRESULT" "sum(v for k, v in d['counters'].items() if k.startswith('lock.lease.expired'))")
    local le_mark le_end
    le_mark=$(churn_get "$WORK/churn.mark" lock_entry.total_bytes) le_end=$(churn_get "$WORK/churn.end" lock_entry.total_bytes)
    local rss_growth table_ratio exact
    rss_growth=$(calc "($rss_end - $rss_mark) / 1024")
    table_ratio=$(calc "$le_end / $le_mark")
    exact=$( ((lines == acquired && unique_pairs == acquired && twice == 0 && tokens == acquired)) && echo met || echo "**not met**")

    header "Churn: leases of 1–3 s acquired through lock_acquire at $CHURN_RATE/s by pgbench -R for $CHURN_SECS s, none released, stock autovacuum (read at ${CHURN_MARK} s and at the end; load1 $load at the start)" \
        what "at ${CHURN_MARK} s" "at ${CHURN_SECS} s" change goal
    row "daemon VmRSS" "$(fmt "$(calc "$rss_mark / 1024")" 2) MiB" "$(fmt "$(calc "$rss_end / 1024")" 2) MiB" \
        "$(fmt "$rss_growth" 2) MiB" "≤ 1 MiB: $( (($(calc "$rss_growth <= 1"))) && echo met || echo "**not met**")"
    row "lock_entry + indexes" "$(mib "$le_mark") MiB" "$(mib "$le_end") MiB" "$(fmt "$table_ratio" 2)×" \
        "≤ 1.5×: $( (($(calc "$table_ratio <= 1.5"))) && echo met || echo "**not met**")"
    row "of which indexes" "$(mib "$(churn_get "$WORK/churn.mark" lock_entry.index_bytes)") MiB" \
        "$(mib "$(churn_get "$WORK/churn.end" lock_entry.index_bytes)") MiB" "" ""
    row "lock_entry rows (live, dead)" \
        "$(churn_get "$WORK/churn.mark" lock_entry.rows), $(churn_get "$WORK/churn.mark" lock_entry.dead_rows)" \
        "$(churn_get "$WORK/churn.end" lock_entry.rows), $(churn_get "$WORK/churn.end" lock_entry.dead_rows)" "" ""
    local t
    for t in lock_reap_handoff job_reap_handoff lock_expiry_outbox lock_held_delta lock_held_count; do
        row "$t rows (bytes)" \
            "$(churn_get "$WORK/churn.mark" "$t.rows") ($(churn_get "$WORK/churn.mark" "$t.total_bytes"))" \
            "$(churn_get "$WORK/churn.end" "$t.rows") ($(churn_get "$WORK/churn.end" "$t.total_bytes"))" "" "bounded"
    done
    for t in lock_entry lock_reap_handoff job_reap_handoff lock_expiry_outbox lock_held_delta lock_held_count; do
        row "$t autovacuum runs (autoanalyze)" \
            "$(churn_get "$WORK/churn.mark" "$t.autovacuum_count") ($(churn_get "$WORK/churn.mark" "$t.autoanalyze_count"))" \
            "$(churn_get "$WORK/churn.end" "$t.autovacuum_count") ($(churn_get "$WORK/churn.end" "$t.autoanalyze_count"))" "" ""
    done
    row "leases acquired (pgbench processed; tokens drawn)" "" "$acquired; $tokens" "" ""
    row "lease_expired lines (StatsD count; reapedBy)" "" "$lines ($counted; $reaped_by)" "" "= acquired"
    row "owner/token pairs unique (reported twice)" "" "$unique_pairs ($twice)" "" "every expiry once: $exact"
    row "pgbench: schedule lag, skipped, over ${CHURN_LATENCY_LIMIT_MS} ms, failed" "" \
        "avg ${lag:-?}; ${skipped:-0} skipped; ${late:-0} late; ${failed:-0} failed" "" \
        "rate kept: $( [[ ${skipped:-0} == 0 && ${late:-0} == 0/* && ${failed:-0} == 0 ]] && echo yes || echo "**no**")"
    log "churn: RSS +$(fmt "$rss_growth" 2) MiB, lock_entry $(fmt "$table_ratio" 2)×, $lines lines for $acquired leases ($unique_pairs unique)"
    ((KEEP)) || rm -f "$out" "$out.err"
    $PSQL -X -q -c "DROP DATABASE $db WITH (FORCE)"
}
