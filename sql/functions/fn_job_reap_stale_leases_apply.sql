CREATE OR REPLACE FUNCTION fn_job_reap_stale_leases_apply(p_actor text, p_limit integer DEFAULT 100)
 RETURNS jsonb
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
DECLARE
    v_refusal jsonb;
    v_raw     text;
    v_base    bigint;
    v_ids     uuid[];
    v_id      uuid;
    v_body    jsonb;
    v_part    jsonb;
    v_actions jsonb[] := '{}';
    v_reset   bigint := 0;
    v_dead    bigint := 0;
    v_aside   jsonb := '[]';
BEGIN
    IF p_actor IS NULL OR pg_catalog.btrim(p_actor) = '' THEN
        RETURN '{"reason": "actor_required", "refused": true}'::pg_catalog.jsonb;
    END IF;
    v_refusal := COALESCE(fn_job_reaper_limit_refusal(p_limit), fn_job_reaper_gate_refusal());
    IF v_refusal IS NOT NULL THEN
        RETURN v_refusal;
    END IF;
    SELECT q.value INTO v_raw FROM queue_setting AS q WHERE q.key = 'queue.retry.backoff_base_sec';
    -- CASE, not AND: the cast must never run on a non-number.
    v_base := CASE WHEN v_raw IS NULL THEN 10
                   WHEN v_raw ~ '^[0-9]{1,5}$' THEN v_raw::pg_catalog.int8 END;
    IF v_base IS NOT NULL AND v_base BETWEEN 1 AND 86400 THEN
        NULL;
    ELSE
        RETURN pg_catalog.jsonb_build_object('reason', 'queue.retry.backoff_base_sec_invalid', 'refused', true,
                                             'value', v_raw);
    END IF;

    BEGIN
        v_body := fn_job_reap_ids(NULL, p_actor, p_limit, v_base);
    EXCEPTION WHEN OTHERS THEN
        v_body := NULL;
    END;

    IF v_body IS NULL THEN
        -- The failed batch's row locks went with its subtransaction: choose
        -- and lock the same rows again, then reap each on its own.
        v_ids := ARRAY(
            SELECT j.job_id
              FROM job_queue AS j
             WHERE j.state = 'leased'
               AND j.lease_until IS NOT NULL
               AND j.lease_until < pg_catalog.now()
             ORDER BY j.lease_until, j.job_id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED);
        FOREACH v_id IN ARRAY v_ids LOOP
            BEGIN
                v_part := fn_job_reap_ids(v_id, p_actor, 1, v_base);
                -- One action per call; appending to a plpgsql array is
                -- amortised O(1), appending to a jsonb array copies it.
                IF pg_catalog.jsonb_array_length(v_part -> 'actions') > 0 THEN
                    v_actions := pg_catalog.array_append(v_actions, v_part -> 'actions' -> 0);
                END IF;
                v_reset := v_reset + (v_part ->> 'reset_count')::pg_catalog.int8;
                v_dead := v_dead + (v_part ->> 'dead_letter_count')::pg_catalog.int8;
            EXCEPTION WHEN OTHERS THEN
                v_aside := v_aside OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_array(
                    (SELECT pg_catalog.jsonb_build_object(  -- few: a copy each is fine
                                'job_id', j.job_id,
                                'job_kind', j.job_kind,
                                'lease_owner', j.lease_owner,
                                'error', pg_catalog.format('%s (SQLSTATE %s)', SQLERRM, SQLSTATE))
                       FROM job_queue AS j WHERE j.job_id = v_id));
            END;
        END LOOP;
        v_body := pg_catalog.jsonb_build_object('actor', p_actor, 'refused', false,
                                                'reset_count', v_reset, 'dead_letter_count', v_dead,
                                                'actions', pg_catalog.to_jsonb(v_actions));
        IF pg_catalog.jsonb_array_length(v_aside) > 0 THEN
            v_body := v_body OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object('set_aside', v_aside);
        END IF;
    END IF;
    RETURN v_body;
END
$function$;

COMMENT ON FUNCTION fn_job_reap_stale_leases_apply(text, integer) IS
'Reaps up to p_limit stale job leases, oldest first: back to retry_waiting with exponential backoff (one set-based statement), or, at the last attempt, attempts bumped and then moved by the queue''s own fn_job_move_to_dead_letter(job_id, ''lease_expired_reaped_at_max_attempts'', p_actor), whose JSON each such action carries as dead_letter; a job completed or re-leased meanwhile is never touched. Refused, changing nothing, as {"reason": ..., "refused": true}, in this order: actor_required, limit_out_of_range, queue.job_substrate.enabled=false, queue.lease.reaper_enabled=false, queue.lease.reaper_dry_run_only=true. SECURITY DEFINER; EXECUTE not granted to PUBLIC. lease-sweeper jobs apply and the daemon call it.';

REVOKE ALL ON FUNCTION fn_job_reap_stale_leases_apply(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fn_job_reap_stale_leases_apply(text, integer) TO lease_sweeper;
