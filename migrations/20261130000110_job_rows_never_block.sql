-- Job leases: no row can stop the reaper, the dry run or the stale gauge,
-- and every change of a queue setting is audited (issue 11).
--
-- Before this migration one stale job at attempts = 2147483647 made every
-- apply fail ("integer out of range"), so no stale job was reaped at all; a
-- lease_until of -infinity broke the apply, the dry run and the gauge the
-- same way; a non-numeric queue.retry.backoff_base_sec written straight into
-- queue_setting broke every apply; and a direct UPDATE of queue_setting was
-- not audited.
--
-- Refused at the door (named CHECK constraints; a database already holding
-- such rows gets an error naming them and the fix before any is added):
--   job_queue_lease_until_finite            lease_until is NULL or finite
--   job_queue_attempts_at_most_1000000      0 <= attempts <= 1,000,000 (max_attempts
--                                           is already 1..1000; the bound leaves
--                                           attempts + 1 far from overflow)
--   queue_setting_boolean_is_true_or_false  the three gates
--   queue_setting_seconds_from_1_to_86400   backoff base and lease duration
-- Handled: overdue values are total (lease_overdue_millis, 20261130000100):
-- a -infinity lease_until reports overdue_millis = i64::MAX and
-- overdue_seconds = i64::MAX. Set aside: a row that still fails inside apply
-- or the dry run (a trigger, a constraint dropped by hand) is skipped, every
-- other row is handled, and the report carries "set_aside": [{job_id,
-- job_kind, lease_owner, error}] (the key is present only when a row was set
-- aside, so reports without one keep their shape exactly).

DO $$
DECLARE
    v_n    bigint;
    v_rows text;
BEGIN
    SELECT pg_catalog.count(*) INTO v_n FROM job_queue AS j WHERE NOT pg_catalog.isfinite(j.lease_until);
    IF v_n > 0 THEN
        SELECT pg_catalog.string_agg(pg_catalog.format('%s (lease_until %s)', s.job_id, s.lease_until), ', ')
          INTO v_rows
          FROM (SELECT j.job_id, j.lease_until FROM job_queue AS j
                 WHERE NOT pg_catalog.isfinite(j.lease_until) ORDER BY j.job_id LIMIT 5) AS s;
        RAISE EXCEPTION 'job_queue holds % job(s) with an infinite lease_until, which the reaper cannot report (first 5 by job_id: %); fix: UPDATE job_queue SET lease_until = now() WHERE NOT isfinite(lease_until); (the reaper then reaps them as stale) then run lease-sweeper migrate again', v_n, v_rows
            USING ERRCODE = '23514', HINT = 'UPDATE job_queue SET lease_until = now() WHERE NOT isfinite(lease_until);';
    END IF;
    SELECT pg_catalog.count(*) INTO v_n FROM job_queue AS j WHERE j.attempts > 1000000;
    IF v_n > 0 THEN
        SELECT pg_catalog.string_agg(pg_catalog.format('%s (attempts %s)', s.job_id, s.attempts), ', ')
          INTO v_rows
          FROM (SELECT j.job_id, j.attempts FROM job_queue AS j
                 WHERE j.attempts > 1000000 ORDER BY j.job_id LIMIT 5) AS s;
        RAISE EXCEPTION 'job_queue holds % job(s) with attempts above 1000000 (first 5 by job_id: %); fix: UPDATE job_queue SET attempts = max_attempts WHERE attempts > 1000000; then run lease-sweeper migrate again', v_n, v_rows
            USING ERRCODE = '23514', HINT = 'UPDATE job_queue SET attempts = max_attempts WHERE attempts > 1000000;';
    END IF;
    SELECT pg_catalog.count(*),
           pg_catalog.string_agg(pg_catalog.format('%s = %L', q.key, q.value), ', ')
      INTO v_n, v_rows
      FROM queue_setting AS q
     WHERE (q.key IN ('queue.job_substrate.enabled', 'queue.lease.reaper_enabled', 'queue.lease.reaper_dry_run_only')
            AND q.value NOT IN ('true', 'false'))
        OR (q.key IN ('queue.retry.backoff_base_sec', 'queue.lease.duration_sec')
            AND NOT CASE WHEN q.value ~ '^[0-9]{1,5}$' THEN q.value::pg_catalog.int4 BETWEEN 1 AND 86400 ELSE false END);
    IF v_n > 0 THEN
        RAISE EXCEPTION 'queue_setting holds % ill-typed value(s): %; fix: set each again through the validating setter, e.g. SELECT fn_queue_setting_set(''queue.retry.backoff_base_sec'', ''10'', ''<your name>''); (gates are true or false, seconds are 1 to 86400), then run lease-sweeper migrate again', v_n, v_rows
            USING ERRCODE = '23514';
    END IF;
END
$$;

ALTER TABLE job_queue ADD CONSTRAINT job_queue_lease_until_finite
    CHECK (pg_catalog.isfinite(lease_until)) NOT VALID;
ALTER TABLE job_queue VALIDATE CONSTRAINT job_queue_lease_until_finite;
ALTER TABLE job_queue ADD CONSTRAINT job_queue_attempts_at_most_1000000
    CHECK (attempts <= 1000000) NOT VALID;
ALTER TABLE job_queue VALIDATE CONSTRAINT job_queue_attempts_at_most_1000000;
ALTER TABLE queue_setting ADD CONSTRAINT queue_setting_boolean_is_true_or_false
    CHECK (key NOT IN ('queue.job_substrate.enabled', 'queue.lease.reaper_enabled', 'queue.lease.reaper_dry_run_only')
           OR value IN ('true', 'false'));
ALTER TABLE queue_setting ADD CONSTRAINT queue_setting_seconds_from_1_to_86400
    CHECK (key NOT IN ('queue.retry.backoff_base_sec', 'queue.lease.duration_sec')
           OR CASE WHEN value ~ '^[0-9]{1,5}$' THEN value::integer BETWEEN 1 AND 86400 ELSE false END);

-- Who reaped a job last: apply's resets used to record no actor (dead
-- letters always had moved_by / moved_by_role).
ALTER TABLE job_queue ADD COLUMN reaped_by text, ADD COLUMN reaped_by_role text;

-- Every change of a setting is audited, whoever makes it and however: the
-- setter, a direct INSERT/UPDATE/DELETE by the owner, a migration. The actor
-- is the setter's p_actor (passed in a transaction-local setting that the
-- setter clears again), else "direct <op> by <role>"; changed_by_role is
-- always the session's role. new_value NULL means the row was deleted.
ALTER TABLE queue_setting_audit ALTER COLUMN new_value DROP NOT NULL;

CREATE FUNCTION queue_setting_audit_change() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    v_actor text := NULLIF(pg_catalog.current_setting('lease_sweeper.setting_actor', true), '');
BEGIN
    IF v_actor IS NULL THEN
        v_actor := pg_catalog.format('direct %s by %s', pg_catalog.lower(TG_OP), session_user);
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO queue_setting_audit (key, old_value, new_value, actor, changed_by_role)
        VALUES (NEW.key, NULL, NEW.value, v_actor, session_user);
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO queue_setting_audit (key, old_value, new_value, actor, changed_by_role)
        VALUES (NEW.key, OLD.value, NEW.value, v_actor, session_user);
    ELSE
        INSERT INTO queue_setting_audit (key, old_value, new_value, actor, changed_by_role)
        VALUES (OLD.key, OLD.value, NULL, v_actor, session_user);
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION queue_setting_audit_change() FROM PUBLIC;

CREATE TRIGGER queue_setting_audited
    AFTER INSERT OR UPDATE OR DELETE ON queue_setting
    FOR EACH ROW EXECUTE FUNCTION queue_setting_audit_change();

-- The setter: as before (20261129000200), but the audit row is written by
-- the trigger, with this call's actor.
CREATE OR REPLACE FUNCTION fn_queue_setting_set(p_key text, p_value text, p_actor text)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    v_value text := pg_catalog.btrim(p_value);
    v_old   text;
    v_row   queue_setting;
BEGIN
    IF p_actor IS NULL OR pg_catalog.btrim(p_actor) = '' THEN
        RAISE EXCEPTION 'fn_queue_setting_set: actor is required (who is changing %?)', COALESCE(p_key, 'the setting')
            USING ERRCODE = '22023';
    END IF;
    IF p_value IS NULL THEN
        RAISE EXCEPTION 'fn_queue_setting_set: value for % must not be NULL', COALESCE(p_key, 'the setting')
            USING ERRCODE = '22023';
    END IF;
    CASE p_key
    WHEN 'queue.job_substrate.enabled', 'queue.lease.reaper_enabled', 'queue.lease.reaper_dry_run_only' THEN
        IF v_value NOT IN ('true', 'false') THEN
            RAISE EXCEPTION 'fn_queue_setting_set: % is a boolean and must be true or false, got "%"', p_key, p_value
                USING ERRCODE = '22023';
        END IF;
    WHEN 'queue.retry.backoff_base_sec', 'queue.lease.duration_sec' THEN
        IF v_value !~ '^[0-9]{1,5}$' OR v_value::integer NOT BETWEEN 1 AND 86400 THEN
            RAISE EXCEPTION 'fn_queue_setting_set: % is a whole number of seconds from 1 to 86400, got "%"', p_key, p_value
                USING ERRCODE = '22023';
        END IF;
        v_value := v_value::integer::text;
    ELSE
        RAISE EXCEPTION 'fn_queue_setting_set: unknown setting key "%"; known keys: queue.job_substrate.enabled, queue.lease.reaper_enabled, queue.lease.reaper_dry_run_only, queue.retry.backoff_base_sec, queue.lease.duration_sec', p_key
            USING ERRCODE = '22023';
    END CASE;

    SELECT q.value INTO v_old FROM queue_setting AS q WHERE q.key = p_key FOR UPDATE;
    PERFORM pg_catalog.set_config('lease_sweeper.setting_actor', p_actor, true);
    INSERT INTO queue_setting AS s (key, value, updated_at, updated_by)
    VALUES (p_key, v_value, pg_catalog.now(), p_actor)
    ON CONFLICT (key) DO UPDATE
        SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by
    RETURNING s.* INTO v_row;
    PERFORM pg_catalog.set_config('lease_sweeper.setting_actor', '', true);
    RETURN pg_catalog.jsonb_build_object(
        'key', v_row.key,
        'old_value', v_old,
        'value', v_row.value,
        'updated_by', v_row.updated_by,
        'updated_at', v_row.updated_at);
END
$$;

-- Reaps up to p_limit stale jobs (only job p_only when it is not NULL),
-- oldest first, in ONE set-based statement, and returns apply's report
-- {"actor", "refused": false, "reset_count", "dead_letter_count", "actions"}
-- (built once here: concatenating a 10,000-action report costs a copy). The shape is
-- 20261129000200's: stale rows locked FOR UPDATE SKIP LOCKED, re-checked and
-- updated by primary key (job_id = ANY(ARRAY(...))), the report aggregated
-- once. Rules as in 20261129000200 (backoff, dead letter at attempts + 1 >=
-- max_attempts with attempts bumped first), plus reaped_by/_role. Internal:
-- called by apply only (not executable by PUBLIC).
--
-- (An earlier draft took the ids as a uuid[] parameter; its generic plan
-- guessed 10 ids and joined 10,000 actions to the dead letters with a nested
-- loop: 60 s instead of 5 for 100,000 stale jobs.)
CREATE FUNCTION fn_job_reap_ids(p_only uuid, p_actor text, p_limit integer, p_base bigint)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public, pg_temp
AS $$
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
$$;
REVOKE ALL ON FUNCTION fn_job_reap_ids(uuid, text, integer, bigint) FROM PUBLIC;

-- Apply: refusals and report as in 20261129000200. The batch is reaped in
-- one statement (fn_job_reap_ids) inside a subtransaction; if that fails,
-- its rows are chosen again and each is reaped on its own, and a row that
-- fails again is set aside (left as it is, listed under "set_aside" with its
-- error) while the others are reaped.
-- A backoff base that is not a number of seconds (possible only with the
-- constraint dropped) is a refusal naming it, not an error.
CREATE OR REPLACE FUNCTION fn_job_reap_stale_leases_apply(p_actor text, p_limit integer DEFAULT 100)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
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
$$;

-- The dry run, total for every row the schema admits (no attempts + 1, a
-- finite-or-i64::MAX overdue), with the same set-aside fallback for a row
-- that still fails. stale_lease_count (the gauge) is a plain count and
-- cannot fail on any row.
CREATE OR REPLACE FUNCTION fn_job_reap_stale_leases_dry_run(p_limit integer DEFAULT 100)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    v_refusal jsonb := fn_job_reaper_limit_refusal(p_limit);
    v_jobs    jsonb;
    v_list    jsonb[] := '{}';
    v_aside   jsonb := '[]';
    r         record;
BEGIN
    IF v_refusal IS NOT NULL THEN
        RETURN v_refusal;
    END IF;
    BEGIN
        SELECT COALESCE(pg_catalog.jsonb_agg(fn_job_dry_run_object(s.job_id, s.job_kind, s.lease_owner, s.lease_until,
                                                                   s.attempts, s.max_attempts)
                                             ORDER BY s.lease_until, s.job_id), '[]'::pg_catalog.jsonb)
          INTO v_jobs
          FROM (SELECT j.job_id, j.job_kind, j.lease_owner, j.lease_until, j.attempts, j.max_attempts
                  FROM job_queue AS j
                 WHERE j.state = 'leased'
                   AND j.lease_until IS NOT NULL
                   AND j.lease_until < pg_catalog.now()
                 ORDER BY j.lease_until, j.job_id
                 LIMIT p_limit) AS s;
    EXCEPTION WHEN OTHERS THEN
        v_jobs := NULL;
    END;
    IF v_jobs IS NULL THEN
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
                v_list := pg_catalog.array_append(v_list,
                    fn_job_dry_run_object(r.job_id, r.job_kind, r.lease_owner, r.lease_until, r.attempts, r.max_attempts));
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
$$;

-- One job of the dry run (shape as in 20261129000200). Total: no
-- attempts + 1 (would_action compares attempts >= max_attempts - 1) and
-- overdue_seconds is i64::MAX for a -infinity lease_until.
CREATE FUNCTION fn_job_dry_run_object(p_job_id uuid, p_job_kind text, p_lease_owner text, p_lease_until timestamptz,
                                      p_attempts integer, p_max_attempts integer)
RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT pg_catalog.jsonb_build_object(
        'job_id', p_job_id,
        'job_kind', p_job_kind,
        'lease_owner', p_lease_owner,
        'lease_until', p_lease_until,
        'attempts', p_attempts,
        'max_attempts', p_max_attempts,
        'overdue_seconds', CASE WHEN pg_catalog.isfinite(p_lease_until)
                                THEN pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.now() - p_lease_until))::pg_catalog.int8
                                ELSE '9223372036854775807'::pg_catalog.int8 END,
        'would_action', CASE WHEN p_attempts >= p_max_attempts - 1
                             THEN 'move_to_dead_letter'
                             ELSE 'reset_to_retry_waiting' END)
$$;
