-- The one rule from a timestamp to epoch milliseconds: floored, and an
-- infinite timestamp saturates at the int8 bound on its side, so a line
-- never carries a made-up finite time. lease_overdue_millis applies it to
-- a lateness; lock_reap_batch's resume bound is its inverse.
CREATE OR REPLACE FUNCTION lease_epoch_millis(p_at timestamp with time zone)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT CASE
        WHEN pg_catalog.isfinite(p_at)
            THEN pg_catalog.floor(EXTRACT(epoch FROM p_at AT TIME ZONE 'UTC') * 1000::pg_catalog.numeric)::pg_catalog.int8
        WHEN EXTRACT(epoch FROM p_at AT TIME ZONE 'UTC') < 0::pg_catalog.numeric
            THEN '-9223372036854775808'::pg_catalog.int8
        ELSE '9223372036854775807'::pg_catalog.int8
    END
$function$;
