-- One batch of the sweep, the only shape there is: up to p_limit expired
-- leases in deadline order from p_after_millis (the newest deadline the
-- sweep's previous batch reaped; NULL: from the oldest), rows other sessions
-- hold skipped, deleted, and handed off in one lock_reap_handoff row in the
-- same transaction, so the caller commits before it writes a line and no
-- lock-server call waits on the daemon's output. Returns the hand-off's id
-- (NULL when nothing was reaped) and the batch as parallel arrays; leases
-- that could not be deleted come back in the set_aside_* arrays, left in
-- place (lock_reap_expired explains both paths).
CREATE OR REPLACE FUNCTION lock_reap_batch(p_limit integer, p_after_millis bigint DEFAULT NULL)
 RETURNS TABLE(handoff_id bigint, lock_keys text[], owner_ids text[], tokens bigint[], expired_at_millis bigint[], overdue_millis bigint[], set_aside_keys text[], set_aside_owner_ids text[], set_aside_tokens bigint[], set_aside_errors text[])
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
#variable_conflict use_variable
DECLARE
    v_id bigint;
    v_k text[]; v_o text[]; v_t bigint[]; v_e bigint[]; v_d bigint[];
    s_k text[]; s_o text[]; s_t bigint[]; s_x text[];
BEGIN
    -- One pass over the batch, every aggregate in its order.
    SELECT pg_catalog.array_agg(r.lock_key) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.owner_id) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.token) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.expired_at_millis) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.overdue_millis) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.lock_key) FILTER (WHERE r.set_aside_error IS NOT NULL),
           pg_catalog.array_agg(r.owner_id) FILTER (WHERE r.set_aside_error IS NOT NULL),
           pg_catalog.array_agg(r.token) FILTER (WHERE r.set_aside_error IS NOT NULL),
           pg_catalog.array_agg(r.set_aside_error) FILTER (WHERE r.set_aside_error IS NOT NULL)
      INTO v_k, v_o, v_t, v_e, v_d, s_k, s_o, s_t, s_x
      FROM lock_reap_expired(p_limit, p_after_millis) AS r;
    IF v_k IS NOT NULL THEN
        INSERT INTO lock_reap_handoff AS h (lock_keys, owner_ids, tokens, expired_at_millis, overdue_millis)
        VALUES (v_k, v_o, v_t, v_e, v_d)
        RETURNING h.handoff_id INTO v_id;
    END IF;
    RETURN QUERY SELECT v_id, v_k, v_o, v_t, v_e, v_d, s_k, s_o, s_t, s_x;
END
$function$;

COMMENT ON FUNCTION lock_reap_batch(integer, bigint) IS
'One sweep batch: deletes up to p_limit (1-100000, else 22023) expired leases in deadline order from p_after_millis (epoch ms; NULL: the oldest), skipping rows other sessions hold, records them in one lock_reap_handoff row and returns its id and the leases as arrays (set_aside_*: leases whose delete failed, left in place). The caller commits, writes the lines, then claims the hand-off (lock_handoff_claim). SECURITY DEFINER; EXECUTE: lease_sweeper only.';

REVOKE ALL ON FUNCTION lock_reap_batch(integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_reap_batch(integer, bigint) TO lease_sweeper;
