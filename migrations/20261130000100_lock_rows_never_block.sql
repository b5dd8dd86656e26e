-- Lock leases: no row can stop a sweep or hide an expiry (issue 11).
--
-- Before this migration a lease whose deadline was before 1970 or
-- -infinity was never reported (the resumable reap's lower bound,
-- `expires_at >= epoch + p_after_millis` with 0, hid it), and one outbox row
-- with an infinite deadline failed lock_drain_takeovers on every sweep
-- ("cannot convert infinity to bigint"), losing every later takeover.
--
-- Three layers:
--   1. Refused at the door: CHECK constraints whose names say the rule
--      (lock_entry_expires_at_finite, lock_expiry_outbox_*_finite). A
--      database that already holds such rows gets an error naming them and
--      the fix before any constraint is added.
--   2. Encoded, never failing: lease_epoch_millis / lease_overdue_millis are
--      total (defined for every timestamptz, infinities included).
--   3. Set aside, never blocking: if a row still fails inside a reaping
--      function (a trigger an operator added, a constraint dropped by hand,
--      anything not foreseen here), the set-based statement's subtransaction
--      is rolled back and the batch is redone row by row, each row in its own
--      subtransaction; a row that fails again is left in place and returned
--      with set_aside_error = its error, every other row is reaped and
--      returned as usual. The daemon writes one ERROR line per set-aside row.
--
-- ===================== CONTRACT OF lock_reap_expired =====================
-- Any later migration that rewrites lock_reap_expired (for speed, say) must
-- keep all of this; tests/it/bad_rows.rs holds it to it:
--   * Signature lock_reap_expired(p_limit integer, p_after_millis bigint
--     DEFAULT NULL), RETURNS TABLE (lock_key text, owner_id text, token
--     bigint, expired_at_millis bigint, overdue_millis bigint,
--     set_aside_error text). SECURITY DEFINER, EXECUTE revoked from PUBLIC,
--     granted to lease_sweeper, search_path pinned (pg_catalog first, the
--     installing schema, pg_temp last) and every call pg_catalog-qualified.
--   * p_limit NULL, < 1 or > 100000: SQLSTATE 22023 naming the limit (NULL
--     used to mean "unbounded", which held row locks on every expired key).
--   * p_after_millis NULL = no lower bound: from the oldest deadline,
--     pre-1970 and -infinity included. The first batch of every sweep passes
--     NULL. 0 is an ordinary bound (1970-01-01), never "from the oldest".
--     A value below the timestamptz range (e.g. i64::MIN, the encoding of
--     -infinity) is no lower bound either; one above it reaps nothing.
--     Non-NULL: resume at expires_at >= epoch + p_after_millis ms, the newest
--     expired_at_millis the previous full batch of the same sweep returned.
--   * Deletes only rows with expires_at <= now() (database clock, checked
--     again on the delete), oldest deadline first, FOR UPDATE SKIP LOCKED.
--     The set-based statement lives in lock_reap_expired_fast(p_limit,
--     p_from timestamptz) (EXPLAINed by tests/it/sweep.rs); a faster
--     rewrite may change it or fold it back in, but must keep running it
--     inside a subtransaction whose failure falls back to the per-row path.
--   * expired_at_millis = lease_epoch_millis(expires_at): floor of epoch ms,
--     NEGATIVE for a pre-1970 deadline, i64::MIN for -infinity.
--     overdue_millis = lease_overdue_millis(expires_at, now()): i64::MAX for
--     -infinity. Never an error for any timestamptz.
--   * A row whose delete fails is not deleted and comes back with
--     set_aside_error = '<message> (SQLSTATE xxxxx)' (millis may be NULL);
--     all other rows of the batch are reaped and returned. Rows returned with
--     set_aside_error NULL are exactly the rows deleted.
-- ==========================================================================

-- 1. At the door. Checked first so the error names the rows, not just the
--    constraint. The fix keeps the expiry signal: a deadline of now() is
--    reported at the next sweep as expired.
DO $$
DECLARE
    v_n    bigint;
    v_rows text;
BEGIN
    SELECT pg_catalog.count(*) INTO v_n FROM lock_entry AS e WHERE NOT pg_catalog.isfinite(e.expires_at);
    IF v_n > 0 THEN
        SELECT pg_catalog.string_agg(pg_catalog.format('%L (token %s, expires_at %s)', s.lock_key, s.token, s.expires_at), ', ')
          INTO v_rows
          FROM (SELECT e.lock_key, e.token, e.expires_at FROM lock_entry AS e
                 WHERE NOT pg_catalog.isfinite(e.expires_at) ORDER BY e.lock_key LIMIT 5) AS s;
        RAISE EXCEPTION 'lock_entry holds % lease(s) with an infinite expires_at, which a sweep cannot report (first 5 by key: %); fix: UPDATE lock_entry SET expires_at = now() WHERE NOT isfinite(expires_at); (the next sweep reports them as expired) or delete them, then run lease-sweeper migrate again', v_n, v_rows
            USING ERRCODE = '23514',
                  HINT = 'UPDATE lock_entry SET expires_at = now() WHERE NOT isfinite(expires_at);';
    END IF;
    SELECT pg_catalog.count(*) INTO v_n FROM lock_expiry_outbox AS o
     WHERE NOT pg_catalog.isfinite(o.expires_at) OR NOT pg_catalog.isfinite(o.taken_over_at);
    IF v_n > 0 THEN
        SELECT pg_catalog.string_agg(pg_catalog.format('outbox_id %s key %L (token %s, expires_at %s, taken_over_at %s)',
                                                       s.outbox_id, s.lock_key, s.token, s.expires_at, s.taken_over_at), ', ')
          INTO v_rows
          FROM (SELECT o.outbox_id, o.lock_key, o.token, o.expires_at, o.taken_over_at FROM lock_expiry_outbox AS o
                 WHERE NOT pg_catalog.isfinite(o.expires_at) OR NOT pg_catalog.isfinite(o.taken_over_at)
                 ORDER BY o.outbox_id LIMIT 5) AS s;
        RAISE EXCEPTION 'lock_expiry_outbox holds % takeover(s) with an infinite expires_at or taken_over_at (first 5: %); fix: UPDATE lock_expiry_outbox SET expires_at = least(greatest(expires_at, taken_over_at - interval ''1 year''), taken_over_at), taken_over_at = least(taken_over_at, now()) WHERE NOT isfinite(expires_at) OR NOT isfinite(taken_over_at); then run lease-sweeper migrate again', v_n, v_rows
            USING ERRCODE = '23514';
    END IF;
END
$$;

ALTER TABLE lock_entry ADD CONSTRAINT lock_entry_expires_at_finite
    CHECK (pg_catalog.isfinite(expires_at)) NOT VALID;
ALTER TABLE lock_entry VALIDATE CONSTRAINT lock_entry_expires_at_finite;
ALTER TABLE lock_expiry_outbox ADD CONSTRAINT lock_expiry_outbox_expires_at_finite
    CHECK (pg_catalog.isfinite(expires_at)) NOT VALID;
ALTER TABLE lock_expiry_outbox VALIDATE CONSTRAINT lock_expiry_outbox_expires_at_finite;
ALTER TABLE lock_expiry_outbox ADD CONSTRAINT lock_expiry_outbox_taken_over_at_finite
    CHECK (pg_catalog.isfinite(taken_over_at)) NOT VALID;
ALTER TABLE lock_expiry_outbox VALIDATE CONSTRAINT lock_expiry_outbox_taken_over_at_finite;

-- 2. Total encodings. Plain SQL, IMMUTABLE and without a SET clause so the
--    planner inlines them (no call cost); every call is qualified, and the
--    bodies use only immutable operations (a timestamptz literal or
--    EXTRACT from a timestamptz is only STABLE, which stops the inlining:
--    the 200,000-lease drain took 40 % longer with a call per row).
--
-- Milliseconds since the Unix epoch, floored: negative before 1970;
-- i64::MIN for -infinity, i64::MAX for infinity. (Epoch seconds of the
-- UTC wall time equal the timestamptz's epoch seconds.)
CREATE FUNCTION lease_epoch_millis(p_at timestamptz)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN pg_catalog.isfinite(p_at)
            THEN pg_catalog.floor(EXTRACT(epoch FROM p_at AT TIME ZONE 'UTC') * 1000::pg_catalog.numeric)::pg_catalog.int8
        WHEN EXTRACT(epoch FROM p_at AT TIME ZONE 'UTC') < 0::pg_catalog.numeric
            THEN '-9223372036854775808'::pg_catalog.int8
        ELSE '9223372036854775807'::pg_catalog.int8
    END
$$;

-- How long after p_deadline p_at is, in ms, floored (negative if before).
-- i64::MAX when the deadline is -infinity, i64::MIN when it is infinity.
CREATE FUNCTION lease_overdue_millis(p_deadline timestamptz, p_at timestamptz)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN pg_catalog.isfinite(p_deadline) AND pg_catalog.isfinite(p_at)
            THEN pg_catalog.floor(EXTRACT(epoch FROM p_at - p_deadline) * 1000::pg_catalog.numeric)::pg_catalog.int8
        WHEN p_deadline < p_at
            THEN '9223372036854775807'::pg_catalog.int8
        WHEN p_deadline > p_at
            THEN '-9223372036854775808'::pg_catalog.int8
        ELSE 0::pg_catalog.int8
    END
$$;

-- One reported row of lock_reap_expired / lock_drain_takeovers: collected in
-- an array inside the subtransaction, returned after it (rows already handed
-- to RETURN QUERY would survive a rollback of the statement that made them).
CREATE TYPE lock_reaped_lease AS (
    lock_key          text,
    owner_id          text,
    token             bigint,
    expired_at_millis bigint,
    overdue_millis    bigint,
    set_aside_error   text
);

-- 3. The reaping functions. The return type gains set_aside_error, which
--    CREATE OR REPLACE cannot do, so they are dropped and re-created and
--    their grants restored below.
-- The set-based delete of one batch (shape and reasons: 20261129000100):
-- rows chosen oldest deadline first with FOR UPDATE SKIP LOCKED, deleted by
-- tuple id, the deadline checked again on the delete. Called only by
-- lock_reap_expired (runs with its caller's rights; not executable by PUBLIC).
-- p_from is the resume bound, '-infinity' for "from the oldest".
CREATE FUNCTION lock_reap_expired_fast(p_limit integer, p_from timestamptz)
RETURNS SETOF lock_reaped_lease
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, public, pg_temp
AS $$
    WITH doomed AS (
        SELECT l.ctid
          FROM lock_entry AS l
         WHERE l.expires_at <= pg_catalog.now()
           AND l.expires_at >= p_from
         ORDER BY l.expires_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM lock_entry AS e
         WHERE e.ctid = ANY (ARRAY(SELECT d.ctid FROM doomed AS d))
           AND e.expires_at <= pg_catalog.now()
        RETURNING e.lock_key, e.owner_id, e.token, e.expires_at
    )
    SELECT g.lock_key, g.owner_id, g.token,
           lease_epoch_millis(g.expires_at),
           lease_overdue_millis(g.expires_at, pg_catalog.now()),
           NULL::pg_catalog.text
      FROM gone AS g
$$;
REVOKE ALL ON FUNCTION lock_reap_expired_fast(integer, timestamptz) FROM PUBLIC;

DROP FUNCTION lock_reap_expired(integer, bigint);
CREATE FUNCTION lock_reap_expired(p_limit integer, p_after_millis bigint DEFAULT NULL)
RETURNS TABLE (lock_key text, owner_id text, token bigint, expired_at_millis bigint,
               overdue_millis bigint, set_aside_error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_from   timestamptz;
    v_rows   lock_reaped_lease[];
    v_one    lock_reaped_lease;
    v_failed boolean := false;
    r        record;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        RAISE EXCEPTION 'lock_reap_expired: limit must be from 1 to 100000, got %', COALESCE(p_limit::pg_catalog.text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    -- One bound expression (not "IS NULL OR ..."), so the scan of
    -- lock_entry_expiry_idx starts at it; -infinity includes everything.
    v_from := CASE
        WHEN p_after_millis IS NULL OR p_after_millis < '-210000000000000'::pg_catalog.int8
            THEN '-infinity'::pg_catalog.timestamptz
        WHEN p_after_millis > '9000000000000000'::pg_catalog.int8
            THEN 'infinity'::pg_catalog.timestamptz
        ELSE '1970-01-01 00:00:00+00'::pg_catalog.timestamptz
             + p_after_millis::pg_catalog.float8 * '1 millisecond'::pg_catalog.interval
    END;

    -- Fast path: one set-based statement, in its own function so its plan
    -- can be EXPLAINed (tests/it/sweep.rs) and tuned on its own. A function
    -- in FROM is run to completion into a tuplestore before its first row
    -- is read, so a failure inside it reaches the handler before RETURN
    -- QUERY has taken any row: no row is returned that was not deleted.
    BEGIN
        RETURN QUERY SELECT f.lock_key, f.owner_id, f.token, f.expired_at_millis, f.overdue_millis, f.set_aside_error
                       FROM lock_reap_expired_fast(p_limit, v_from) AS f;
        RETURN;
    EXCEPTION WHEN OTHERS THEN
        v_failed := true;
    END;

    -- Slow path, only after a failure: the same rows one by one.
    IF v_failed THEN
        v_rows := '{}';
        FOR r IN
            SELECT l.lock_key, l.owner_id, l.token
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
                RETURNING e.lock_key, e.owner_id, e.token,
                          lease_epoch_millis(e.expires_at),
                          lease_overdue_millis(e.expires_at, pg_catalog.now()),
                          NULL::pg_catalog.text
                     INTO v_one;
                IF FOUND THEN
                    v_rows := pg_catalog.array_append(v_rows, v_one);
                END IF;
            EXCEPTION WHEN OTHERS THEN
                v_rows := pg_catalog.array_append(v_rows,
                    ROW(r.lock_key, r.owner_id, r.token, NULL, NULL,
                        pg_catalog.format('%s (SQLSTATE %s)', SQLERRM, SQLSTATE))::lock_reaped_lease);
            END;
        END LOOP;
    END IF;

    RETURN QUERY SELECT u.lock_key, u.owner_id, u.token, u.expired_at_millis, u.overdue_millis, u.set_aside_error
                   FROM pg_catalog.unnest(v_rows) AS u;
END
$$;

-- Drains recorded takeovers, oldest first; lateness is measured at the
-- moment of the steal. Same limits, encodings and set-aside rule as above.
DROP FUNCTION lock_drain_takeovers(integer);
CREATE FUNCTION lock_drain_takeovers(p_limit integer)
RETURNS TABLE (lock_key text, owner_id text, token bigint, expired_at_millis bigint,
               overdue_millis bigint, set_aside_error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_rows   lock_reaped_lease[];
    v_one    lock_reaped_lease;
    v_failed boolean := false;
    r        record;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        RAISE EXCEPTION 'lock_drain_takeovers: limit must be from 1 to 100000, got %', COALESCE(p_limit::pg_catalog.text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    BEGIN
        WITH gone AS (
            DELETE FROM lock_expiry_outbox AS o
             WHERE o.outbox_id = ANY (ARRAY(
                    SELECT b.outbox_id
                      FROM lock_expiry_outbox AS b
                     ORDER BY b.outbox_id
                     LIMIT p_limit
                       FOR UPDATE SKIP LOCKED))
            RETURNING o.lock_key, o.owner_id, o.token, o.expires_at, o.taken_over_at
        )
        SELECT pg_catalog.array_agg(ROW(g.lock_key, g.owner_id, g.token,
                                        lease_epoch_millis(g.expires_at),
                                        lease_overdue_millis(g.expires_at, g.taken_over_at),
                                        NULL)::lock_reaped_lease)
          INTO v_rows
          FROM gone AS g;
    EXCEPTION WHEN OTHERS THEN
        v_failed := true;
    END;

    IF v_failed THEN
        v_rows := '{}';
        FOR r IN
            SELECT b.outbox_id, b.lock_key, b.owner_id, b.token
              FROM lock_expiry_outbox AS b
             ORDER BY b.outbox_id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED
        LOOP
            BEGIN
                DELETE FROM lock_expiry_outbox AS o
                 WHERE o.outbox_id = r.outbox_id
                RETURNING o.lock_key, o.owner_id, o.token,
                          lease_epoch_millis(o.expires_at),
                          lease_overdue_millis(o.expires_at, o.taken_over_at),
                          NULL::pg_catalog.text
                     INTO v_one;
                IF FOUND THEN
                    v_rows := pg_catalog.array_append(v_rows, v_one);
                END IF;
            EXCEPTION WHEN OTHERS THEN
                v_rows := pg_catalog.array_append(v_rows,
                    ROW(r.lock_key, r.owner_id, r.token, NULL, NULL,
                        pg_catalog.format('%s (SQLSTATE %s)', SQLERRM, SQLSTATE))::lock_reaped_lease);
            END;
        END LOOP;
    END IF;

    RETURN QUERY SELECT u.lock_key, u.owner_id, u.token, u.expired_at_millis, u.overdue_millis, u.set_aside_error
                   FROM pg_catalog.unnest(v_rows) AS u;
END
$$;

REVOKE ALL ON FUNCTION lock_reap_expired(integer, bigint), lock_drain_takeovers(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_reap_expired(integer, bigint), lock_drain_takeovers(integer) TO lease_sweeper;
