# shellcheck shell=bash
# `scripts/bench --only profile`: where the CPU goes, for the two goals that
# are not met: the drain against the reference DELETE, and the idle fleet
# (sourced by scripts/bench, which provides the cluster, the binary and the
# helpers used here).
#
#   drain  perf samples (cpu-clock, 999 Hz, all CPUs, then kept to the pids
#          that did the work) of the daemon draining N expired leases and of
#          the reference `psql -XAtq` DELETE … RETURNING on a fresh copy of
#          the same seed: milliseconds by process, the backend's by kind of
#          work, and the top symbols
#   idle   the same for $FLEET idle daemons over PROFILE_SECS s, against
#          pgbench sending `SELECT 1` once a second on as many connections:
#          what a statement a second costs a backend whatever the SQL
#
# Needs perf (Debian: linux-perf) and pgbench (postgresql-contrib).

PROFILE_HZ=999
PROFILE_SECS=${PROFILE_SECS:-20}

# perf_start FILE: system-wide sampling in the background; sets PERF_PID.
perf_start() {
    perf record -q -e cpu-clock -F "$PROFILE_HZ" -a -o "$1" >/dev/null 2>"$1.err" &
    PERF_PID=$!
    sleep 0.5
}
perf_stop() {
    kill -INT "$PERF_PID" 2>/dev/null || true
    wait "$PERF_PID" 2>/dev/null || true
}
# perf_flat DATA PIDS OUT: the flat report of the samples of PIDS (comma list).
perf_flat() {
    perf report -q -i "$1" --pid "$2" -n --no-children --sort comm,dso,sym \
        --stdio -g none --percent-limit 0 >"$3" 2>/dev/null
}
backend_pids() { # backend_pids APPLICATION DB: comma list
    $PSQL -X -Atc "SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE application_name = '$1' AND datname = '$2'"
}

# profile_kinds LABEL JSON [LABEL JSON]...: per backend kind, one tab-separated
# line with that kind's milliseconds in each run, then the total.
profile_kinds() {
    python3 - "$@" <<'PY'
import json, sys
labels = sys.argv[1::2]
runs = [json.loads(s) for s in sys.argv[2::2]]
kinds = []
for r in runs:
    for k in r["backend_ms_by_kind"]:
        if k not in kinds:
            kinds.append(k)
for k in kinds:
    print("\t".join([k] + [f'{r["backend_ms_by_kind"].get(k, 0):.0f} ms' for r in runs]))
print("\t".join(["**all backend samples**"] + [f'{r["ms_by_process"].get("postgres", 0):.0f} ms' for r in runs]))
PY
}

profile_drain() {
    local n=${DRAIN_SIZES%% *} ref=$WORK/prof.ref.data dmn=$WORK/prof.daemon.data
    log "profile drain: seeding $n expired leases"
    drain_seed seed_prof "$BIN" "$n"

    # The reference: psql and its backend, on a fresh copy.
    fresh prof_ref seed_prof
    local pidfile=$WORK/prof.ref.backend
    perf_start "$ref"
    $PSQL -XAtq -d prof_ref -v ON_ERROR_STOP=1 >/dev/null <<SQL &
SELECT pg_backend_pid() \\g $pidfile
$BARE_DELETE;
SQL
    local psql_pid=$!
    wait "$psql_pid"
    perf_stop
    perf_flat "$ref" "$psql_pid,$(tr -dc 0-9 <"$pidfile")" "$ref.txt"

    # The daemon and its backends, on another fresh copy.
    fresh prof_daemon seed_prof
    perf_start "$dmn"
    drain_daemon prof_daemon "$BIN" "$n" "$WORK/prof.daemon.log"
    perf_stop
    perf_flat "$dmn" "$DPID,$D_BACKENDS" "$dmn.txt"

    local r d
    r=$(python3 "$HERE/perf_categories.py" "$PROFILE_HZ" "$ref.txt")
    d=$(python3 "$HERE/perf_categories.py" "$PROFILE_HZ" "$dmn.txt")
    header "Profile of the drain of $n leases (perf, cpu-clock at $PROFILE_HZ Hz; milliseconds of CPU by process)" \
        run "psql / daemon process" "database backend(s)" "lines"
    row "reference: psql -XAtq DELETE … RETURNING" "$(json /dev/stdin "round(d['ms_by_process'].get('psql', 0))" <<<"$r") ms" \
        "$(json /dev/stdin "round(d['ms_by_process'].get('postgres', 0))" <<<"$r") ms" "-"
    row "daemon" "$(json /dev/stdin "round(sum(v for k, v in d['ms_by_process'].items() if k != 'postgres'))" <<<"$d") ms" \
        "$(json /dev/stdin "round(d['ms_by_process'].get('postgres', 0))" <<<"$d") ms" "$D_LINES"
    header "The backend's work in that drain, by kind (milliseconds of CPU)" kind "reference (one DELETE)" "daemon (batches)"
    while IFS=$'\t' read -r k a b; do row "$k" "$a" "$b"; done < <(profile_kinds ref "$r" daemon "$d")
    header "Top symbols of the daemon process in that drain" symbol "ms"
    json /dev/stdin "'\n'.join(f'{s}\t{v}' for c, l in d['top_symbols'].items() if c != 'postgres' for s, v in l[:10])" <<<"$d" \
        | while IFS=$'\t' read -r s v; do row "\`$s\`" "$v"; done
    $PSQL -X -q -c "DROP DATABASE prof_ref" -c "DROP DATABASE prof_daemon WITH (FORCE)" -c "DROP DATABASE seed_prof"
}

profile_idle() {
    local k=$FLEET fl=$WORK/prof.fleet.data pb=$WORK/prof.pgbench.data i pids=()
    log "profile idle: $k daemons on $IDLE_LEASES live leases, then pgbench SELECT 1 on $k connections"
    createdb prof_idle
    migrate prof_idle
    load_leases prof_idle "$IDLE_LEASES" false
    prepare prof_idle
    start_listener prof_idle
    for ((i = 0; i < k; i++)); do
        start_daemon prof_idle "$WORK/prof.idle.$i.log"
        pids+=("$DPID")
    done
    sleep 10
    local backends
    backends=$(backend_pids lease-sweeper prof_idle)
    perf_start "$fl"
    sleep "$PROFILE_SECS"
    perf_stop
    perf_flat "$fl" "$backends" "$fl.txt"
    for i in "${pids[@]}"; do kill -TERM "$i" 2>/dev/null || true; done
    for i in "${pids[@]}"; do wait "$i" 2>/dev/null || true; done
    stop_pid "$LPID"
    rm -f "$WORK"/prof.idle.*.log "$WORK"/prof.idle.*.log.err

    # The floor: SELECT 1 once a second per connection, as many connections
    # as the fleet has (two per daemon).
    local conns=$((2 * k)) script=$WORK/select1.sql
    echo "SELECT 1;" >"$script"
    PGAPPNAME=pgbench "$PG_BIN/pgbench" -n -M simple -f "$script" -c "$conns" -j 2 -R "$conns" \
        -T $((PROFILE_SECS + 12)) prof_idle >"$WORK/pgbench.out" 2>&1 &
    local bench_pid=$!
    sleep 10
    backends=$(backend_pids pgbench prof_idle)
    perf_start "$pb"
    sleep "$PROFILE_SECS"
    perf_stop
    wait "$bench_pid" || true
    perf_flat "$pb" "$backends" "$pb.txt"

    local f p per
    f=$(python3 "$HERE/perf_categories.py" "$PROFILE_HZ" "$fl.txt")
    p=$(python3 "$HERE/perf_categories.py" "$PROFILE_HZ" "$pb.txt")
    per=$(calc "$k * $PROFILE_SECS")
    header "Profile of an idle fleet: $k daemons ($conns backends) vs pgbench SELECT 1 once a second on $conns connections, ${PROFILE_SECS} s (perf, cpu-clock at $PROFILE_HZ Hz)" \
        kind "fleet: ms per daemon per s" "SELECT 1: ms per 2 connections per s"
    while IFS=$'\t' read -r kind a b; do
        a=${a% ms} b=${b% ms}
        row "$kind" "$(fmt "$(calc "$a / $per")" 3)" "$(fmt "$(calc "$b / $per")" 3)"
    done < <(profile_kinds fleet "$f" select1 "$p")
    $PSQL -X -q -c "DROP DATABASE prof_idle WITH (FORCE)"
}

bench_profile() {
    if ! command -v perf >/dev/null; then
        log "profile: skipped, perf is not installed (Debian: linux-perf)"
        return 0
    fi
    profile_drain
    profile_idle
}
