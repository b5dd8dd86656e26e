-- The backlog walk goes on past pages that hold no row at all.
--
-- lock_reap_expired_walk visits the heap p_limit / 2 pages at a time and,
-- when a range came back with fewer than p_limit expired rows, gave the rest
-- of the sweep to the expiry index: fewer than two expired rows a page is
-- where the index is cheaper. A range with no row at all says nothing about
-- that, yet it ended the walk too. A table whose first half was released and
-- vacuumed (churn while the sweepers were down: the expired half sits behind
-- thousands of empty pages) met an empty first range and drained its whole
-- backlog through the index, at random heap pages: 4.2 s for 500,000 leases
-- where one DELETE of the same rows takes 1.0 s.
--
-- Now a short range is counted: when it holds no more than twice the expired
-- rows it gave (empty pages, or rows mostly expired and locked by another
-- replica), the walk goes on to the next range in the same call, up to
-- p_limit rows; only a range where the expired rows really are sparse among
-- live ones ends the walk as before. The count reads the pages the range
-- scan has just read, and a full batch (a compact backlog) never takes it.
--
-- The contract is otherwise that of 20261130000300 and 20261201000100: pages
-- in physical order, FOR UPDATE SKIP LOCKED, the held count's delta in the
-- deleting statement, next_page where the batch stopped (full), -1 at the
-- end of the table, or the first page after a sparse range.

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
    v_to bigint;
    v_doomed tid[] := '{}';
    v_found tid[];
    v_rows bigint;
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
    LOOP
        v_to := v_from + v_budget;
        -- Infinite deadlines are left to lock_reap_expired, whose oldest-first
        -- batch (the first of every sweep) reaps them: `late` stays finite here.
        SELECT pg_catalog.array_agg(d.ctid) INTO v_found
          FROM (SELECT ctid
                  FROM lock_entry
                 WHERE ctid >= pg_catalog.format('(%s,0)', v_from)::tid
                   AND ctid < pg_catalog.format('(%s,0)', v_to)::tid
                   AND expires_at <= pg_catalog.now()
                   AND pg_catalog.isfinite(expires_at)
                 LIMIT p_limit - pg_catalog.cardinality(v_doomed)
                   FOR UPDATE SKIP LOCKED) AS d;
        v_doomed := v_doomed || COALESCE(v_found, '{}');
        IF pg_catalog.cardinality(v_doomed) >= p_limit AND p_limit > 0 THEN
            -- Full: resume on the page where the limit was reached.
            -- The scan returns pages in order, so the last tuple id is on the
            -- furthest page; were it not, resuming earlier only revisits pages.
            v_next := (v_doomed[pg_catalog.cardinality(v_doomed)]::text::point)[0]::bigint;
            EXIT;
        ELSIF v_to >= v_pages THEN
            v_next := -1;
            EXIT;
        END IF;
        v_next := v_to;
        EXIT WHEN p_limit = 0;
        -- A short range: sparse expired rows among live ones end the walk,
        -- empty pages do not.
        SELECT pg_catalog.count(*) INTO v_rows
          FROM lock_entry
         WHERE ctid >= pg_catalog.format('(%s,0)', v_from)::tid
           AND ctid < pg_catalog.format('(%s,0)', v_to)::tid;
        EXIT WHEN v_rows > 2 * COALESCE(pg_catalog.cardinality(v_found), 0);
        v_from := v_to;
    END LOOP;
    IF pg_catalog.cardinality(v_doomed) = 0 THEN
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
