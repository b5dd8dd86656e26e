-- The proposed resumable reap (docs/performance.md, "Drain"), installed by
-- the harness under a bench name so the statement shape can be measured
-- against any build: the product's lock_reap_expired with a lower bound on
-- the deadline, carried from batch to batch by the caller.
CREATE OR REPLACE FUNCTION bench_reap_resume(p_limit integer, p_after_millis bigint)
RETURNS TABLE (lock_key text, owner_id text, token bigint, expired_at_millis bigint, overdue_millis bigint)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    WITH doomed AS (
        SELECT ctid
          FROM lock_entry
         WHERE expires_at <= pg_catalog.now()
           AND expires_at >= '1970-01-01 00:00:00+00'::pg_catalog.timestamptz
                             + p_after_millis::pg_catalog.float8 * '1 millisecond'::pg_catalog.interval
         ORDER BY expires_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    )
    DELETE FROM lock_entry AS e
     WHERE e.ctid = ANY (ARRAY(SELECT ctid FROM doomed))
       AND e.expires_at <= pg_catalog.now()
    RETURNING e.lock_key,
              e.owner_id,
              e.token,
              pg_catalog.floor(EXTRACT(epoch FROM e.expires_at) * 1000::numeric)::bigint,
              pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.now() - e.expires_at) * 1000::numeric)::bigint
$$;
