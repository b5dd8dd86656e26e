-- Dropped first: up to the first release it returned no fallback_cause,
-- and CREATE OR REPLACE cannot change a function's result columns. This
-- file runs only in `migrate`'s one transaction, and grants again below, so
-- callers never see it missing.
DROP FUNCTION IF EXISTS lock_drain_takeovers(integer);

-- Drains the outbox in one set-based statement; when that fails (one row
-- whose delete an operator's trigger refuses, say), takes the same rows one
-- by one, so the failing row is set aside and the rest are reported, and
-- says why on every row it returns (fallback_cause), as lock_reap_batch
-- does. A fallback that took nothing returns no row, so a caller reading
-- these columns by name always gets a lease.
CREATE OR REPLACE FUNCTION lock_drain_takeovers(p_limit integer)
 RETURNS TABLE(lock_key text, owner_id text, token text, expired_at_millis bigint, overdue_millis bigint, set_aside_error text, reaped_by text, fallback_cause text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_rows   lock_reaped_lease[];
    v_one    lock_reaped_lease;
    v_cause  text;
    r        record;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        RAISE EXCEPTION 'lock_drain_takeovers: limit must be from 1 to 100000, got %', COALESCE(p_limit::pg_catalog.text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    BEGIN
        WITH gone AS (
            DELETE FROM lock_expiry_outbox AS o
             WHERE o.outbox_id = ANY (ARRAY(
                    SELECT b.outbox_id
                      FROM lock_expiry_outbox AS b
                     ORDER BY b.outbox_id
                     LIMIT p_limit
                       FOR UPDATE SKIP LOCKED))
            RETURNING o.lock_key, o.owner_id, o.token, o.expires_at, o.taken_over_at, o.reaped_by
        )
        SELECT pg_catalog.array_agg(ROW(g.lock_key, g.owner_id, g.token,
                                        lease_epoch_millis(g.expires_at),
                                        lease_overdue_millis(g.expires_at, g.taken_over_at),
                                        NULL, g.reaped_by)::lock_reaped_lease)
          INTO v_rows
          FROM gone AS g;
    EXCEPTION WHEN OTHERS THEN
        v_cause := pg_catalog.format('%s (SQLSTATE %s)', SQLERRM, SQLSTATE);
    END;

    IF v_cause IS NOT NULL THEN
        v_rows := '{}';
        FOR r IN
            SELECT b.outbox_id, b.lock_key, b.owner_id, b.token, b.reaped_by
              FROM lock_expiry_outbox AS b
             ORDER BY b.outbox_id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED
        LOOP
            BEGIN
                DELETE FROM lock_expiry_outbox AS o
                 WHERE o.outbox_id = r.outbox_id
                RETURNING o.lock_key, o.owner_id, o.token,
                          lease_epoch_millis(o.expires_at),
                          lease_overdue_millis(o.expires_at, o.taken_over_at),
                          NULL::pg_catalog.text, o.reaped_by
                     INTO v_one;
                IF FOUND THEN
                    v_rows := pg_catalog.array_append(v_rows, v_one);
                END IF;
            EXCEPTION WHEN OTHERS THEN
                v_rows := pg_catalog.array_append(v_rows,
                    ROW(r.lock_key, r.owner_id, r.token, NULL, NULL,
                        pg_catalog.format('%s (SQLSTATE %s)', SQLERRM, SQLSTATE), r.reaped_by)::lock_reaped_lease);
            END;
        END LOOP;
    END IF;

    RETURN QUERY SELECT u.lock_key, u.owner_id, u.token, u.expired_at_millis, u.overdue_millis, u.set_aside_error, u.reaped_by,
                        v_cause
                   FROM pg_catalog.unnest(v_rows) AS u;
END
$function$;

COMMENT ON FUNCTION lock_drain_takeovers(integer) IS
'Deletes and returns up to p_limit (1-100000, else 22023) recorded expiries from lock_expiry_outbox (takeovers, late releases and late renewals), oldest first, lateness measured when the lease left lock_entry or was renewed; the sweeper reports each as lease_expired with reapedBy = reaped_by (takeover, release or renewal) before committing (fallback_cause: why the set-based statement failed, when the rows were taken one by one). SECURITY DEFINER; EXECUTE: lease_sweeper only.';

REVOKE ALL ON FUNCTION lock_drain_takeovers(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_drain_takeovers(integer) TO lease_sweeper;
