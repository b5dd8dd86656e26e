-- The sweep's batch call: lock_reap_batch's one batch, one row per lease,
-- unnested from the arrays it hands off. A reaped lease comes with the
-- hand-off's id; a lease set aside (its delete failed, it was left in place)
-- with set_aside_error and no id. fallback_cause is on every row of a batch
-- taken row by row, and is the only thing on the one row of such a batch
-- that took nothing.
CREATE OR REPLACE FUNCTION lock_reap_leases(p_limit integer, p_after_millis bigint DEFAULT NULL::bigint)
 RETURNS TABLE(handoff_id bigint, lock_key text, owner_id text, token text, expired_at_millis bigint, overdue_millis bigint, set_aside_error text, fallback_cause text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    -- PL/pgSQL, so the session plans this once, as it does the batch.
    RETURN QUERY
    WITH b AS MATERIALIZED (
        SELECT * FROM lock_reap_batch(p_limit, p_after_millis)
    )
    SELECT r.handoff_id, r.lock_key, r.owner_id, r.token, r.expired_at_millis, r.overdue_millis,
           r.set_aside_error, b.fallback_cause
      FROM b,
           LATERAL (SELECT b.handoff_id, u.k, u.o, u.t, u.e, u.d, NULL::pg_catalog.text, 1, u.i
                      FROM ROWS FROM (pg_catalog.unnest(b.lock_keys), pg_catalog.unnest(b.owner_ids),
                                      pg_catalog.unnest(b.tokens), pg_catalog.unnest(b.expired_at_millis),
                                      pg_catalog.unnest(b.overdue_millis))
                           WITH ORDINALITY AS u (k, o, t, e, d, i)
                    UNION ALL
                    SELECT NULL, u.k, u.o, u.t, NULL, NULL, u.x, 2, u.i
                      FROM ROWS FROM (pg_catalog.unnest(b.set_aside_keys), pg_catalog.unnest(b.set_aside_owner_ids),
                                      pg_catalog.unnest(b.set_aside_tokens), pg_catalog.unnest(b.set_aside_errors))
                           WITH ORDINALITY AS u (k, o, t, x, i)
                    UNION ALL
                    SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, 3, 1
                     WHERE b.fallback_cause IS NOT NULL AND b.lock_keys IS NULL AND b.set_aside_keys IS NULL)
               AS r (handoff_id, lock_key, owner_id, token, expired_at_millis, overdue_millis, set_aside_error, part, i)
     ORDER BY r.part, r.i;
END
$function$;

COMMENT ON FUNCTION lock_reap_leases(integer, bigint) IS
'One sweep batch (lock_reap_batch(p_limit, p_after_millis)), one row per lease: reaped ones with their hand-off''s id, set-aside ones with set_aside_error; fallback_cause on every row when the batch was taken row by row. The caller commits, then claims the hand-off (lock_handoff_claim), writes the lines and commits. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

REVOKE ALL ON FUNCTION lock_reap_leases(integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_reap_leases(integer, bigint) TO lease_sweeper;
