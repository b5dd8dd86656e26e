-- Faster reaping and one held-lease count for a whole fleet (issue 12).
--
-- 1. lock_reap_expired is not touched here: its semantics (lower bound,
--    limits, rows set aside) belong to migration 20261130000100 (issue 11,
--    branch `rows`), and the first batch of every sweep still goes through
--    it. Only the backlog after a full first batch takes the walk below.
--
-- 2. lock_reap_expired_walk(integer, bigint): the reap for a backlog,
--    walking the heap in physical order (a TID range scan) instead of the
--    expiry index in deadline order. When most of the table has expired the
--    index order visits heap pages at random and the drain paid for it; the
--    walk reads each page once. Each row comes back with its lateness as an
--    interval and the statement's clock in integer microseconds; the caller
--    derives expiredAtMillis and overdueMillis from them with integer
--    arithmetic (exact). The caller passes the page to start at (0 the
--    first time) and gets back, on every row, the page to pass next:
--    - the page where this batch stopped, when it came back full (rows left
--      on that page are still to be visited);
--    - -1 when the walk reached the end of the table;
--    - the first page after the walk's budget (p_limit / 2 pages) when the
--      budget ran out before p_limit rows were found: fewer than two expired
--      rows per page, where the index is the cheaper way (the caller goes
--      back to lock_reap_expired).
--    A batch that deletes nothing still returns one row, all NULL but
--    next_page, so the caller always knows where it is.
--    A batch that fails (a row that cannot be deleted: a trigger, a
--    constraint) rolls back whole; the daemon then reaps the rest of the
--    sweep through lock_reap_expired, whose per-row path sets the bad row
--    aside, so the walk never stops a sweep.
--    A row passed over (locked by another replica or an acquire, or expiring
--    after the walk passed its page) is reaped by a later batch or sweep,
--    which starts from the oldest deadline: never lost, at most one sweep late.
--
-- 3. lock_held_count: one shared, timestamped count of held leases for the
--    lock.held.current gauge. Before, every daemon ran count(*) over the
--    whole table every 10 s (12 ms of database CPU at 100,000 leases, times
--    the number of daemons). lock_held_count_get(max_age) returns the stored
--    count with one primary-key probe; only when it is older than max_age does
--    the caller try to take the row (FOR UPDATE SKIP LOCKED) and recount. So
--    a fleet recounts once per interval whatever its size, nobody waits on the
--    recounting daemon, and the others get the previous count meanwhile.
--
-- Hardening as in the lock migration: SECURITY DEFINER with search_path
-- pinned (pg_temp last), pg_catalog-qualified calls, operands of the built-in
-- types, EXECUTE revoked from PUBLIC and granted to lease_sweeper only.

CREATE FUNCTION lock_reap_expired_walk(p_limit integer, p_from_page bigint)
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
    -- Fewer than two expired rows per page: the index is cheaper (see above).
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
    -- row pays for numeric (or float) conversions. No subtransaction here
    -- (collecting the rows inside one cost ~25 % of a drain's CPU): a batch
    -- whose delete fails fails whole, rolls back, and the caller reaps the
    -- rest of the sweep through lock_reap_expired, which sets a bad row aside.
    RETURN QUERY
    DELETE FROM lock_entry AS e
     WHERE e.ctid = ANY (v_doomed)
       AND e.expires_at <= pg_catalog.now()
    RETURNING e.lock_key, e.owner_id, e.token, pg_catalog.now() - e.expires_at, v_now_us, v_next;
END
$$;

-- The shared held-lease count: one row, refreshed by whichever daemon finds
-- it stale first. `recounts` counts refreshes (operators and tests can see
-- that a fleet recounts once per interval, not once per daemon).
CREATE TABLE lock_held_count (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    held       bigint      NOT NULL,
    counted_at timestamptz NOT NULL,
    recounts   bigint      NOT NULL DEFAULT 0
);
INSERT INTO lock_held_count (held, counted_at) VALUES (0, '-infinity');

-- The held-lease count, at most p_max_age_millis old (plus the duration of
-- one count), and whether this call recounted. Every call is one primary-key
-- probe; a call that finds the count stale tries to take the row with
-- FOR UPDATE SKIP LOCKED: the one that gets it recounts (count(*) over
-- lock_entry) and stores the count, the others return the previous count
-- without waiting. counted_at_millis is when the returned count was taken
-- (database clock, ms since the epoch).
CREATE FUNCTION lock_held_count_get(p_max_age_millis bigint)
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
    SELECT c.held, c.counted_at INTO v_held, v_at FROM lock_held_count AS c WHERE c.singleton;
    IF v_at IS NOT NULL AND v_at > v_fresh_after THEN
        RETURN QUERY SELECT v_held, lock_held_count_millis(v_at), false;
        RETURN;
    END IF;
    PERFORM 1 FROM lock_held_count AS c
     WHERE c.singleton AND c.counted_at <= v_fresh_after
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- Another daemon is recounting (or just did): its count, or the
        -- previous one, without waiting.
        SELECT c.held, c.counted_at INTO v_held, v_at FROM lock_held_count AS c WHERE c.singleton;
        RETURN QUERY SELECT v_held, lock_held_count_millis(v_at), false;
        RETURN;
    END IF;
    UPDATE lock_held_count AS c
       SET held = (SELECT pg_catalog.count(*) FROM lock_entry),
           counted_at = pg_catalog.now(),
           recounts = c.recounts + 1
     WHERE c.singleton
    RETURNING c.held, c.counted_at INTO v_held, v_at;
    RETURN QUERY SELECT v_held, lock_held_count_millis(v_at), true;
END
$$;

-- counted_at in ms since the epoch (-infinity before the first count: 0).
CREATE FUNCTION lock_held_count_millis(p_at timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN pg_catalog.isfinite(p_at)
                THEN pg_catalog.floor(EXTRACT(epoch FROM p_at) * 1000::numeric)::bigint
                ELSE 0 END
$$;

REVOKE ALL ON FUNCTION lock_reap_expired_walk(integer, bigint), lock_held_count_get(bigint) FROM PUBLIC;
REVOKE ALL ON TABLE lock_held_count FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_reap_expired_walk(integer, bigint), lock_held_count_get(bigint) TO lease_sweeper;

-- One statement for an idle sweep: is anything expired, is any takeover
-- recorded, and, when nothing is expired, the shared held count (as
-- lock_held_count_get; NULL when the sweep is about to delete, so the count
-- it reports is read after its deletions). An idle
-- sweep used to run two transactions (reap, takeovers) and a count; with
-- this probe it runs one statement, and the reaping statements only when
-- there is something to reap. Something that expires or is taken over just
-- after the probe is reaped by the next sweep, as it would have been had it
-- happened just after the reap.
CREATE FUNCTION lock_sweep_probe(p_max_age_millis bigint)
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
    SELECT c.held INTO v_held FROM lock_held_count AS c
     WHERE c.singleton
       AND c.counted_at > pg_catalog.now() - p_max_age_millis * '1 millisecond'::interval;
    IF v_held IS NULL THEN
        SELECT c.held INTO v_held FROM lock_held_count_get(p_max_age_millis) AS c;
    END IF;
    RETURN QUERY SELECT false, v_takeovers, v_held;
END
$$;

REVOKE ALL ON FUNCTION lock_sweep_probe(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_sweep_probe(bigint) TO lease_sweeper;

-- The held count now comes from lock_held_count_get and lock_sweep_probe
-- (definers): the sweeper role no longer reads lock_entry itself, so it loses
-- the SELECT that 20261129000300 granted for its count(*).
REVOKE SELECT ON lock_entry FROM lease_sweeper;

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
