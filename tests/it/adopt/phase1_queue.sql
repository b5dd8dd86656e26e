-- A job queue as its own tool makes it (the job-queue document's Phase 1),
-- run by its owner role: the document's columns, objects and statements,
-- and nothing of the sidecar's (no per-kind lease durations, no record of
-- who reaped a job). The test puts the state column's type for STATE_TYPE:
-- text, or an enum of the five states it created first.

CREATE TABLE queue_schema_history (
    version     integer PRIMARY KEY,
    description text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO queue_schema_history (version, description) VALUES (1, 'phase 1 job substrate');

CREATE TABLE job_queue (
    job_id       uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    job_kind     text NOT NULL CHECK (job_kind <> ''),
    payload      jsonb NOT NULL DEFAULT '{}',
    state        STATE_TYPE NOT NULL DEFAULT 'queued'
                 CHECK (state IN ('queued', 'leased', 'retry_waiting', 'succeeded', 'dead_letter')),
    attempts     integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts integer NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 1000),
    scheduled_at timestamptz NOT NULL DEFAULT now(),
    lease_owner  text,
    lease_until  timestamptz,
    last_error   text,
    metadata     jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_queue_lease_consistent CHECK (
        CASE WHEN state = 'leased' THEN lease_owner IS NOT NULL AND lease_until IS NOT NULL
             ELSE lease_owner IS NULL AND lease_until IS NULL END)
);
CREATE INDEX job_queue_claimable_idx ON job_queue (scheduled_at) WHERE state IN ('queued', 'retry_waiting');
CREATE INDEX job_queue_lease_until_idx ON job_queue (lease_until) WHERE state = 'leased';

CREATE TABLE job_dead_letter (
    dead_letter_id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    job_id         uuid NOT NULL,
    job_kind       text NOT NULL,
    payload        jsonb NOT NULL,
    attempts       integer NOT NULL,
    final_error    text NOT NULL,
    moved_by       text NOT NULL,
    moved_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_dead_letter_job_idx ON job_dead_letter (job_id);

CREATE TABLE queue_setting (
    key        text PRIMARY KEY,
    value      text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text NOT NULL
);
CREATE TABLE queue_setting_audit (
    audit_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key        text NOT NULL,
    old_value  text,
    new_value  text,
    actor      text NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION queue_setting_audited() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO queue_setting_audit (key, old_value, new_value, actor)
        VALUES (OLD.key, OLD.value, NULL, session_user);
    ELSE
        INSERT INTO queue_setting_audit (key, old_value, new_value, actor)
        VALUES (NEW.key, CASE WHEN TG_OP = 'UPDATE' THEN OLD.value END, NEW.value, NEW.updated_by);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER queue_setting_audit AFTER INSERT OR UPDATE OR DELETE ON queue_setting
    FOR EACH ROW EXECUTE FUNCTION queue_setting_audited();

INSERT INTO queue_setting (key, value, updated_by) VALUES
    ('queue.job_substrate.enabled', 'false', 'phase1'),
    ('queue.retry.backoff_base_sec', '10', 'phase1'),
    ('queue.lease.duration_sec', '300', 'phase1');

-- The setter: validates the key and the value, and says who.
CREATE FUNCTION fn_queue_setting_set(p_key text, p_value text, p_actor text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_old text;
BEGIN
    IF p_actor IS NULL OR btrim(p_actor) = '' THEN
        RAISE EXCEPTION 'actor is required' USING ERRCODE = '22023';
    END IF;
    IF p_key IN ('queue.job_substrate.enabled', 'queue.lease.reaper_enabled', 'queue.lease.reaper_dry_run_only') THEN
        IF p_value NOT IN ('true', 'false') THEN
            RAISE EXCEPTION '% must be true or false', p_key USING ERRCODE = '22023';
        END IF;
    ELSIF p_key IN ('queue.retry.backoff_base_sec', 'queue.lease.duration_sec') THEN
        IF p_value !~ '^[0-9]{1,5}$' OR p_value::integer NOT BETWEEN 1 AND 86400 THEN
            RAISE EXCEPTION '% must be whole seconds from 1 to 86400', p_key USING ERRCODE = '22023';
        END IF;
    ELSE
        RAISE EXCEPTION 'unknown setting %', p_key USING ERRCODE = '22023';
    END IF;
    SELECT value INTO v_old FROM queue_setting WHERE key = p_key FOR UPDATE;
    INSERT INTO queue_setting (key, value, updated_at, updated_by) VALUES (p_key, p_value, now(), p_actor)
    ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = now(), updated_by = EXCLUDED.updated_by;
    RETURN jsonb_build_object('key', p_key, 'old_value', v_old, 'value', p_value, 'updated_by', p_actor);
END
$$;

CREATE FUNCTION fn_job_enqueue(p_job_kind text, p_payload jsonb DEFAULT '{}', p_max_attempts integer DEFAULT 5)
RETURNS uuid LANGUAGE sql AS $$
    INSERT INTO job_queue (job_kind, payload, max_attempts) VALUES (p_job_kind, p_payload, p_max_attempts)
    RETURNING job_id
$$;

-- Leases for queue.lease.duration_sec, whatever the kind.
CREATE FUNCTION fn_job_claim(p_worker text, p_limit integer DEFAULT 1) RETURNS SETOF job_queue
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT value FROM queue_setting WHERE key = 'queue.job_substrate.enabled') IS DISTINCT FROM 'true' THEN
        RAISE EXCEPTION 'refused: queue.job_substrate.enabled=false' USING ERRCODE = '55000';
    END IF;
    RETURN QUERY
    UPDATE job_queue AS j
       SET state = 'leased', lease_owner = p_worker, updated_at = now(),
           lease_until = now() + (SELECT value::integer FROM queue_setting WHERE key = 'queue.lease.duration_sec')
                                 * interval '1 second'
     WHERE j.job_id IN (SELECT q.job_id FROM job_queue AS q
                         WHERE q.state IN ('queued', 'retry_waiting') AND q.scheduled_at <= now()
                         ORDER BY q.scheduled_at LIMIT p_limit FOR UPDATE SKIP LOCKED)
    RETURNING j.*;
END
$$;

CREATE FUNCTION fn_job_heartbeat(p_job_id uuid, p_worker text) RETURNS timestamptz
LANGUAGE sql AS $$
    UPDATE job_queue
       SET lease_until = now() + (SELECT value::integer FROM queue_setting WHERE key = 'queue.lease.duration_sec')
                                 * interval '1 second',
           updated_at = now()
     WHERE job_id = p_job_id AND state = 'leased' AND lease_owner = p_worker AND lease_until >= now()
    RETURNING lease_until
$$;

CREATE FUNCTION fn_job_complete(p_job_id uuid, p_worker text) RETURNS boolean
LANGUAGE sql AS $$
    WITH done AS (
        UPDATE job_queue SET state = 'succeeded', lease_owner = NULL, lease_until = NULL, updated_at = now()
         WHERE job_id = p_job_id AND state = 'leased' AND lease_owner = p_worker
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM done)
$$;

-- Moves a job to the dead-letter table as it stands; the dead_letter object.
CREATE FUNCTION fn_job_move_to_dead_letter(p_job_id uuid, p_final_error text, p_actor text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_job  job_queue;
    v_dead job_dead_letter;
BEGIN
    IF p_actor IS NULL OR btrim(p_actor) = '' THEN
        RETURN '{"reason": "actor_required", "refused": true}';
    END IF;
    SELECT * INTO v_job FROM job_queue WHERE job_id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('reason', 'job_not_found', 'refused', true, 'job_id', p_job_id);
    END IF;
    IF v_job.state NOT IN ('queued', 'leased', 'retry_waiting') THEN
        RETURN jsonb_build_object('reason', 'job_not_movable', 'refused', true, 'job_id', p_job_id,
                                  'state', v_job.state);
    END IF;
    UPDATE job_queue
       SET state = 'dead_letter', last_error = p_final_error, lease_owner = NULL, lease_until = NULL,
           updated_at = now()
     WHERE job_id = p_job_id;
    INSERT INTO job_dead_letter (job_id, job_kind, payload, attempts, final_error, moved_by)
    VALUES (v_job.job_id, v_job.job_kind, v_job.payload, v_job.attempts, p_final_error, p_actor)
    RETURNING * INTO v_dead;
    RETURN jsonb_build_object('dead_letter_id', v_dead.dead_letter_id, 'job_id', v_dead.job_id,
                              'state', 'dead_letter', 'refused', false, 'attempts', v_dead.attempts,
                              'final_error', v_dead.final_error, 'moved_by', v_dead.moved_by,
                              'moved_at', v_dead.moved_at);
END
$$;
