CREATE OR REPLACE FUNCTION fn_job_reaper_limit_refusal(p_limit integer)
 RETURNS jsonb
 LANGUAGE sql
 IMMUTABLE
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
    SELECT CASE WHEN p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        pg_catalog.jsonb_build_object('reason', 'limit_out_of_range', 'refused', true,
                           'limit', p_limit, 'limit_min', 1, 'limit_max', 10000)
    END
$function$;

GRANT EXECUTE ON FUNCTION fn_job_reaper_limit_refusal(integer) TO lease_sweeper;
