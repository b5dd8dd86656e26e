-- One batch of the sweep, the only shape there is: up to p_limit expired
-- leases in deadline order from p_after_millis (the newest deadline the
-- sweep's previous batch reaped; NULL: from the oldest), rows other sessions
-- hold skipped, deleted, and handed off in one lock_reap_handoff row in the
-- same transaction, so the caller commits before it writes a line and no
-- lock-server call waits on the daemon's output. Returns the hand-off's id
-- (NULL when nothing was reaped) and the batch as parallel arrays; leases
-- that could not be deleted come back in the set_aside_* arrays, left in
-- place (lock_reap_expired explains both paths).
CREATE OR REPLACE FUNCTION lock_reap_batch(p_limit integer, p_after_millis bigint DEFAULT NULL)
 RETURNS TABLE(handoff_id bigint, lock_keys text[], owner_ids text[], tokens text[], expired_at_millis bigint[], overdue_millis bigint[], set_aside_keys text[], set_aside_owner_ids text[], set_aside_tokens text[], set_aside_errors text[])
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
#variable_conflict use_variable
DECLARE
    v_from timestamptz;
    v_id bigint;
    v_k text[]; v_o text[]; v_t text[]; v_e bigint[]; v_d bigint[];
    s_k text[]; s_o text[]; s_t text[]; s_x text[];
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        RAISE EXCEPTION 'lock_reap_batch: limit must be from 1 to 100000, got %', COALESCE(p_limit::pg_catalog.text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    -- One bound expression (not "IS NULL OR ..."), so the scan of the
    -- deadline index starts at it; -infinity includes everything.
    v_from := CASE
        WHEN p_after_millis IS NULL OR p_after_millis < '-210000000000000'::pg_catalog.int8
            THEN '-infinity'::pg_catalog.timestamptz
        WHEN p_after_millis > '9000000000000000'::pg_catalog.int8
            THEN 'infinity'::pg_catalog.timestamptz
        ELSE '1970-01-01 00:00:00+00'::pg_catalog.timestamptz
             + p_after_millis::pg_catalog.float8 * '1 millisecond'::pg_catalog.interval
    END;
    -- The sweep's own deletions are not late releases (sql/lock_entry_hooks.sql).
    PERFORM pg_catalog.set_config('lease_sweeper.reaping', 'on', true);

    -- The batch in one statement: rows in deadline order, those another
    -- session holds skipped, deleted by tuple id (`= ANY(ARRAY(...))`, not
    -- `IN`, which plans a hash join over the whole table), counted into the
    -- shared held count's delta, built into arrays in one pass (every
    -- aggregate of one pass sees the rows in the same order) and handed
    -- off. A failure anywhere rolls the whole statement back before it
    -- returns a row, and the batch is taken again row by row below.
    BEGIN
        WITH doomed AS (
            SELECT l.ctid
              FROM lock_entry AS l
             WHERE l.expires_at <= pg_catalog.now()
               AND l.expires_at >= v_from
             ORDER BY l.expires_at
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED
        ), gone AS (
            DELETE FROM lock_entry AS e
             WHERE e.ctid = ANY (ARRAY(SELECT d.ctid FROM doomed AS d))
               AND e.expires_at <= pg_catalog.now()
            RETURNING e.lock_key, e.owner_id, e.token, e.expires_at, e.xmin AS version
        ), recorded AS (
            INSERT INTO lock_held_delta (n)
            SELECT pg_catalog.count(*)::pg_catalog.int4
              FROM gone AS g, lock_held_count AS c
             WHERE c.singleton
               AND lock_held_counted(g.version, c.counted_at, c.counted_xmin, c.counted_xmax, c.counted_xip)
            HAVING pg_catalog.count(*) > 0::pg_catalog.int8
        ), batch AS (
            SELECT pg_catalog.array_agg(g.lock_key) AS k,
                   pg_catalog.array_agg(g.owner_id) AS o,
                   pg_catalog.array_agg(g.token::pg_catalog.text) AS t,
                   pg_catalog.array_agg(lease_epoch_millis(g.expires_at)) AS e,
                   pg_catalog.array_agg(lease_overdue_millis(g.expires_at, pg_catalog.now())) AS d
              FROM gone AS g
        ), handed AS (
            INSERT INTO lock_reap_handoff AS h (lock_keys, owner_ids, tokens, expired_at_millis, overdue_millis)
            SELECT b.k, b.o, b.t, b.e, b.d FROM batch AS b WHERE b.k IS NOT NULL
            RETURNING h.handoff_id
        )
        SELECT (SELECT x.handoff_id FROM handed AS x), b.k, b.o, b.t, b.e, b.d
          INTO v_id, v_k, v_o, v_t, v_e, v_d
          FROM batch AS b;
        PERFORM pg_catalog.set_config('lease_sweeper.reaping', '', true);
        RETURN QUERY SELECT v_id, v_k, v_o, v_t, v_e, v_d, NULL::text[], NULL::text[], NULL::text[], NULL::text[];
        RETURN;
    EXCEPTION WHEN OTHERS THEN
        NULL;
    END;

    -- A row could not be deleted (an operator's trigger refused, say):
    -- lock_reap_expired takes the same batch row by row and sets the
    -- failing ones aside, so the others are reaped.
    SELECT pg_catalog.array_agg(r.lock_key) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.owner_id) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.token) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.expired_at_millis) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.overdue_millis) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.lock_key) FILTER (WHERE r.set_aside_error IS NOT NULL),
           pg_catalog.array_agg(r.owner_id) FILTER (WHERE r.set_aside_error IS NOT NULL),
           pg_catalog.array_agg(r.token) FILTER (WHERE r.set_aside_error IS NOT NULL),
           pg_catalog.array_agg(r.set_aside_error) FILTER (WHERE r.set_aside_error IS NOT NULL)
      INTO v_k, v_o, v_t, v_e, v_d, s_k, s_o, s_t, s_x
      FROM lock_reap_expired(p_limit, p_after_millis) AS r;
    IF v_k IS NOT NULL THEN
        INSERT INTO lock_reap_handoff AS h (lock_keys, owner_ids, tokens, expired_at_millis, overdue_millis)
        VALUES (v_k, v_o, v_t, v_e, v_d)
        RETURNING h.handoff_id INTO v_id;
    END IF;
    RETURN QUERY SELECT v_id, v_k, v_o, v_t, v_e, v_d, s_k, s_o, s_t, s_x;
END
$function$;

COMMENT ON FUNCTION lock_reap_batch(integer, bigint) IS
'One sweep batch: deletes up to p_limit (1-100000, else 22023) expired leases in deadline order from p_after_millis (epoch ms; NULL: the oldest), skipping rows other sessions hold, records them in one lock_reap_handoff row and returns its id and the leases as arrays (tokens as their text) (set_aside_*: leases whose delete failed, left in place). The caller commits, writes the lines, then claims the hand-off (lock_handoff_claim). SECURITY DEFINER; EXECUTE: lease_sweeper only.';

REVOKE ALL ON FUNCTION lock_reap_batch(integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_reap_batch(integer, bigint) TO lease_sweeper;
