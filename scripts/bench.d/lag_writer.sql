-- The lock server beside the daemon in the lag step: one session that keeps
-- inserting the leases that then expire, :rate a second for :secs s, each
-- with a TTL of :ttl s, instead of a table loaded before the run.
-- psql variables: rate, secs, ttl (seconds, may be fractional).
--
-- Every 10 ms it inserts, in one statement committed on its own, the leases
-- whose time has come: lease g (from 1) is due at t0 + (g - 1) / rate and
-- expires ttl later, so the leases expire evenly at :rate/s from t0 + ttl
-- on, the same schedule as the pre-loaded run (load_leases.sql with a
-- spread), and a writer running late writes the leases it owes at once.
-- Keys, owners and sessions as load_leases.sql writes them (one lease in 16
-- belongs to a session), tokens from the fencing sequence.
--
-- Prints, once done: rows written|seconds it took|statements|how late the
-- latest statement committed after its first lease was due (ms).
\set ON_ERROR_STOP 1
INSERT INTO lock_session (session_id, owner_id, expires_at)
SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(s), 12, '0'))::uuid,
       'host-' || (s % 8) || '/worker-' || s, now() + interval '1 day'
  FROM generate_series(1, 64) AS s
ON CONFLICT DO NOTHING;

SELECT set_config('bench.rate', :'rate', false), set_config('bench.secs', :'secs', false),
       set_config('bench.ttl', :'ttl', false) \g /dev/null

DO $$
DECLARE
    rate   float8 := current_setting('bench.rate')::float8;
    n      bigint := round(current_setting('bench.rate')::float8 * current_setting('bench.secs')::float8);
    ttl    float8 := current_setting('bench.ttl')::float8;
    t0     timestamptz := clock_timestamp();
    done   bigint := 0;
    due    bigint;
    stmts  int := 0;
    worst  float8 := 0;
BEGIN
    LOOP
        due := least(n, floor(extract(epoch FROM clock_timestamp() - t0) * rate)::bigint + 1);
        IF due > done THEN
            INSERT INTO lock_entry (lock_key, session_id, owner_id, token, acquired_at, expires_at)
            SELECT 'orders/' || md5(g::text) || '/' || g,
                   CASE WHEN g % 16 = 0
                        THEN ('00000000-0000-4000-8000-' || lpad(to_hex(1 + g % 64), 12, '0'))::uuid END,
                   'host-' || (g % 8) || '/worker-' || (g % 64),
                   nextval('lock_fencing_token_seq'),
                   clock_timestamp(),
                   t0 + (ttl + (g - 1) / rate) * interval '1 second'
              FROM generate_series(done + 1, due) AS g;
            COMMIT;
            worst := greatest(worst, extract(epoch FROM clock_timestamp() - t0) - done / rate);
            done := due;
            stmts := stmts + 1;
        END IF;
        EXIT WHEN done >= n;
        PERFORM pg_sleep(0.01);
    END LOOP;
    PERFORM set_config('bench.result', format('%s|%s|%s|%s', done,
        round(extract(epoch FROM clock_timestamp() - t0)::numeric, 2), stmts, round((worst * 1000)::numeric)), false);
END
$$;

SELECT current_setting('bench.result');
