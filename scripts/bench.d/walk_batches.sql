-- Drains every expired lease of the database as the sweeper's walk does,
-- batch by batch in one session, and prints the session's CPU (schedstat,
-- s) and wall time: what a batch costs the server, without the daemon.
--   psql -X -q -At -d DB -v limit=500 -v careful=true -f walk_batches.sql
-- careful=true locks each row first and skips those others hold (the walk
-- beside a workload); false deletes by page range (alone). Run it on a
-- copy of a backlog with autovacuum off for lock_entry (a vacuum the drain
-- sets off shares the machine), as a superuser (pg_read_file of /proc) on
-- the server's machine.
\set ON_ERROR_STOP 1
SELECT set_config('bench.limit', :'limit', false), set_config('bench.careful', :'careful', false) \gset
CREATE TEMP TABLE walk_start AS
SELECT split_part(pg_read_file('/proc/' || pg_backend_pid() || '/schedstat'), ' ', 1)::bigint AS cpu_ns,
       clock_timestamp() AS at;
DO $$
DECLARE
    r record;
    p bigint := 0;
    n bigint := 0;
    b integer := 0;
BEGIN
    LOOP
        SELECT * INTO r
          FROM lock_reap_walk(current_setting('bench.limit')::integer, p,
                              current_setting('bench.careful')::boolean);
        COMMIT;
        EXIT WHEN r.handoff_id IS NULL;
        n := n + cardinality(r.lock_keys);
        b := b + 1;
        PERFORM lock_handoff_claim(r.handoff_id);
        COMMIT;
        p := r.next_page;
        EXIT WHEN p < 0;
    END LOOP;
    RAISE NOTICE 'walk_batches: % leases in % batches', n, b;
END
$$;
SELECT round((split_part(pg_read_file('/proc/' || pg_backend_pid() || '/schedstat'), ' ', 1)::bigint
              - s.cpu_ns) / 1e9, 3) AS cpu_s,
       round(extract(epoch FROM clock_timestamp() - s.at)::numeric, 3) AS wall_s
  FROM walk_start AS s;
