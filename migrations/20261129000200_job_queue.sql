-- Job leases: the job-queue substrate, its operator gates and the stale-lease
-- reaper (SPEC §4, reference 000_cf5dfb35a80fe781).
--
-- Workers enqueue, claim (a lease of queue.lease.duration_sec), heartbeat and
-- complete jobs through the fn_job_* functions. A lease that runs out while
-- its job is still 'leased' is stale: its worker died, paused or was cut off.
-- The reaper returns stale jobs to 'retry_waiting' with exponential backoff,
-- or dead-letters them at their last attempt, but only when three operator
-- gates in queue_setting allow it; a read-only dry run is always available.
-- Gates change only through fn_queue_setting_set, which validates and audits.
--
-- Privileges: functions that can change data on behalf of a caller who holds
-- no table privileges (the setter and the reaper's apply) are SECURITY
-- DEFINER with a pinned search_path (pg_temp last, so no temporary object can
-- shadow a table or function) and are not executable by PUBLIC; the owner
-- grants EXECUTE to the roles that need it (docs/sql-api.md). Everything else
-- is SECURITY INVOKER and needs the caller's own table privileges.
--
-- A pinned search_path is not enough on its own: PostgreSQL prefers a better
-- matching overload in a later schema to pg_catalog's variadic, polymorphic
-- or coercing one, so a role that may CREATE in public (every database
-- created before PostgreSQL 15) could slip its own jsonb_build_object(text,
-- …) or *(bigint, interval) into the definer's call tree. So every call in
-- this file is either schema-qualified (pg_catalog.jsonb_build_object,
-- pg_catalog.jsonb_agg) or written with operand types that match a
-- pg_catalog operator exactly (float8 * interval, numeric * numeric), where
-- the earlier schema wins.

CREATE TABLE job_queue (
    job_id       uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    job_kind     text        NOT NULL CHECK (job_kind <> ''),
    payload      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    state        text        NOT NULL DEFAULT 'queued'
                 CHECK (state IN ('queued', 'leased', 'retry_waiting', 'succeeded', 'dead_letter')),
    -- Attempts that have ended (by a reap or a dead-letter move). A claim
    -- starts an attempt without counting it; the reaper counts the one whose
    -- lease ran out.
    attempts     integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts integer     NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 1000),
    -- Not claimable before this (the retry backoff moves it forward).
    scheduled_at timestamptz NOT NULL DEFAULT now(),
    lease_owner  text,
    lease_until  timestamptz,
    last_error   text,
    metadata     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    -- A leased job always has an owner and a deadline (otherwise it could
    -- never go stale and would be stuck), and only a leased job has them.
    CONSTRAINT job_queue_lease_consistent CHECK (
        CASE WHEN state = 'leased'
             THEN lease_owner IS NOT NULL AND lease_until IS NOT NULL
             ELSE lease_owner IS NULL AND lease_until IS NULL
        END)
);

-- The reaper's scan: state='leased' AND lease_until < now(), oldest first.
CREATE INDEX job_queue_lease_until_idx ON job_queue (lease_until) WHERE state = 'leased';
-- The claim's scan: claimable jobs in schedule order.
CREATE INDEX job_queue_claimable_idx ON job_queue (scheduled_at)
    WHERE state IN ('queued', 'retry_waiting');

-- Jobs that will not be retried. The job_queue row stays (state
-- 'dead_letter') so the job's history is in one place; this table is what an
-- operator inspects and re-drives from.
CREATE TABLE job_dead_letter (
    dead_letter_id uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    job_id         uuid        NOT NULL,
    job_kind       text        NOT NULL,
    payload        jsonb       NOT NULL,
    attempts       integer     NOT NULL,
    final_error    text        NOT NULL,
    -- The actor the caller named, and the database role that made the call
    -- (an actor name is the caller's word; the role is not).
    moved_by       text        NOT NULL,
    moved_by_role  text        NOT NULL DEFAULT session_user,
    moved_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_dead_letter_job_idx ON job_dead_letter (job_id);

-- Operator settings, text-valued; fn_queue_setting_set is the only writer
-- meant for people, and it keeps each value well-typed.
CREATE TABLE queue_setting (
    key        text        PRIMARY KEY,
    value      text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text        NOT NULL
);

INSERT INTO queue_setting (key, value, updated_by) VALUES
    ('queue.job_substrate.enabled',      'false', 'migration'),
    ('queue.lease.reaper_enabled',       'false', 'migration'),
    ('queue.lease.reaper_dry_run_only',  'true',  'migration'),
    ('queue.retry.backoff_base_sec',     '10',    'migration'),
    ('queue.lease.duration_sec',         '300',   'migration');

CREATE TABLE queue_setting_audit (
    audit_id   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key        text        NOT NULL,
    old_value  text,
    new_value  text        NOT NULL,
    actor      text        NOT NULL,
    -- The database role behind the actor name.
    changed_by_role text   NOT NULL DEFAULT session_user,
    changed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX queue_setting_audit_key_idx ON queue_setting_audit (key, changed_at);

-- The only data-changing paths for callers without table privileges are the
-- definer functions below; tables carry no PUBLIC privileges.
REVOKE ALL ON job_queue, job_dead_letter, queue_setting, queue_setting_audit FROM PUBLIC;

-- Changes one setting: rejects unknown keys, ill-typed values and an empty
-- actor (SQLSTATE 22023 with a message naming the problem), stores the value
-- in canonical form and records old value, new value, actor, role and time.
-- Returns {"key", "old_value", "value", "updated_by", "updated_at"}.
CREATE FUNCTION fn_queue_setting_set(p_key text, p_value text, p_actor text)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    v_value text := btrim(p_value);
    v_old   text;
    v_row   queue_setting;
BEGIN
    IF p_actor IS NULL OR btrim(p_actor) = '' THEN
        RAISE EXCEPTION 'fn_queue_setting_set: actor is required (who is changing %?)', coalesce(p_key, 'the setting')
            USING ERRCODE = '22023';
    END IF;
    IF p_value IS NULL THEN
        RAISE EXCEPTION 'fn_queue_setting_set: value for % must not be NULL', coalesce(p_key, 'the setting')
            USING ERRCODE = '22023';
    END IF;
    CASE p_key
    WHEN 'queue.job_substrate.enabled', 'queue.lease.reaper_enabled', 'queue.lease.reaper_dry_run_only' THEN
        IF v_value NOT IN ('true', 'false') THEN
            RAISE EXCEPTION 'fn_queue_setting_set: % is a boolean and must be true or false, got "%"', p_key, p_value
                USING ERRCODE = '22023';
        END IF;
    WHEN 'queue.retry.backoff_base_sec', 'queue.lease.duration_sec' THEN
        -- 1 s to 1 day. At most 5 digits before the cast, so no overflow.
        IF v_value !~ '^[0-9]{1,5}$' OR v_value::integer NOT BETWEEN 1 AND 86400 THEN
            RAISE EXCEPTION 'fn_queue_setting_set: % is a whole number of seconds from 1 to 86400, got "%"', p_key, p_value
                USING ERRCODE = '22023';
        END IF;
        v_value := v_value::integer::text;  -- canonical: no leading zeros
    ELSE
        RAISE EXCEPTION 'fn_queue_setting_set: unknown setting key "%"; known keys: queue.job_substrate.enabled, queue.lease.reaper_enabled, queue.lease.reaper_dry_run_only, queue.retry.backoff_base_sec, queue.lease.duration_sec', p_key
            USING ERRCODE = '22023';
    END CASE;

    SELECT value INTO v_old FROM queue_setting WHERE key = p_key FOR UPDATE;
    INSERT INTO queue_setting AS s (key, value, updated_at, updated_by)
    VALUES (p_key, v_value, now(), p_actor)
    ON CONFLICT (key) DO UPDATE
        SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by
    RETURNING s.* INTO v_row;
    INSERT INTO queue_setting_audit (key, old_value, new_value, actor)
    VALUES (p_key, v_old, v_value, p_actor);
    RETURN pg_catalog.jsonb_build_object(
        'key', v_row.key,
        'old_value', v_old,
        'value', v_row.value,
        'updated_by', v_row.updated_by,
        'updated_at', v_row.updated_at);
END
$$;
REVOKE ALL ON FUNCTION fn_queue_setting_set(text, text, text) FROM PUBLIC;

-- Why the reaper's apply would be refused right now, by the three gates in
-- their fixed order, or NULL when all three allow it. A missing setting
-- counts as closed. Shared by apply and the daemon, so the gate rule lives in
-- one place.
CREATE FUNCTION fn_job_reaper_gate_refusal()
RETURNS jsonb
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT CASE
        WHEN coalesce((SELECT value FROM queue_setting WHERE key = 'queue.job_substrate.enabled'), 'false') <> 'true'
            THEN '{"reason": "queue.job_substrate.enabled=false", "refused": true}'::jsonb
        WHEN coalesce((SELECT value FROM queue_setting WHERE key = 'queue.lease.reaper_enabled'), 'false') <> 'true'
            THEN '{"reason": "queue.lease.reaper_enabled=false", "refused": true}'::jsonb
        WHEN coalesce((SELECT value FROM queue_setting WHERE key = 'queue.lease.reaper_dry_run_only'), 'true') <> 'false'
            THEN '{"reason": "queue.lease.reaper_dry_run_only=true", "refused": true}'::jsonb
    END
$$;

-- The refusal for a p_limit outside 1..10000 (both reaper functions).
CREATE FUNCTION fn_job_reaper_limit_refusal(p_limit integer)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT CASE WHEN p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        pg_catalog.jsonb_build_object('reason', 'limit_out_of_range', 'refused', true,
                           'limit', p_limit, 'limit_min', 1, 'limit_max', 10000)
    END
$$;

-- The dead_letter object of a move, the same from fn_job_move_to_dead_letter
-- and from the reaper's apply.
CREATE FUNCTION fn_job_dead_letter_object(p_dead_letter_id uuid, p_job_id uuid, p_attempts integer,
                                          p_final_error text, p_moved_by text, p_moved_at timestamptz)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT pg_catalog.jsonb_build_object(
        'dead_letter_id', p_dead_letter_id,
        'job_id', p_job_id,
        'state', 'dead_letter',
        'refused', false,
        'attempts', p_attempts,
        'final_error', p_final_error,
        'moved_by', p_moved_by,
        'moved_at', p_moved_at)
$$;

-- Queues a job for immediate claiming. Allowed while the substrate gate is
-- off, so producers can fill the queue before workers are enabled.
CREATE FUNCTION fn_job_enqueue(p_job_kind text, p_payload jsonb DEFAULT '{}'::jsonb,
                               p_max_attempts integer DEFAULT 5)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_job_id uuid;
BEGIN
    IF p_job_kind IS NULL OR p_job_kind = '' THEN
        RAISE EXCEPTION 'fn_job_enqueue: job kind must be a non-empty string' USING ERRCODE = '22023';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'fn_job_enqueue: max attempts must be from 1 to 1000, got %', p_max_attempts
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO job_queue (job_kind, payload, max_attempts)
    VALUES (p_job_kind, coalesce(p_payload, '{}'::jsonb), p_max_attempts)
    RETURNING job_id INTO v_job_id;
    RETURN v_job_id;
END
$$;

-- Leases up to p_limit claimable jobs (queued or retry_waiting and due), of
-- the given kinds or any kind when p_job_kinds is NULL, to p_worker until
-- now() + queue.lease.duration_sec. Jobs another worker is claiming are
-- skipped, never waited on. Refuses (SQLSTATE 55000) while
-- queue.job_substrate.enabled is not true. Returns the leased rows.
CREATE FUNCTION fn_job_claim(p_worker text, p_job_kinds text[] DEFAULT NULL, p_limit integer DEFAULT 1)
RETURNS SETOF job_queue
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_duration integer;
BEGIN
    IF p_worker IS NULL OR btrim(p_worker) = '' THEN
        RAISE EXCEPTION 'fn_job_claim: worker is required' USING ERRCODE = '22023';
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'fn_job_claim: limit must be from 1 to 10000, got %', p_limit USING ERRCODE = '22023';
    END IF;
    IF coalesce((SELECT value FROM queue_setting WHERE key = 'queue.job_substrate.enabled'), 'false') <> 'true' THEN
        RAISE EXCEPTION 'fn_job_claim: refused: queue.job_substrate.enabled=false' USING ERRCODE = '55000';
    END IF;
    v_duration := coalesce((SELECT value::integer FROM queue_setting WHERE key = 'queue.lease.duration_sec'), 300);
    RETURN QUERY
    WITH picked AS (
        SELECT job_id
          FROM job_queue
         WHERE state IN ('queued', 'retry_waiting')
           AND scheduled_at <= now()
           AND (p_job_kinds IS NULL OR job_kind = ANY (p_job_kinds))
         ORDER BY scheduled_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    )
    UPDATE job_queue AS j
       SET state = 'leased',
           lease_owner = p_worker,
           lease_until = now() + v_duration::float8 * interval '1 second',
           updated_at = now()
      FROM picked
     WHERE j.job_id = picked.job_id
    RETURNING j.*;
END
$$;

-- Extends the lease of a job p_worker holds by queue.lease.duration_sec from
-- now. Returns the new lease_until, or NULL when the worker no longer holds a
-- live lease on it (expired, reaped, completed or someone else's): the
-- worker has lost the job and must stop.
CREATE FUNCTION fn_job_heartbeat(p_job_id uuid, p_worker text)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_until timestamptz;
BEGIN
    UPDATE job_queue
       SET lease_until = now() + coalesce((SELECT value::integer FROM queue_setting
                                            WHERE key = 'queue.lease.duration_sec'), 300)::float8 * interval '1 second',
           updated_at = now()
     WHERE job_id = p_job_id
       AND state = 'leased'
       AND lease_owner = p_worker
       AND lease_until >= now()
    RETURNING lease_until INTO v_until;
    RETURN v_until;
END
$$;

-- Marks a job p_worker holds as succeeded and clears its lease. Accepted even
-- after the lease ran out as long as no reaper has acted yet (the work is
-- done; redoing it helps nobody). Returns false when the worker does not hold
-- the job (reaped, re-leased, completed or unknown).
CREATE FUNCTION fn_job_complete(p_job_id uuid, p_worker text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    UPDATE job_queue
       SET state = 'succeeded',
           lease_owner = NULL,
           lease_until = NULL,
           last_error = NULL,
           updated_at = now()
     WHERE job_id = p_job_id
       AND state = 'leased'
       AND lease_owner = p_worker;
    RETURN FOUND;
END
$$;

-- Moves one not-yet-finished job (queued, leased or retry_waiting) to the
-- dead-letter table as it stands (attempts are not bumped here), records the
-- final error and who moved it, and returns the dead_letter object
-- {"dead_letter_id", "job_id", "state": "dead_letter", "refused": false,
-- "attempts", "final_error", "moved_by", "moved_at"}. Refusals:
-- actor_required, job_not_found, job_not_movable (with the job's "state").
CREATE FUNCTION fn_job_move_to_dead_letter(p_job_id uuid, p_final_error text, p_actor text)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_job  job_queue;
    v_dead job_dead_letter;
BEGIN
    IF p_actor IS NULL OR btrim(p_actor) = '' THEN
        RETURN '{"reason": "actor_required", "refused": true}'::jsonb;
    END IF;
    SELECT * INTO v_job FROM job_queue WHERE job_id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN pg_catalog.jsonb_build_object('reason', 'job_not_found', 'refused', true, 'job_id', p_job_id);
    END IF;
    IF v_job.state NOT IN ('queued', 'leased', 'retry_waiting') THEN
        RETURN pg_catalog.jsonb_build_object('reason', 'job_not_movable', 'refused', true,
                                  'job_id', p_job_id, 'state', v_job.state);
    END IF;
    UPDATE job_queue
       SET state = 'dead_letter',
           last_error = coalesce(p_final_error, 'moved_to_dead_letter'),
           lease_owner = NULL,
           lease_until = NULL,
           updated_at = now()
     WHERE job_id = p_job_id;
    INSERT INTO job_dead_letter (job_id, job_kind, payload, attempts, final_error, moved_by)
    VALUES (v_job.job_id, v_job.job_kind, v_job.payload, v_job.attempts,
            coalesce(p_final_error, 'moved_to_dead_letter'), p_actor)
    RETURNING * INTO v_dead;
    RETURN fn_job_dead_letter_object(v_dead.dead_letter_id, v_dead.job_id, v_dead.attempts,
                                     v_dead.final_error, v_dead.moved_by, v_dead.moved_at);
END
$$;

-- What the reaper would do now, without doing it. Always available; STABLE,
-- so PostgreSQL itself rejects any write it might attempt. stale_lease_count
-- is every stale lease; jobs[] lists the p_limit oldest.
CREATE FUNCTION fn_job_reap_stale_leases_dry_run(p_limit integer DEFAULT 100)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    v_refusal jsonb := fn_job_reaper_limit_refusal(p_limit);
BEGIN
    IF v_refusal IS NOT NULL THEN
        RETURN v_refusal;
    END IF;
    RETURN pg_catalog.jsonb_build_object(
        'evaluated_at', now(),
        'stale_lease_count', (SELECT count(*)
                                FROM job_queue
                               WHERE state = 'leased'
                                 AND lease_until IS NOT NULL
                                 AND lease_until < now()),
        'limit', p_limit,
        'mutation', false,
        'jobs', coalesce((
            SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                       'job_id', s.job_id,
                       'job_kind', s.job_kind,
                       'lease_owner', s.lease_owner,
                       'lease_until', s.lease_until,
                       'attempts', s.attempts,
                       'max_attempts', s.max_attempts,
                       'overdue_seconds', floor(extract(epoch FROM now() - s.lease_until))::bigint,
                       'would_action', CASE WHEN s.attempts + 1 >= s.max_attempts
                                            THEN 'move_to_dead_letter'
                                            ELSE 'reset_to_retry_waiting' END)
                       ORDER BY s.lease_until, s.job_id)
              FROM (SELECT job_id, job_kind, lease_owner, lease_until, attempts, max_attempts
                      FROM job_queue
                     WHERE state = 'leased'
                       AND lease_until IS NOT NULL
                       AND lease_until < now()
                     ORDER BY lease_until, job_id
                     LIMIT p_limit) AS s),
            '[]'::jsonb));
END
$$;

-- Reaps up to p_limit stale leases, oldest first, in one set-based statement:
-- lock the stale rows (FOR UPDATE SKIP LOCKED, so concurrent reapers split
-- the work and a job a worker is completing is skipped, not waited on),
-- re-check the stale predicate on the locked row versions, reset the
-- retryable ones and dead-letter the last-attempt ones in ONE update found by
-- primary key (job_id = ANY(ARRAY(...))), and aggregate the report once.
-- (A row loop appending to a jsonb array is quadratic: SPEC §6. Two UPDATEs
-- joined to `stale` were planned as hash joins over a sequential scan of the
-- whole job_queue each, which grows with every finished job kept:
-- docs/performance.md, 33 -> 28 µs per job at 100,000.)
--
-- Refusals, in this order: actor_required; limit_out_of_range; the gates
-- (fn_job_reaper_gate_refusal). Reset: attempts+1, last_error
-- 'lease_expired_reaped', lease cleared, scheduled_at = now() + backoff_sec
-- where backoff_sec = queue.retry.backoff_base_sec * 2^min(attempts-1, 10)
-- on the bumped attempts. Dead letter when attempts + 1 >= max_attempts:
-- attempts bumped first, final_error 'lease_expired_reaped_at_max_attempts'.
-- Each action also carries job_kind, lease_owner, lease_until, max_attempts
-- and overdue_millis for the daemon's job_lease_expired line.
CREATE FUNCTION fn_job_reap_stale_leases_apply(p_actor text, p_limit integer DEFAULT 100)
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
REVOKE ALL ON FUNCTION fn_job_reap_stale_leases_apply(text, integer) FROM PUBLIC;
