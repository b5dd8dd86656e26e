-- How late p_at is after p_deadline, in milliseconds, floored. With an
-- infinite end the lateness is infinite one way or the other (or nothing,
-- when both ends are the same infinity), and saturates as lease_epoch_millis
-- saturates an infinite timestamp.
CREATE OR REPLACE FUNCTION lease_overdue_millis(p_deadline timestamp with time zone, p_at timestamp with time zone)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT CASE
        WHEN pg_catalog.isfinite(p_deadline) AND pg_catalog.isfinite(p_at)
            THEN pg_catalog.floor(EXTRACT(epoch FROM p_at - p_deadline) * 1000::pg_catalog.numeric)::pg_catalog.int8
        ELSE lease_epoch_millis(CASE WHEN p_deadline < p_at THEN 'infinity'::pg_catalog.timestamptz
                                     WHEN p_deadline > p_at THEN '-infinity'::pg_catalog.timestamptz
                                     ELSE 'epoch'::pg_catalog.timestamptz END)
    END
$function$;
