-- The floor of the one batch shape, statement by statement in psql:
--   psql -X -q -d DB -v n=100000 -f scripts/bench.d/batch_floor.sql
-- on a database the current build migrated. Three times, each on the same
-- n expired leases loaded afresh (deadlines over the past hour in random
-- order): the plain DELETE … RETURNING (the drain's reference), the batch's
-- row selection and delete in one statement (deadline order, FOR UPDATE
-- SKIP LOCKED, by tuple id) for all n at once, and lock_reap_batch in
-- batches of 1,000 from where the last left off, as the daemon calls it
-- (its hand-off rows claimed at the end). Each marked as a sweep's delete,
-- so the late-release trigger skips them. psql prints each one's time.
\set ON_ERROR_STOP 1
SELECT set_config('lease_sweeper.reaping', 'on', false) \g /dev/null

\echo plain DELETE … RETURNING
TRUNCATE lock_entry CASCADE;
INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
SELECT 'floor-' || g, 'o', g, now() - (random() * 3600000)::int * interval '1 millisecond'
  FROM generate_series(1, :n) AS g;
VACUUM ANALYZE lock_entry;
\timing on
WITH gone AS (DELETE FROM lock_entry WHERE expires_at <= now()
              RETURNING lock_key, owner_id, token, expires_at)
SELECT count(*) FROM gone;
\timing off

\echo rows locked in deadline order, then deleted by tuple id
TRUNCATE lock_entry CASCADE;
INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
SELECT 'floor-' || g, 'o', g, now() - (random() * 3600000)::int * interval '1 millisecond'
  FROM generate_series(1, :n) AS g;
VACUUM ANALYZE lock_entry;
\timing on
WITH doomed AS (SELECT l.ctid FROM lock_entry AS l
                 WHERE l.expires_at <= now() ORDER BY l.expires_at LIMIT :n FOR UPDATE SKIP LOCKED),
     gone AS (DELETE FROM lock_entry AS e WHERE e.ctid = ANY (ARRAY(SELECT d.ctid FROM doomed AS d))
              RETURNING e.lock_key, e.owner_id, e.token, e.expires_at)
SELECT count(*) FROM gone;
\timing off

\echo lock_reap_batch, 1,000 a batch, with its hand-off
TRUNCATE lock_entry CASCADE;
INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
SELECT 'floor-' || g, 'o', g, now() - (random() * 3600000)::int * interval '1 millisecond'
  FROM generate_series(1, :n) AS g;
VACUUM ANALYZE lock_entry;
\timing on
DO $$
DECLARE
    v_n integer;
    v_after bigint;
    v_newest bigint;
BEGIN
    LOOP
        SELECT coalesce(cardinality(b.lock_keys), 0), (SELECT max(x) FROM unnest(b.expired_at_millis) AS x)
          INTO v_n, v_newest
          FROM lock_reap_batch(1000, v_after) AS b;
        v_after := coalesce(v_newest, v_after);
        EXIT WHEN v_n < 1000;
    END LOOP;
END
$$;
DELETE FROM lock_reap_handoff;
\timing off
