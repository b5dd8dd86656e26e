CREATE OR REPLACE FUNCTION lock_reap_expired(p_limit integer, p_after_millis bigint DEFAULT NULL::bigint)
 RETURNS TABLE(lock_key text, owner_id text, token text, expired_at_millis bigint, overdue_millis bigint, set_aside_error text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_from    timestamptz;
    v_rows    lock_reaped_lease[];
    v_one     lock_reaped_lease;
    v_counted boolean;
    v_n       integer := 0;
    v_count   lock_held_count;
    r         record;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        RAISE EXCEPTION 'lock_reap_expired: limit must be from 1 to 100000, got %', COALESCE(p_limit::pg_catalog.text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    -- One bound expression (not "IS NULL OR ..."), so the scan of
    -- lock_entry_expiry_idx starts at it; -infinity includes everything.
    v_from := CASE
        WHEN p_after_millis IS NULL OR p_after_millis < '-210000000000000'::pg_catalog.int8
            THEN '-infinity'::pg_catalog.timestamptz
        WHEN p_after_millis > '9000000000000000'::pg_catalog.int8
            THEN 'infinity'::pg_catalog.timestamptz
        ELSE '1970-01-01 00:00:00+00'::pg_catalog.timestamptz
             + p_after_millis::pg_catalog.float8 * '1 millisecond'::pg_catalog.interval
    END;
    -- The sweep's own deletions are not late releases: the trigger
    -- lock_entry_late_release skips rows deleted while this says `on`
    -- (sql/lock_entry_hooks.sql). Local to the transaction, and set back
    -- before returning, so nothing else the transaction deletes is hidden.
    PERFORM pg_catalog.set_config('lease_sweeper.reaping', 'on', true);

    -- The rows one by one, each delete in its own subtransaction, so one
    -- that fails is set aside and the rest are reaped: what lock_reap_batch
    -- falls back on when its one statement fails.
    SELECT * INTO v_count FROM lock_held_count AS c WHERE c.singleton;
    v_rows := '{}';
    FOR r IN
        SELECT l.lock_key, l.owner_id, l.token::pg_catalog.text AS token
          FROM lock_entry AS l
         WHERE l.expires_at <= pg_catalog.now()
           AND l.expires_at >= v_from
         ORDER BY l.expires_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    LOOP
        BEGIN
            DELETE FROM lock_entry AS e
             WHERE e.lock_key = r.lock_key
               AND e.expires_at <= pg_catalog.now()
            RETURNING e.lock_key, e.owner_id, e.token::pg_catalog.text,
                      lease_epoch_millis(e.expires_at),
                      lease_overdue_millis(e.expires_at, pg_catalog.now()),
                      NULL::pg_catalog.text,
                      lock_held_counted(e.xmin, v_count.counted_at, v_count.counted_xmin,
                                        v_count.counted_xmax, v_count.counted_xip)
                 INTO v_one.lock_key, v_one.owner_id, v_one.token, v_one.expired_at_millis,
                      v_one.overdue_millis, v_one.set_aside_error, v_counted;
            IF FOUND THEN
                v_rows := pg_catalog.array_append(v_rows, v_one);
                IF v_counted THEN
                    v_n := v_n + 1;
                END IF;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            v_rows := pg_catalog.array_append(v_rows,
                ROW(r.lock_key, r.owner_id, r.token, NULL, NULL,
                    pg_catalog.format('%s (SQLSTATE %s)', SQLERRM, SQLSTATE), 'sweep')::lock_reaped_lease);
        END;
    END LOOP;
    IF v_n > 0 THEN
        INSERT INTO lock_held_delta (n) VALUES (v_n);
    END IF;

    PERFORM pg_catalog.set_config('lease_sweeper.reaping', '', true);
    RETURN QUERY SELECT u.lock_key, u.owner_id, u.token, u.expired_at_millis, u.overdue_millis, u.set_aside_error
                   FROM pg_catalog.unnest(v_rows) AS u;
END
$function$;

COMMENT ON FUNCTION lock_reap_expired(integer, bigint) IS
'A sweep batch row by row: deletes up to p_limit (1-100000, else 22023) leases whose deadline has passed (database clock, checked again on each delete), oldest first from p_after_millis (epoch ms; NULL: the oldest), skipping rows another session holds (FOR UPDATE SKIP LOCKED), each delete in its own subtransaction, and returns each with its deadline and lateness in ms; a row whose delete fails is left in place and returned with set_aside_error. lock_reap_batch falls back on it when its one statement fails, and hands the batch off. SECURITY DEFINER; EXECUTE: its owner only.';

REVOKE ALL ON FUNCTION lock_reap_expired(integer, bigint) FROM PUBLIC;
