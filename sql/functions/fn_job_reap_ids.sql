CREATE OR REPLACE FUNCTION fn_job_reap_ids(p_only uuid, p_actor text, p_limit integer, p_base bigint)
 RETURNS jsonb
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
 SET enable_nestloop TO 'off'
AS $function$
DECLARE
    v_result jsonb;
BEGIN
    WITH stale AS (
        -- A batch (p_only NULL): the stale index, oldest first. One job: its
        -- primary key. Two branches rather than "p_only IS NULL OR job_id =
        -- p_only", so a cached generic plan serves both well.
        SELECT b.job_id, b.lease_owner, b.lease_until
          FROM (SELECT j.job_id, j.lease_owner, j.lease_until
                  FROM job_queue AS j
                 WHERE p_only IS NULL
                   AND j.state = 'leased'
                   AND j.lease_until IS NOT NULL
                   AND j.lease_until < pg_catalog.now()
                 ORDER BY j.lease_until, j.job_id
                 LIMIT p_limit
                   FOR UPDATE SKIP LOCKED) AS b
        UNION ALL
        SELECT o.job_id, o.lease_owner, o.lease_until
          FROM (SELECT j.job_id, j.lease_owner, j.lease_until
                  FROM job_queue AS j
                 WHERE j.job_id = p_only
                   AND j.state = 'leased'
                   AND j.lease_until < pg_catalog.now()
                   FOR UPDATE SKIP LOCKED) AS o
    ),
    moved AS (
        UPDATE job_queue AS j
           SET state = CASE WHEN j.attempts >= j.max_attempts - 1
                            THEN 'dead_letter' ELSE 'retry_waiting' END,
               attempts = j.attempts + 1,
               last_error = CASE WHEN j.attempts >= j.max_attempts - 1
                                 THEN 'lease_expired_reaped_at_max_attempts'
                                 ELSE 'lease_expired_reaped' END,
               scheduled_at = CASE WHEN j.attempts >= j.max_attempts - 1
                                   THEN j.scheduled_at
                                   ELSE pg_catalog.now()
                                        + (p_base * (1::pg_catalog.int8 << LEAST(j.attempts, 10)))::pg_catalog.float8
                                          * '1 second'::pg_catalog.interval END,
               lease_owner = NULL,
               lease_until = NULL,
               reaped_by = p_actor,
               reaped_by_role = session_user,
               updated_at = pg_catalog.now()
         WHERE j.job_id = ANY (ARRAY(SELECT s.job_id FROM stale AS s))
           AND j.state = 'leased'
           AND j.lease_until < pg_catalog.now()
        RETURNING j.job_id, j.job_kind, j.payload, j.attempts, j.max_attempts, j.scheduled_at,
                  j.state = 'dead_letter' AS dead
    ),
    dead AS (
        INSERT INTO job_dead_letter (job_id, job_kind, payload, attempts, final_error, moved_by)
        SELECT m.job_id, m.job_kind, m.payload, m.attempts, 'lease_expired_reaped_at_max_attempts', p_actor
          FROM moved AS m
         WHERE m.dead
        RETURNING *
    ),
    actions AS (
        SELECT s.lease_until, m.job_id,
               CASE WHEN NOT m.dead THEN
                   pg_catalog.jsonb_build_object(
                       'action', 'reset_to_retry_waiting',
                       'job_id', m.job_id,
                       'attempts', m.attempts,
                       'backoff_sec', p_base * (1::pg_catalog.int8 << LEAST(m.attempts - 1, 10)),
                       'scheduled_at', m.scheduled_at,
                       'job_kind', m.job_kind,
                       'lease_owner', s.lease_owner,
                       'lease_until', s.lease_until,
                       'max_attempts', m.max_attempts,
                       'overdue_millis', lease_overdue_millis(s.lease_until, pg_catalog.now()))
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
                       'overdue_millis', lease_overdue_millis(s.lease_until, pg_catalog.now()))
               END AS action,
               m.dead
          FROM moved AS m
          JOIN stale AS s USING (job_id)
          LEFT JOIN dead AS d USING (job_id)
    )
    SELECT pg_catalog.jsonb_build_object(
               'actor', p_actor,
               'refused', false,
               'reset_count', pg_catalog.count(*) FILTER (WHERE NOT a.dead),
               'dead_letter_count', pg_catalog.count(*) FILTER (WHERE a.dead),
               'actions', COALESCE(pg_catalog.jsonb_agg(a.action ORDER BY a.lease_until, a.job_id), '[]'::pg_catalog.jsonb))
      INTO v_result
      FROM actions AS a;
    RETURN v_result;
END
$function$;

REVOKE ALL ON FUNCTION fn_job_reap_ids(uuid, text, integer, bigint) FROM PUBLIC;
