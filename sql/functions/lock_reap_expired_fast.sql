CREATE OR REPLACE FUNCTION lock_reap_expired_fast(p_limit integer, p_from timestamp with time zone)
 RETURNS SETOF lock_reaped_lease
 LANGUAGE sql
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
    WITH doomed AS (
        SELECT l.ctid
          FROM lock_entry AS l
         WHERE l.expires_at <= pg_catalog.now()
           AND l.expires_at >= p_from
         ORDER BY l.expires_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM lock_entry AS e
         WHERE e.ctid = ANY (ARRAY(SELECT d.ctid FROM doomed AS d))
           AND e.expires_at <= pg_catalog.now()
        RETURNING e.lock_key, e.owner_id, e.token, e.expires_at, e.xmin AS version
    ), recorded AS (
        INSERT INTO lock_held_delta (n)
        SELECT pg_catalog.count(*)::pg_catalog.int4
          FROM gone AS g, lock_held_count AS c
         WHERE c.singleton
           AND lock_held_counted(g.version, c.counted_at, c.counted_xmin, c.counted_xmax, c.counted_xip)
        HAVING pg_catalog.count(*) > 0::pg_catalog.int8
    )
    SELECT g.lock_key, g.owner_id, g.token,
           lease_epoch_millis(g.expires_at),
           lease_overdue_millis(g.expires_at, pg_catalog.now()),
           NULL::pg_catalog.text,
           'sweep'::pg_catalog.text
      FROM gone AS g
$function$;

REVOKE ALL ON FUNCTION lock_reap_expired_fast(integer, timestamp with time zone) FROM PUBLIC;
