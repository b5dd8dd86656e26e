CREATE OR REPLACE FUNCTION fn_job_reaper_gate_refusal()
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
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
$function$;

COMMENT ON FUNCTION fn_job_reaper_gate_refusal() IS
'NULL when the three gates allow an apply, else the refusal an apply would return now ({"reason": ..., "refused": true}). STABLE, SECURITY INVOKER (needs SELECT on queue_setting).';

GRANT EXECUTE ON FUNCTION fn_job_reaper_gate_refusal() TO lease_sweeper;
