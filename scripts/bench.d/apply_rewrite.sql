-- A rewrite of fn_job_reap_stale_leases_apply's reaping statement, measured
-- by the harness next to the original (docs/performance.md, "Job reaper").
-- Same refusals, semantics and JSON; installed as bench_job_reap_apply so it
-- can be measured against any build. Differences, all in the statement:
--   * one UPDATE for both outcomes (CASE on the bumped attempts) instead of
--     two, each of which joined `stale` to job_queue;
--   * the UPDATE finds its rows with job_id = ANY(ARRAY(SELECT ... FROM
--     stale)), a primary-key probe per row, instead of a join the planner
--     ran as a hash join over a sequential scan of the whole job_queue (in
--     each of the two UPDATEs); the old lease_owner/lease_until the report
--     needs come from `stale` when the actions are built.
CREATE OR REPLACE FUNCTION bench_job_reap_apply(p_actor text, p_limit integer DEFAULT 100)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    v_refusal jsonb;
    v_base    bigint;
    v_result  jsonb;
BEGIN
    IF p_actor IS NULL OR btrim(p_actor) = '' THEN
        RETURN '{"reason": "actor_required", "refused": true}'::jsonb;
    END IF;
    v_refusal := coalesce(fn_job_reaper_limit_refusal(p_limit), fn_job_reaper_gate_refusal());
    IF v_refusal IS NOT NULL THEN
        RETURN v_refusal;
    END IF;
    v_base := coalesce((SELECT value::bigint FROM queue_setting WHERE key = 'queue.retry.backoff_base_sec'), 10);

    WITH stale AS (
        SELECT job_id, lease_owner, lease_until, max_attempts, attempts + 1 AS bumped
          FROM job_queue
         WHERE state = 'leased'
           AND lease_until IS NOT NULL
           AND lease_until < now()
         ORDER BY lease_until, job_id
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ),
    moved AS (
        -- The rows are locked by `stale`, so attempts + 1 here is its bumped.
        UPDATE job_queue AS j
           SET state = CASE WHEN j.attempts + 1 >= j.max_attempts
                            THEN 'dead_letter' ELSE 'retry_waiting' END,
               attempts = j.attempts + 1,
               last_error = CASE WHEN j.attempts + 1 >= j.max_attempts
                                 THEN 'lease_expired_reaped_at_max_attempts'
                                 ELSE 'lease_expired_reaped' END,
               scheduled_at = CASE WHEN j.attempts + 1 >= j.max_attempts
                                   THEN j.scheduled_at
                                   ELSE now() + (v_base * (1::bigint << least(j.attempts, 10)))::float8
                                                * interval '1 second' END,
               lease_owner = NULL,
               lease_until = NULL,
               updated_at = now()
         WHERE j.job_id = ANY (ARRAY(SELECT job_id FROM stale))
           AND j.state = 'leased'
           AND j.lease_until < now()
        RETURNING j.job_id, j.job_kind, j.payload, j.attempts, j.max_attempts, j.scheduled_at,
                  j.state = 'dead_letter' AS dead
    ),
    dead AS (
        INSERT INTO job_dead_letter (job_id, job_kind, payload, attempts, final_error, moved_by)
        SELECT job_id, job_kind, payload, attempts, 'lease_expired_reaped_at_max_attempts', p_actor
          FROM moved
         WHERE dead
        RETURNING *
    ),
    actions AS (
        SELECT s.lease_until, m.job_id,
               CASE WHEN NOT m.dead THEN
                   pg_catalog.jsonb_build_object(
                       'action', 'reset_to_retry_waiting',
                       'job_id', m.job_id,
                       'attempts', m.attempts,
                       'backoff_sec', v_base * (1::bigint << least(m.attempts - 1, 10)),
                       'scheduled_at', m.scheduled_at,
                       'job_kind', m.job_kind,
                       'lease_owner', s.lease_owner,
                       'lease_until', s.lease_until,
                       'max_attempts', m.max_attempts,
                       'overdue_millis', floor(extract(epoch FROM now() - s.lease_until) * 1000::numeric)::bigint)
               ELSE
                   pg_catalog.jsonb_build_object(
                       'action', 'moved_to_dead_letter',
                       'job_id', m.job_id,
                       'attempts', m.attempts,
                       'dead_letter', fn_job_dead_letter_object(d.dead_letter_id, d.job_id, d.attempts,
                                                                d.final_error, d.moved_by, d.moved_at),
                       'job_kind', m.job_kind,
                       'lease_owner', s.lease_owner,
                       'lease_until', s.lease_until,
                       'max_attempts', m.max_attempts,
                       'overdue_millis', floor(extract(epoch FROM now() - s.lease_until) * 1000::numeric)::bigint)
               END AS action,
               m.dead
          FROM moved AS m
          JOIN stale AS s USING (job_id)
          LEFT JOIN dead AS d USING (job_id)
    )
    SELECT pg_catalog.jsonb_build_object(
               'actor', p_actor,
               'refused', false,
               'reset_count', count(*) FILTER (WHERE NOT a.dead),
               'dead_letter_count', count(*) FILTER (WHERE a.dead),
               'actions', coalesce(pg_catalog.jsonb_agg(a.action ORDER BY a.lease_until, a.job_id), '[]'::jsonb))
      INTO v_result
      FROM actions AS a;
    RETURN v_result;
END
$$;
