-- Dropped first: up to the first release it returned no fallback_cause,
-- and CREATE OR REPLACE cannot change a function's result columns. This
-- file runs only in `migrate`'s one transaction, and grants again below, so
-- callers never see it missing.
DROP FUNCTION IF EXISTS lock_reap_batch(integer, bigint);

-- One batch of the sweep: up to p_limit expired leases in deadline order
-- from p_after_millis (the newest deadline the sweep's previous batch
-- reaped; NULL: from the oldest), rows other sessions hold skipped,
-- deleted, counted out of the shared held count, and recorded in one
-- lock_reap_handoff row, all in the caller's transaction, which commits
-- before a line is written, so no lock-server call waits on the daemon's
-- output. Returns the hand-off's id (NULL when nothing was reaped) and its
-- leases as the hand-off keeps them, in parallel arrays; leases whose
-- delete failed come back in the set_aside_* arrays, left in place. One
-- row of arrays, not a row per lease: the server sends, and the daemon
-- decodes, one value per column instead of one per lease
-- (docs/performance.md measures the difference).
--
-- fallback_cause says why the one set-based statement failed, when it did
-- and the batch was taken row by row instead. That pass is kept because
-- one row whose delete fails (an operator's or the lock server's trigger
-- refusing it) would otherwise fail every batch that holds it, and no
-- expiry behind it would ever be reported.
CREATE OR REPLACE FUNCTION lock_reap_batch(p_limit integer, p_after_millis bigint DEFAULT NULL::bigint)
 RETURNS TABLE(handoff_id bigint, lock_keys text[], owner_ids text[], tokens text[], expired_at_millis bigint[], overdue_millis bigint[], set_aside_keys text[], set_aside_owner_ids text[], set_aside_tokens text[], set_aside_errors text[], fallback_cause text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
#variable_conflict use_variable
DECLARE
    v_from    timestamptz;
    v_id      bigint;
    v_cause   text;
    v_k text[]; v_o text[]; v_t text[]; v_e bigint[]; v_d bigint[];
    s_k text[]; s_o text[]; s_t text[]; s_x text[];
    v_rows    lock_reaped_lease[] := '{}';
    v_one     lock_reaped_lease;
    v_counted boolean;
    v_n       integer := 0;
    v_count   lock_held_count;
    r         record;
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
    -- The sweep's own deletions are not late releases: the trigger
    -- lock_entry_late_release skips rows deleted while this says `on`
    -- (sql/lock_entry_hooks.sql). Local to the transaction, and set back
    -- before returning, so nothing else the transaction deletes is hidden.
    PERFORM pg_catalog.set_config('lease_sweeper.reaping', 'on', true);

    -- The batch in one statement: rows in deadline order, those another
    -- session holds skipped, deleted by tuple id (`= ANY(ARRAY(...))`, not
    -- `IN`, which plans a hash join over the whole table), counted into the
    -- shared held count's delta, built into the hand-off's arrays in one
    -- pass (every aggregate of one pass sees the rows in the same order) and
    -- handed off. A failure anywhere rolls the whole statement back, and
    -- the batch is taken again row by row below.
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
        RETURN QUERY SELECT v_id, v_k, v_o, v_t, v_e, v_d, NULL::text[], NULL::text[], NULL::text[], NULL::text[], NULL::text;
        RETURN;
    EXCEPTION WHEN OTHERS THEN
        -- A row could not be deleted (an operator's trigger refused, say):
        -- without the pass below, that one row would stop every expiry.
        v_cause := pg_catalog.format('%s (SQLSTATE %s)', SQLERRM, SQLSTATE);
    END;

    -- The same batch row by row, each delete in its own subtransaction, so
    -- one that fails is set aside and the rest are reaped and handed off.
    SELECT * INTO v_count FROM lock_held_count AS c WHERE c.singleton;
    FOR r IN
        SELECT l.lock_key, l.owner_id, l.token::pg_catalog.text AS token
          FROM lock_entry AS l
         WHERE l.expires_at <= pg_catalog.now()
           AND l.expires_at >= v_from
         ORDER BY l.expires_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    LOOP
        BEGIN
            DELETE FROM lock_entry AS e
             WHERE e.lock_key = r.lock_key
               AND e.expires_at <= pg_catalog.now()
            RETURNING e.lock_key, e.owner_id, e.token::pg_catalog.text,
                      lease_epoch_millis(e.expires_at),
                      lease_overdue_millis(e.expires_at, pg_catalog.now()),
                      NULL::pg_catalog.text, 'sweep',
                      lock_held_counted(e.xmin, v_count.counted_at, v_count.counted_xmin,
                                        v_count.counted_xmax, v_count.counted_xip)
                 INTO v_one.lock_key, v_one.owner_id, v_one.token, v_one.expired_at_millis,
                      v_one.overdue_millis, v_one.set_aside_error, v_one.reaped_by, v_counted;
            IF FOUND THEN
                v_rows := pg_catalog.array_append(v_rows, v_one);
                IF v_counted THEN
                    v_n := v_n + 1;
                END IF;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            v_rows := pg_catalog.array_append(v_rows,
                ROW(r.lock_key, r.owner_id, r.token, NULL, NULL,
                    pg_catalog.format('%s (SQLSTATE %s)', SQLERRM, SQLSTATE), 'sweep')::lock_reaped_lease);
        END;
    END LOOP;
    IF v_n > 0 THEN
        INSERT INTO lock_held_delta (n) VALUES (v_n);
    END IF;
    SELECT pg_catalog.array_agg(u.lock_key) FILTER (WHERE u.set_aside_error IS NULL),
           pg_catalog.array_agg(u.owner_id) FILTER (WHERE u.set_aside_error IS NULL),
           pg_catalog.array_agg(u.token) FILTER (WHERE u.set_aside_error IS NULL),
           pg_catalog.array_agg(u.expired_at_millis) FILTER (WHERE u.set_aside_error IS NULL),
           pg_catalog.array_agg(u.overdue_millis) FILTER (WHERE u.set_aside_error IS NULL),
           pg_catalog.array_agg(u.lock_key) FILTER (WHERE u.set_aside_error IS NOT NULL),
           pg_catalog.array_agg(u.owner_id) FILTER (WHERE u.set_aside_error IS NOT NULL),
           pg_catalog.array_agg(u.token) FILTER (WHERE u.set_aside_error IS NOT NULL),
           pg_catalog.array_agg(u.set_aside_error) FILTER (WHERE u.set_aside_error IS NOT NULL)
      INTO v_k, v_o, v_t, v_e, v_d, s_k, s_o, s_t, s_x
      FROM pg_catalog.unnest(v_rows) AS u;
    IF v_k IS NOT NULL THEN
        INSERT INTO lock_reap_handoff AS h (lock_keys, owner_ids, tokens, expired_at_millis, overdue_millis)
        VALUES (v_k, v_o, v_t, v_e, v_d)
        RETURNING h.handoff_id INTO v_id;
    END IF;
    PERFORM pg_catalog.set_config('lease_sweeper.reaping', '', true);
    RETURN QUERY SELECT v_id, v_k, v_o, v_t, v_e, v_d, s_k, s_o, s_t, s_x, v_cause;
END
$function$;

COMMENT ON FUNCTION lock_reap_batch(integer, bigint) IS
'One sweep batch: deletes up to p_limit (1-100000, else 22023) expired leases in deadline order from p_after_millis (epoch ms; NULL: the oldest), skipping rows other sessions hold, records them in one lock_reap_handoff row and returns its id and the leases as arrays (tokens as their text) (set_aside_*: leases whose delete failed, left in place; fallback_cause: why the set-based statement failed, when the batch was taken row by row). The caller commits, then claims the hand-off (lock_handoff_claim), writes the lines and commits. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

REVOKE ALL ON FUNCTION lock_reap_batch(integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_reap_batch(integer, bigint) TO lease_sweeper;
