-- The job reaper's idle question in PL/pgSQL (issue 12).
--
-- A gated job reaper asks every second why apply is refused and how many
-- stale leases there are. Profiled (docs/performance.md, section 9), that
-- statement was two thirds of an idle daemon's database CPU: the gate rule
-- was a LANGUAGE sql function with a SET clause, which PostgreSQL never
-- inlines and parses and plans again on every call, and the stale count came
-- from the dry run, which builds its JSON report and opens a subtransaction
-- to give one number. Measured with pgbench, 80 connections asking once a
-- second: 0.82 ms/s of backend CPU per connection before, 0.42 after, the
-- same as the lock sweep's probe.
--
-- 1. fn_job_reaper_gate_refusal keeps its signature, its answers and its
--    order (substrate, reaper_enabled, dry_run_only; a missing setting is
--    closed), so apply, the dry run and `gates` are unchanged; PL/pgSQL
--    caches its one query's plan per session.
-- 2. fn_job_stale_lease_count is the dry run's stale_lease_count alone: the
--    gauge queue.lease.stale.current, without the report. SECURITY INVOKER,
--    so it reads job_queue with the caller's column privileges (the sweeper
--    role's dry-run columns are enough).

-- 1. The gate rule.
CREATE OR REPLACE FUNCTION fn_job_reaper_gate_refusal()
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    v_substrate text;
    v_enabled   text;
    v_dry_run   text;
BEGIN
    -- key is queue_setting's primary key: one row per gate at most.
    SELECT pg_catalog.max(s.value) FILTER (WHERE s.key OPERATOR(pg_catalog.=) 'queue.job_substrate.enabled'),
           pg_catalog.max(s.value) FILTER (WHERE s.key OPERATOR(pg_catalog.=) 'queue.lease.reaper_enabled'),
           pg_catalog.max(s.value) FILTER (WHERE s.key OPERATOR(pg_catalog.=) 'queue.lease.reaper_dry_run_only')
      INTO v_substrate, v_enabled, v_dry_run
      FROM queue_setting AS s
     WHERE s.key OPERATOR(pg_catalog.=) ANY (ARRAY['queue.job_substrate.enabled',
                                                  'queue.lease.reaper_enabled',
                                                  'queue.lease.reaper_dry_run_only']);
    IF COALESCE(v_substrate, 'false') OPERATOR(pg_catalog.<>) 'true' THEN
        RETURN '{"reason": "queue.job_substrate.enabled=false", "refused": true}'::pg_catalog.jsonb;
    ELSIF COALESCE(v_enabled, 'false') OPERATOR(pg_catalog.<>) 'true' THEN
        RETURN '{"reason": "queue.lease.reaper_enabled=false", "refused": true}'::pg_catalog.jsonb;
    ELSIF COALESCE(v_dry_run, 'true') OPERATOR(pg_catalog.<>) 'false' THEN
        RETURN '{"reason": "queue.lease.reaper_dry_run_only=true", "refused": true}'::pg_catalog.jsonb;
    END IF;
    RETURN NULL;
END
$$;

-- 2. The stale gauge, as the dry run counts it.
CREATE FUNCTION fn_job_stale_lease_count()
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    RETURN (SELECT pg_catalog.count(*)
              FROM job_queue AS j
             WHERE j.state OPERATOR(pg_catalog.=) 'leased'
               AND j.lease_until IS NOT NULL
               AND j.lease_until OPERATOR(pg_catalog.<) pg_catalog.now());
END
$$;

GRANT EXECUTE ON FUNCTION fn_job_stale_lease_count() TO lease_sweeper;

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
