-- The job reaper's statement returning one row per action instead of one
-- JSON document (docs/performance.md, "Job reaper"), installed by the
-- harness as bench_job_reap_apply_rows to measure what building the JSON
-- report costs. Same locking, re-check, backoff and dead-lettering as
-- fn_job_reap_stale_leases_apply (the product's single-UPDATE statement); the columns are the fields of
-- the report's actions, in the report's order. A daemon would build its
-- job_lease_expired lines from these columns; the JSON form stays for the
-- CLI and for SQL callers.
CREATE OR REPLACE FUNCTION bench_job_reap_apply_rows(p_actor text, p_limit integer DEFAULT 100)
RETURNS TABLE (action text, job_id uuid, job_kind text, attempts integer, max_attempts integer, backoff_sec bigint, scheduled_at timestamptz, lease_owner text, lease_until timestamptz, overdue_millis bigint, dead_letter_id uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_refusal jsonb;
    v_base    bigint;
BEGIN
    IF p_actor IS NULL OR btrim(p_actor) = '' THEN
        RETURN;
    END IF;
    v_refusal := coalesce(fn_job_reaper_limit_refusal(p_limit), fn_job_reaper_gate_refusal());
    IF v_refusal IS NOT NULL THEN
        RETURN;
    END IF;
    v_base := coalesce((SELECT value::bigint FROM queue_setting WHERE key = 'queue.retry.backoff_base_sec'), 10);

    RETURN QUERY
    WITH stale AS (
        SELECT q.job_id, q.lease_owner, q.lease_until, q.max_attempts, q.attempts + 1 AS bumped
          FROM job_queue q
         WHERE q.state = 'leased'
           AND q.lease_until IS NOT NULL
           AND q.lease_until < now()
         ORDER BY q.lease_until, q.job_id
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
         WHERE j.job_id = ANY (ARRAY(SELECT stale.job_id FROM stale))
           AND j.state = 'leased'
           AND j.lease_until < now()
        RETURNING j.job_id AS jid, j.job_kind AS jkind, j.payload, j.attempts AS attempts, j.max_attempts AS max_attempts, j.scheduled_at AS scheduled_at,
                  j.state = 'dead_letter' AS dead
    ),
    dead AS (
        INSERT INTO job_dead_letter (job_id, job_kind, payload, attempts, final_error, moved_by)
        SELECT jid, jkind, payload, attempts, 'lease_expired_reaped_at_max_attempts', p_actor
          FROM moved
         WHERE dead
        RETURNING *
    )
    SELECT CASE WHEN m.dead THEN 'moved_to_dead_letter' ELSE 'reset_to_retry_waiting' END,
           m.jid, m.jkind, m.attempts, m.max_attempts,
           CASE WHEN NOT m.dead THEN v_base * (1::bigint << least(m.attempts - 1, 10)) END,
           m.scheduled_at, s.lease_owner, s.lease_until,
           floor(extract(epoch FROM now() - s.lease_until) * 1000::numeric)::bigint,
           d.dead_letter_id
      FROM moved AS m
      JOIN stale AS s ON s.job_id = m.jid
      LEFT JOIN dead AS d ON d.job_id = m.jid
     ORDER BY s.lease_until, m.jid;

END
$$;
