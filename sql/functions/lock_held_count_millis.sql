CREATE OR REPLACE FUNCTION lock_held_count_millis(p_at timestamp with time zone)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT CASE WHEN pg_catalog.isfinite(p_at)
                THEN pg_catalog.floor(EXTRACT(epoch FROM p_at) * 1000::numeric)::bigint
                ELSE 0 END
$function$;
