CREATE OR REPLACE FUNCTION lock_held_counted(p_version xid, p_counted_at timestamp with time zone, p_xmin xid, p_xmax xid, p_xip xid[])
 RETURNS boolean
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT p_counted_at > pg_catalog.now() - '1 minute'::pg_catalog.interval
       AND pg_catalog.age(p_version) > pg_catalog.age(p_xmax)
       AND (pg_catalog.age(p_version) > pg_catalog.age(p_xmin)
            OR p_version <> ALL (p_xip))
$function$;

REVOKE ALL ON FUNCTION lock_held_counted(xid, timestamp with time zone, xid, xid, xid[]) FROM PUBLIC;
