-- Dropped first: it returned a third column (counted_at_millis) up to the
-- first release, which no daemon read, and CREATE OR REPLACE cannot change
-- a function's result columns. This file runs only in `migrate`'s one
-- transaction, and grants again below, so callers never see it missing.
DROP FUNCTION IF EXISTS lock_held_count_get(bigint);

CREATE OR REPLACE FUNCTION lock_held_count_get(p_max_age_millis bigint)
 RETURNS TABLE(held bigint, recounted boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_held bigint;
    v_at timestamptz;
    v_fresh_after timestamptz;
BEGIN
    IF p_max_age_millis IS NULL OR p_max_age_millis < 0 THEN
        RAISE EXCEPTION 'lock_held_count_get: max age must be a non-negative number of milliseconds, got %', p_max_age_millis
            USING ERRCODE = '22023';
    END IF;
    v_fresh_after := pg_catalog.now() - p_max_age_millis * '1 millisecond'::interval;
    SELECT c.held - COALESCE((SELECT pg_catalog.sum(d.n) FROM lock_held_delta AS d), 0::pg_catalog.int8),
           c.counted_at
      INTO v_held, v_at
      FROM lock_held_count AS c WHERE c.singleton;
    IF v_at IS NOT NULL AND v_at > v_fresh_after THEN
        RETURN QUERY SELECT v_held, false;
        RETURN;
    END IF;
    PERFORM 1 FROM lock_held_count AS c
     WHERE c.singleton AND c.counted_at <= v_fresh_after
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- Another daemon is recounting (or just did): its count, or the
        -- previous one, without waiting; sweeps since subtracted either way.
        SELECT c.held - COALESCE((SELECT pg_catalog.sum(d.n) FROM lock_held_delta AS d), 0::pg_catalog.int8)
          INTO v_held
          FROM lock_held_count AS c WHERE c.singleton;
        RETURN QUERY SELECT v_held, false;
        RETURN;
    END IF;
    -- One statement, one snapshot: the rows deleted from lock_held_delta are
    -- exactly those of the batches this count(*) sees; the snapshot stored
    -- is the one both ran with (the active snapshot of this statement).
    WITH folded AS (DELETE FROM lock_held_delta)
    UPDATE lock_held_count AS c
       SET held = (SELECT pg_catalog.count(*) FROM lock_entry),
           counted_at = pg_catalog.now(),
           counted_xmin = pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())::pg_catalog.xid,
           counted_xmax = pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::pg_catalog.xid,
           counted_xip = ARRAY(SELECT x::pg_catalog.xid
                                 FROM pg_catalog.pg_snapshot_xip(pg_catalog.pg_current_snapshot()) AS x),
           recounts = c.recounts + 1
     WHERE c.singleton
    RETURNING c.held INTO v_held;
    RETURN QUERY SELECT v_held, true;
END
$function$;

REVOKE ALL ON FUNCTION lock_held_count_get(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_held_count_get(bigint) TO lease_sweeper;
