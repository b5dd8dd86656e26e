-- Two walkers of one sweeper drain a backlog side by side, each in its own
-- ranges: lock_reap_walk takes a stride and a phase, and looks only at the
-- ranges whose number is the phase modulo the stride.
--
-- One walker's statements are the drain's floor: in one drain's statement
-- log the walk was busy 0.92-0.94 s of 1.15-1.19 s for 500,000 leases, the
-- rest round trips. Two walkers that started at the same page, each taking
-- whatever range was free, were faster but read again, as they leapfrogged,
-- the ranges the other had just emptied: at the SQL level two sessions from
-- page 0 cost 1.08-1.11 s of backend CPU where one took 0.78-0.84 s, while
-- two on disjoint halves of the table took 0.85 s in 0.52 s of wall time.
-- Alternate ranges are disjoint on any layout, a heap whose first half is
-- empty included, and each walker passes over the other's ranges without
-- reading a page of them.
--
-- So the fast walk no longer deletes one span from its first range to its
-- last row less the ranges held by others in between (whose pages the TID
-- range scan still read): it deletes each run of ranges it locked one after
-- another as one span, one DELETE per span. With a stride of 1 and no range
-- held by another walker, that is one DELETE, as before.
--
-- The function is dropped and created again because its arguments change;
-- the two new ones default to one walker (stride 1, phase 0), so a call with
-- the three arguments of 20261204000300 runs as it did.

DROP FUNCTION lock_reap_walk(integer, bigint, boolean);

CREATE FUNCTION lock_reap_walk(p_limit integer, p_from_page bigint, p_skip_locked boolean,
                               p_stride integer DEFAULT 1, p_phase integer DEFAULT 0)
RETURNS TABLE (handoff_id bigint, next_page bigint, lock_keys text[], owner_ids text[],
               tokens bigint[], expires_at timestamptz[], reaped_at timestamptz, waiters integer,
               busy integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
-- A known 5,000-element tuple-id array makes the planner prefer a
-- sequential scan of the whole table to 5,000 tuple fetches (the careful
-- walk's DELETE), and a narrow tuple-id range is cheaper still by a TID
-- range scan.
SET enable_seqscan = off
-- A row someone else holds fails the batch after this long (see
-- 20261204000200).
SET lock_timeout = '10ms'
AS $$
#variable_conflict use_column
DECLARE
    v_pages bigint := pg_catalog.pg_relation_size('lock_entry'::regclass)
                      / pg_catalog.current_setting('block_size')::bigint;
    -- The first range to look at, and its first page: p_from_page's range,
    -- or the next one of this walker's (set once the arguments are checked).
    v_range bigint := GREATEST(p_from_page, 0) / lock_walk_range_pages();
    v_lo bigint := GREATEST(p_from_page, 0);
    v_hi bigint;
    v_from tid;
    v_to tid;
    v_next bigint := GREATEST(p_from_page, 0);
    v_locked integer := 0;
    -- Others at work as the call starts, for the caller's next batches.
    v_busy integer := lock_reap_busy();
    -- Rows the batch takes so far, and in this range.
    v_taken bigint := 0;
    v_found bigint;
    -- Careful walk: the rows chosen and locked, by tuple id.
    v_doomed tid[] := '{}';
    v_locked_rows tid[];
    -- Fast walk: the spans to delete, from a locked range's first page to
    -- the last row counted in it, a run of ranges locked one after another
    -- making one span; the last range locked, to tell a run.
    v_span_lo tid[] := '{}';
    v_span_hi tid[] := '{}';
    v_last_range bigint;
    v_row tid;
    v_rows bigint;
    -- The held count's snapshot (lock_held_counted's rule, 20261201000100).
    v_counted boolean;
    v_age_xmin integer;
    v_age_xmax integer;
    v_xip xid[];
    -- The batch.
    v_keys text[];
    v_owners text[];
    v_tokens bigint[];
    v_expires timestamptz[];
    v_subtract bigint := 0;
    -- One span's share of the batch.
    s_keys text[];
    s_owners text[];
    s_tokens bigint[];
    s_expires timestamptz[];
    s_subtract bigint;
    v_id bigint;
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
    IF p_stride IS NULL OR p_stride < 1 THEN
        RAISE EXCEPTION 'lock_reap_walk: stride must be 1 or more (1: every range), got %', p_stride
            USING ERRCODE = '22023';
    END IF;
    IF p_phase IS NULL OR p_phase < 0 OR p_phase >= p_stride THEN
        RAISE EXCEPTION 'lock_reap_walk: phase must be from 0 to stride - 1 (%), got %', p_stride - 1, p_phase
            USING ERRCODE = '22023';
    END IF;
    IF v_range % p_stride <> p_phase THEN
        v_range := v_range + (p_phase - v_range % p_stride + p_stride) % p_stride;
        v_lo := v_range * lock_walk_range_pages();
    END IF;
    WHILE v_taken < p_limit LOOP
        IF v_lo >= v_pages THEN
            v_next := -1;
            EXIT;
        END IF;
        v_hi := (v_range + 1) * lock_walk_range_pages();
        -- The range as tuple ids: its first page's first, the next range's.
        v_from := pg_catalog.format('(%s,0)', v_lo)::tid;
        v_to := pg_catalog.format('(%s,0)', v_hi)::tid;
        -- Infinite deadlines are left to lock_reap_expired, whose
        -- oldest-first batch (the first of every sweep) reaps them.
        -- Seen first, no row locked: alone, how many expired rows the range
        -- holds, up to what the batch has room for, and the last of them;
        -- carefully, whether it holds any.
        IF p_skip_locked THEN
            SELECT pg_catalog.count(*) INTO v_found
              FROM (SELECT 1
                      FROM lock_entry
                     WHERE ctid >= v_from
                       AND ctid < v_to
                       AND expires_at <= pg_catalog.now()
                       AND pg_catalog.isfinite(expires_at)
                     LIMIT 1) AS d;
        ELSE
            SELECT pg_catalog.count(*), pg_catalog.max(d.ctid) INTO v_found, v_row
              FROM (SELECT ctid
                      FROM lock_entry
                     WHERE ctid >= v_from
                       AND ctid < v_to
                       AND expires_at <= pg_catalog.now()
                       AND pg_catalog.isfinite(expires_at)
                     LIMIT p_limit - v_taken) AS d;
        END IF;
        IF v_found > 0 THEN
            -- Taken once it has rows, so empty stretches take no lock, and
            -- before any of its rows is locked: a row locked in a range
            -- another walker holds would be held for nothing until commit,
            -- and a caller of its key would wait as long. Rows counted
            -- before the lock are safe: whoever held the range has committed
            -- (or rolled back) by now, and the DELETE sees it.
            IF NOT pg_catalog.pg_try_advisory_xact_lock(lock_walk_lock_class(), v_range::integer) THEN
                -- Another walker's range: its rows are its to delete, and
                -- no span of this batch covers it.
                v_range := v_range + p_stride;
                v_lo := v_range * lock_walk_range_pages();
                v_next := v_lo;
                CONTINUE;
            END IF;
            v_locked := v_locked + 1;
            IF p_skip_locked THEN
                -- Beside a workload: the rows still free, locked now; those
                -- others hold are skipped, never waited on.
                SELECT pg_catalog.count(*), pg_catalog.array_agg(d.ctid) INTO v_found, v_locked_rows
                  FROM (SELECT ctid
                          FROM lock_entry
                         WHERE ctid >= v_from
                           AND ctid < v_to
                           AND expires_at <= pg_catalog.now()
                           AND pg_catalog.isfinite(expires_at)
                         LIMIT p_limit - v_taken
                           FOR UPDATE SKIP LOCKED) AS d;
                v_doomed := v_doomed || v_locked_rows;
                v_row := v_locked_rows[pg_catalog.cardinality(v_locked_rows)];
            ELSIF v_last_range = v_range - 1 THEN
                -- Right after the range locked last: the same span, longer.
                v_span_hi[pg_catalog.cardinality(v_span_hi)] := v_row;
            ELSE
                v_span_lo := v_span_lo || v_from;
                v_span_hi := v_span_hi || v_row;
            END IF;
            v_last_range := v_range;
            v_taken := v_taken + v_found;
            IF v_taken >= p_limit THEN
                -- Full: resume on the page where the limit was reached (the
                -- range scan returns pages in order).
                v_next := (v_row::text::point)[0]::bigint;
                EXIT;
            END IF;
        END IF;
        v_next := v_hi;
        -- Fewer than two expired rows a page, most rows live: the index is
        -- cheaper from here (the batch comes back short, and the sweep goes
        -- on by the index). Empty pages do not end the walk.
        IF v_found < 2 * (v_hi - v_lo) THEN
            SELECT pg_catalog.count(*) INTO v_rows
              FROM lock_entry
             WHERE ctid >= v_from
               AND ctid < v_to;
            EXIT WHEN v_rows > 2 * v_found;
        END IF;
        -- A bounded number of advisory locks per transaction (the lock
        -- table is shared): past it the batch comes back short too.
        EXIT WHEN v_locked >= lock_walk_max_ranges();
        v_range := v_range + p_stride;
        v_lo := v_range * lock_walk_range_pages();
    END LOOP;
    IF v_next >= v_pages THEN
        v_next := -1;
    END IF;
    IF v_taken = 0 THEN
        RETURN QUERY SELECT NULL::bigint, v_next, NULL::text[], NULL::text[], NULL::bigint[],
                            NULL::timestamptz[], pg_catalog.now(), 0, v_busy;
        RETURN;
    END IF;
    SELECT c.counted_at > pg_catalog.now() - '1 minute'::pg_catalog.interval,
           pg_catalog.age(c.counted_xmin), pg_catalog.age(c.counted_xmax), c.counted_xip
      INTO v_counted, v_age_xmin, v_age_xmax, v_xip
      FROM lock_held_count AS c
     WHERE c.singleton;
    IF p_skip_locked THEN
        WITH gone AS (
            DELETE FROM lock_entry AS e
             WHERE e.ctid = ANY (v_doomed)
               AND e.expires_at <= pg_catalog.now()
            RETURNING e.lock_key, e.owner_id, e.token, e.expires_at, e.xmin
        )
        SELECT pg_catalog.array_agg(g.lock_key), pg_catalog.array_agg(g.owner_id),
               pg_catalog.array_agg(g.token), pg_catalog.array_agg(g.expires_at),
               pg_catalog.count(*) FILTER (
                   WHERE v_counted
                     AND (pg_catalog.age(g.xmin) > v_age_xmin
                          OR (pg_catalog.age(g.xmin) > v_age_xmax
                              AND g.xmin OPERATOR(pg_catalog.<>) ALL (v_xip))))
          INTO v_keys, v_owners, v_tokens, v_expires, v_subtract
          FROM gone AS g;
    ELSE
        -- One DELETE per span, page by page (a TID range scan); the pages
        -- between two spans (another walker's ranges) are not read.
        FOR i IN 1 .. pg_catalog.cardinality(v_span_lo) LOOP
            v_from := v_span_lo[i];
            v_row := v_span_hi[i];
            WITH gone AS (
                DELETE FROM lock_entry AS e
                 WHERE e.ctid >= v_from
                   AND e.ctid <= v_row
                   AND e.expires_at <= pg_catalog.now()
                   AND pg_catalog.isfinite(e.expires_at)
                RETURNING e.lock_key, e.owner_id, e.token, e.expires_at, e.xmin
            )
            SELECT pg_catalog.array_agg(g.lock_key), pg_catalog.array_agg(g.owner_id),
                   pg_catalog.array_agg(g.token), pg_catalog.array_agg(g.expires_at),
                   pg_catalog.count(*) FILTER (
                       WHERE v_counted
                         AND (pg_catalog.age(g.xmin) > v_age_xmin
                              OR (pg_catalog.age(g.xmin) > v_age_xmax
                                  AND g.xmin OPERATOR(pg_catalog.<>) ALL (v_xip))))
              INTO s_keys, s_owners, s_tokens, s_expires, s_subtract
              FROM gone AS g;
            -- Concatenating with NULL (nothing yet, or a span emptied since
            -- it was counted) gives the other array back.
            v_keys := v_keys || s_keys;
            v_owners := v_owners || s_owners;
            v_tokens := v_tokens || s_tokens;
            v_expires := v_expires || s_expires;
            v_subtract := v_subtract + s_subtract;
        END LOOP;
    END IF;
    IF v_keys IS NULL THEN
        -- Every chosen row changed before the DELETE: nothing to hand off.
        RETURN QUERY SELECT NULL::bigint, v_next, NULL::text[], NULL::text[], NULL::bigint[],
                            NULL::timestamptz[], pg_catalog.now(), lock_reap_waiters(), v_busy;
        RETURN;
    END IF;
    IF v_subtract > 0 THEN
        INSERT INTO lock_held_delta (n) VALUES (v_subtract::pg_catalog.int4);
    END IF;
    INSERT INTO lock_reap_handoff (lock_keys, owner_ids, tokens, expires_at, reaped_at)
    VALUES (v_keys, v_owners, v_tokens, v_expires, pg_catalog.now())
    RETURNING lock_reap_handoff.handoff_id INTO v_id;
    -- The waiters are counted after the DELETE.
    RETURN QUERY SELECT v_id, v_next, v_keys, v_owners, v_tokens, v_expires, pg_catalog.now(),
                        lock_reap_waiters(), v_busy;
END
$$;

REVOKE ALL ON FUNCTION lock_reap_walk(integer, bigint, boolean, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_reap_walk(integer, bigint, boolean, integer, integer) TO lease_sweeper;

COMMENT ON FUNCTION lock_reap_walk(integer, bigint, boolean, integer, integer) IS
'Deletes p_limit expired leases (a few more if rows expire into the batch while it is taken) walking the heap from page p_from_page in ranges no other walker holds (advisory locks), only those whose number is p_phase modulo p_stride (1 and 0: every range; two walkers of one sweeper take 2 and 0, 2 and 1); alone, one DELETE per run of ranges by page range, a row someone holds failing the call after lock_timeout; with p_skip_locked, rows locked first and those others hold skipped. Records them in one lock_reap_handoff row in the same transaction, and returns its id, the page to go on from (-1: the end), the batch as arrays with the statement''s clock, how many sessions wait on its deleted rows and how many others are running a statement. The sweeper commits, then claims the hand-off with lock_handoff_claim and writes its lines. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

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
