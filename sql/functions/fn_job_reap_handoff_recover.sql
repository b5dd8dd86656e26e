CREATE OR REPLACE FUNCTION fn_job_reap_handoff_recover()
 RETURNS TABLE(report text)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
    DELETE FROM job_reap_handoff AS h
     WHERE h.handoff_id = (SELECT o.handoff_id
                             FROM job_reap_handoff AS o
                            WHERE o.written_at < pg_catalog.now() - signal_handoff_grace()
                            ORDER BY o.handoff_id
                            LIMIT 1
                              FOR UPDATE SKIP LOCKED)
    RETURNING h.report
$function$;

COMMENT ON FUNCTION fn_job_reap_handoff_recover() IS
'Deletes the oldest job hand-off older than signal_handoff_grace() that no other transaction holds and returns its report, whose actions are written as job_lease_expired lines before committing. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

REVOKE ALL ON FUNCTION fn_job_reap_handoff_recover() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fn_job_reap_handoff_recover() TO lease_sweeper;
