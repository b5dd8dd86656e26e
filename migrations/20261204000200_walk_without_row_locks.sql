-- The backlog walk deletes without locking each row first, and hands its
-- batch off as the rows' own deadlines.
--
-- lock_reap_expired_walk_handed_off (20261202000300) cost the database
-- twice what one DELETE of the same rows costs. Measured at the SQL level
-- on 500,000 expired leases in 5,000-lease batches (backend CPU, schedstat,
-- best of three): one DELETE … RETURNING 0.59 s; the walk before the
-- hand-off 0.68 s; the walk with the hand-off 1.14 s, and 1.41 s once the
-- held count is fresh, as it is while a daemon runs. Where it went:
--   * FOR UPDATE SKIP LOCKED locks every row before the DELETE deletes it:
--     a second WAL record and a second write of each tuple (~0.25 s, 27 MB
--     of WAL);
--   * the batch was aggregated from the walk's result set and each deadline
--     turned into two millisecond fields per row in SQL (~0.3 s);
--   * the held count's check called age() four times per row (~0.3 s with a
--     fresh count).
--
-- Now, per batch:
--   * Replicas split the heap by fixed ranges of lock_walk_range_pages()
--     pages. A range is taken with pg_try_advisory_xact_lock once it is
--     seen to hold expired rows: a range another walker holds is skipped,
--     never waited on, and released at its holder's commit. The advisory
--     lock lives in the lock manager's memory: no WAL, no tuple write. At
--     most lock_walk_max_ranges() are taken per call.
--   * While no other session of the database is running a statement (no
--     lock server at work), the expired rows of the ranges taken are chosen
--     without a row lock and deleted by tuple id. Two walkers never meet
--     (the ranges); an index batch (lock_reap_expired: FOR UPDATE SKIP
--     LOCKED) skips what a walker deletes; a walker's DELETE that meets a
--     row someone else holds (an index batch, any session's FOR UPDATE)
--     waits at most lock_timeout (10 ms, set on the function) and then fails
--     whole (SQLSTATE 55P03), and the sweeper hands the rest of that sweep
--     to the index reap, which skips locked rows and sets failing ones
--     aside. A row a walker chose that changed before its DELETE is
--     re-checked by the DELETE (`expires_at <= now()` on the row as it is
--     then): an acquire that stole it made it live, so it is not deleted
--     and not reported here (the takeover is, from the outbox).
--   * Beside a busy workload (the caller says so, p_skip_locked: the
--     sweep's first question or an earlier batch saw others at work, see
--     lock_reap_busy) the rows are locked first, FOR UPDATE SKIP LOCKED, as
--     before: a lock server stealing the storm's keys must never wait for a
--     walker that waits on it.
--   * The DELETE's RETURNING feeds the hand-off row directly, as the rows'
--     deadlines (timestamptz[]) and the statement's clock (reaped_at); the
--     daemon derives expiredAtMillis and overdueMillis from them with
--     integer arithmetic, exactly as lease_epoch_millis and
--     lease_overdue_millis floor them.
--   * The held count's check is the rule of 20261201000100 with the
--     snapshot's ages read once per batch: one age() per row.
--
-- Measured the same way (best of three, one run): 0.91 s, and 0.95 s with a
-- fresh held count (1.07 and 1.23 s before), 52 MB of WAL (81 MB before).
-- The walk before the hand-off took 0.65 s in that run: what is left above
-- it is the hand-off's own write, the batch's arrays into TOAST (about
-- 0.2 s and 25 MB of WAL per 500,000 leases), the price of a lock server
-- that never waits on the lines.
--
-- The hand-off row now has two forms: the millisecond arrays (written by
-- lock_reap_expired_handed_off, and by daemons older than this migration)
-- or the deadlines and reaped_at (written by lock_reap_walk). Recovery
-- reads both. lock_reap_expired_walk_handed_off stays, unchanged, for
-- daemons that have not been upgraded yet.

ALTER TABLE lock_reap_handoff
    ADD COLUMN expires_at timestamptz[],
    ADD COLUMN reaped_at  timestamptz,
    ALTER COLUMN expired_at_millis DROP NOT NULL,
    ALTER COLUMN overdue_millis DROP NOT NULL,
    DROP CONSTRAINT lock_reap_handoff_one_length_each,
    ADD CONSTRAINT lock_reap_handoff_one_length_each CHECK (
        pg_catalog.cardinality(lock_keys) > 0
        AND pg_catalog.cardinality(owner_ids) = pg_catalog.cardinality(lock_keys)
        AND pg_catalog.cardinality(tokens) = pg_catalog.cardinality(lock_keys)
        AND ((expires_at IS NULL AND reaped_at IS NULL
              AND pg_catalog.cardinality(expired_at_millis) = pg_catalog.cardinality(lock_keys)
              AND pg_catalog.cardinality(overdue_millis) = pg_catalog.cardinality(lock_keys))
          OR (expired_at_millis IS NULL AND overdue_millis IS NULL AND reaped_at IS NOT NULL
              AND pg_catalog.cardinality(expires_at) = pg_catalog.cardinality(lock_keys))));

DO $$
BEGIN
    ALTER TABLE lock_reap_handoff ALTER COLUMN expires_at SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    ALTER TABLE lock_reap_handoff ALTER COLUMN expires_at SET STORAGE EXTERNAL;
END
$$;

-- How many heap pages one advisory lock of the walk covers: about 4,400
-- leases of 100 bytes, so a dense backlog's batch of 5,000 takes two.
-- Plain SQL and IMMUTABLE so it inlines.
CREATE FUNCTION lock_walk_range_pages() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 64::pg_catalog.int8 $$;
REVOKE ALL ON FUNCTION lock_walk_range_pages() FROM PUBLIC;

-- How many ranges one walk call may lock: well inside the lock table's
-- share per transaction (max_locks_per_transaction, 64 by default).
CREATE FUNCTION lock_walk_max_ranges() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 16 $$;
REVOKE ALL ON FUNCTION lock_walk_max_ranges() FROM PUBLIC;

-- The advisory lock class of the walk's ranges (the first key of the
-- two-key form; the second is the range's number). 0x6c777261, "lwra".
CREATE FUNCTION lock_walk_lock_class() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1819767393 $$;
REVOKE ALL ON FUNCTION lock_walk_lock_class() FROM PUBLIC;

-- How many other sessions of this database are at work right now: the
-- workload the sweeper shares the server with. A session holds a snapshot
-- (backend_xmin) while its statement runs, or through a REPEATABLE READ
-- transaction, and a transaction id (backend_xid) once it writes, until it
-- ends; every role sees both (the state column needs pg_read_all_stats).
-- Sessions with the caller's application_name (the sweepers, their other
-- services) are not counted, nor background workers (no user: autovacuum,
-- which a drain itself sets off).
--
-- One look is one instant: 1,500 lock-server calls a second over 8
-- connections leave no session at work about 40 % of the time. So the look
-- is taken up to p_looks times, 1 ms apart (the activity snapshot cleared
-- between, as PostgreSQL keeps one per transaction), and stops at the first
-- that sees someone: three looks miss such a workload about 6 % of the time.
-- A sweep's first question takes three; each walk batch takes one more.
CREATE FUNCTION lock_reap_busy(p_looks integer DEFAULT 1) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    v_busy integer := 0;
BEGIN
    FOR i IN 1 .. GREATEST(p_looks, 1) LOOP
        IF i > 1 THEN
            PERFORM pg_catalog.pg_stat_clear_snapshot();
            PERFORM pg_catalog.pg_sleep(0.001);
        END IF;
        SELECT pg_catalog.count(*)::pg_catalog.int4 INTO v_busy
          FROM pg_catalog.pg_stat_get_activity(NULL::pg_catalog.int4) AS a
         WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
           AND a.usesysid IS NOT NULL
           AND a.datid OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database AS d
                                                WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
           AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
           AND a.application_name IS DISTINCT FROM pg_catalog.current_setting('application_name');
        EXIT WHEN v_busy > 0;
    END LOOP;
    RETURN v_busy;
END
$$;
REVOKE ALL ON FUNCTION lock_reap_busy(integer) FROM PUBLIC;

-- One walk batch: up to p_limit expired leases (finite deadlines) in heap
-- order from page p_from_page, in ranges no other walker holds, locked
-- first and those others hold skipped when p_skip_locked (see above),
-- deleted,
-- recorded in one hand-off row, committed by the caller. Returns one row:
-- the hand-off's id (NULL when nothing was reaped), the page to go on from
-- (-1: the end of the table), the batch as arrays (element i is one lease),
-- the statement's clock, how many sessions wait on the batch's deleted rows
-- and how many others were at work as it started (lock_reap_busy). The walk
-- goes on past empty pages and ranges others hold; a range
-- with fewer than two expired rows a page and more live rows than expired
-- ones ends it, as in lock_reap_expired_walk (20261204000100): the batch
-- comes back short with the page after that range, and the sweep goes on
-- by the index.
CREATE FUNCTION lock_reap_walk(p_limit integer, p_from_page bigint, p_skip_locked boolean)
RETURNS TABLE (handoff_id bigint, next_page bigint, lock_keys text[], owner_ids text[],
               tokens bigint[], expires_at timestamptz[], reaped_at timestamptz, waiters integer,
               busy integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
-- A known 5,000-element tuple-id array makes the planner prefer a
-- sequential scan of the whole table to 5,000 tuple fetches.
SET enable_seqscan = off
-- A row someone else holds fails the batch after this long (see above).
SET lock_timeout = '10ms'
AS $$
#variable_conflict use_column
DECLARE
    v_pages bigint := pg_catalog.pg_relation_size('lock_entry'::regclass)
                      / pg_catalog.current_setting('block_size')::bigint;
    v_range bigint := GREATEST(p_from_page, 0) / lock_walk_range_pages();
    v_lo bigint := GREATEST(p_from_page, 0);
    v_hi bigint;
    v_locked integer := 0;
    v_doomed tid[] := '{}';
    v_found tid[];
    v_rows bigint;
    v_next bigint := GREATEST(p_from_page, 0);
    -- Others at work as the call starts, for the caller's next batches.
    v_busy integer := lock_reap_busy();
    v_skip_locked boolean;
    v_counted boolean;
    v_age_xmin integer;
    v_age_xmax integer;
    v_xip xid[];
BEGIN
    IF p_limit IS NULL OR p_limit < 0 THEN
        RAISE EXCEPTION 'lock_reap_walk: limit must be a non-negative number of leases, got %', p_limit
            USING ERRCODE = '22023';
    END IF;
    IF p_from_page IS NULL THEN
        RAISE EXCEPTION 'lock_reap_walk: the page to start at must not be NULL (0 starts at the first)'
            USING ERRCODE = '22023';
    END IF;
    IF p_skip_locked IS NULL THEN
        RAISE EXCEPTION 'lock_reap_walk: skip_locked must be true or false'
            USING ERRCODE = '22023';
    END IF;
    v_skip_locked := p_skip_locked;
    WHILE p_limit > 0 LOOP
        IF v_lo >= v_pages THEN
            v_next := -1;
            EXIT;
        END IF;
        v_hi := (v_range + 1) * lock_walk_range_pages();
        -- Infinite deadlines are left to lock_reap_expired, whose
        -- oldest-first batch (the first of every sweep) reaps them.
        IF v_skip_locked THEN
            SELECT pg_catalog.array_agg(d.ctid) INTO v_found
              FROM (SELECT ctid
                      FROM lock_entry
                     WHERE ctid >= pg_catalog.format('(%s,0)', v_lo)::tid
                       AND ctid < pg_catalog.format('(%s,0)', v_hi)::tid
                       AND expires_at <= pg_catalog.now()
                       AND pg_catalog.isfinite(expires_at)
                     LIMIT p_limit - pg_catalog.cardinality(v_doomed)
                       FOR UPDATE SKIP LOCKED) AS d;
        ELSE
            SELECT pg_catalog.array_agg(d.ctid) INTO v_found
              FROM (SELECT ctid
                      FROM lock_entry
                     WHERE ctid >= pg_catalog.format('(%s,0)', v_lo)::tid
                       AND ctid < pg_catalog.format('(%s,0)', v_hi)::tid
                       AND expires_at <= pg_catalog.now()
                       AND pg_catalog.isfinite(expires_at)
                     LIMIT p_limit - pg_catalog.cardinality(v_doomed)) AS d;
        END IF;
        IF v_found IS NOT NULL THEN
            -- Locked once it has rows, so empty stretches take no lock. Rows
            -- chosen before the lock are safe: whoever held the range has
            -- committed (or rolled back) by now, and the DELETE sees it.
            IF NOT pg_catalog.pg_try_advisory_xact_lock(lock_walk_lock_class(), v_range::integer) THEN
                -- Another walker's range: its rows are its to delete.
                v_range := v_range + 1;
                v_lo := v_hi;
                v_next := v_hi;
                CONTINUE;
            END IF;
            v_locked := v_locked + 1;
            v_doomed := v_doomed || v_found;
            IF pg_catalog.cardinality(v_doomed) >= p_limit THEN
                -- Full: resume on the page where the limit was reached (the
                -- range scan returns pages in order).
                v_next := (v_doomed[pg_catalog.cardinality(v_doomed)]::text::point)[0]::bigint;
                EXIT;
            END IF;
        END IF;
        v_next := v_hi;
        -- Fewer than two expired rows a page, most rows live: the index is
        -- cheaper from here (the batch comes back short, and the sweep goes
        -- on by the index). Empty pages do not end the walk.
        IF COALESCE(pg_catalog.cardinality(v_found), 0) < 2 * (v_hi - v_lo) THEN
            SELECT pg_catalog.count(*) INTO v_rows
              FROM lock_entry
             WHERE ctid >= pg_catalog.format('(%s,0)', v_lo)::tid
               AND ctid < pg_catalog.format('(%s,0)', v_hi)::tid;
            EXIT WHEN v_rows > 2 * COALESCE(pg_catalog.cardinality(v_found), 0);
        END IF;
        -- A bounded number of advisory locks per transaction (the lock
        -- table is shared): past it the batch comes back short too.
        EXIT WHEN v_locked >= lock_walk_max_ranges();
        v_range := v_range + 1;
        v_lo := v_hi;
    END LOOP;
    IF v_next >= v_pages THEN
        v_next := -1;
    END IF;
    IF pg_catalog.cardinality(v_doomed) = 0 THEN
        RETURN QUERY SELECT NULL::bigint, v_next, NULL::text[], NULL::text[], NULL::bigint[],
                            NULL::timestamptz[], pg_catalog.now(), 0, v_busy;
        RETURN;
    END IF;
    -- The held count's snapshot, once: a deleted lease is subtracted when
    -- the transaction that wrote it had committed when the count was taken
    -- (lock_held_counted's rule, 20261201000100).
    SELECT c.counted_at > pg_catalog.now() - '1 minute'::pg_catalog.interval,
           pg_catalog.age(c.counted_xmin), pg_catalog.age(c.counted_xmax), c.counted_xip
      INTO v_counted, v_age_xmin, v_age_xmax, v_xip
      FROM lock_held_count AS c
     WHERE c.singleton;
    RETURN QUERY
    WITH gone AS (
        DELETE FROM lock_entry AS e
         WHERE e.ctid = ANY (v_doomed)
           AND e.expires_at <= pg_catalog.now()
        RETURNING e.lock_key, e.owner_id, e.token, e.expires_at,
                  (v_counted
                   AND (pg_catalog.age(e.xmin) > v_age_xmin
                        OR (pg_catalog.age(e.xmin) > v_age_xmax AND e.xmin OPERATOR(pg_catalog.<>) ALL (v_xip))))
                  AS counted
    ), recorded AS (
        INSERT INTO lock_held_delta (n)
        SELECT pg_catalog.count(*)::pg_catalog.int4
          FROM gone AS g
         WHERE g.counted
        HAVING pg_catalog.count(*) > 0::pg_catalog.int8
    ), handed AS (
        INSERT INTO lock_reap_handoff AS h (lock_keys, owner_ids, tokens, expires_at, reaped_at)
        SELECT pg_catalog.array_agg(g.lock_key), pg_catalog.array_agg(g.owner_id),
               pg_catalog.array_agg(g.token), pg_catalog.array_agg(g.expires_at), pg_catalog.now()
          FROM gone AS g
        HAVING pg_catalog.count(*) > 0::pg_catalog.int8
        -- RETURNING the row as inserted is cheaper than keeping the arrays
        -- in a CTE of their own (measured: 0.89 against 1.03 s).
        RETURNING h.handoff_id, h.lock_keys, h.owner_ids, h.tokens, h.expires_at, h.reaped_at
    )
    -- The waiters are counted after the DELETE, on the one row.
    SELECT h.handoff_id, v_next, h.lock_keys, h.owner_ids, h.tokens, h.expires_at, h.reaped_at,
           lock_reap_waiters(), v_busy
      FROM handed AS h;
    IF NOT FOUND THEN
        -- Every chosen row changed before the DELETE: nothing to hand off.
        RETURN QUERY SELECT NULL::bigint, v_next, NULL::text[], NULL::text[], NULL::bigint[],
                            NULL::timestamptz[], pg_catalog.now(), lock_reap_waiters(), v_busy;
    END IF;
END
$$;

-- The probe a sweep starts with also says whether others are busy, when
-- something has expired (an idle probe asks nothing more): the sweep's
-- first batch is then already a careful one. As in 20261202000100
-- otherwise; a new column needs the function dropped and created again,
-- its grants with it.
DROP FUNCTION lock_sweep_probe(bigint);
CREATE FUNCTION lock_sweep_probe(p_max_age_millis bigint)
RETURNS TABLE (expired boolean, takeovers boolean, held bigint, busy integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_expired boolean := EXISTS (SELECT 1 FROM lock_entry AS e WHERE e.expires_at <= pg_catalog.now());
    v_takeovers boolean := EXISTS (SELECT 1 FROM lock_expiry_outbox)
                           OR EXISTS (SELECT 1 FROM lock_reap_handoff AS h
                                       WHERE h.written_at < pg_catalog.now() - signal_handoff_grace());
    v_held bigint;
BEGIN
    IF v_expired THEN
        RETURN QUERY SELECT true, v_takeovers, NULL::bigint, lock_reap_busy(3);
        RETURN;
    END IF;
    SELECT c.held - COALESCE((SELECT pg_catalog.sum(d.n) FROM lock_held_delta AS d), 0::pg_catalog.int8)
      INTO v_held
      FROM lock_held_count AS c
     WHERE c.singleton
       AND c.counted_at > pg_catalog.now() - p_max_age_millis * '1 millisecond'::interval;
    IF v_held IS NULL THEN
        SELECT c.held INTO v_held FROM lock_held_count_get(p_max_age_millis) AS c;
    END IF;
    RETURN QUERY SELECT false, v_takeovers, v_held, 0;
END
$$;
REVOKE ALL ON FUNCTION lock_sweep_probe(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_sweep_probe(bigint) TO lease_sweeper;

-- Recovery reads both forms of a hand-off (see above).
CREATE OR REPLACE FUNCTION lock_handoff_recover()
RETURNS TABLE (lock_key text, owner_id text, token bigint, expired_at_millis bigint,
               overdue_millis bigint)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM lock_reap_handoff AS h
         WHERE h.handoff_id = (SELECT o.handoff_id
                                 FROM lock_reap_handoff AS o
                                WHERE o.written_at < pg_catalog.now() - signal_handoff_grace()
                                ORDER BY o.handoff_id
                                LIMIT 1
                                  FOR UPDATE SKIP LOCKED)
        RETURNING h.lock_keys, h.owner_ids, h.tokens, h.expired_at_millis, h.overdue_millis,
                  h.expires_at, h.reaped_at
    )
    SELECT u.k, u.o, u.t,
           COALESCE(u.e, lease_epoch_millis(u.x)),
           COALESCE(u.d, lease_overdue_millis(u.x, g.reaped_at))
      FROM gone AS g,
           ROWS FROM (pg_catalog.unnest(g.lock_keys), pg_catalog.unnest(g.owner_ids),
                      pg_catalog.unnest(g.tokens), pg_catalog.unnest(g.expired_at_millis),
                      pg_catalog.unnest(g.overdue_millis), pg_catalog.unnest(g.expires_at))
               WITH ORDINALITY AS u (k, o, t, e, d, x, i)
     ORDER BY u.i
$$;

REVOKE ALL ON FUNCTION lock_reap_walk(integer, bigint, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_reap_walk(integer, bigint, boolean) TO lease_sweeper;

COMMENT ON FUNCTION lock_reap_walk(integer, bigint, boolean) IS
'Deletes up to p_limit expired leases walking the heap from page p_from_page in ranges no other walker holds (advisory locks, no row locks; a row someone holds fails the call after lock_timeout), records them in one lock_reap_handoff row in the same transaction, and returns its id, the page to go on from (-1: the end), the batch as arrays with the statement''s clock, how many sessions wait on its deleted rows and how many others are running a statement. The sweeper commits, then claims the hand-off with lock_handoff_claim and writes its lines. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

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
