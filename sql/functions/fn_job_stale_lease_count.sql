CREATE OR REPLACE FUNCTION fn_job_stale_lease_count()
 RETURNS bigint
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
BEGIN
    RETURN (SELECT pg_catalog.count(*)
              FROM job_queue AS j
             WHERE j.state OPERATOR(pg_catalog.=) 'leased'
               AND j.lease_until IS NOT NULL
               AND j.lease_until OPERATOR(pg_catalog.<) pg_catalog.now());
END
$function$;

COMMENT ON FUNCTION fn_job_stale_lease_count() IS
'The number of stale job leases (state leased, lease_until < now()): the dry run''s stale_lease_count, and the queue.lease.stale.current gauge. STABLE, SECURITY INVOKER.';

GRANT EXECUTE ON FUNCTION fn_job_stale_lease_count() TO lease_sweeper;
