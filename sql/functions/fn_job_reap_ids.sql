CREATE OR REPLACE FUNCTION fn_job_reap_ids(p_only uuid, p_actor text, p_limit integer, p_base bigint)
 RETURNS jsonb
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
 SET enable_nestloop TO 'off'
AS $function$
DECLARE
    -- The queue records who reaped a job (reaped_by, reaped_by_role): the
    -- stand-in does, a queue adopted as its own tool made it may not. The
    -- two reset statements below differ only in that.
    v_records_reaper boolean := fn_job_queue_has_columns('{reaped_by,reaped_by_role}');
    v_ids     uuid[];
    v_owners  text[];
    v_untils  timestamptz[];
    v_moved   uuid[];
    v_kinds   text[];
    v_tries   integer[];
    v_maxes   integer[];
    v_due     timestamptz[];
    v_id      uuid;
    v_letter  jsonb;
    -- The dead letters' job ids and the function's answers, element by
    -- element: appended in place (an object grown with || would be copied
    -- whole at every job).
    v_dead    uuid[] := '{}';
    v_letters jsonb[] := '{}';
    v_result  jsonb;
BEGIN
    -- The stale jobs, locked, oldest first. A batch (p_only NULL): the
    -- stale index. One job: its primary key. Two branches rather than
    -- "p_only IS NULL OR job_id = p_only", so a cached generic plan serves
    -- both well.
    SELECT pg_catalog.array_agg(s.job_id ORDER BY s.lease_until, s.job_id),
           pg_catalog.array_agg(s.lease_owner::pg_catalog.text ORDER BY s.lease_until, s.job_id),
           pg_catalog.array_agg(s.lease_until ORDER BY s.lease_until, s.job_id)
      INTO v_ids, v_owners, v_untils
      FROM (SELECT b.job_id, b.lease_owner, b.lease_until
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
                       FOR UPDATE SKIP LOCKED) AS o) AS s;

    -- One set-based statement for them all: a job with attempts to spare
    -- goes back to retry_waiting after its backoff; a job at its last
    -- attempt only has its attempts bumped here (it stays leased, its lease
    -- as it was), and is moved below by the queue's own
    -- fn_job_move_to_dead_letter, so its dead letter records the final
    -- count. The state is compared and assigned as string literals, which
    -- a text column and an enum of the queue's states both take.
    IF v_records_reaper THEN
        WITH moved AS (
            UPDATE job_queue AS j
               SET state = CASE WHEN j.attempts >= j.max_attempts - 1
                                THEN j.state ELSE 'retry_waiting' END,
                   attempts = j.attempts + 1,
                   last_error = CASE WHEN j.attempts >= j.max_attempts - 1
                                     THEN j.last_error ELSE 'lease_expired_reaped' END,
                   scheduled_at = CASE WHEN j.attempts >= j.max_attempts - 1
                                       THEN j.scheduled_at
                                       ELSE pg_catalog.now()
                                            + (p_base * (1::pg_catalog.int8 << LEAST(j.attempts, 10)))::pg_catalog.float8
                                              * '1 second'::pg_catalog.interval END,
                   lease_owner = CASE WHEN j.attempts >= j.max_attempts - 1
                                      THEN j.lease_owner END,
                   lease_until = CASE WHEN j.attempts >= j.max_attempts - 1
                                      THEN j.lease_until END,
                   reaped_by = p_actor,
                   reaped_by_role = session_user,
                   updated_at = pg_catalog.now()
             WHERE j.job_id = ANY (v_ids)
               AND j.state = 'leased'
               AND j.lease_until < pg_catalog.now()
            RETURNING j.job_id, j.job_kind, j.attempts, j.max_attempts, j.scheduled_at
        )
        SELECT pg_catalog.array_agg(m.job_id), pg_catalog.array_agg(m.job_kind::pg_catalog.text),
               pg_catalog.array_agg(m.attempts), pg_catalog.array_agg(m.max_attempts),
               pg_catalog.array_agg(m.scheduled_at)
          INTO v_moved, v_kinds, v_tries, v_maxes, v_due
          FROM moved AS m;
    ELSE
        WITH moved AS (
            UPDATE job_queue AS j
               SET state = CASE WHEN j.attempts >= j.max_attempts - 1
                                THEN j.state ELSE 'retry_waiting' END,
                   attempts = j.attempts + 1,
                   last_error = CASE WHEN j.attempts >= j.max_attempts - 1
                                     THEN j.last_error ELSE 'lease_expired_reaped' END,
                   scheduled_at = CASE WHEN j.attempts >= j.max_attempts - 1
                                       THEN j.scheduled_at
                                       ELSE pg_catalog.now()
                                            + (p_base * (1::pg_catalog.int8 << LEAST(j.attempts, 10)))::pg_catalog.float8
                                              * '1 second'::pg_catalog.interval END,
                   lease_owner = CASE WHEN j.attempts >= j.max_attempts - 1
                                      THEN j.lease_owner END,
                   lease_until = CASE WHEN j.attempts >= j.max_attempts - 1
                                      THEN j.lease_until END,
                   updated_at = pg_catalog.now()
             WHERE j.job_id = ANY (v_ids)
               AND j.state = 'leased'
               AND j.lease_until < pg_catalog.now()
            RETURNING j.job_id, j.job_kind, j.attempts, j.max_attempts, j.scheduled_at
        )
        SELECT pg_catalog.array_agg(m.job_id), pg_catalog.array_agg(m.job_kind::pg_catalog.text),
               pg_catalog.array_agg(m.attempts), pg_catalog.array_agg(m.max_attempts),
               pg_catalog.array_agg(m.scheduled_at)
          INTO v_moved, v_kinds, v_tries, v_maxes, v_due
          FROM moved AS m;
    END IF;

    -- The few at their last attempt, oldest first: each moved by the
    -- queue's own function, whose JSON the action carries as its
    -- dead_letter. A refusal (or anything but a JSON object) fails the
    -- call, so nothing of it stays; the apply then reaps one job at a time
    -- and sets that one aside with this message.
    FOR v_id IN
        SELECT m.job_id
          FROM ROWS FROM (pg_catalog.unnest(v_moved), pg_catalog.unnest(v_tries), pg_catalog.unnest(v_maxes)) AS m (job_id, attempts, max_attempts)
          JOIN ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_untils)) AS s (job_id, lease_until) USING (job_id)
         WHERE m.attempts >= m.max_attempts
         ORDER BY s.lease_until, m.job_id
    LOOP
        v_letter := fn_job_move_to_dead_letter(v_id, 'lease_expired_reaped_at_max_attempts', p_actor);
        IF v_letter IS NULL OR pg_catalog.jsonb_typeof(v_letter) <> 'object'
           OR (v_letter ->> 'refused') = 'true' THEN
            RAISE EXCEPTION 'fn_job_move_to_dead_letter did not move job % to the dead-letter table: %',
                v_id, COALESCE(v_letter::pg_catalog.text, 'NULL')
                USING ERRCODE = '55000';
        END IF;
        v_dead := pg_catalog.array_append(v_dead, v_id);
        v_letters := pg_catalog.array_append(v_letters, v_letter);
    END LOOP;

    SELECT pg_catalog.jsonb_build_object(
               'actor', p_actor,
               'refused', false,
               'reset_count', pg_catalog.count(*) FILTER (WHERE NOT a.dead),
               'dead_letter_count', pg_catalog.count(*) FILTER (WHERE a.dead),
               'actions', COALESCE(pg_catalog.jsonb_agg(a.action ORDER BY a.lease_until, a.job_id), '[]'::pg_catalog.jsonb))
      INTO v_result
      FROM (SELECT s.lease_until, m.job_id, m.attempts >= m.max_attempts AS dead,
                   CASE WHEN m.attempts < m.max_attempts THEN
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
                           'dead_letter', d.letter,
                           'job_kind', m.job_kind,
                           'lease_owner', s.lease_owner,
                           'lease_until', s.lease_until,
                           'max_attempts', m.max_attempts,
                           'overdue_millis', lease_overdue_millis(s.lease_until, pg_catalog.now()))
                   END AS action
              FROM ROWS FROM (pg_catalog.unnest(v_moved), pg_catalog.unnest(v_kinds), pg_catalog.unnest(v_tries), pg_catalog.unnest(v_maxes), pg_catalog.unnest(v_due))
                       AS m (job_id, job_kind, attempts, max_attempts, scheduled_at)
              JOIN ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_owners), pg_catalog.unnest(v_untils))
                       AS s (job_id, lease_owner, lease_until) USING (job_id)
              LEFT JOIN ROWS FROM (pg_catalog.unnest(v_dead), pg_catalog.unnest(v_letters))
                       AS d (job_id, letter) USING (job_id)) AS a;
    RETURN v_result;
END
$function$;

REVOKE ALL ON FUNCTION fn_job_reap_ids(uuid, text, integer, bigint) FROM PUBLIC;
