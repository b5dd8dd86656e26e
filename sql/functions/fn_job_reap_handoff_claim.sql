CREATE OR REPLACE FUNCTION fn_job_reap_handoff_claim(p_handoff_id bigint)
 RETURNS boolean
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
    WITH gone AS (
        DELETE FROM job_reap_handoff AS h WHERE h.handoff_id = p_handoff_id
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM gone)
$function$;

COMMENT ON FUNCTION fn_job_reap_handoff_claim(bigint) IS
'Deletes job hand-off p_handoff_id and returns true, or false when it is gone. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

REVOKE ALL ON FUNCTION fn_job_reap_handoff_claim(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fn_job_reap_handoff_claim(bigint) TO lease_sweeper;
