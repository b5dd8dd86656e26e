#!/usr/bin/env bash
# sql_drain.sh DB SHAPE BATCH [explain]
#
# Drains every expired lease of DB in batches of BATCH with one statement
# SHAPE per transaction, from psql (prepared, unaligned output to
# /dev/null): the database's share of the daemon's drain, without the
# daemon. Prints the elapsed seconds, the backend's CPU seconds (schedstat)
# and the WAL written in MiB. HELD_FRESH=1 recounts the shared held count
# first, so the reaping statements' per-row held check runs, as it does
# while daemons run (else the count is stale and the check is skipped).
# With `explain`, writes EXPLAIN
# (ANALYZE, BUFFERS) of the first, middle and last batch to stdout instead
# of timing (those batches delete their rows as usual).
#
# Shapes:
#   function  the product's batch from the oldest every batch:
#           lock_reap_batch($1) (SECURITY DEFINER, around the ctid
#           statement, its hand-off claimed in a second transaction; what
#           the daemon did before the resumable reap)
#   function_resume  the product as the daemon calls it now:
#           lock_reap_batch($1, <newest deadline of the previous batch>),
#           then lock_handoff_claim in a second transaction
#   The walk shapes below call functions only a database migrated by an
#   earlier build has (the sweep is one batch shape since): run them with
#   --bin of such a build.
#   walk    the backlog walk without a hand-off: lock_reap_expired_walk($1,
#           <page it returned last>) (migration 20261204000100), the page
#           carried through a setting
#   walk_counted  the same, its rows counted in the statement instead of
#           sent (as the three below: psql's text output of 5,000 rows or
#           arrays a batch would be most of what is measured, where the
#           daemon reads binary)
#   walk_handed_off  the walk with its hand-off as daemons before
#           migration 20261204000200 ran it: lock_reap_expired_walk_handed_off,
#           then lock_handoff_claim in a second transaction
#   reap_walk  the walk as the daemon runs it alone on the server:
#           lock_reap_walk($1, <page>, false) (no row lock before the
#           delete), then lock_handoff_claim in a second transaction
#   reap_walk_careful  the same with skip_locked (rows locked first), as
#           beside a busy workload
#   ctid    the function's statement run inline (ctid = ANY(ARRAY(...)))
#   key     lock_key IN (subquery)  (1,000,000 leases in 5,000-row batches: 37-46 s)
#   keyset  ctid shape plus `expires_at >= <last deadline reaped>`, the
#           bound carried from batch to batch (here through a session
#           setting, as for function_resume; in the daemon it is a bind
#           parameter)
#   keyset_nolock  keyset without FOR UPDATE SKIP LOCKED: what the row
#           locks that let replicas split the work cost (analysis only:
#           the product must keep them)
set -euo pipefail
db=$1 shape=$2 batch=$3 mode=${4:-time}
PSQL=${PSQL:-psql}
returning="RETURNING e.lock_key, e.owner_id, e.token,
          floor(extract(epoch FROM e.expires_at) * 1000)::bigint AS expired_at_millis,
          floor(extract(epoch FROM now() - e.expires_at) * 1000)::bigint AS overdue_millis"
case $shape in
function)
    stmt="SELECT set_config('bench.id', coalesce(b.handoff_id, 0)::text, false), b.*
      FROM lock_reap_batch(\$1) AS b"
    claim=1 ;;
function_resume)
    stmt="SELECT set_config('bench.after', coalesce((SELECT max(x) FROM unnest(b.expired_at_millis) AS x), current_setting('bench.after')::bigint)::text, false),
           set_config('bench.id', coalesce(b.handoff_id, 0)::text, false), b.*
      FROM lock_reap_batch(\$1, current_setting('bench.after')::bigint) AS b"
    claim=1 ;;
walk)
    stmt="WITH del AS (SELECT * FROM lock_reap_expired_walk(\$1, current_setting('bench.page')::bigint)),
    mark AS (SELECT set_config('bench.page', coalesce(max(next_page), -1)::text, false) FROM del)
    SELECT del.* FROM del, mark" ;;
walk_counted)
    stmt="SELECT set_config('bench.page', coalesce(max(w.next_page), -1)::text, false), count(w.lock_key)
    FROM lock_reap_expired_walk(\$1, current_setting('bench.page')::bigint) AS w" ;;
walk_handed_off)
    stmt="SELECT set_config('bench.page', w.next_page::text, false), set_config('bench.id', coalesce(w.handoff_id, 0)::text, false),
    cardinality(w.lock_keys)
    FROM lock_reap_expired_walk_handed_off(\$1, current_setting('bench.page')::bigint) AS w"
    claim=1 ;;
reap_walk|reap_walk_careful)
    careful=false
    [[ $shape == reap_walk_careful ]] && careful=true
    stmt="SELECT set_config('bench.page', w.next_page::text, false), set_config('bench.id', coalesce(w.handoff_id, 0)::text, false),
    cardinality(w.lock_keys)
    FROM lock_reap_walk(\$1, current_setting('bench.page')::bigint, $careful) AS w"
    claim=1 ;;
ctid) stmt="WITH doomed AS (SELECT ctid FROM lock_entry WHERE expires_at <= now()
        ORDER BY expires_at LIMIT \$1 FOR UPDATE SKIP LOCKED)
    DELETE FROM lock_entry AS e WHERE e.ctid = ANY (ARRAY(SELECT ctid FROM doomed))
       AND e.expires_at <= now() $returning" ;;
key) stmt="DELETE FROM lock_entry AS e WHERE e.lock_key IN (SELECT lock_key FROM lock_entry
        WHERE expires_at <= now() ORDER BY expires_at LIMIT \$1 FOR UPDATE SKIP LOCKED)
       AND e.expires_at <= now() $returning" ;;
keyset) stmt="WITH doomed AS (SELECT ctid FROM lock_entry WHERE expires_at <= now()
        AND expires_at >= 'epoch'::timestamptz + current_setting('bench.after')::bigint * interval '1 millisecond'
        ORDER BY expires_at LIMIT \$1 FOR UPDATE SKIP LOCKED),
    del AS (DELETE FROM lock_entry AS e WHERE e.ctid = ANY (ARRAY(SELECT ctid FROM doomed))
       AND e.expires_at <= now() $returning),
    mark AS (SELECT set_config('bench.after', coalesce(max(expired_at_millis), 0)::text, false) FROM del)
    SELECT del.* FROM del, mark" ;;
keyset_nolock) stmt="WITH doomed AS (SELECT ctid FROM lock_entry WHERE expires_at <= now()
        AND expires_at >= 'epoch'::timestamptz + current_setting('bench.after')::bigint * interval '1 millisecond'
        ORDER BY expires_at LIMIT \$1),
    del AS (DELETE FROM lock_entry AS e WHERE e.ctid = ANY (ARRAY(SELECT ctid FROM doomed))
       AND e.expires_at <= now() $returning),
    mark AS (SELECT set_config('bench.after', coalesce(max(expired_at_millis), 0)::text, false) FROM del)
    SELECT del.* FROM del, mark" ;;
*) echo "unknown shape $shape" >&2; exit 2 ;;
esac
n=$($PSQL -X -At -d "$db" -c "SELECT count(*) FROM lock_entry WHERE expires_at <= now()")
batches=$(( n / batch + 1 ))
[[ ${HELD_FRESH:-0} == 1 ]] && $PSQL -X -q -d "$db" -c "SELECT * FROM lock_held_count_get(0)" >/dev/null
script=$(mktemp)
cpu=$(mktemp)
trap 'rm -f "$script" "$cpu" "$cpu".*' EXIT
{
    echo "SET bench.after = '0'; SET bench.page = '0'; SET bench.id = '0';"
    echo "SELECT pg_backend_pid() AS bpid \\gset"
    echo "\\setenv BPID :bpid"
    echo "\\! cut -d' ' -f1 /proc/\$BPID/schedstat > $cpu.0"
    echo "PREPARE reap(integer) AS $stmt;"
    [[ -n ${claim:-} ]] && echo "PREPARE claim AS SELECT lock_handoff_claim(current_setting('bench.id')::bigint);"
    for ((i = 1; i <= batches; i++)); do
        if [[ $mode == explain ]] && (( i == 1 || i == (batches + 1) / 2 || i == batches )); then
            echo "BEGIN; \\echo === batch $i of $batches
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE reap($batch); COMMIT;"
        else
            echo "BEGIN; EXECUTE reap($batch); COMMIT;"
        fi
        [[ -n ${claim:-} ]] && echo "BEGIN; EXECUTE claim; COMMIT;"
    done
    echo "\\! cut -d' ' -f1 /proc/\$BPID/schedstat > $cpu.1"
} >"$script"
if [[ $mode == explain ]]; then
    $PSQL -X -q -At -v ON_ERROR_STOP=1 -d "$db" -f "$script" | grep -v '^orders/' 
else
    w0=$($PSQL -X -At -c "SELECT pg_current_wal_insert_lsn()")
    start=$(date +%s.%N)
    $PSQL -X -q -At -v ON_ERROR_STOP=1 -d "$db" -f "$script" >/dev/null
    end=$(date +%s.%N)
    wal=$($PSQL -X -At -c "SELECT round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '$w0') / 1048576.0, 1)")
    left=$($PSQL -X -At -d "$db" -c "SELECT count(*) FROM lock_entry WHERE expires_at <= now()")
    [[ $left == 0 ]] || { echo "drain left $left rows" >&2; exit 1; }
    printf '%.2f %.2f %s\n' "$(echo "$end - $start" | bc -l)" \
        "$(echo "($(cat "$cpu.1") - $(cat "$cpu.0")) / 1000000000" | bc -l)" "$wal"
fi
