-- The hand-off row is written by the reaping call itself, not sent back by
-- the daemon.
--
-- 20261202000100 had the daemon send each batch back in a second statement
-- (lock_handoff_put / fn_job_reap_handoff_put): about 520 KB a 5,000-lease
-- batch, bound, parsed and compressed again by the server. Measured on
-- 500,000 expired leases (the drain benchmark's keys): that statement took
-- 20 ms of the server's time a batch, as long as the reap itself, and the
-- drain went from 2.3 s to 5.6 s. Now one call reaps, records the hand-off
-- and answers with the batch as arrays, one row: the batch crosses the wire
-- once, and the daemon decodes one row instead of 5,000.
--
-- The hand-off's columns are compressed with lz4 where the server has it
-- (it is about ten times faster than pglz, which spent most of the old
-- statement's time failing to compress random keys); else they are stored
-- uncompressed.

DROP FUNCTION lock_handoff_put(text[], text[], bigint[], bigint[], bigint[]);
DROP FUNCTION fn_job_reap_handoff_put(text);

DO $$
BEGIN
    ALTER TABLE lock_reap_handoff
        ALTER COLUMN lock_keys SET COMPRESSION lz4,
        ALTER COLUMN owner_ids SET COMPRESSION lz4,
        ALTER COLUMN tokens SET COMPRESSION lz4,
        ALTER COLUMN expired_at_millis SET COMPRESSION lz4,
        ALTER COLUMN overdue_millis SET COMPRESSION lz4;
    ALTER TABLE job_reap_handoff ALTER COLUMN report SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    ALTER TABLE lock_reap_handoff
        ALTER COLUMN lock_keys SET STORAGE EXTERNAL,
        ALTER COLUMN owner_ids SET STORAGE EXTERNAL,
        ALTER COLUMN tokens SET STORAGE EXTERNAL,
        ALTER COLUMN expired_at_millis SET STORAGE EXTERNAL,
        ALTER COLUMN overdue_millis SET STORAGE EXTERNAL;
    ALTER TABLE job_reap_handoff ALTER COLUMN report SET STORAGE EXTERNAL;
END
$$;

-- lock_reap_expired (its whole contract: oldest first, SKIP LOCKED, rows
-- that fail set aside), then the reaped leases recorded in one hand-off row
-- in the same transaction. One row back: the hand-off's id (NULL when
-- nothing was reaped), the reaped leases as arrays (element i is one lease,
-- oldest deadline first) and the set-aside ones likewise (NULL when none).
CREATE FUNCTION lock_reap_expired_handed_off(p_limit integer, p_after_millis bigint DEFAULT NULL)
RETURNS TABLE (handoff_id bigint, lock_keys text[], owner_ids text[], tokens bigint[],
               expired_at_millis bigint[], overdue_millis bigint[],
               set_aside_keys text[], set_aside_owner_ids text[], set_aside_tokens bigint[],
               set_aside_errors text[], waiters integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_id bigint;
    v_k text[]; v_o text[]; v_t bigint[]; v_e bigint[]; v_d bigint[];
    s_k text[]; s_o text[]; s_t bigint[]; s_x text[];
BEGIN
    -- One pass over the function's result, every aggregate in its order.
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
    RETURN QUERY SELECT v_id, v_k, v_o, v_t, v_e, v_d, s_k, s_o, s_t, s_x, lock_reap_waiters();
END
$$;

-- lock_reap_expired_walk (its contract: a page range in physical order,
-- SKIP LOCKED, the page to go on from), then the hand-off as above. The
-- walk returns each lease's lateness as an interval and the statement's
-- clock in microseconds; the millisecond fields are derived here with
-- float8 and integer arithmetic (no numeric per row), floored as the
-- index path floors them.
CREATE FUNCTION lock_reap_expired_walk_handed_off(p_limit integer, p_from_page bigint)
RETURNS TABLE (handoff_id bigint, next_page bigint, lock_keys text[], owner_ids text[],
               tokens bigint[], expired_at_millis bigint[], overdue_millis bigint[],
               waiters integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_id bigint;
    v_next bigint;
    v_k text[]; v_o text[]; v_t bigint[]; v_e bigint[]; v_d bigint[];
BEGIN
    SELECT pg_catalog.max(w.next_page),
           pg_catalog.array_agg(w.lock_key) FILTER (WHERE w.lock_key IS NOT NULL),
           pg_catalog.array_agg(w.owner_id) FILTER (WHERE w.lock_key IS NOT NULL),
           pg_catalog.array_agg(w.token) FILTER (WHERE w.lock_key IS NOT NULL),
           pg_catalog.array_agg(lease_floor_div_1000(w.now_micros - w.late_us)) FILTER (WHERE w.lock_key IS NOT NULL),
           pg_catalog.array_agg(lease_floor_div_1000(w.late_us)) FILTER (WHERE w.lock_key IS NOT NULL)
      INTO v_next, v_k, v_o, v_t, v_e, v_d
      FROM (SELECT x.lock_key, x.owner_id, x.token, x.now_micros, x.next_page,
                   pg_catalog.round(pg_catalog.date_part('epoch', x.late) * 1000000::pg_catalog.float8)::pg_catalog.int8 AS late_us
              FROM lock_reap_expired_walk(p_limit, p_from_page) AS x) AS w;
    IF v_k IS NOT NULL THEN
        INSERT INTO lock_reap_handoff AS h (lock_keys, owner_ids, tokens, expired_at_millis, overdue_millis)
        VALUES (v_k, v_o, v_t, v_e, v_d)
        RETURNING h.handoff_id INTO v_id;
    END IF;
    RETURN QUERY SELECT v_id, COALESCE(v_next, -1::pg_catalog.int8), v_k, v_o, v_t, v_e, v_d,
                        lock_reap_waiters();
END
$$;

-- How many sessions wait on this transaction right now: a lock-server call
-- that touched a lease of the batch and queued behind its row lock. Asked
-- at the end of each reaping call, before its commit, while every such
-- waiter still waits; the sweeper takes smaller batches while it sees any.
-- A waiter waits on the transaction id that locked the row, which is a
-- subtransaction's (lock_reap_expired reaps inside one), so it is matched
-- against every transaction id this backend holds, from one read of
-- pg_locks (readable by every role).
CREATE FUNCTION lock_reap_waiters() RETURNS integer
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, public, pg_temp
AS $$
    WITH l AS MATERIALIZED (
        SELECT k.locktype, k.transactionid, k.pid, k.granted FROM pg_catalog.pg_locks AS k
    )
    SELECT pg_catalog.count(*)::pg_catalog.int4
      FROM l AS w
     WHERE w.locktype OPERATOR(pg_catalog.=) 'transactionid'
       AND NOT w.granted
       AND w.transactionid IN (SELECT h.transactionid FROM l AS h
                                WHERE h.locktype OPERATOR(pg_catalog.=) 'transactionid'
                                  AND h.granted
                                  AND h.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())
$$;
REVOKE ALL ON FUNCTION lock_reap_waiters() FROM PUBLIC;

-- Floor of x / 1000 for any bigint (integer division truncates toward zero,
-- which is not the floor for a pre-1970 deadline). Plain SQL, inlined.
CREATE FUNCTION lease_floor_div_1000(p_x bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (p_x - ((p_x % 1000::pg_catalog.int8) + 1000::pg_catalog.int8) % 1000::pg_catalog.int8) / 1000::pg_catalog.int8
$$;
REVOKE ALL ON FUNCTION lease_floor_div_1000(bigint) FROM PUBLIC;

-- fn_job_reap_stale_leases_apply (its whole contract: the gates, the
-- refusals, the report), and when it reaped something its report recorded
-- in one hand-off row in the same transaction. Returns the hand-off's id
-- (NULL on a refusal or when nothing was reaped) and the report.
CREATE FUNCTION fn_job_reap_stale_leases_apply_handed_off(p_actor text, p_limit integer DEFAULT 100)
RETURNS TABLE (handoff_id bigint, report text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_report jsonb := fn_job_reap_stale_leases_apply(p_actor, p_limit);
    v_text text := v_report::pg_catalog.text;
    v_id bigint;
BEGIN
    IF pg_catalog.jsonb_typeof(v_report -> 'actions') = 'array'
       AND pg_catalog.jsonb_array_length(v_report -> 'actions') > 0 THEN
        INSERT INTO job_reap_handoff AS h (report) VALUES (v_text) RETURNING h.handoff_id INTO v_id;
    END IF;
    RETURN QUERY SELECT v_id, v_text;
END
$$;

REVOKE ALL ON FUNCTION
    lock_reap_expired_handed_off(integer, bigint),
    lock_reap_expired_walk_handed_off(integer, bigint),
    fn_job_reap_stale_leases_apply_handed_off(text, integer)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    lock_reap_expired_handed_off(integer, bigint),
    lock_reap_expired_walk_handed_off(integer, bigint),
    fn_job_reap_stale_leases_apply_handed_off(text, integer)
    TO lease_sweeper;

COMMENT ON FUNCTION lock_reap_expired_handed_off(integer, bigint) IS
'lock_reap_expired(p_limit, p_after_millis), with the reaped leases recorded in one lock_reap_handoff row in the same transaction; returns its id (NULL when nothing was reaped) and the batch as arrays, then the set-aside leases, then how many sessions wait on its row locks. The sweeper commits, then claims the hand-off with lock_handoff_claim and writes its lines. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
COMMENT ON FUNCTION lock_reap_expired_walk_handed_off(integer, bigint) IS
'lock_reap_expired_walk(p_limit, p_from_page), with the reaped leases recorded in one lock_reap_handoff row in the same transaction; returns its id, the page to go on from (-1: the end), the batch as arrays and how many sessions wait on its row locks. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
COMMENT ON FUNCTION fn_job_reap_stale_leases_apply_handed_off(text, integer) IS
'fn_job_reap_stale_leases_apply(p_actor, p_limit), with its report recorded in one job_reap_handoff row in the same transaction when it reaped something; returns the hand-off''s id (NULL otherwise) and the report. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

-- Follow the installing schema, as migrations/20261130000120_privilege_holes.sql
-- asks of every later migration that creates a pinned definer (idempotent).
DO $$
DECLARE
    v_schema text := pg_catalog.current_schema();
    f        record;
BEGIN
    IF v_schema IS NULL THEN
        RAISE EXCEPTION 'no schema to install into: search_path names no existing schema; set it (e.g. ?options=-c%%20search_path%%3Dpublic) and run lease-sweeper migrate again'
            USING ERRCODE = '3F000';
    END IF;
    IF v_schema = 'public' THEN
        RETURN;
    END IF;
    FOR f IN
        SELECT p.oid::pg_catalog.regprocedure AS fn
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = v_schema::pg_catalog.regnamespace
           AND 'search_path=pg_catalog, public, pg_temp' OPERATOR(pg_catalog.=) ANY (p.proconfig)
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f.fn, v_schema);
    END LOOP;
END
$$;
