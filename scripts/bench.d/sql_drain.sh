#!/usr/bin/env bash
# sql_drain.sh DB SHAPE BATCH [explain]
#
# Drains every expired lease of DB in batches of BATCH with one statement
# SHAPE per transaction, from psql (prepared, unaligned output to
# /dev/null): the database's share of the daemon's drain, without the
# daemon. Prints the elapsed seconds. With `explain`, writes EXPLAIN
# (ANALYZE, BUFFERS) of the first, middle and last batch to stdout instead
# of timing (those batches delete their rows as usual).
#
# Shapes:
#   function  the product's function from the oldest every batch:
#           SELECT * FROM lock_reap_expired($1) (a SECURITY DEFINER SQL
#           function around the ctid statement; what the daemon did before
#           the resumable reap)
#   function_resume  the product as the daemon calls it now:
#           lock_reap_expired($1, <newest deadline of the previous batch>)
#   walk    the backlog walk as the daemon drives it after a full first
#           batch: lock_reap_expired_walk($1, <page it returned last>)
#           (migration 20261130000300), the page carried through a setting
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
function) stmt="SELECT * FROM lock_reap_expired(\$1)" ;;
function_resume)
    stmt="WITH del AS (SELECT * FROM lock_reap_expired(\$1, current_setting('bench.after')::bigint)),
    mark AS (SELECT set_config('bench.after', coalesce(max(expired_at_millis), 0)::text, false) FROM del)
    SELECT del.* FROM del, mark" ;;
walk)
    stmt="WITH del AS (SELECT * FROM lock_reap_expired_walk(\$1, current_setting('bench.page')::bigint)),
    mark AS (SELECT set_config('bench.page', coalesce(max(next_page), -1)::text, false) FROM del)
    SELECT del.* FROM del, mark" ;;
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
script=$(mktemp)
trap 'rm -f "$script"' EXIT
{
    echo "SET bench.after = '0'; SET bench.page = '0';"
    echo "PREPARE reap(integer) AS $stmt;"
    for ((i = 1; i <= batches; i++)); do
        if [[ $mode == explain ]] && (( i == 1 || i == (batches + 1) / 2 || i == batches )); then
            echo "BEGIN; \\echo === batch $i of $batches
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE reap($batch); COMMIT;"
        else
            echo "BEGIN; EXECUTE reap($batch); COMMIT;"
        fi
    done
} >"$script"
if [[ $mode == explain ]]; then
    $PSQL -X -q -At -v ON_ERROR_STOP=1 -d "$db" -f "$script" | grep -v '^orders/' 
else
    start=$(date +%s.%N)
    $PSQL -X -q -At -v ON_ERROR_STOP=1 -d "$db" -f "$script" >/dev/null
    end=$(date +%s.%N)
    left=$($PSQL -X -At -d "$db" -c "SELECT count(*) FROM lock_entry WHERE expires_at <= now()")
    [[ $left == 0 ]] || { echo "drain left $left rows" >&2; exit 1; }
    echo "$end - $start" | bc -l | xargs printf '%.2f\n'
fi
