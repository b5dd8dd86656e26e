CREATE OR REPLACE FUNCTION fn_job_dry_run_object(p_job_id uuid, p_job_kind text, p_lease_owner text, p_lease_until timestamp with time zone, p_attempts integer, p_max_attempts integer, p_lease_duration_sec integer, p_lease_duration_source text)
 RETURNS jsonb
 LANGUAGE sql
 STABLE
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
    SELECT pg_catalog.jsonb_build_object(
        'job_id', p_job_id,
        'job_kind', p_job_kind,
        'lease_owner', p_lease_owner,
        'lease_until', p_lease_until,
        'attempts', p_attempts,
        'max_attempts', p_max_attempts,
        'lease_duration_sec', p_lease_duration_sec,
        'lease_duration_source', p_lease_duration_source,
        'overdue_seconds', CASE WHEN pg_catalog.isfinite(p_lease_until)
                                THEN pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.now() - p_lease_until))::pg_catalog.int8
                                ELSE '9223372036854775807'::pg_catalog.int8 END,
        'would_action', CASE WHEN p_attempts >= p_max_attempts - 1
                             THEN 'move_to_dead_letter'
                             ELSE 'reset_to_retry_waiting' END)
$function$;
