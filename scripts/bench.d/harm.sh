# shellcheck shell=bash
# The harm step (sourced by scripts/bench; uses its helpers): what the
# daemon's worst hour costs the lock server's callers and the queue's
# workers. pgbench plays the callers at a fixed rate; 5 s into the run the
# daemon starts on a backlog; the callers' latency while it drains is set
# against the same callers, same data, same seconds of a run without it.
#
# Rows (pgbench -n -M prepared -c 8 -j 2 -T $HARM_T, per-transaction logs):
#   storm keys  -R 1500 lock_acquire + lock_release (harm_lock.pgbench) on a
#               random key of the storm: $HARM_STORM expired leases (deadlines
#               over the last hour, load_leases.sql) beside $HARM_LIVE live
#               ones (harm_live.sql); the daemon reaps the storm
#   other keys  the same on $HARM_OTHER keys never leased (after the live ones)
#   job reap    -R 800 fn_job_claim(worker, {work}, 1) + fn_job_complete
#               (harm_job.pgbench) on queued `work` jobs (harm_work.sql) while
#               the daemon reaps $HARM_JOBS stale leased jobs of other kinds,
#               all three gates open (load_jobs.sql)
# Sides: "with" starts the daemon (stdout to a file, StatsD to a listener)
# at the $HARM_AT s mark; "without" runs the same load with no daemon at
# all (the same data on both sides, so the storm is still there: callers
# take expired keys over themselves, as they do whenever no sweeper runs).
# Each side runs on its own copy of one seed (CREATE DATABASE … TEMPLATE,
# VACUUM ANALYZE, CHECKPOINT, every table and index prewarmed); with
# --baseline, the baseline gets its own seed from its own `migrate` and the
# same loaders with the same random seed. The order of the sides alternates
# from run to run.
#
# The drain window is the daemon's start to its last lease_expired line
# (job_lease_expired for the job reap); the without side is measured over
# the same offsets from its own load's start. Latency is pgbench's `time`
# of every transaction scheduled to start in the window: under -R it counts
# from the scheduled start, so it includes schedule lag (harm_stats.py).
# The database CPU of the drain is schedstat of the daemon's backends (the
# server processes that appeared with it), read when the StatsD listener has
# counted the whole backlog.
#
#   floor       the other-keys load with, instead of the daemon, a shell busy
#               loop on one core for $HARM_FLOOR_SECS s (no database work at
#               all): what any process that takes a core costs the callers
#               on this machine, the floor under every other row; run once,
#               for the first build
#   paced floor the same, but the loop paced as a drain beside a workload
#               is (paced_loop.py): busy $HARM_PACED_ON_MS ms (default 2,
#               about one careful batch), then idle three times as long, for
#               $HARM_PACED_SECS s (a storm's paced drain window): what that
#               share of one core costs, whoever spends it
#   null        the other-keys load with nothing beside it on either side,
#               for $HARM_PACED_SECS s: two runs of the same load, so its
#               ratios are the method's own noise, against which every other
#               row's are read
#
# HARM_ROWS (default "storm other jobs floor") picks rows, e.g. HARM_ROWS=storm;
# "paced" and "null" are run only when named.
#
# HARM_PIN=1 gives the daemon a core of its own, as a server with a spare
# core would: pgbench and the callers' backends on core 0 (pinned once
# connected, on both sides), the daemon, its backends (moved there within
# 5 ms of their start by pin_backends.py, started before the daemon) and the
# harness on core 1; the server's own processes (autovacuum too) run on
# either. What is left of the harm is what a drain costs the callers besides
# a share of their CPU.
#
# Goals: p99 with ≤ 1.25 × p99 without on every row; max with ≤ 2 × max without.

HARM_AT=5 HARM_CLIENTS=8 HARM_THREADS=2 HARM_LOCK_RATE=1500 HARM_JOB_RATE=800 HARM_OTHER=20000
HARM_FLOOR_SECS=3 HARM_PACED_ON_MS=${HARM_PACED_ON_MS:-2} HARM_PIN=${HARM_PIN:-0}
if ((QUICK)); then
    HARM_T=10 HARM_STORM=20000 HARM_LIVE=2000 HARM_JOBS=10000 HARM_PACED_SECS=3
else
    HARM_T=20 HARM_STORM=200000 HARM_LIVE=20000 HARM_JOBS=100000 HARM_PACED_SECS=6
fi
# The rows without a daemon (a busy loop, or nothing), for this many seconds.
declare -gA HARM_LOOP_SECS=([floor]=$HARM_FLOOR_SECS [paced]=$HARM_PACED_SECS [null]=$HARM_PACED_SECS)
# Twice what the workers can claim in a run, so the queue never runs dry.
HARM_WORK=$((2 * HARM_JOB_RATE * HARM_T))
# The same pseudo-random deadlines in every seed (setseed before each loader).
HARM_SEED=0.4242

# harm_load DB PSQL-ARGS...: one loader, random() seeded the same every time.
harm_load() {
    local db=$1
    shift
    $PSQL -X -q -d "$db" -v ON_ERROR_STOP=1 -c "SELECT setseed($HARM_SEED)" "$@" >/dev/null
}

# harm_seed KIND DB BIN: a seed migrated by BIN's own `migrate`; KIND locks
# (the storm, live leases) or jobs (stale jobs, gates open, queued work).
harm_seed() {
    local kind=$1 db=$2 keep=$BIN
    createdb "$db"
    BIN=$3 migrate "$db"
    BIN=$keep
    # psql sets every -v before it runs any -c or -f, so one loader a call.
    if [[ $kind == locks ]]; then
        harm_load "$db" -v n="$HARM_STORM" -v past=true -v spread=0 -v lead=0 -f "$HERE/load_leases.sql"
        harm_load "$db" -v after="$HARM_STORM" -v n="$HARM_LIVE" -f "$HERE/harm_live.sql"
    else
        harm_load "$db" -v n="$HARM_JOBS" -f "$HERE/load_jobs.sql"
        harm_load "$db" -v n="$HARM_WORK" -f "$HERE/harm_work.sql"
    fi
    $PSQL -X -q -c CHECKPOINT
}

# harm_copy SEED: a fresh copy named harm_run, vacuumed, checkpointed and
# with every table and index of the schema in shared buffers.
harm_copy() {
    createdb harm_run "$1"
    $PSQL -X -q -d harm_run -c "CREATE EXTENSION IF NOT EXISTS pg_prewarm" -c "VACUUM ANALYZE" -c CHECKPOINT \
        -c "SELECT count(pg_prewarm(c.oid)) FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i')" >/dev/null
}

# harm_backends DB: pids of the server processes serving a client on DB,
# read from their process titles (no query, so nothing lands on the load).
harm_backends() {
    local f title
    for f in /proc/[0-9]*/cmdline; do
        title=
        read -r -d '' title 2>/dev/null <"$f" || true
        [[ $title == "postgres: postgres $1 "* ]] && { f=${f#/proc/}; echo "${f%/cmdline}"; }
    done
    return 0
}

# harm_drained BEFORE: the drain is over; H_CPU = the schedstat CPU of the
# backends serving harm_run that are not in BEFORE (the daemon's), seconds.
harm_drained() {
    local p cpu=0
    for p in $(harm_backends harm_run); do
        [[ $1 == *" $p "* ]] || cpu=$((cpu + $(cpu_ns "$p")))
    done
    H_CPU=$(fmt "$(calc "$cpu / 1000000000")" 3)
    reached=1
}

# harm_side ROW BIN SIDE TAG: one run of ROW's load on a fresh copy of
# $H_SEED, the daemon BIN started at the $HARM_AT s mark when SIDE is with.
# Sets H_TL (the load's start, epoch s), H_TD (the daemon's start, or the
# mark), H_CPU (database CPU of the drain, s, or n/a), H_LOG (its stdout) and
# H_PGLOG (the per-transaction logs' prefix).
harm_side() {
    local row=$1 bin=$2 side=$3 tag=$4 script rate defs=() metric target
    case $row in
    storm) script=harm_lock.pgbench rate=$HARM_LOCK_RATE defs=(-D lo=1 -D hi="$HARM_STORM")
        metric=lock.lease.expired target=$HARM_STORM ;;
    other | floor | paced | null) script=harm_lock.pgbench rate=$HARM_LOCK_RATE
        defs=(-D lo=$((HARM_STORM + HARM_LIVE + 1)) -D hi=$((HARM_STORM + HARM_LIVE + HARM_OTHER)))
        metric=lock.lease.expired target=$HARM_STORM ;;
    jobs) script=harm_job.pgbench rate=$HARM_JOB_RATE defs=()
        metric=queue.lease.reaped target=$HARM_JOBS ;;
    esac
    harm_copy "$H_SEED"
    H_PGLOG=$WORK/harm.$tag H_LOG=$WORK/harm.$tag.daemon.log H_CPU=n/a
    rm -f "$H_PGLOG".* "$H_LOG"
    start_listener "harm.$tag" "$target" "$metric"
    local before pgb rc=0 reached=0 pin=() pinner= p
    ((HARM_PIN)) && pin=(taskset -c 0)
    H_TL=$(now)
    "${pin[@]}" "$PG_BIN/pgbench" -n -M prepared -c "$HARM_CLIENTS" -j "$HARM_THREADS" -R "$rate" -T "$HARM_T" \
        -l --log-prefix="$H_PGLOG" -f "$HERE/$script" "${defs[@]}" harm_run >"$H_PGLOG.out" 2>&1 &
    pgb=$!
    PIDS+=("$pgb")
    if ((HARM_PIN)); then
        # The callers' backends, once pgbench has connected them all.
        while (($(harm_backends harm_run | wc -l) < HARM_CLIENTS)) && kill -0 "$pgb" 2>/dev/null; do sleep 0.01; done
        for p in $(harm_backends harm_run); do taskset -p -c 0 "$p" >/dev/null; done
    fi
    sleep "$(calc "x = $H_TL + $HARM_AT - $(now); if (x < 0) 0 else x")"
    # Both sides read the process table at the mark, so both carry the
    # same harness work inside the run.
    before=" $(harm_backends harm_run | paste -sd' ') "
    if ((HARM_PIN)) && [[ $side == with && ! -v HARM_LOOP_SECS[$row] ]]; then
        rm -f "$WORK/pin.ready"
        # shellcheck disable=SC2086
        python3 "$HERE/pin_backends.py" "$WORK/pin.ready" "$(head -1 "$PG_DIR/data/postmaster.pid")" 1 harm_run $before &
        pinner=$!
        PIDS+=("$pinner")
        while [[ ! -e $WORK/pin.ready ]] && kill -0 "$pinner" 2>/dev/null; do sleep 0.01; done
    fi
    H_TD=$(now)
    # A row without a daemon starts what stands in for it (the null row:
    # nothing), and its run ends with the load.
    if [[ $side == with && $row == floor ]]; then
        timeout "$HARM_FLOOR_SECS" sh -c 'while :; do :; done' &
    elif [[ $side == with && $row == paced ]]; then
        python3 "$HERE/paced_loop.py" "$HARM_PACED_ON_MS" "$HARM_PACED_SECS" &
    fi
    [[ -v HARM_LOOP_SECS[$row] ]] && side=floor
    [[ $side == with ]] && BIN=$bin start_daemon harm_run "$H_LOG"
    ((HARM_PIN)) && [[ $side == with ]] && taskset -a -p -c 1 "$DPID" >/dev/null
    while kill -0 "$pgb" 2>/dev/null; do
        [[ $side == with ]] && ((!reached)) && [[ -s $LRESULT ]] && harm_drained "$before"
        sleep 0.05
    done
    # A drain that outlasts the load is waited for, so the window still
    # ends at its last line (the latency can only be measured up to the
    # load's end).
    local deadline=$(($(date +%s) + 300))
    while [[ $side == with ]] && ((!reached)) && (($(date +%s) < deadline)) && kill -0 "$DPID" 2>/dev/null; do
        [[ -s $LRESULT ]] && harm_drained "$before"
        sleep 0.2
    done
    wait "$pgb" || rc=$?
    if [[ $side == with ]]; then
        if ! kill -0 "$DPID" 2>/dev/null; then
            echo "bench: harm: the daemon exited during the $row run (see $H_LOG.err)" >&2
            tail -5 "$H_LOG.err" >&2
            return 1
        fi
        stop_pid "$DPID"
    fi
    [[ -n $pinner ]] && stop_pid "$pinner"
    stop_pid "$LPID"
    if ((rc != 0)) || grep -q 'aborted\|error' "$H_PGLOG.out"; then
        echo "bench: harm: pgbench failed on the $row run (exit $rc):" >&2
        tail -8 "$H_PGLOG.out" >&2
        return 1
    fi
    $PSQL -X -q -c "DROP DATABASE harm_run WITH (FORCE)"
}

# harm_lat START END PREFIX: latency JSON of one side's transactions in [START, END].
harm_lat() { python3 "$HERE/harm_stats.py" latency "$1" "$2" "$3".[0-9]*; }
harm_ms() { fmt "$(json /dev/stdin "d['$1']" <<<"$2")" 2; }

bench_harm() {
    [[ -x $PG_BIN/pgbench ]] || { echo "bench: harm needs pgbench in $PG_BIN" >&2; return 1; }
    local bins=("$BIN") names=(this) i row r k
    if [[ -n $BASELINE ]]; then bins+=("$BASELINE"); names+=("baseline"); fi
    local -A label=([storm]="storm keys" [other]="other keys" [jobs]="job reap" [floor]="floor: a busy loop" [paced]="floor: a paced busy loop" [null]="noise: nothing beside the callers")
    local -A message=([storm]=lease_expired [other]=lease_expired [jobs]=job_lease_expired)
    # What a row without a daemon measures, in place of goals.
    local -A measures=([floor]="what one busy core costs" [paced]="what a quarter of one core costs" [null]="the method's noise")
    local pinned=
    if ((HARM_PIN)); then
        pinned="; HARM_PIN=1: pgbench and the callers' backends on core 0, the daemon and its backends on core 1"
        taskset -p -c 1 $$ >/dev/null
    fi
    header "Harm: callers' latency (ms, pgbench -R, schedule lag included) while the daemon drains, against the same seconds without it ($RUNS runs; $HARM_STORM expired + $HARM_LIVE live leases, $HARM_JOBS stale jobs; daemon at ${HARM_AT} s of ${HARM_T} s$pinned)" \
        row build run "window s (from load start)" lines "with: n" "with p50" "with p99" "with max" \
        "without: n" "without p50" "without p99" "without max" "p99 ratio" "max ratio" "db CPU of drain s" load1 "goals"
    for i in "${!bins[@]}"; do
        log "harm: seeding for ${names[i]} (${bins[i]})"
        harm_seed locks "seed_harm_locks" "${bins[i]}"
        harm_seed jobs "seed_harm_jobs" "${bins[i]}"
        for row in ${HARM_ROWS:-storm other jobs floor}; do
            ((i > 0)) && [[ -v HARM_LOOP_SECS[$row] ]] && continue
            [[ $row == jobs ]] && H_SEED=seed_harm_jobs || H_SEED=seed_harm_locks
            for ((r = 1; r <= RUNS; r++)); do
                local order=(with without) load tl_with td_with tl_without cpu win s e lines
                ((r % 2)) || order=(without with)
                load=$(cut -d' ' -f1 /proc/loadavg)
                for k in "${order[@]}"; do
                    log "harm: ${names[i]} ${label[$row]} run $r, $k the daemon"
                    harm_side "$row" "${bins[i]}" "$k" "$row.${names[i]}.$r.$k"
                    if [[ $k == with ]]; then
                        tl_with=$H_TL td_with=$H_TD cpu=$H_CPU
                    else
                        tl_without=$H_TL
                    fi
                done
                local tag=$WORK/harm.$row.${names[i]}.$r
                s=$(calc "$td_with - $tl_with")
                if [[ -v HARM_LOOP_SECS[$row] ]]; then
                    lines=— cpu=n/a e=$(calc "$s + ${HARM_LOOP_SECS[$row]}")
                else
                    win=$(python3 "$HERE/harm_stats.py" window "$tag.with.daemon.log" "${message[$row]}")
                    lines=$(json /dev/stdin "d['count']" <<<"$win")
                    if ((lines == 0)); then
                        echo "bench: harm: the daemon wrote no ${message[$row]} line on the ${label[$row]} run (see $tag.with.daemon.log.err)" >&2
                        return 1
                    fi
                    e=$(calc "$(json /dev/stdin "d['last']" <<<"$win") - $tl_with")
                fi
                local cut=
                if ! (($(calc "$e < $HARM_T"))); then
                    cut=", outlasted the load: latency up to ${HARM_T} s"
                    log "harm: the drain outlasted the load (ends at $(fmt "$e" 1) s of $HARM_T s)"
                fi
                local with without p99r maxr goals
                with=$(harm_lat "$(calc "$tl_with + $s")" "$(calc "$tl_with + $e")" "$tag.with")
                without=$(harm_lat "$(calc "$tl_without + $s")" "$(calc "$tl_without + $e")" "$tag.without")
                p99r=$(calc "$(json /dev/stdin "d['p99']" <<<"$with") / $(json /dev/stdin "d['p99']" <<<"$without")")
                maxr=$(calc "$(json /dev/stdin "d['max']" <<<"$with") / $(json /dev/stdin "d['max']" <<<"$without")")
                goals="p99 $( (($(calc "$p99r <= 1.25"))) && echo met || echo "**not met**"), max $( (($(calc "$maxr <= 2"))) && echo met || echo "**not met**")"
                [[ -v measures[$row] ]] && goals="none: ${measures[$row]}"
                row "${label[$row]}" "${names[i]}" "$r ($(IFS=,; echo "${order[*]}"))" \
                    "$(fmt "$s" 2)–$(fmt "$e" 2) ($(fmt "$(calc "$e - $s")" 2) s$cut)" "$lines" \
                    "$(json /dev/stdin "d['n']" <<<"$with")" "$(harm_ms p50 "$with")" "$(harm_ms p99 "$with")" "$(harm_ms max "$with")" \
                    "$(json /dev/stdin "d['n']" <<<"$without")" "$(harm_ms p50 "$without")" "$(harm_ms p99 "$without")" "$(harm_ms max "$without")" \
                    "$(fmt "$p99r" 2)×" "$(fmt "$maxr" 2)×" "$cpu" "$load" "$goals"
                ((KEEP)) || rm -f "$tag".*
            done
        done
        $PSQL -X -q -c "DROP DATABASE seed_harm_locks" -c "DROP DATABASE seed_harm_jobs"
    done
    ((HARM_PIN)) && taskset -p -c "0-$(($(nproc --all) - 1))" $$ >/dev/null
    echo "Goals: p99 with the daemon ≤ 1.25 × p99 without on every row; max with ≤ 2 × max without. \"without\" = no daemon running, same data, same offsets from the load's start; latency = pgbench's per-transaction time, from the scheduled start (schedule lag included)." \
        | tee -a "$RESULTS"
}
