CREATE OR REPLACE FUNCTION fn_job_reap_stale_leases_dry_run(p_limit integer DEFAULT 100)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
DECLARE
    v_refusal jsonb := fn_job_reaper_limit_refusal(p_limit);
    v_jobs    jsonb;
    v_list    jsonb[] := '{}';
    v_aside   jsonb := '[]';
    r         record;
    v_sec     integer;
    v_source  text;
    -- Whether the queue records the lease each claim gave (the stand-in
    -- does; a queue adopted as its own tool made it may not). Without them
    -- each job's object leaves both fields out rather than guess: the
    -- reaper itself only asks lease_until < now().
    v_durations boolean := fn_job_queue_has_columns('{lease_duration_sec,lease_duration_source}');
BEGIN
    IF v_refusal IS NOT NULL THEN
        RETURN v_refusal;
    END IF;
    BEGIN
        IF v_durations THEN
            SELECT COALESCE(pg_catalog.jsonb_agg(fn_job_dry_run_object(s.job_id, s.job_kind, s.lease_owner, s.lease_until,
                                                                       s.attempts, s.max_attempts,
                                                                       s.lease_duration_sec, s.lease_duration_source)
                                                 ORDER BY s.lease_until, s.job_id), '[]'::pg_catalog.jsonb)
              INTO v_jobs
              FROM (SELECT j.job_id, j.job_kind, j.lease_owner, j.lease_until, j.attempts, j.max_attempts,
                           j.lease_duration_sec, j.lease_duration_source
                      FROM job_queue AS j
                     WHERE j.state = 'leased'
                       AND j.lease_until IS NOT NULL
                       AND j.lease_until < pg_catalog.now()
                     ORDER BY j.lease_until, j.job_id
                     LIMIT p_limit) AS s;
        ELSE
            SELECT COALESCE(pg_catalog.jsonb_agg(fn_job_dry_run_object(s.job_id, s.job_kind, s.lease_owner, s.lease_until,
                                                                       s.attempts, s.max_attempts, NULL, NULL)
                                                 OPERATOR(pg_catalog.-) '{lease_duration_sec,lease_duration_source}'::pg_catalog.text[]
                                                 ORDER BY s.lease_until, s.job_id), '[]'::pg_catalog.jsonb)
              INTO v_jobs
              FROM (SELECT j.job_id, j.job_kind, j.lease_owner, j.lease_until, j.attempts, j.max_attempts
                      FROM job_queue AS j
                     WHERE j.state = 'leased'
                       AND j.lease_until IS NOT NULL
                       AND j.lease_until < pg_catalog.now()
                     ORDER BY j.lease_until, j.job_id
                     LIMIT p_limit) AS s;
        END IF;
    EXCEPTION WHEN OTHERS THEN
        v_jobs := NULL;
    END;
    IF v_jobs IS NULL THEN
        -- One job at a time, each with the two lease fields or none.
        FOR r IN
            SELECT j.job_id, j.job_kind, j.lease_owner, j.lease_until, j.attempts, j.max_attempts
              FROM job_queue AS j
             WHERE j.state = 'leased'
               AND j.lease_until IS NOT NULL
               AND j.lease_until < pg_catalog.now()
             ORDER BY j.lease_until, j.job_id
             LIMIT p_limit
        LOOP
            BEGIN
                IF v_durations THEN
                    SELECT j.lease_duration_sec, j.lease_duration_source INTO v_sec, v_source
                      FROM job_queue AS j WHERE j.job_id = r.job_id;
                    v_list := pg_catalog.array_append(v_list,
                        fn_job_dry_run_object(r.job_id, r.job_kind, r.lease_owner, r.lease_until, r.attempts,
                                              r.max_attempts, v_sec, v_source));
                ELSE
                    v_list := pg_catalog.array_append(v_list,
                        fn_job_dry_run_object(r.job_id, r.job_kind, r.lease_owner, r.lease_until, r.attempts,
                                              r.max_attempts, NULL, NULL)
                        OPERATOR(pg_catalog.-) '{lease_duration_sec,lease_duration_source}'::pg_catalog.text[]);
                END IF;
            EXCEPTION WHEN OTHERS THEN
                v_aside := v_aside OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                    'job_id', r.job_id, 'job_kind', r.job_kind, 'lease_owner', r.lease_owner,
                    'error', pg_catalog.format('%s (SQLSTATE %s)', SQLERRM, SQLSTATE)));
            END;
        END LOOP;
        v_jobs := pg_catalog.to_jsonb(v_list);
    END IF;
    RETURN pg_catalog.jsonb_build_object(
        'evaluated_at', pg_catalog.now(),
        'stale_lease_count', (SELECT pg_catalog.count(*)
                                FROM job_queue AS j
                               WHERE j.state = 'leased'
                                 AND j.lease_until IS NOT NULL
                                 AND j.lease_until < pg_catalog.now()),
        'limit', p_limit,
        'mutation', false,
        'jobs', v_jobs)
        OPERATOR(pg_catalog.||) CASE WHEN pg_catalog.jsonb_array_length(v_aside) > 0
                                     THEN pg_catalog.jsonb_build_object('set_aside', v_aside)
                                     ELSE '{}'::pg_catalog.jsonb END;
END
$function$;

COMMENT ON FUNCTION fn_job_reap_stale_leases_dry_run(integer) IS
'What the reaper would do now, changing nothing whatever the gates say: stale_lease_count (every job with state leased and lease_until < now()) and, for the p_limit oldest (1-10000, else the limit_out_of_range refusal), each job''s would_action (reset_to_retry_waiting or move_to_dead_letter) and, where job_queue records them, the lease its latest claim or heartbeat gave it (lease_duration_sec, lease_duration_source; both left out on a queue without those columns). STABLE, SECURITY INVOKER (needs SELECT on job_queue''s reaper columns). lease-sweeper jobs dry-run calls it.';

GRANT EXECUTE ON FUNCTION fn_job_reap_stale_leases_dry_run(integer) TO lease_sweeper;
