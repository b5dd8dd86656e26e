# shellcheck shell=bash
# The claim benchmark (sourced by scripts/bench; uses its helpers): what
# lease durations per kind and per job cost fn_job_claim.
#
# 10,000 claimable jobs of 10 kinds (load_claim.sql), all claimed by one
# call with the largest limit, on a fresh copy of the seed each time
# (VACUUM ANALYZEd, checkpointed and prewarmed the same way). Measured: the
# CPU time of the backend running the claim (schedstat, so other load on a
# shared machine does not count) and the server's Execution Time of
# `EXPLAIN (ANALYZE, TIMING OFF) SELECT count(*) FROM <claim>(…)` (wall
# time, no client or socket). Four variants, interleaved round by round
# (each round starting with the next one) so that the machine's state falls
# on all of them alike:
#   before/plain  the function body before lease durations (claim_before.sql,
#                 installed as bench_job_claim_before) on jobs without
#                 overrides: every claim until now
#   now/plain     fn_job_claim on the same seed, no kind durations and no
#                 overrides: today's behaviour on the new code
#   before/mixed  the old body on the mixed seed (5 of 10 kinds with a
#                 duration, 1 job in 10 with an override), which it ignores
#   now/mixed     fn_job_claim on the mixed seed: the cost of the feature
# The goal: now/mixed within 1.2x of before/plain (the same 10,000 jobs
# claimed today). BENCH_CLAIM_RUNS sets the rounds (default 9); medians are
# reported, and the minimum CPU as the least disturbed run.

CLAIM_RUNS=${BENCH_CLAIM_RUNS:-9}

# claim_seed NAME MIXED: a seed database migrated by the product, loaded,
# with the old body installed beside the new one.
claim_seed() {
    createdb "$1"
    migrate "$1"
    $PSQL -X -q -d "$1" -v mixed="$2" -f "$HERE/load_claim.sql" >/dev/null
    $PSQL -X -q -d "$1" -v ON_ERROR_STOP=1 -f "$HERE/claim_before.sql" >/dev/null
}

# claim_run FUNCTION SEED: one claim of 10,000 jobs by FUNCTION on a fresh
# copy of SEED; prints "CPU_MS EXEC_MS" (backend CPU, server wall time) and
# checks that all 10,000 were leased.
claim_run() {
    createdb claim_run "$2"
    $PSQL -X -q -d claim_run -c "CREATE EXTENSION IF NOT EXISTS pg_prewarm" -c "VACUUM ANALYZE" -c CHECKPOINT \
        -c "SELECT pg_prewarm(c) FROM unnest(ARRAY['job_queue', 'job_queue_pkey', 'job_queue_claimable_idx', 'job_queue_lease_until_idx', 'job_kind_lease']::regclass[]) AS c" >/dev/null
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
    local variants=("bench_job_claim_before seed_claim_plain" "fn_job_claim seed_claim_plain"
                    "bench_job_claim_before seed_claim_mixed" "fn_job_claim seed_claim_mixed")
    local names=("before/plain" "now/plain" "before/mixed" "now/mixed")
    local -A cpu=() wall=()
    local r k i out
    for ((r = 1; r <= CLAIM_RUNS; r++)); do
        # Each round starts one variant later, so none is always first.
        for ((k = 0; k < ${#variants[@]}; k++)); do
            i=$(((r + k) % ${#variants[@]}))
            # shellcheck disable=SC2086
            out=$(claim_run ${variants[i]})
            cpu[$i]+="${out% *} "
            wall[$i]+="${out#* } "
            log "claim round $r ${names[i]}: CPU ${out% *} ms, execution ${out#* } ms"
        done
    done
    # Correctness of the mixed claim, on one more copy: each job its own duration.
    createdb claim_run seed_claim_mixed
    local sources
    sources=$($PSQL -X -At -d claim_run -c "SELECT string_agg(s || ' ' || n, ', ' ORDER BY s) FROM (SELECT lease_duration_source AS s, count(*) AS n FROM fn_job_claim('bench', NULL, 10000) GROUP BY 1) AS x")
    $PSQL -X -q -c "DROP DATABASE claim_run"
    local base_cpu base_wall
    base_cpu=$(claim_stat "${cpu[0]}" median)
    base_wall=$(claim_stat "${wall[0]}" median)
    header "Claim: 10,000 jobs of 10 kinds in one call, $CLAIM_RUNS runs each (backend CPU by schedstat; server execution time)" \
        variant "CPU ms (median)" "CPU ms (min)" "CPU vs before/plain" "execution ms (median)" "execution vs before/plain"
    for i in "${!variants[@]}"; do
        local c w
        c=$(claim_stat "${cpu[$i]}" median)
        w=$(claim_stat "${wall[$i]}" median)
        row "${names[i]}" "$(fmt "$c" 1)" "$(fmt "$(claim_stat "${cpu[$i]}" min)" 1)" "$(fmt "$(calc "$c / $base_cpu")" 3)x" \
            "$(fmt "$w" 1)" "$(fmt "$(calc "$w / $base_wall")" 3)x"
    done
    log "claim now/mixed leased by source: $sources"
    echo "now/mixed leases by source: $sources" | tee -a "$RESULTS"
    $PSQL -X -q -c "DROP DATABASE seed_claim_plain" -c "DROP DATABASE seed_claim_mixed"
}
