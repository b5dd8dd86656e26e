CREATE OR REPLACE FUNCTION lock_handoff_recover()
 RETURNS TABLE(lock_key text, owner_id text, token text, expired_at_millis bigint, overdue_millis bigint)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
    WITH gone AS (
        DELETE FROM lock_reap_handoff AS h
         WHERE h.handoff_id = (SELECT o.handoff_id
                                 FROM lock_reap_handoff AS o
                                WHERE o.written_at < pg_catalog.now() - signal_handoff_grace()
                                ORDER BY o.handoff_id
                                LIMIT 1
                                  FOR UPDATE SKIP LOCKED)
        RETURNING h.lock_keys, h.owner_ids, h.tokens, h.expired_at_millis, h.overdue_millis
    )
    SELECT u.k, u.o, u.t, u.e, u.d
      FROM gone AS g,
           ROWS FROM (pg_catalog.unnest(g.lock_keys), pg_catalog.unnest(g.owner_ids),
                      pg_catalog.unnest(g.tokens), pg_catalog.unnest(g.expired_at_millis),
                      pg_catalog.unnest(g.overdue_millis))
               WITH ORDINALITY AS u (k, o, t, e, d, i)
     ORDER BY u.i
$function$;

COMMENT ON FUNCTION lock_handoff_recover() IS
'Deletes the oldest lock hand-off older than signal_handoff_grace() that no other transaction holds and returns its leases, to be reported as lease_expired reapedBy=sweep before committing. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

REVOKE ALL ON FUNCTION lock_handoff_recover() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_handoff_recover() TO lease_sweeper;
