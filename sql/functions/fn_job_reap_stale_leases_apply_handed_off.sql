CREATE OR REPLACE FUNCTION fn_job_reap_stale_leases_apply_handed_off(p_actor text, p_limit integer DEFAULT 100)
 RETURNS TABLE(handoff_id bigint, report text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
#variable_conflict use_variable
DECLARE
    v_report jsonb := fn_job_reap_stale_leases_apply(p_actor, p_limit);
    v_text text := v_report::pg_catalog.text;
    v_id bigint;
BEGIN
    IF pg_catalog.jsonb_typeof(v_report -> 'actions') = 'array'
       AND pg_catalog.jsonb_array_length(v_report -> 'actions') > 0 THEN
        INSERT INTO job_reap_handoff AS h (report) VALUES (v_text) RETURNING h.handoff_id INTO v_id;
    END IF;
    RETURN QUERY SELECT v_id, v_text;
END
$function$;

COMMENT ON FUNCTION fn_job_reap_stale_leases_apply_handed_off(text, integer) IS
'fn_job_reap_stale_leases_apply(p_actor, p_limit), with its report recorded in one job_reap_handoff row in the same transaction when it reaped something; returns the hand-off''s id (NULL otherwise) and the report. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

REVOKE ALL ON FUNCTION fn_job_reap_stale_leases_apply_handed_off(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fn_job_reap_stale_leases_apply_handed_off(text, integer) TO lease_sweeper;
