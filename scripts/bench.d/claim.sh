# shellcheck shell=bash
# The claim benchmark (sourced by scripts/bench; uses its helpers): what
# lease durations per kind and per job cost fn_job_claim.
#
# 10,000 claimable jobs of 10 kinds (load_claim.sql), all claimed by one
# call with the largest limit. Two seeds: plain (no kind durations, no
# overrides: every claim until now) and mixed (5 of the 10 kinds with a
# duration, 1 job in 10 with an override). Two bodies: fn_job_claim as it
# is, and the body before lease durations (claim_before.sql, installed as
# bench_job_claim_before). Four variants:
#   before/plain  the old body on the plain seed: today's claim
#   now/plain     fn_job_claim on the plain seed: today's behaviour, new code
#   before/mixed  the old body on the mixed seed (it ignores kinds and overrides)
#   now/mixed     fn_job_claim on the mixed seed: the cost of the feature
# The goal: now/mixed within 1.2x of before/plain.
#
# Measured as the CPU time of the backend running the claim (schedstat, so
# other load on a shared machine does not count), two ways:
#   warm  one session per seed copy runs the two bodies alternately, each
#         claim rolled back and the table vacuumed before the next, so both
#         bodies claim the same rows from the same pages with a warm backend;
#         the first round is a warm-up and is not counted
#   cold  a fresh copy (VACUUM ANALYZEd, checkpointed, prewarmed) and a fresh
#         backend per claim, rounds interleaved and rotated; also reports the
#         server's Execution Time (EXPLAIN (ANALYZE, TIMING OFF))
# A fresh backend's first claim spends much of its time in the kernel
# (page faults for its tuplestore, extending the heap file: perf), which
# varies by ±20% from run to run whatever the body; the warm figures leave
# that out. BENCH_CLAIM_RUNS sets the rounds of each (default 9).

CLAIM_RUNS=${BENCH_CLAIM_RUNS:-9}
CLAIM_BODIES=(bench_job_claim_before fn_job_claim)

# claim_seed NAME MIXED: a seed database migrated by the product, loaded,
# with the old body installed beside the new one.
claim_seed() {
    createdb "$1"
    migrate "$1"
    $PSQL -X -q -d "$1" -v mixed="$2" -f "$HERE/load_claim.sql" >/dev/null
    $PSQL -X -q -d "$1" -v ON_ERROR_STOP=1 -f "$HERE/claim_before.sql" >/dev/null
}

# claim_copy SEED: a fresh copy of SEED named claim_run, prepared for a claim.
claim_copy() {
    createdb claim_run "$1"
    $PSQL -X -q -d claim_run -c "CREATE EXTENSION IF NOT EXISTS pg_prewarm" -c "VACUUM ANALYZE" -c CHECKPOINT \
        -c "SELECT pg_prewarm(c) FROM unnest(ARRAY['job_queue', 'job_queue_pkey', 'job_queue_claimable_idx', 'job_queue_lease_until_idx', 'job_kind_lease']::regclass[]) AS c" >/dev/null
}

# claim_cold FUNCTION SEED: one claim by FUNCTION on a fresh copy of SEED in
# a fresh backend; prints "CPU_MS EXEC_MS" and checks all 10,000 were leased.
claim_cold() {
    claim_copy "$2"
    local exec_ms leased
    exec_ms=$($PSQL -XAtq -d claim_run -v ON_ERROR_STOP=1 <<SQL | exec_ms
SELECT pg_backend_pid() AS bpid \\gset
\\setenv BPID :bpid
\\! cut -d' ' -f1 /proc/\$BPID/schedstat > $WORK/claim.c0
EXPLAIN (ANALYZE, TIMING OFF) SELECT count(*) FROM $1('bench', NULL, 10000);
\\! cut -d' ' -f1 /proc/\$BPID/schedstat > $WORK/claim.c1
SQL
)
    leased=$($PSQL -X -At -d claim_run -c "SELECT count(*) FROM job_queue WHERE state = 'leased'")
    [[ $leased == 10000 ]] || { echo "bench: $1 on $2 leased $leased of 10000 jobs" >&2; return 1; }
    echo "$(calc "($(cat "$WORK/claim.c1") - $(cat "$WORK/claim.c0")) / 1000000") $exec_ms"
}

# claim_warm SEED: CLAIM_RUNS + 1 rounds of both bodies in one session on a
# copy of SEED; appends "FUNCTION CPU_NS_BEFORE CPU_NS_AFTER LEASED" lines
# to $WORK/claim.warm.SEED.
claim_warm() {
    claim_copy "$1"
    local out=$WORK/claim.warm.$1 r k f
    : >"$out"
    {
        echo "SELECT pg_backend_pid() AS bpid \\gset"
        echo "\\setenv BPID :bpid"
        for ((r = 0; r <= CLAIM_RUNS; r++)); do
            for ((k = 0; k < ${#CLAIM_BODIES[@]}; k++)); do
                # Each round starts with the other body.
                f=${CLAIM_BODIES[$(((r + k) % ${#CLAIM_BODIES[@]}))]}
                echo "BEGIN;"
                echo "\\! printf '%s %s ' $f \$(cut -d' ' -f1 /proc/\$BPID/schedstat) >> $out"
                echo "SELECT count(*) AS leased FROM $f('bench', NULL, 10000) \\gset"
                echo "\\setenv LEASED :leased"
                echo "\\! printf '%s %s\\n' \$(cut -d' ' -f1 /proc/\$BPID/schedstat) \$LEASED >> $out"
                echo "ROLLBACK;"
                echo "VACUUM job_queue;"
            done
        done
    } | $PSQL -XAtq -d claim_run -v ON_ERROR_STOP=1 >/dev/null
    if awk '$4 != 10000 {bad = 1} END {exit !bad}' "$out"; then
        echo "bench: a warm claim on $1 did not lease 10000 jobs (see $out)" >&2
        return 1
    fi
}

# median / min of the numbers on stdin
claim_median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
claim_min() { sort -g | head -1; }
# claim_stat RUNS median|min: of one variant's runs (space-separated)
claim_stat() { tr ' ' '\n' <<<"$1" | grep . | "claim_$2"; }

bench_claim() {
    log "claim: seeding 10,000 jobs of 10 kinds, plain and mixed"
    claim_seed seed_claim_plain false
    claim_seed seed_claim_mixed true
    $PSQL -X -q -c CHECKPOINT
    local seeds=(seed_claim_plain seed_claim_plain seed_claim_mixed seed_claim_mixed)
    local bodies=(bench_job_claim_before fn_job_claim bench_job_claim_before fn_job_claim)
    local names=("before/plain" "now/plain" "before/mixed" "now/mixed")
    local -A warm=() cold=() wall=()
    local r k i out s

    for s in seed_claim_plain seed_claim_mixed; do
        log "claim: warm, $s"
        claim_warm "$s"
    done
    for i in "${!names[@]}"; do
        # Rows after the warm-up round (the first of each body).
        warm[$i]=$(awk -v f="${bodies[i]}" '$1 == f && seen[f]++ {printf "%s ", ($3 - $2) / 1000000}' \
            "$WORK/claim.warm.${seeds[i]}")
    done

    for ((r = 1; r <= CLAIM_RUNS; r++)); do
        # Each round starts one variant later, so none is always first.
        for ((k = 0; k < ${#names[@]}; k++)); do
            i=$(((r + k) % ${#names[@]}))
            out=$(claim_cold "${bodies[i]}" "${seeds[i]}")
            cold[$i]+="${out% *} "
            wall[$i]+="${out#* } "
            log "claim cold round $r ${names[i]}: CPU ${out% *} ms, execution ${out#* } ms"
        done
    done

    # Correctness of the mixed claim, on one more copy: each job its own duration.
    createdb claim_run seed_claim_mixed
    local sources
    sources=$($PSQL -X -At -d claim_run -c "SELECT string_agg(s || ' ' || n, ', ' ORDER BY s) FROM (SELECT lease_duration_source AS s, count(*) AS n FROM fn_job_claim('bench', NULL, 10000) GROUP BY 1) AS x")
    $PSQL -X -q -c "DROP DATABASE claim_run"

    local base_warm base_cold base_wall
    base_warm=$(claim_stat "${warm[0]}" median)
    base_cold=$(claim_stat "${cold[0]}" median)
    base_wall=$(claim_stat "${wall[0]}" median)
    header "Claim: 10,000 jobs of 10 kinds in one call, $CLAIM_RUNS runs each, backend CPU (schedstat) and server time" \
        variant "warm CPU ms (median)" "warm vs before/plain" "cold CPU ms (median)" "cold vs before/plain" \
        "cold execution ms (median)" "execution vs before/plain"
    for i in "${!names[@]}"; do
        local w c e
        w=$(claim_stat "${warm[$i]}" median)
        c=$(claim_stat "${cold[$i]}" median)
        e=$(claim_stat "${wall[$i]}" median)
        row "${names[i]}" "$(fmt "$w" 1)" "$(fmt "$(calc "$w / $base_warm")" 3)x" \
            "$(fmt "$c" 1)" "$(fmt "$(calc "$c / $base_cold")" 3)x" \
            "$(fmt "$e" 1)" "$(fmt "$(calc "$e / $base_wall")" 3)x"
    done
    local same
    same=$(calc "$(claim_stat "${warm[3]}" median) / $(claim_stat "${warm[2]}" median)")
    echo "now/mixed vs before/mixed, same rows in the same warm session: $(fmt "$same" 3)x; now/mixed leases by source: $sources" \
        | tee -a "$RESULTS"
    $PSQL -X -q -c "DROP DATABASE seed_claim_plain" -c "DROP DATABASE seed_claim_mixed"
}
