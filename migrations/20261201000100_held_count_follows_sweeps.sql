-- The shared held count follows every sweep at once.
--
-- Before, lock_held_count was recounted (count(*) over lock_entry) only when
-- older than the daemons' max age: a sweep that deleted N leases left every
-- daemon reporting the count from before it until the next recount. Now:
--
-- 1. lock_held_delta, append-only: each reaping batch (lock_reap_expired_fast,
--    the per-row path of lock_reap_expired, lock_reap_expired_walk) inserts
--    one row, in its own transaction, with the number of leases it deleted
--    that the stored count included (3). A batch that rolls back (its lines
--    could not be written, say) takes its row with it: it subtracts nothing.
--    Inserts never wait on one another, so a daemon stuck with its batch
--    open (stdout blocked) holds up nobody. lock_drain_takeovers inserts
--    nothing: a takeover replaces a lease, the number held stays the same.
--
-- 2. Every reading (lock_sweep_probe, lock_held_count_get) returns
--    held - sum(lock_held_delta.n) in one statement, so one snapshot: a sweep
--    is in every daemon's next reading, the sweeping daemon's included (it
--    reads after its batches commit). The recount deletes the rows it folds
--    in the same statement as its count(*) (same snapshot): every batch
--    committed before that snapshot is in the count and its row is deleted,
--    every batch committing after it is not in the count and its row stays,
--    to be subtracted once.
--
-- 3. What a row subtracts. The stored count is the number of rows visible to
--    the recount's snapshot, which the recount now stores (counted_xmin,
--    counted_xmax, counted_xip). A batch counts a deleted lease only if the
--    row version it deleted was visible to that snapshot (its xmin had
--    committed). Subtracting every deleted lease would also subtract leases
--    acquired after the count, which it never included: 7 counted, 5 more
--    acquired and 3 more acquired and swept would read 4, a number of leases
--    there never were, and below zero when the count was 0. So a reading is
--    always the count the last recount took minus leases it included that
--    were swept since, never less than the leases of that count still held.
--    A lease renewed or taken over after the count (a new row version) and
--    swept before the next recount is not subtracted: the reading stays
--    higher by it until the next recount, as acquisitions and releases do.
--    One exception, from PostgreSQL's snapshot functions listing top-level
--    transactions only: a lease written inside a subtransaction (savepoint)
--    of a transaction still open at the instant of a count, and swept before
--    the next recount, is subtracted although the count did not include it;
--    the reading is then low by that lease until the next recount.
--    The ages compare 32-bit transaction ids (age(), modulo 2^32), so a batch
--    uses a stored snapshot only while it is at most a minute old (a running
--    fleet recounts every few seconds); past that it records nothing and the
--    next reading recounts anyway.
--
-- Signatures, return types and grants are unchanged; the functions are
-- restated whole. Hardening as before: SECURITY DEFINER with search_path
-- pinned (pg_temp last), pg_catalog-qualified calls, operands of the built-in
-- types, EXECUTE revoked from PUBLIC; the sweeper role gets no right on the
-- new table.

CREATE TABLE lock_held_delta (
    -- A key, so the recount's DELETE works in a database that publishes
    -- all tables for logical replication.
    delta_id bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Counted leases one committed batch deleted.
    n        integer NOT NULL CHECK (n > 0)
);
REVOKE ALL ON TABLE lock_held_delta FROM PUBLIC;

-- The snapshot the stored count was taken with (NULL until the first
-- recount after this migration: nothing is subtracted before it).
ALTER TABLE lock_held_count
    ADD COLUMN counted_xmin xid,
    ADD COLUMN counted_xmax xid,
    ADD COLUMN counted_xip  xid[];

-- Whether the row version written by transaction p_version is in the count
-- taken at p_counted_at with the snapshot (p_xmin, p_xmax, p_xip): that
-- transaction had committed when the snapshot was taken. age() is the
-- distance back from this transaction, so "older than" is "greater age". A
-- row written more than 2^31 transactions ago (xmin keeps its raw id when
-- frozen) may read as newer and not be subtracted: high until the next
-- recount, never low. A snapshot older than a minute is not used (see 3
-- above). Plain SQL, STABLE and without a SET clause so the planner inlines
-- it into the reaping statements (no call per row).
CREATE FUNCTION lock_held_counted(p_version xid, p_counted_at timestamptz,
                                  p_xmin xid, p_xmax xid, p_xip xid[])
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT p_counted_at > pg_catalog.now() - '1 minute'::pg_catalog.interval
       AND pg_catalog.age(p_version) > pg_catalog.age(p_xmax)
       AND (pg_catalog.age(p_version) > pg_catalog.age(p_xmin)
            OR p_version <> ALL (p_xip))
$$;
REVOKE ALL ON FUNCTION lock_held_counted(xid, timestamptz, xid, xid, xid[]) FROM PUBLIC;

-- The set-based delete of one batch, as in 20261130000100, and the batch's
-- row in lock_held_delta in the same statement (so in the same
-- subtransaction of lock_reap_expired: if anything here fails, neither the
-- deletions nor the row remain, and the per-row path takes over).
CREATE OR REPLACE FUNCTION lock_reap_expired_fast(p_limit integer, p_from timestamptz)
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
        RETURNING e.lock_key, e.owner_id, e.token, e.expires_at, e.xmin AS version
    ), recorded AS (
        INSERT INTO lock_held_delta (n)
        SELECT pg_catalog.count(*)::pg_catalog.int4
          FROM gone AS g, lock_held_count AS c
         WHERE c.singleton
           AND lock_held_counted(g.version, c.counted_at, c.counted_xmin, c.counted_xmax, c.counted_xip)
        HAVING pg_catalog.count(*) > 0::pg_catalog.int8
    )
    SELECT g.lock_key, g.owner_id, g.token,
           lease_epoch_millis(g.expires_at),
           lease_overdue_millis(g.expires_at, pg_catalog.now()),
           NULL::pg_catalog.text
      FROM gone AS g
$$;
REVOKE ALL ON FUNCTION lock_reap_expired_fast(integer, timestamptz) FROM PUBLIC;

-- As in 20261130000100 (its contract stands); the per-row path now also
-- records the counted leases it deleted, once, after its loop.
CREATE OR REPLACE FUNCTION lock_reap_expired(p_limit integer, p_after_millis bigint DEFAULT NULL)
RETURNS TABLE (lock_key text, owner_id text, token bigint, expired_at_millis bigint,
               overdue_millis bigint, set_aside_error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_from    timestamptz;
    v_rows    lock_reaped_lease[];
    v_one     lock_reaped_lease;
    v_failed  boolean := false;
    v_counted boolean;
    v_n       integer := 0;
    v_count   lock_held_count;
    r         record;
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
    -- It records its own row in lock_held_delta.
    BEGIN
        RETURN QUERY SELECT f.lock_key, f.owner_id, f.token, f.expired_at_millis, f.overdue_millis, f.set_aside_error
                       FROM lock_reap_expired_fast(p_limit, v_from) AS f;
        RETURN;
    EXCEPTION WHEN OTHERS THEN
        v_failed := true;
    END;

    -- Slow path, only after a failure: the same rows one by one.
    IF v_failed THEN
        SELECT * INTO v_count FROM lock_held_count AS c WHERE c.singleton;
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
                          NULL::pg_catalog.text,
                          lock_held_counted(e.xmin, v_count.counted_at, v_count.counted_xmin,
                                            v_count.counted_xmax, v_count.counted_xip)
                     INTO v_one.lock_key, v_one.owner_id, v_one.token, v_one.expired_at_millis,
                          v_one.overdue_millis, v_one.set_aside_error, v_counted;
                IF FOUND THEN
                    v_rows := pg_catalog.array_append(v_rows, v_one);
                    IF v_counted THEN
                        v_n := v_n + 1;
                    END IF;
                END IF;
            EXCEPTION WHEN OTHERS THEN
                v_rows := pg_catalog.array_append(v_rows,
                    ROW(r.lock_key, r.owner_id, r.token, NULL, NULL,
                        pg_catalog.format('%s (SQLSTATE %s)', SQLERRM, SQLSTATE))::lock_reaped_lease);
            END;
        END LOOP;
        IF v_n > 0 THEN
            INSERT INTO lock_held_delta (n) VALUES (v_n);
        END IF;
    END IF;

    RETURN QUERY SELECT u.lock_key, u.owner_id, u.token, u.expired_at_millis, u.overdue_millis, u.set_aside_error
                   FROM pg_catalog.unnest(v_rows) AS u;
END
$$;

-- As in 20261130000300; the delete and the batch's row in lock_held_delta
-- are one statement (no subtransaction here: a failure fails the batch, and
-- the daemon goes on through lock_reap_expired).
CREATE OR REPLACE FUNCTION lock_reap_expired_walk(p_limit integer, p_from_page bigint)
RETURNS TABLE (lock_key text, owner_id text, token bigint, late interval, now_micros bigint,
               next_page bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
-- With the batch's tuple ids as a known 5,000-element array the planner
-- prefers a sequential scan of the whole table to 5,000 tuple fetches
-- (measured: 300 ms instead of 5 ms per batch at 500,000 rows).
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now_us bigint := (EXTRACT(epoch FROM pg_catalog.now()) * 1000000::numeric)::bigint;
    -- Fewer than two expired rows per page: the index is cheaper.
    v_budget bigint := GREATEST(p_limit / 2, 1);
    v_pages bigint := pg_catalog.pg_relation_size('lock_entry'::regclass)
                      / pg_catalog.current_setting('block_size')::bigint;
    v_from bigint := GREATEST(p_from_page, 0);
    v_doomed tid[];
    v_next bigint;
BEGIN
    IF p_limit IS NULL OR p_limit < 0 THEN
        RAISE EXCEPTION 'lock_reap_expired_walk: limit must be a non-negative number of leases, got %', p_limit
            USING ERRCODE = '22023';
    END IF;
    IF p_from_page IS NULL THEN
        RAISE EXCEPTION 'lock_reap_expired_walk: the page to start at must not be NULL (0 starts at the first)'
            USING ERRCODE = '22023';
    END IF;
    -- Infinite deadlines are left to lock_reap_expired, whose oldest-first
    -- batch (the first of every sweep) reaps them: `late` stays finite here.
    SELECT pg_catalog.array_agg(d.ctid) INTO v_doomed
      FROM (SELECT ctid
              FROM lock_entry
             WHERE ctid >= pg_catalog.format('(%s,0)', v_from)::tid
               AND ctid < pg_catalog.format('(%s,0)', v_from + v_budget)::tid
               AND expires_at <= pg_catalog.now()
               AND pg_catalog.isfinite(expires_at)
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED) AS d;
    IF COALESCE(pg_catalog.cardinality(v_doomed), 0) >= p_limit AND p_limit > 0 THEN
        -- Full: resume on the page where the limit was reached.
        -- The scan returns pages in order, so the last tuple id is on the
        -- furthest page; were it not, resuming earlier only revisits pages.
        v_next := (v_doomed[pg_catalog.cardinality(v_doomed)]::text::point)[0]::bigint;
    ELSIF v_from + v_budget >= v_pages THEN
        v_next := -1;
    ELSE
        v_next := v_from + v_budget;
    END IF;
    IF v_doomed IS NULL THEN
        -- Nothing to delete; one row tells the caller where to go next.
        RETURN QUERY SELECT NULL::text, NULL::text, NULL::bigint, NULL::interval, v_now_us, v_next;
        RETURN;
    END IF;
    -- Lateness as an interval and the clock once as integer microseconds: the
    -- caller derives both millisecond fields with integer arithmetic, so no
    -- row pays for numeric (or float) conversions.
    RETURN QUERY
    WITH gone AS (
        DELETE FROM lock_entry AS e
         WHERE e.ctid = ANY (v_doomed)
           AND e.expires_at <= pg_catalog.now()
        RETURNING e.lock_key, e.owner_id, e.token, e.expires_at, e.xmin AS version
    ), recorded AS (
        INSERT INTO lock_held_delta (n)
        SELECT pg_catalog.count(*)::pg_catalog.int4
          FROM gone AS g, lock_held_count AS c
         WHERE c.singleton
           AND lock_held_counted(g.version, c.counted_at, c.counted_xmin, c.counted_xmax, c.counted_xip)
        HAVING pg_catalog.count(*) > 0::pg_catalog.int8
    )
    SELECT g.lock_key, g.owner_id, g.token, pg_catalog.now() - g.expires_at, v_now_us, v_next
      FROM gone AS g;
END
$$;

-- As in 20261130000300, with the batches since the count subtracted in the
-- same statement as each read of it, and the recount folding them in the
-- same statement as its count(*) and storing its snapshot.
CREATE OR REPLACE FUNCTION lock_held_count_get(p_max_age_millis bigint)
RETURNS TABLE (held bigint, counted_at_millis bigint, recounted boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
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
        RETURN QUERY SELECT v_held, lock_held_count_millis(v_at), false;
        RETURN;
    END IF;
    PERFORM 1 FROM lock_held_count AS c
     WHERE c.singleton AND c.counted_at <= v_fresh_after
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- Another daemon is recounting (or just did): its count, or the
        -- previous one, without waiting; sweeps since subtracted either way.
        SELECT c.held - COALESCE((SELECT pg_catalog.sum(d.n) FROM lock_held_delta AS d), 0::pg_catalog.int8),
               c.counted_at
          INTO v_held, v_at
          FROM lock_held_count AS c WHERE c.singleton;
        RETURN QUERY SELECT v_held, lock_held_count_millis(v_at), false;
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
    RETURNING c.held, c.counted_at INTO v_held, v_at;
    RETURN QUERY SELECT v_held, lock_held_count_millis(v_at), true;
END
$$;

-- As in 20261130000300; the fresh count read inline subtracts the batches
-- since it in the same statement.
CREATE OR REPLACE FUNCTION lock_sweep_probe(p_max_age_millis bigint)
RETURNS TABLE (expired boolean, takeovers boolean, held bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_expired boolean := EXISTS (SELECT 1 FROM lock_entry AS e WHERE e.expires_at <= pg_catalog.now());
    v_takeovers boolean := EXISTS (SELECT 1 FROM lock_expiry_outbox);
    v_held bigint;
BEGIN
    IF v_expired THEN
        -- The sweep is about to delete: its count is read (and, if stale,
        -- recounted) after the deletions, not before them.
        RETURN QUERY SELECT true, v_takeovers, NULL::bigint;
        RETURN;
    END IF;
    -- The fresh case inline (one probe, no second definer call, whose
    -- search_path switch costs as much as the probe itself).
    SELECT c.held - COALESCE((SELECT pg_catalog.sum(d.n) FROM lock_held_delta AS d), 0::pg_catalog.int8)
      INTO v_held
      FROM lock_held_count AS c
     WHERE c.singleton
       AND c.counted_at > pg_catalog.now() - p_max_age_millis * '1 millisecond'::interval;
    IF v_held IS NULL THEN
        SELECT c.held INTO v_held FROM lock_held_count_get(p_max_age_millis) AS c;
    END IF;
    RETURN QUERY SELECT false, v_takeovers, v_held;
END
$$;

REVOKE ALL ON FUNCTION lock_reap_expired(integer, bigint), lock_reap_expired_walk(integer, bigint),
                       lock_held_count_get(bigint), lock_sweep_probe(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_reap_expired(integer, bigint), lock_reap_expired_walk(integer, bigint),
                          lock_held_count_get(bigint), lock_sweep_probe(bigint) TO lease_sweeper;

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
