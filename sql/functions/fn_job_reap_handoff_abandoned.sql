CREATE OR REPLACE FUNCTION fn_job_reap_handoff_abandoned()
 RETURNS boolean
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
    SELECT EXISTS (SELECT 1 FROM job_reap_handoff AS o
                    WHERE o.written_at < pg_catalog.now() - signal_handoff_grace())
$function$;

COMMENT ON FUNCTION fn_job_reap_handoff_abandoned() IS
'Whether a job hand-off older than signal_handoff_grace() waits for recovery. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

REVOKE ALL ON FUNCTION fn_job_reap_handoff_abandoned() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fn_job_reap_handoff_abandoned() TO lease_sweeper;
