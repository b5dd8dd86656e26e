CREATE OR REPLACE FUNCTION lease_overdue_millis(p_deadline timestamp with time zone, p_at timestamp with time zone)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT CASE
        WHEN pg_catalog.isfinite(p_deadline) AND pg_catalog.isfinite(p_at)
            THEN pg_catalog.floor(EXTRACT(epoch FROM p_at - p_deadline) * 1000::pg_catalog.numeric)::pg_catalog.int8
        WHEN p_deadline < p_at
            THEN '9223372036854775807'::pg_catalog.int8
        WHEN p_deadline > p_at
            THEN '-9223372036854775808'::pg_catalog.int8
        ELSE 0::pg_catalog.int8
    END
$function$;
