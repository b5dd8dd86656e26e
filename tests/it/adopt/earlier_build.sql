-- A database as an earlier build of lease-sweeper left it (its 19 migrations,
-- history in _sqlx_migrations), dumped with pg_dump --inserts, with what a
-- running fleet leaves: expired leases not yet swept, live ones, a recorded
-- takeover, and an abandoned hand-off of each row shape that build wrote.
-- The cluster-wide role that build created and marked (pg_dump leaves roles out).
DO $$
BEGIN
    BEGIN
        CREATE ROLE lease_sweeper NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
    BEGIN
        COMMENT ON ROLE lease_sweeper IS 'lease-sweeper daemon role: NOLOGIN, members are sweeper hosts (docs/least-privilege.md)';
    EXCEPTION WHEN unique_violation OR internal_error THEN NULL;
    END;
END
$$;
SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;
CREATE TYPE public.lock_reaped_lease AS (
	lock_key text,
	owner_id text,
	token bigint,
	expired_at_millis bigint,
	overdue_millis bigint,
	set_aside_error text
);
ALTER TYPE public.lock_reaped_lease OWNER TO postgres;
SET default_tablespace = '';
SET default_table_access_method = heap;
CREATE TABLE public.job_queue (
    job_id uuid DEFAULT gen_random_uuid() NOT NULL,
    job_kind text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    state text DEFAULT 'queued'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 5 NOT NULL,
    scheduled_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_owner text,
    lease_until timestamp with time zone,
    last_error text,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    reaped_by text,
    reaped_by_role text,
    lease_duration_sec integer,
    lease_duration_source text,
    CONSTRAINT job_queue_attempts_at_most_1000000 CHECK ((attempts <= 1000000)),
    CONSTRAINT job_queue_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT job_queue_job_kind_check CHECK ((job_kind <> ''::text)),
    CONSTRAINT job_queue_lease_consistent CHECK (
CASE
    WHEN (state = 'leased'::text) THEN ((lease_owner IS NOT NULL) AND (lease_until IS NOT NULL))
    ELSE ((lease_owner IS NULL) AND (lease_until IS NULL))
END),
    CONSTRAINT job_queue_lease_duration_sec_from_1_to_86400 CHECK (((lease_duration_sec >= 1) AND (lease_duration_sec <= 86400))),
    CONSTRAINT job_queue_lease_duration_source_known CHECK ((lease_duration_source = ANY (ARRAY['override'::text, 'kind'::text, 'default'::text]))),
    CONSTRAINT job_queue_lease_override_sec_whole_from_1_to_86400 CHECK (
CASE
    WHEN ((metadata -> 'lease_override_sec'::text) IS NULL) THEN true
    WHEN (jsonb_typeof((metadata -> 'lease_override_sec'::text)) = 'number'::text) THEN (((((metadata -> 'lease_override_sec'::text))::numeric >= (1)::numeric) AND (((metadata -> 'lease_override_sec'::text))::numeric <= (86400)::numeric)) AND (((metadata -> 'lease_override_sec'::text))::numeric = trunc(((metadata -> 'lease_override_sec'::text))::numeric)))
    ELSE false
END),
    CONSTRAINT job_queue_lease_until_finite CHECK (isfinite(lease_until)),
    CONSTRAINT job_queue_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 1000))),
    CONSTRAINT job_queue_state_check CHECK ((state = ANY (ARRAY['queued'::text, 'leased'::text, 'retry_waiting'::text, 'succeeded'::text, 'dead_letter'::text])))
);
ALTER TABLE public.job_queue OWNER TO postgres;
CREATE FUNCTION public.fn_job_claim(p_worker text, p_job_kinds text[] DEFAULT NULL::text[], p_limit integer DEFAULT 1) RETURNS SETOF public.job_queue
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_default integer;
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
    v_default := fn_job_default_lease_sec();
    RETURN QUERY
    WITH picked AS (
        SELECT q.job_id, q.job_kind, fn_job_lease_override_sec(q.metadata) AS override_sec
          FROM job_queue AS q
         WHERE q.state IN ('queued', 'retry_waiting')
           AND q.scheduled_at <= now()
           AND (p_job_kinds IS NULL OR q.job_kind = ANY (p_job_kinds))
         ORDER BY q.scheduled_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ),
    given AS (
        SELECT p.job_id,
               coalesce(p.override_sec, k.lease_sec, v_default) AS sec,
               CASE WHEN p.override_sec IS NOT NULL THEN 'override'
                    WHEN k.lease_sec IS NOT NULL THEN 'kind'
                    ELSE 'default' END AS source
          FROM picked AS p
          LEFT JOIN job_kind_lease AS k ON k.job_kind = p.job_kind
    )
    UPDATE job_queue AS j
       SET state = 'leased',
           lease_owner = p_worker,
           lease_until = now() + g.sec::float8 * interval '1 second',
           lease_duration_sec = g.sec,
           lease_duration_source = g.source,
           updated_at = now()
      FROM given AS g
     WHERE j.job_id = g.job_id
    RETURNING j.*;
END
$$;
ALTER FUNCTION public.fn_job_claim(p_worker text, p_job_kinds text[], p_limit integer) OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_claim(p_worker text, p_job_kinds text[], p_limit integer) IS 'Leases up to p_limit (1-10000) claimable jobs (queued or retry_waiting, due), of the kinds p_job_kinds (NULL: any), oldest first, to p_worker, each for its own duration (metadata.lease_override_sec, else its kind''s in job_kind_lease, else queue.lease.duration_sec), and returns the leased rows; rows another claimer holds are skipped. Error 55000 while queue.job_substrate.enabled is not true.';
CREATE FUNCTION public.fn_job_complete(p_job_id uuid, p_worker text) RETURNS boolean
    LANGUAGE plpgsql
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
ALTER FUNCTION public.fn_job_complete(p_job_id uuid, p_worker text) OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_complete(p_job_id uuid, p_worker text) IS 'Marks the job succeeded when p_worker holds its lease, even one past its deadline as long as no reaper has acted; false otherwise (reaped, re-leased, completed, unknown).';
CREATE FUNCTION public.fn_job_dead_letter_object(p_dead_letter_id uuid, p_job_id uuid, p_attempts integer, p_final_error text, p_moved_by text, p_moved_at timestamp with time zone) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
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
ALTER FUNCTION public.fn_job_dead_letter_object(p_dead_letter_id uuid, p_job_id uuid, p_attempts integer, p_final_error text, p_moved_by text, p_moved_at timestamp with time zone) OWNER TO postgres;
CREATE FUNCTION public.fn_job_default_lease_sec() RETURNS integer
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $_$
DECLARE
    v_raw text;
    v_sec integer;
BEGIN
    SELECT s.value INTO v_raw FROM queue_setting AS s WHERE s.key = 'queue.lease.duration_sec';
    -- Nested, not AND: the cast must never run on a non-number.
    IF v_raw ~ '^[0-9]{1,5}$' THEN
        v_sec := v_raw::integer;
        IF v_sec BETWEEN 1 AND 86400 THEN
            RETURN v_sec;
        END IF;
    END IF;
    RETURN 300;
END
$_$;
ALTER FUNCTION public.fn_job_default_lease_sec() OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_default_lease_sec() IS 'queue.lease.duration_sec as claims and heartbeats read it: the lease of a job with no override whose kind has no duration of its own (300 when the row is missing).';
CREATE FUNCTION public.fn_job_dry_run_object(p_job_id uuid, p_job_kind text, p_lease_owner text, p_lease_until timestamp with time zone, p_attempts integer, p_max_attempts integer, p_lease_duration_sec integer, p_lease_duration_source text) RETURNS jsonb
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    SELECT pg_catalog.jsonb_build_object(
        'job_id', p_job_id,
        'job_kind', p_job_kind,
        'lease_owner', p_lease_owner,
        'lease_until', p_lease_until,
        'attempts', p_attempts,
        'max_attempts', p_max_attempts,
        'lease_duration_sec', p_lease_duration_sec,
        'lease_duration_source', p_lease_duration_source,
        'overdue_seconds', CASE WHEN pg_catalog.isfinite(p_lease_until)
                                THEN pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.now() - p_lease_until))::pg_catalog.int8
                                ELSE '9223372036854775807'::pg_catalog.int8 END,
        'would_action', CASE WHEN p_attempts >= p_max_attempts - 1
                             THEN 'move_to_dead_letter'
                             ELSE 'reset_to_retry_waiting' END)
$$;
ALTER FUNCTION public.fn_job_dry_run_object(p_job_id uuid, p_job_kind text, p_lease_owner text, p_lease_until timestamp with time zone, p_attempts integer, p_max_attempts integer, p_lease_duration_sec integer, p_lease_duration_source text) OWNER TO postgres;
CREATE FUNCTION public.fn_job_enqueue(p_job_kind text, p_payload jsonb DEFAULT '{}'::jsonb, p_max_attempts integer DEFAULT 5, p_metadata jsonb DEFAULT '{}'::jsonb) RETURNS uuid
    LANGUAGE plpgsql
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
        -- A bad lease_override_sec is refused by the table's constraint
        -- (job_queue_lease_override_sec_whole_from_1_to_86400).
        INSERT INTO job_queue (job_kind, payload, max_attempts, metadata)
        VALUES (p_job_kind, coalesce(p_payload, '{}'::jsonb), p_max_attempts, coalesce(p_metadata, '{}'::jsonb))
        RETURNING job_id INTO v_job_id;
        RETURN v_job_id;
    END
    $$;
ALTER FUNCTION public.fn_job_enqueue(p_job_kind text, p_payload jsonb, p_max_attempts integer, p_metadata jsonb) OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_enqueue(p_job_kind text, p_payload jsonb, p_max_attempts integer, p_metadata jsonb) IS 'Queues a job of kind p_job_kind, claimable at once; returns its job_id. p_max_attempts 1-1000; p_metadata.lease_override_sec (whole seconds 1-86400) gives this job its own lease duration. Errors 22023: empty kind, attempts out of range; 23514: a bad lease_override_sec. Allowed while queue.job_substrate.enabled is false.';
CREATE FUNCTION public.fn_job_heartbeat(p_job_id uuid, p_worker text) RETURNS timestamp with time zone
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_override integer;
    v_kind     integer;
    v_sec      integer;
    v_until    timestamptz;
BEGIN
    -- Locks the job only when this worker holds a live lease on it, as the
    -- update alone did before.
    SELECT fn_job_lease_override_sec(j.metadata), k.lease_sec INTO v_override, v_kind
      FROM job_queue AS j
      LEFT JOIN job_kind_lease AS k ON k.job_kind = j.job_kind
     WHERE j.job_id = p_job_id
       AND j.state = 'leased'
       AND j.lease_owner = p_worker
       AND j.lease_until >= now()
       FOR UPDATE OF j;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_sec := coalesce(v_override, v_kind, fn_job_default_lease_sec());
    UPDATE job_queue AS j
       SET lease_until = now() + v_sec::float8 * interval '1 second',
           lease_duration_sec = v_sec,
           lease_duration_source = CASE WHEN v_override IS NOT NULL THEN 'override'
                                        WHEN v_kind IS NOT NULL THEN 'kind'
                                        ELSE 'default' END,
           updated_at = now()
     WHERE j.job_id = p_job_id
    RETURNING j.lease_until INTO v_until;
    RETURN v_until;
END
$$;
ALTER FUNCTION public.fn_job_heartbeat(p_job_id uuid, p_worker text) OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_heartbeat(p_job_id uuid, p_worker text) IS 'Extends the live lease p_worker holds on p_job_id by the job''s own duration (computed as a claim computes it) and returns the new lease_until; NULL when the worker holds no live lease on it (expired, reaped, completed or someone else''s): the worker has lost the job and must stop.';
CREATE FUNCTION public.fn_job_kind_lease_set(p_job_kind text, p_lease_sec integer, p_actor text) RETURNS jsonb
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    v_old     integer;
    v_default integer;
    v_at      timestamptz := pg_catalog.now();
BEGIN
    IF p_actor IS NULL OR pg_catalog.btrim(p_actor) = '' THEN
        RAISE EXCEPTION 'fn_job_kind_lease_set: actor is required (who is changing the lease duration of kind %?)',
            COALESCE(pg_catalog.quote_literal(p_job_kind), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_job_kind IS NULL OR p_job_kind = '' THEN
        RAISE EXCEPTION 'fn_job_kind_lease_set: job kind must be a non-empty string, got %',
            COALESCE(pg_catalog.quote_literal(p_job_kind), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_lease_sec IS NOT NULL AND p_lease_sec NOT BETWEEN 1 AND 86400 THEN
        RAISE EXCEPTION 'fn_job_kind_lease_set: the lease duration of kind % is a whole number of seconds from 1 to 86400 (NULL clears it), got %',
            pg_catalog.quote_literal(p_job_kind), p_lease_sec
            USING ERRCODE = '22023';
    END IF;
    SELECT k.lease_sec INTO v_old FROM job_kind_lease AS k WHERE k.job_kind = p_job_kind FOR UPDATE;
    PERFORM pg_catalog.set_config('lease_sweeper.setting_actor', p_actor, true);
    IF p_lease_sec IS NULL THEN
        DELETE FROM job_kind_lease AS k WHERE k.job_kind = p_job_kind;
    ELSE
        INSERT INTO job_kind_lease AS k (job_kind, lease_sec, updated_at, updated_by)
        VALUES (p_job_kind, p_lease_sec, v_at, p_actor)
        ON CONFLICT (job_kind) DO UPDATE
            SET lease_sec = EXCLUDED.lease_sec, updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by;
    END IF;
    PERFORM pg_catalog.set_config('lease_sweeper.setting_actor', '', true);
    v_default := fn_job_default_lease_sec();
    RETURN pg_catalog.jsonb_build_object(
        'job_kind', p_job_kind,
        'old_lease_sec', v_old,
        'lease_sec', p_lease_sec,
        'default_sec', v_default,
        'updated_by', p_actor,
        'updated_at', v_at);
END
$$;
ALTER FUNCTION public.fn_job_kind_lease_set(p_job_kind text, p_lease_sec integer, p_actor text) OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_kind_lease_set(p_job_kind text, p_lease_sec integer, p_actor text) IS 'The audited setter of job_kind_lease: gives kind p_job_kind (matched exactly) a lease of p_lease_sec seconds (1-86400), or with NULL returns it to queue.lease.duration_sec; records the change in job_kind_lease_audit and returns it as JSON. Errors 22023: empty actor or kind, seconds out of range. SECURITY DEFINER; EXECUTE not granted to PUBLIC nor to lease_sweeper. lease-sweeper leases set / clear call it.';
CREATE FUNCTION public.fn_job_lease_override_sec(p_metadata jsonb) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN pg_catalog.jsonb_typeof(p_metadata OPERATOR(pg_catalog.->) 'lease_override_sec'::pg_catalog.text)
                     OPERATOR(pg_catalog.=) 'number'::pg_catalog.text
                THEN CASE WHEN (p_metadata OPERATOR(pg_catalog.->) 'lease_override_sec'::pg_catalog.text)::pg_catalog.numeric
                               OPERATOR(pg_catalog.>=) 1::pg_catalog.numeric
                           AND (p_metadata OPERATOR(pg_catalog.->) 'lease_override_sec'::pg_catalog.text)::pg_catalog.numeric
                               OPERATOR(pg_catalog.<=) 86400::pg_catalog.numeric
                           AND (p_metadata OPERATOR(pg_catalog.->) 'lease_override_sec'::pg_catalog.text)::pg_catalog.numeric
                               OPERATOR(pg_catalog.=) pg_catalog.trunc((p_metadata OPERATOR(pg_catalog.->) 'lease_override_sec'::pg_catalog.text)::pg_catalog.numeric)
                          THEN (p_metadata OPERATOR(pg_catalog.->) 'lease_override_sec'::pg_catalog.text)::pg_catalog.int4
                     END
           END
$$;
ALTER FUNCTION public.fn_job_lease_override_sec(p_metadata jsonb) OWNER TO postgres;
CREATE FUNCTION public.fn_job_move_to_dead_letter(p_job_id uuid, p_final_error text, p_actor text) RETURNS jsonb
    LANGUAGE plpgsql
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
ALTER FUNCTION public.fn_job_move_to_dead_letter(p_job_id uuid, p_final_error text, p_actor text) OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_move_to_dead_letter(p_job_id uuid, p_final_error text, p_actor text) IS 'Moves a queued, leased or retry_waiting job to job_dead_letter as it stands, with p_final_error and p_actor, and returns the dead_letter object; refusals as JSON: actor_required, job_not_found, job_not_movable (already succeeded or dead-lettered).';
CREATE FUNCTION public.fn_job_reap_handoff_abandoned() RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    SELECT EXISTS (SELECT 1 FROM job_reap_handoff AS o
                    WHERE o.written_at < pg_catalog.now() - signal_handoff_grace())
$$;
ALTER FUNCTION public.fn_job_reap_handoff_abandoned() OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_reap_handoff_abandoned() IS 'Whether a job hand-off older than signal_handoff_grace() waits for recovery. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
CREATE FUNCTION public.fn_job_reap_handoff_claim(p_handoff_id bigint) RETURNS boolean
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    WITH gone AS (
        DELETE FROM job_reap_handoff AS h WHERE h.handoff_id = p_handoff_id
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM gone)
$$;
ALTER FUNCTION public.fn_job_reap_handoff_claim(p_handoff_id bigint) OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_reap_handoff_claim(p_handoff_id bigint) IS 'Deletes job hand-off p_handoff_id and returns true, or false when it is gone. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
CREATE FUNCTION public.fn_job_reap_handoff_recover() RETURNS TABLE(report text)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    DELETE FROM job_reap_handoff AS h
     WHERE h.handoff_id = (SELECT o.handoff_id
                             FROM job_reap_handoff AS o
                            WHERE o.written_at < pg_catalog.now() - signal_handoff_grace()
                            ORDER BY o.handoff_id
                            LIMIT 1
                              FOR UPDATE SKIP LOCKED)
    RETURNING h.report
$$;
ALTER FUNCTION public.fn_job_reap_handoff_recover() OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_reap_handoff_recover() IS 'Deletes the oldest job hand-off older than signal_handoff_grace() that no other transaction holds and returns its report, whose actions are written as job_lease_expired lines before committing. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
CREATE FUNCTION public.fn_job_reap_ids(p_only uuid, p_actor text, p_limit integer, p_base bigint) RETURNS jsonb
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET enable_nestloop TO 'off'
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
ALTER FUNCTION public.fn_job_reap_ids(p_only uuid, p_actor text, p_limit integer, p_base bigint) OWNER TO postgres;
CREATE FUNCTION public.fn_job_reap_stale_leases_apply(p_actor text, p_limit integer DEFAULT 100) RETURNS jsonb
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $_$
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
$_$;
ALTER FUNCTION public.fn_job_reap_stale_leases_apply(p_actor text, p_limit integer) OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_reap_stale_leases_apply(p_actor text, p_limit integer) IS 'Reaps up to p_limit stale job leases, oldest first: back to retry_waiting with exponential backoff, or to job_dead_letter at the last attempt; a job completed or re-leased meanwhile is never touched. Refused, changing nothing, as {"reason": ..., "refused": true}, in this order: actor_required, limit_out_of_range, queue.job_substrate.enabled=false, queue.lease.reaper_enabled=false, queue.lease.reaper_dry_run_only=true. SECURITY DEFINER; EXECUTE not granted to PUBLIC. lease-sweeper jobs apply and the daemon call it.';
CREATE FUNCTION public.fn_job_reap_stale_leases_apply_handed_off(p_actor text, p_limit integer DEFAULT 100) RETURNS TABLE(handoff_id bigint, report text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_variable
DECLARE
    v_report jsonb := fn_job_reap_stale_leases_apply(p_actor, p_limit);
    v_text text := v_report::pg_catalog.text;
    v_id bigint;
BEGIN
    IF pg_catalog.jsonb_typeof(v_report -> 'actions') = 'array'
       AND pg_catalog.jsonb_array_length(v_report -> 'actions') > 0 THEN
        INSERT INTO job_reap_handoff AS h (report) VALUES (v_text) RETURNING h.handoff_id INTO v_id;
    END IF;
    RETURN QUERY SELECT v_id, v_text;
END
$$;
ALTER FUNCTION public.fn_job_reap_stale_leases_apply_handed_off(p_actor text, p_limit integer) OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_reap_stale_leases_apply_handed_off(p_actor text, p_limit integer) IS 'fn_job_reap_stale_leases_apply(p_actor, p_limit), with its report recorded in one job_reap_handoff row in the same transaction when it reaped something; returns the hand-off''s id (NULL otherwise) and the report. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
CREATE FUNCTION public.fn_job_reap_stale_leases_dry_run(p_limit integer DEFAULT 100) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
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
    EXCEPTION WHEN OTHERS THEN
        v_jobs := NULL;
    END;
    IF v_jobs IS NULL THEN
        FOR r IN
            SELECT j.job_id, j.job_kind, j.lease_owner, j.lease_until, j.attempts, j.max_attempts,
                   j.lease_duration_sec, j.lease_duration_source
              FROM job_queue AS j
             WHERE j.state = 'leased'
               AND j.lease_until IS NOT NULL
               AND j.lease_until < pg_catalog.now()
             ORDER BY j.lease_until, j.job_id
             LIMIT p_limit
        LOOP
            BEGIN
                v_list := pg_catalog.array_append(v_list,
                    fn_job_dry_run_object(r.job_id, r.job_kind, r.lease_owner, r.lease_until, r.attempts, r.max_attempts,
                                          r.lease_duration_sec, r.lease_duration_source));
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
ALTER FUNCTION public.fn_job_reap_stale_leases_dry_run(p_limit integer) OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_reap_stale_leases_dry_run(p_limit integer) IS 'What the reaper would do now, changing nothing whatever the gates say: stale_lease_count (every job with state leased and lease_until < now()) and, for the p_limit oldest (1-10000, else the limit_out_of_range refusal), each job''s would_action (reset_to_retry_waiting or move_to_dead_letter) and the lease it was given. STABLE, SECURITY INVOKER (needs SELECT on job_queue''s reaper columns). lease-sweeper jobs dry-run calls it.';
CREATE FUNCTION public.fn_job_reaper_gate_refusal() RETURNS jsonb
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    v_substrate text;
    v_enabled   text;
    v_dry_run   text;
BEGIN
    -- key is queue_setting's primary key: one row per gate at most.
    SELECT pg_catalog.max(s.value) FILTER (WHERE s.key OPERATOR(pg_catalog.=) 'queue.job_substrate.enabled'),
           pg_catalog.max(s.value) FILTER (WHERE s.key OPERATOR(pg_catalog.=) 'queue.lease.reaper_enabled'),
           pg_catalog.max(s.value) FILTER (WHERE s.key OPERATOR(pg_catalog.=) 'queue.lease.reaper_dry_run_only')
      INTO v_substrate, v_enabled, v_dry_run
      FROM queue_setting AS s
     WHERE s.key OPERATOR(pg_catalog.=) ANY (ARRAY['queue.job_substrate.enabled',
                                                  'queue.lease.reaper_enabled',
                                                  'queue.lease.reaper_dry_run_only']);
    IF COALESCE(v_substrate, 'false') OPERATOR(pg_catalog.<>) 'true' THEN
        RETURN '{"reason": "queue.job_substrate.enabled=false", "refused": true}'::pg_catalog.jsonb;
    ELSIF COALESCE(v_enabled, 'false') OPERATOR(pg_catalog.<>) 'true' THEN
        RETURN '{"reason": "queue.lease.reaper_enabled=false", "refused": true}'::pg_catalog.jsonb;
    ELSIF COALESCE(v_dry_run, 'true') OPERATOR(pg_catalog.<>) 'false' THEN
        RETURN '{"reason": "queue.lease.reaper_dry_run_only=true", "refused": true}'::pg_catalog.jsonb;
    END IF;
    RETURN NULL;
END
$$;
ALTER FUNCTION public.fn_job_reaper_gate_refusal() OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_reaper_gate_refusal() IS 'NULL when the three gates allow an apply, else the refusal an apply would return now ({"reason": ..., "refused": true}). STABLE, SECURITY INVOKER (needs SELECT on queue_setting).';
CREATE FUNCTION public.fn_job_reaper_limit_refusal(p_limit integer) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    SELECT CASE WHEN p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        pg_catalog.jsonb_build_object('reason', 'limit_out_of_range', 'refused', true,
                           'limit', p_limit, 'limit_min', 1, 'limit_max', 10000)
    END
$$;
ALTER FUNCTION public.fn_job_reaper_limit_refusal(p_limit integer) OWNER TO postgres;
CREATE FUNCTION public.fn_job_stale_lease_count() RETURNS bigint
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    RETURN (SELECT pg_catalog.count(*)
              FROM job_queue AS j
             WHERE j.state OPERATOR(pg_catalog.=) 'leased'
               AND j.lease_until IS NOT NULL
               AND j.lease_until OPERATOR(pg_catalog.<) pg_catalog.now());
END
$$;
ALTER FUNCTION public.fn_job_stale_lease_count() OWNER TO postgres;
COMMENT ON FUNCTION public.fn_job_stale_lease_count() IS 'The number of stale job leases (state leased, lease_until < now()): the dry run''s stale_lease_count, and the queue.lease.stale.current gauge. STABLE, SECURITY INVOKER.';
CREATE FUNCTION public.fn_queue_setting_set(p_key text, p_value text, p_actor text) RETURNS jsonb
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $_$
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
$_$;
ALTER FUNCTION public.fn_queue_setting_set(p_key text, p_value text, p_actor text) OWNER TO postgres;
COMMENT ON FUNCTION public.fn_queue_setting_set(p_key text, p_value text, p_actor text) IS 'The audited setter of queue_setting (the gates, queue.retry.backoff_base_sec, queue.lease.duration_sec): validates p_key and p_value, records old and new value, p_actor and the session role in queue_setting_audit, and returns the change as JSON. Errors 22023: empty actor, unknown key, a boolean not true/false, seconds not a whole number 1-86400. SECURITY DEFINER; EXECUTE not granted to PUBLIC (grant it to operators). lease-sweeper gates set calls it.';
CREATE FUNCTION public.job_kind_lease_audit_change() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    v_actor text := NULLIF(pg_catalog.current_setting('lease_sweeper.setting_actor', true), '');
BEGIN
    IF v_actor IS NULL THEN
        v_actor := pg_catalog.format('direct %s by %s', pg_catalog.lower(TG_OP), session_user);
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') AND (TG_OP = 'DELETE' OR OLD.job_kind IS DISTINCT FROM NEW.job_kind) THEN
        -- A renamed kind is the old kind cleared and the new one set.
        INSERT INTO job_kind_lease_audit (job_kind, old_lease_sec, new_lease_sec, actor, changed_by_role)
        VALUES (OLD.job_kind, OLD.lease_sec, NULL, v_actor, session_user);
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND OLD.job_kind IS DISTINCT FROM NEW.job_kind) THEN
        INSERT INTO job_kind_lease_audit (job_kind, old_lease_sec, new_lease_sec, actor, changed_by_role)
        VALUES (NEW.job_kind, NULL, NEW.lease_sec, v_actor, session_user);
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO job_kind_lease_audit (job_kind, old_lease_sec, new_lease_sec, actor, changed_by_role)
        VALUES (NEW.job_kind, OLD.lease_sec, NEW.lease_sec, v_actor, session_user);
    END IF;
    RETURN NULL;
END
$$;
ALTER FUNCTION public.job_kind_lease_audit_change() OWNER TO postgres;
CREATE FUNCTION public.lease_epoch_millis(p_at timestamp with time zone) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE
        WHEN pg_catalog.isfinite(p_at)
            THEN pg_catalog.floor(EXTRACT(epoch FROM p_at AT TIME ZONE 'UTC') * 1000::pg_catalog.numeric)::pg_catalog.int8
        WHEN EXTRACT(epoch FROM p_at AT TIME ZONE 'UTC') < 0::pg_catalog.numeric
            THEN '-9223372036854775808'::pg_catalog.int8
        ELSE '9223372036854775807'::pg_catalog.int8
    END
$$;
ALTER FUNCTION public.lease_epoch_millis(p_at timestamp with time zone) OWNER TO postgres;
CREATE FUNCTION public.lease_floor_div_1000(p_x bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT (p_x - ((p_x % 1000::pg_catalog.int8) + 1000::pg_catalog.int8) % 1000::pg_catalog.int8) / 1000::pg_catalog.int8
$$;
ALTER FUNCTION public.lease_floor_div_1000(p_x bigint) OWNER TO postgres;
CREATE FUNCTION public.lease_overdue_millis(p_deadline timestamp with time zone, p_at timestamp with time zone) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE
        WHEN pg_catalog.isfinite(p_deadline) AND pg_catalog.isfinite(p_at)
            THEN pg_catalog.floor(EXTRACT(epoch FROM p_at - p_deadline) * 1000::pg_catalog.numeric)::pg_catalog.int8
        WHEN p_deadline < p_at
            THEN '9223372036854775807'::pg_catalog.int8
        WHEN p_deadline > p_at
            THEN '-9223372036854775808'::pg_catalog.int8
        ELSE 0::pg_catalog.int8
    END
$$;
ALTER FUNCTION public.lease_overdue_millis(p_deadline timestamp with time zone, p_at timestamp with time zone) OWNER TO postgres;
CREATE FUNCTION public.lock_acquire(p_lock_key text, p_owner_id text, p_ttl_millis bigint, p_session_id uuid DEFAULT NULL::uuid) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_token bigint;
BEGIN
    IF p_lock_key IS NULL OR p_lock_key = '' THEN
        RAISE EXCEPTION 'lock_acquire: lock key must be a non-empty string' USING ERRCODE = '22023';
    END IF;
    IF p_owner_id IS NULL THEN
        RAISE EXCEPTION 'lock_acquire: owner id must not be NULL' USING ERRCODE = '22023';
    END IF;
    IF p_ttl_millis IS NULL OR p_ttl_millis <= 0 OR p_ttl_millis > 31536000000 THEN
        RAISE EXCEPTION 'lock_acquire: ttl must be a positive number of milliseconds, got % (at most 31536000000, one year)', p_ttl_millis
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO lock_entry AS e (lock_key, session_id, owner_id, token, acquired_at, expires_at)
    VALUES (p_lock_key, p_session_id, p_owner_id, nextval('lock_fencing_token_seq'), now(),
            now() + p_ttl_millis * interval '1 millisecond')
    ON CONFLICT (lock_key) DO UPDATE
        SET session_id  = EXCLUDED.session_id,
            owner_id    = EXCLUDED.owner_id,
            token       = EXCLUDED.token,
            acquired_at = EXCLUDED.acquired_at,
            expires_at  = EXCLUDED.expires_at
        WHERE e.expires_at <= now()
    RETURNING token INTO v_token;
    RETURN v_token;
END
$$;
ALTER FUNCTION public.lock_acquire(p_lock_key text, p_owner_id text, p_ttl_millis bigint, p_session_id uuid) OWNER TO postgres;
COMMENT ON FUNCTION public.lock_acquire(p_lock_key text, p_owner_id text, p_ttl_millis bigint, p_session_id uuid) IS 'Takes the lease on p_lock_key for p_owner_id until now() + p_ttl_millis (database clock), optionally tied to lock_session p_session_id (its leases go with the session, unreported). Returns the new fencing token, strictly greater than every token issued before, or NULL while another live lease holds the key (even one of the same owner). An expired lease still in lock_entry is taken over: its row gets the new owner and token, and the old lease is recorded in lock_expiry_outbox in the same statement, so the sweeper reports it as lease_expired reapedBy=takeover. Errors 22023: NULL or empty key, NULL owner, ttl NULL, <= 0 or over 31536000000 ms (one year); 23503: an unknown session. SECURITY INVOKER: needs SELECT, INSERT, UPDATE on lock_entry and USAGE on lock_fencing_token_seq.';
CREATE FUNCTION public.lock_drain_takeovers(p_limit integer) RETURNS TABLE(lock_key text, owner_id text, token bigint, expired_at_millis bigint, overdue_millis bigint, set_aside_error text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_rows   lock_reaped_lease[];
    v_one    lock_reaped_lease;
    v_failed boolean := false;
    r        record;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        RAISE EXCEPTION 'lock_drain_takeovers: limit must be from 1 to 100000, got %', COALESCE(p_limit::pg_catalog.text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    BEGIN
        WITH gone AS (
            DELETE FROM lock_expiry_outbox AS o
             WHERE o.outbox_id = ANY (ARRAY(
                    SELECT b.outbox_id
                      FROM lock_expiry_outbox AS b
                     ORDER BY b.outbox_id
                     LIMIT p_limit
                       FOR UPDATE SKIP LOCKED))
            RETURNING o.lock_key, o.owner_id, o.token, o.expires_at, o.taken_over_at
        )
        SELECT pg_catalog.array_agg(ROW(g.lock_key, g.owner_id, g.token,
                                        lease_epoch_millis(g.expires_at),
                                        lease_overdue_millis(g.expires_at, g.taken_over_at),
                                        NULL)::lock_reaped_lease)
          INTO v_rows
          FROM gone AS g;
    EXCEPTION WHEN OTHERS THEN
        v_failed := true;
    END;
    IF v_failed THEN
        v_rows := '{}';
        FOR r IN
            SELECT b.outbox_id, b.lock_key, b.owner_id, b.token
              FROM lock_expiry_outbox AS b
             ORDER BY b.outbox_id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED
        LOOP
            BEGIN
                DELETE FROM lock_expiry_outbox AS o
                 WHERE o.outbox_id = r.outbox_id
                RETURNING o.lock_key, o.owner_id, o.token,
                          lease_epoch_millis(o.expires_at),
                          lease_overdue_millis(o.expires_at, o.taken_over_at),
                          NULL::pg_catalog.text
                     INTO v_one;
                IF FOUND THEN
                    v_rows := pg_catalog.array_append(v_rows, v_one);
                END IF;
            EXCEPTION WHEN OTHERS THEN
                v_rows := pg_catalog.array_append(v_rows,
                    ROW(r.lock_key, r.owner_id, r.token, NULL, NULL,
                        pg_catalog.format('%s (SQLSTATE %s)', SQLERRM, SQLSTATE))::lock_reaped_lease);
            END;
        END LOOP;
    END IF;
    RETURN QUERY SELECT u.lock_key, u.owner_id, u.token, u.expired_at_millis, u.overdue_millis, u.set_aside_error
                   FROM pg_catalog.unnest(v_rows) AS u;
END
$$;
ALTER FUNCTION public.lock_drain_takeovers(p_limit integer) OWNER TO postgres;
COMMENT ON FUNCTION public.lock_drain_takeovers(p_limit integer) IS 'Deletes and returns up to p_limit (1-100000, else 22023) recorded takeovers from lock_expiry_outbox, oldest first, lateness measured at the takeover; the sweeper reports each as lease_expired reapedBy=takeover before committing. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
CREATE FUNCTION public.lock_entry_record_takeover() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    -- A new token on an existing key is a steal; it is an expiry only if the
    -- old lease had reached its deadline (it always has, via lock_acquire).
    IF OLD.expires_at <= pg_catalog.now() THEN
        INSERT INTO lock_expiry_outbox (lock_key, owner_id, token, expires_at, taken_over_at, new_token)
        VALUES (OLD.lock_key, OLD.owner_id, OLD.token, OLD.expires_at, pg_catalog.now(), NEW.token);
    END IF;
    RETURN NULL;
END
$$;
ALTER FUNCTION public.lock_entry_record_takeover() OWNER TO postgres;
CREATE FUNCTION public.lock_handoff_claim(p_handoff_id bigint) RETURNS boolean
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    WITH gone AS (
        DELETE FROM lock_reap_handoff AS h WHERE h.handoff_id = p_handoff_id
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM gone)
$$;
ALTER FUNCTION public.lock_handoff_claim(p_handoff_id bigint) OWNER TO postgres;
COMMENT ON FUNCTION public.lock_handoff_claim(p_handoff_id bigint) IS 'Deletes hand-off p_handoff_id and returns true, or false when it is gone (another sweeper recovered it and wrote its lines). The caller writes the lines before committing. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
CREATE FUNCTION public.lock_handoff_recover() RETURNS TABLE(lock_key text, owner_id text, token bigint, expired_at_millis bigint, overdue_millis bigint)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    WITH gone AS (
        DELETE FROM lock_reap_handoff AS h
         WHERE h.handoff_id = (SELECT o.handoff_id
                                 FROM lock_reap_handoff AS o
                                WHERE o.written_at < pg_catalog.now() - signal_handoff_grace()
                                ORDER BY o.handoff_id
                                LIMIT 1
                                  FOR UPDATE SKIP LOCKED)
        RETURNING h.lock_keys, h.owner_ids, h.tokens, h.expired_at_millis, h.overdue_millis,
                  h.expires_at, h.reaped_at
    )
    SELECT u.k, u.o, u.t,
           COALESCE(u.e, lease_epoch_millis(u.x)),
           COALESCE(u.d, lease_overdue_millis(u.x, g.reaped_at))
      FROM gone AS g,
           ROWS FROM (pg_catalog.unnest(g.lock_keys), pg_catalog.unnest(g.owner_ids),
                      pg_catalog.unnest(g.tokens), pg_catalog.unnest(g.expired_at_millis),
                      pg_catalog.unnest(g.overdue_millis), pg_catalog.unnest(g.expires_at))
               WITH ORDINALITY AS u (k, o, t, e, d, x, i)
     ORDER BY u.i
$$;
ALTER FUNCTION public.lock_handoff_recover() OWNER TO postgres;
COMMENT ON FUNCTION public.lock_handoff_recover() IS 'Deletes the oldest lock hand-off older than signal_handoff_grace() that no other transaction holds and returns its leases, to be reported as lease_expired reapedBy=sweep before committing. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
CREATE FUNCTION public.lock_held_count_get(p_max_age_millis bigint) RETURNS TABLE(held bigint, counted_at_millis bigint, recounted boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_held bigint;
    v_at timestamptz;
    v_fresh_after timestamptz;
BEGIN
    IF p_max_age_millis IS NULL OR p_max_age_millis < 0 THEN
        RAISE EXCEPTION 'lock_held_count_get: max age must be a non-negative number of milliseconds, got %', p_max_age_millis
            USING ERRCODE = '22023';
    END IF;
    v_fresh_after := pg_catalog.now() - p_max_age_millis * '1 millisecond'::interval;
    SELECT c.held - COALESCE((SELECT pg_catalog.sum(d.n) FROM lock_held_delta AS d), 0::pg_catalog.int8),
           c.counted_at
      INTO v_held, v_at
      FROM lock_held_count AS c WHERE c.singleton;
    IF v_at IS NOT NULL AND v_at > v_fresh_after THEN
        RETURN QUERY SELECT v_held, lock_held_count_millis(v_at), false;
        RETURN;
    END IF;
    PERFORM 1 FROM lock_held_count AS c
     WHERE c.singleton AND c.counted_at <= v_fresh_after
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- Another daemon is recounting (or just did): its count, or the
        -- previous one, without waiting; sweeps since subtracted either way.
        SELECT c.held - COALESCE((SELECT pg_catalog.sum(d.n) FROM lock_held_delta AS d), 0::pg_catalog.int8),
               c.counted_at
          INTO v_held, v_at
          FROM lock_held_count AS c WHERE c.singleton;
        RETURN QUERY SELECT v_held, lock_held_count_millis(v_at), false;
        RETURN;
    END IF;
    -- One statement, one snapshot: the rows deleted from lock_held_delta are
    -- exactly those of the batches this count(*) sees; the snapshot stored
    -- is the one both ran with (the active snapshot of this statement).
    WITH folded AS (DELETE FROM lock_held_delta)
    UPDATE lock_held_count AS c
       SET held = (SELECT pg_catalog.count(*) FROM lock_entry),
           counted_at = pg_catalog.now(),
           counted_xmin = pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())::pg_catalog.xid,
           counted_xmax = pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::pg_catalog.xid,
           counted_xip = ARRAY(SELECT x::pg_catalog.xid
                                 FROM pg_catalog.pg_snapshot_xip(pg_catalog.pg_current_snapshot()) AS x),
           recounts = c.recounts + 1
     WHERE c.singleton
    RETURNING c.held, c.counted_at INTO v_held, v_at;
    RETURN QUERY SELECT v_held, lock_held_count_millis(v_at), true;
END
$$;
ALTER FUNCTION public.lock_held_count_get(p_max_age_millis bigint) OWNER TO postgres;
CREATE FUNCTION public.lock_held_count_millis(p_at timestamp with time zone) RETURNS bigint
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN pg_catalog.isfinite(p_at)
                THEN pg_catalog.floor(EXTRACT(epoch FROM p_at) * 1000::numeric)::bigint
                ELSE 0 END
$$;
ALTER FUNCTION public.lock_held_count_millis(p_at timestamp with time zone) OWNER TO postgres;
CREATE FUNCTION public.lock_held_counted(p_version xid, p_counted_at timestamp with time zone, p_xmin xid, p_xmax xid, p_xip xid[]) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT p_counted_at > pg_catalog.now() - '1 minute'::pg_catalog.interval
       AND pg_catalog.age(p_version) > pg_catalog.age(p_xmax)
       AND (pg_catalog.age(p_version) > pg_catalog.age(p_xmin)
            OR p_version <> ALL (p_xip))
$$;
ALTER FUNCTION public.lock_held_counted(p_version xid, p_counted_at timestamp with time zone, p_xmin xid, p_xmax xid, p_xip xid[]) OWNER TO postgres;
CREATE FUNCTION public.lock_reap_busy(p_looks integer DEFAULT 1) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    v_busy integer := 0;
BEGIN
    FOR i IN 1 .. GREATEST(p_looks, 1) LOOP
        IF i > 1 THEN
            PERFORM pg_catalog.pg_stat_clear_snapshot();
            PERFORM pg_catalog.pg_sleep(0.001);
        END IF;
        SELECT pg_catalog.count(*)::pg_catalog.int4 INTO v_busy
          FROM pg_catalog.pg_stat_get_activity(NULL::pg_catalog.int4) AS a
         WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
           AND a.usesysid IS NOT NULL
           AND a.datid OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database AS d
                                                WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
           AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
           AND a.application_name IS DISTINCT FROM pg_catalog.current_setting('application_name');
        EXIT WHEN v_busy > 0;
    END LOOP;
    RETURN v_busy;
END
$$;
ALTER FUNCTION public.lock_reap_busy(p_looks integer) OWNER TO postgres;
CREATE FUNCTION public.lock_reap_expired(p_limit integer, p_after_millis bigint DEFAULT NULL::bigint) RETURNS TABLE(lock_key text, owner_id text, token bigint, expired_at_millis bigint, overdue_millis bigint, set_aside_error text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_from    timestamptz;
    v_rows    lock_reaped_lease[];
    v_one     lock_reaped_lease;
    v_failed  boolean := false;
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
    -- Fast path: one set-based statement, in its own function so its plan
    -- can be EXPLAINed (tests/it/sweep.rs) and tuned on its own. A function
    -- in FROM is run to completion into a tuplestore before its first row
    -- is read, so a failure inside it reaches the handler before RETURN
    -- QUERY has taken any row: no row is returned that was not deleted.
    -- It records its own row in lock_held_delta.
    BEGIN
        RETURN QUERY SELECT f.lock_key, f.owner_id, f.token, f.expired_at_millis, f.overdue_millis, f.set_aside_error
                       FROM lock_reap_expired_fast(p_limit, v_from) AS f;
        RETURN;
    EXCEPTION WHEN OTHERS THEN
        v_failed := true;
    END;
    -- Slow path, only after a failure: the same rows one by one.
    IF v_failed THEN
        SELECT * INTO v_count FROM lock_held_count AS c WHERE c.singleton;
        v_rows := '{}';
        FOR r IN
            SELECT l.lock_key, l.owner_id, l.token
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
                RETURNING e.lock_key, e.owner_id, e.token,
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
                        pg_catalog.format('%s (SQLSTATE %s)', SQLERRM, SQLSTATE))::lock_reaped_lease);
            END;
        END LOOP;
        IF v_n > 0 THEN
            INSERT INTO lock_held_delta (n) VALUES (v_n);
        END IF;
    END IF;
    RETURN QUERY SELECT u.lock_key, u.owner_id, u.token, u.expired_at_millis, u.overdue_millis, u.set_aside_error
                   FROM pg_catalog.unnest(v_rows) AS u;
END
$$;
ALTER FUNCTION public.lock_reap_expired(p_limit integer, p_after_millis bigint) OWNER TO postgres;
COMMENT ON FUNCTION public.lock_reap_expired(p_limit integer, p_after_millis bigint) IS 'The sweep: deletes up to p_limit (1-100000, else 22023) leases whose deadline has passed (database clock, checked again on the delete), oldest first, skipping rows another session holds (FOR UPDATE SKIP LOCKED), and returns each with its deadline and lateness in ms. p_after_millis resumes a drain after the newest deadline of the previous batch; NULL starts from the oldest. A row whose delete fails is left in place and returned with set_aside_error. The caller must report every row before committing. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
CREATE FUNCTION public.lock_reap_expired_fast(p_limit integer, p_from timestamp with time zone) RETURNS SETOF public.lock_reaped_lease
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    WITH doomed AS (
        SELECT l.ctid
          FROM lock_entry AS l
         WHERE l.expires_at <= pg_catalog.now()
           AND l.expires_at >= p_from
         ORDER BY l.expires_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM lock_entry AS e
         WHERE e.ctid = ANY (ARRAY(SELECT d.ctid FROM doomed AS d))
           AND e.expires_at <= pg_catalog.now()
        RETURNING e.lock_key, e.owner_id, e.token, e.expires_at, e.xmin AS version
    ), recorded AS (
        INSERT INTO lock_held_delta (n)
        SELECT pg_catalog.count(*)::pg_catalog.int4
          FROM gone AS g, lock_held_count AS c
         WHERE c.singleton
           AND lock_held_counted(g.version, c.counted_at, c.counted_xmin, c.counted_xmax, c.counted_xip)
        HAVING pg_catalog.count(*) > 0::pg_catalog.int8
    )
    SELECT g.lock_key, g.owner_id, g.token,
           lease_epoch_millis(g.expires_at),
           lease_overdue_millis(g.expires_at, pg_catalog.now()),
           NULL::pg_catalog.text
      FROM gone AS g
$$;
ALTER FUNCTION public.lock_reap_expired_fast(p_limit integer, p_from timestamp with time zone) OWNER TO postgres;
CREATE FUNCTION public.lock_reap_expired_handed_off(p_limit integer, p_after_millis bigint DEFAULT NULL::bigint) RETURNS TABLE(handoff_id bigint, lock_keys text[], owner_ids text[], tokens bigint[], expired_at_millis bigint[], overdue_millis bigint[], set_aside_keys text[], set_aside_owner_ids text[], set_aside_tokens bigint[], set_aside_errors text[], waiters integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_variable
DECLARE
    v_id bigint;
    v_k text[]; v_o text[]; v_t bigint[]; v_e bigint[]; v_d bigint[];
    s_k text[]; s_o text[]; s_t bigint[]; s_x text[];
BEGIN
    -- One pass over the function's result, every aggregate in its order.
    SELECT pg_catalog.array_agg(r.lock_key) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.owner_id) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.token) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.expired_at_millis) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.overdue_millis) FILTER (WHERE r.set_aside_error IS NULL),
           pg_catalog.array_agg(r.lock_key) FILTER (WHERE r.set_aside_error IS NOT NULL),
           pg_catalog.array_agg(r.owner_id) FILTER (WHERE r.set_aside_error IS NOT NULL),
           pg_catalog.array_agg(r.token) FILTER (WHERE r.set_aside_error IS NOT NULL),
           pg_catalog.array_agg(r.set_aside_error) FILTER (WHERE r.set_aside_error IS NOT NULL)
      INTO v_k, v_o, v_t, v_e, v_d, s_k, s_o, s_t, s_x
      FROM lock_reap_expired(p_limit, p_after_millis) AS r;
    IF v_k IS NOT NULL THEN
        INSERT INTO lock_reap_handoff AS h (lock_keys, owner_ids, tokens, expired_at_millis, overdue_millis)
        VALUES (v_k, v_o, v_t, v_e, v_d)
        RETURNING h.handoff_id INTO v_id;
    END IF;
    RETURN QUERY SELECT v_id, v_k, v_o, v_t, v_e, v_d, s_k, s_o, s_t, s_x, lock_reap_waiters();
END
$$;
ALTER FUNCTION public.lock_reap_expired_handed_off(p_limit integer, p_after_millis bigint) OWNER TO postgres;
COMMENT ON FUNCTION public.lock_reap_expired_handed_off(p_limit integer, p_after_millis bigint) IS 'lock_reap_expired(p_limit, p_after_millis), with the reaped leases recorded in one lock_reap_handoff row in the same transaction; returns its id (NULL when nothing was reaped) and the batch as arrays, then the set-aside leases, then how many sessions wait on its row locks. The sweeper commits, then claims the hand-off with lock_handoff_claim and writes its lines. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
CREATE FUNCTION public.lock_reap_expired_walk(p_limit integer, p_from_page bigint) RETURNS TABLE(lock_key text, owner_id text, token bigint, late interval, now_micros bigint, next_page bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    v_now_us bigint := (EXTRACT(epoch FROM pg_catalog.now()) * 1000000::numeric)::bigint;
    -- Fewer than two expired rows per page: the index is cheaper.
    v_budget bigint := GREATEST(p_limit / 2, 1);
    v_pages bigint := pg_catalog.pg_relation_size('lock_entry'::regclass)
                      / pg_catalog.current_setting('block_size')::bigint;
    v_from bigint := GREATEST(p_from_page, 0);
    v_to bigint;
    v_doomed tid[] := '{}';
    v_found tid[];
    v_rows bigint;
    v_next bigint;
BEGIN
    IF p_limit IS NULL OR p_limit < 0 THEN
        RAISE EXCEPTION 'lock_reap_expired_walk: limit must be a non-negative number of leases, got %', p_limit
            USING ERRCODE = '22023';
    END IF;
    IF p_from_page IS NULL THEN
        RAISE EXCEPTION 'lock_reap_expired_walk: the page to start at must not be NULL (0 starts at the first)'
            USING ERRCODE = '22023';
    END IF;
    LOOP
        v_to := v_from + v_budget;
        -- Infinite deadlines are left to lock_reap_expired, whose oldest-first
        -- batch (the first of every sweep) reaps them: `late` stays finite here.
        SELECT pg_catalog.array_agg(d.ctid) INTO v_found
          FROM (SELECT ctid
                  FROM lock_entry
                 WHERE ctid >= pg_catalog.format('(%s,0)', v_from)::tid
                   AND ctid < pg_catalog.format('(%s,0)', v_to)::tid
                   AND expires_at <= pg_catalog.now()
                   AND pg_catalog.isfinite(expires_at)
                 LIMIT p_limit - pg_catalog.cardinality(v_doomed)
                   FOR UPDATE SKIP LOCKED) AS d;
        v_doomed := v_doomed || COALESCE(v_found, '{}');
        IF pg_catalog.cardinality(v_doomed) >= p_limit AND p_limit > 0 THEN
            -- Full: resume on the page where the limit was reached.
            -- The scan returns pages in order, so the last tuple id is on the
            -- furthest page; were it not, resuming earlier only revisits pages.
            v_next := (v_doomed[pg_catalog.cardinality(v_doomed)]::text::point)[0]::bigint;
            EXIT;
        ELSIF v_to >= v_pages THEN
            v_next := -1;
            EXIT;
        END IF;
        v_next := v_to;
        EXIT WHEN p_limit = 0;
        -- A short range: sparse expired rows among live ones end the walk,
        -- empty pages do not.
        SELECT pg_catalog.count(*) INTO v_rows
          FROM lock_entry
         WHERE ctid >= pg_catalog.format('(%s,0)', v_from)::tid
           AND ctid < pg_catalog.format('(%s,0)', v_to)::tid;
        EXIT WHEN v_rows > 2 * COALESCE(pg_catalog.cardinality(v_found), 0);
        v_from := v_to;
    END LOOP;
    IF pg_catalog.cardinality(v_doomed) = 0 THEN
        -- Nothing to delete; one row tells the caller where to go next.
        RETURN QUERY SELECT NULL::text, NULL::text, NULL::bigint, NULL::interval, v_now_us, v_next;
        RETURN;
    END IF;
    -- Lateness as an interval and the clock once as integer microseconds: the
    -- caller derives both millisecond fields with integer arithmetic, so no
    -- row pays for numeric (or float) conversions.
    RETURN QUERY
    WITH gone AS (
        DELETE FROM lock_entry AS e
         WHERE e.ctid = ANY (v_doomed)
           AND e.expires_at <= pg_catalog.now()
        RETURNING e.lock_key, e.owner_id, e.token, e.expires_at, e.xmin AS version
    ), recorded AS (
        INSERT INTO lock_held_delta (n)
        SELECT pg_catalog.count(*)::pg_catalog.int4
          FROM gone AS g, lock_held_count AS c
         WHERE c.singleton
           AND lock_held_counted(g.version, c.counted_at, c.counted_xmin, c.counted_xmax, c.counted_xip)
        HAVING pg_catalog.count(*) > 0::pg_catalog.int8
    )
    SELECT g.lock_key, g.owner_id, g.token, pg_catalog.now() - g.expires_at, v_now_us, v_next
      FROM gone AS g;
END
$$;
ALTER FUNCTION public.lock_reap_expired_walk(p_limit integer, p_from_page bigint) OWNER TO postgres;
CREATE FUNCTION public.lock_reap_expired_walk_handed_off(p_limit integer, p_from_page bigint) RETURNS TABLE(handoff_id bigint, next_page bigint, lock_keys text[], owner_ids text[], tokens bigint[], expired_at_millis bigint[], overdue_millis bigint[], waiters integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_variable
DECLARE
    v_id bigint;
    v_next bigint;
    v_k text[]; v_o text[]; v_t bigint[]; v_e bigint[]; v_d bigint[];
BEGIN
    SELECT pg_catalog.max(w.next_page),
           pg_catalog.array_agg(w.lock_key) FILTER (WHERE w.lock_key IS NOT NULL),
           pg_catalog.array_agg(w.owner_id) FILTER (WHERE w.lock_key IS NOT NULL),
           pg_catalog.array_agg(w.token) FILTER (WHERE w.lock_key IS NOT NULL),
           pg_catalog.array_agg(lease_floor_div_1000(w.now_micros - w.late_us)) FILTER (WHERE w.lock_key IS NOT NULL),
           pg_catalog.array_agg(lease_floor_div_1000(w.late_us)) FILTER (WHERE w.lock_key IS NOT NULL)
      INTO v_next, v_k, v_o, v_t, v_e, v_d
      FROM (SELECT x.lock_key, x.owner_id, x.token, x.now_micros, x.next_page,
                   pg_catalog.round(pg_catalog.date_part('epoch', x.late) * 1000000::pg_catalog.float8)::pg_catalog.int8 AS late_us
              FROM lock_reap_expired_walk(p_limit, p_from_page) AS x) AS w;
    IF v_k IS NOT NULL THEN
        INSERT INTO lock_reap_handoff AS h (lock_keys, owner_ids, tokens, expired_at_millis, overdue_millis)
        VALUES (v_k, v_o, v_t, v_e, v_d)
        RETURNING h.handoff_id INTO v_id;
    END IF;
    RETURN QUERY SELECT v_id, COALESCE(v_next, -1::pg_catalog.int8), v_k, v_o, v_t, v_e, v_d,
                        lock_reap_waiters();
END
$$;
ALTER FUNCTION public.lock_reap_expired_walk_handed_off(p_limit integer, p_from_page bigint) OWNER TO postgres;
COMMENT ON FUNCTION public.lock_reap_expired_walk_handed_off(p_limit integer, p_from_page bigint) IS 'lock_reap_expired_walk(p_limit, p_from_page), with the reaped leases recorded in one lock_reap_handoff row in the same transaction; returns its id, the page to go on from (-1: the end), the batch as arrays and how many sessions wait on its row locks. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
CREATE FUNCTION public.lock_reap_waiters() RETURNS integer
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    WITH l AS MATERIALIZED (
        SELECT k.locktype, k.transactionid, k.pid, k.granted FROM pg_catalog.pg_locks AS k
    )
    SELECT pg_catalog.count(*)::pg_catalog.int4
      FROM l AS w
     WHERE w.locktype OPERATOR(pg_catalog.=) 'transactionid'
       AND NOT w.granted
       AND w.transactionid IN (SELECT h.transactionid FROM l AS h
                                WHERE h.locktype OPERATOR(pg_catalog.=) 'transactionid'
                                  AND h.granted
                                  AND h.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())
$$;
ALTER FUNCTION public.lock_reap_waiters() OWNER TO postgres;
CREATE FUNCTION public.lock_reap_walk(p_limit integer, p_from_page bigint, p_skip_locked boolean, p_stride integer DEFAULT 1, p_phase integer DEFAULT 0) RETURNS TABLE(handoff_id bigint, next_page bigint, lock_keys text[], owner_ids text[], tokens bigint[], expires_at timestamp with time zone[], reaped_at timestamp with time zone, waiters integer, busy integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET lock_timeout TO '10ms'
    AS $$
#variable_conflict use_column
DECLARE
    v_pages bigint := pg_catalog.pg_relation_size('lock_entry'::regclass)
                      / pg_catalog.current_setting('block_size')::bigint;
    -- The first range to look at, and its first page: p_from_page's range,
    -- or the next one of this walker's (set once the arguments are checked).
    v_range bigint := GREATEST(p_from_page, 0) / lock_walk_range_pages();
    v_lo bigint := GREATEST(p_from_page, 0);
    v_hi bigint;
    v_from tid;
    v_to tid;
    v_next bigint := GREATEST(p_from_page, 0);
    v_locked integer := 0;
    -- Others at work as the call starts, for the caller's next batches.
    v_busy integer := lock_reap_busy();
    -- Rows the batch takes so far, and in this range.
    v_taken bigint := 0;
    v_found bigint;
    -- Careful walk: the rows chosen and locked, by tuple id.
    v_doomed tid[] := '{}';
    v_locked_rows tid[];
    -- Fast walk: the spans to delete, from a locked range's first page to
    -- the last row counted in it, a run of ranges locked one after another
    -- making one span; the last range locked, to tell a run.
    v_span_lo tid[] := '{}';
    v_span_hi tid[] := '{}';
    v_last_range bigint;
    v_row tid;
    v_rows bigint;
    -- The held count's snapshot (lock_held_counted's rule, 20261201000100).
    v_counted boolean;
    v_age_xmin integer;
    v_age_xmax integer;
    v_xip xid[];
    -- The batch.
    v_keys text[];
    v_owners text[];
    v_tokens bigint[];
    v_expires timestamptz[];
    v_subtract bigint := 0;
    -- One span's share of the batch.
    s_keys text[];
    s_owners text[];
    s_tokens bigint[];
    s_expires timestamptz[];
    s_subtract bigint;
    v_id bigint;
BEGIN
    IF p_limit IS NULL OR p_limit < 0 THEN
        RAISE EXCEPTION 'lock_reap_walk: limit must be a non-negative number of leases, got %', p_limit
            USING ERRCODE = '22023';
    END IF;
    IF p_from_page IS NULL THEN
        RAISE EXCEPTION 'lock_reap_walk: the page to start at must not be NULL (0 starts at the first)'
            USING ERRCODE = '22023';
    END IF;
    IF p_skip_locked IS NULL THEN
        RAISE EXCEPTION 'lock_reap_walk: skip_locked must be true or false'
            USING ERRCODE = '22023';
    END IF;
    IF p_stride IS NULL OR p_stride < 1 THEN
        RAISE EXCEPTION 'lock_reap_walk: stride must be 1 or more (1: every range), got %', p_stride
            USING ERRCODE = '22023';
    END IF;
    IF p_phase IS NULL OR p_phase < 0 OR p_phase >= p_stride THEN
        RAISE EXCEPTION 'lock_reap_walk: phase must be from 0 to stride - 1 (%), got %', p_stride - 1, p_phase
            USING ERRCODE = '22023';
    END IF;
    IF v_range % p_stride <> p_phase THEN
        v_range := v_range + (p_phase - v_range % p_stride + p_stride) % p_stride;
        v_lo := v_range * lock_walk_range_pages();
    END IF;
    WHILE v_taken < p_limit LOOP
        IF v_lo >= v_pages THEN
            v_next := -1;
            EXIT;
        END IF;
        v_hi := (v_range + 1) * lock_walk_range_pages();
        -- The range as tuple ids: its first page's first, the next range's.
        v_from := pg_catalog.format('(%s,0)', v_lo)::tid;
        v_to := pg_catalog.format('(%s,0)', v_hi)::tid;
        -- Infinite deadlines are left to lock_reap_expired, whose
        -- oldest-first batch (the first of every sweep) reaps them.
        -- Seen first, no row locked: alone, how many expired rows the range
        -- holds, up to what the batch has room for, and the last of them;
        -- carefully, whether it holds any.
        IF p_skip_locked THEN
            SELECT pg_catalog.count(*) INTO v_found
              FROM (SELECT 1
                      FROM lock_entry
                     WHERE ctid >= v_from
                       AND ctid < v_to
                       AND expires_at <= pg_catalog.now()
                       AND pg_catalog.isfinite(expires_at)
                     LIMIT 1) AS d;
        ELSE
            SELECT pg_catalog.count(*), pg_catalog.max(d.ctid) INTO v_found, v_row
              FROM (SELECT ctid
                      FROM lock_entry
                     WHERE ctid >= v_from
                       AND ctid < v_to
                       AND expires_at <= pg_catalog.now()
                       AND pg_catalog.isfinite(expires_at)
                     LIMIT p_limit - v_taken) AS d;
        END IF;
        IF v_found > 0 THEN
            -- Taken once it has rows, so empty stretches take no lock, and
            -- before any of its rows is locked: a row locked in a range
            -- another walker holds would be held for nothing until commit,
            -- and a caller of its key would wait as long. Rows counted
            -- before the lock are safe: whoever held the range has committed
            -- (or rolled back) by now, and the DELETE sees it.
            IF NOT pg_catalog.pg_try_advisory_xact_lock(lock_walk_lock_class(), v_range::integer) THEN
                -- Another walker's range: its rows are its to delete, and
                -- no span of this batch covers it.
                v_range := v_range + p_stride;
                v_lo := v_range * lock_walk_range_pages();
                v_next := v_lo;
                CONTINUE;
            END IF;
            v_locked := v_locked + 1;
            IF p_skip_locked THEN
                -- Beside a workload: the rows still free, locked now; those
                -- others hold are skipped, never waited on.
                SELECT pg_catalog.count(*), pg_catalog.array_agg(d.ctid) INTO v_found, v_locked_rows
                  FROM (SELECT ctid
                          FROM lock_entry
                         WHERE ctid >= v_from
                           AND ctid < v_to
                           AND expires_at <= pg_catalog.now()
                           AND pg_catalog.isfinite(expires_at)
                         LIMIT p_limit - v_taken
                           FOR UPDATE SKIP LOCKED) AS d;
                v_doomed := v_doomed || v_locked_rows;
                v_row := v_locked_rows[pg_catalog.cardinality(v_locked_rows)];
            ELSIF v_last_range = v_range - 1 THEN
                -- Right after the range locked last: the same span, longer.
                v_span_hi[pg_catalog.cardinality(v_span_hi)] := v_row;
            ELSE
                v_span_lo := v_span_lo || v_from;
                v_span_hi := v_span_hi || v_row;
            END IF;
            v_last_range := v_range;
            v_taken := v_taken + v_found;
            IF v_taken >= p_limit THEN
                -- Full: resume on the page where the limit was reached (the
                -- range scan returns pages in order).
                v_next := (v_row::text::point)[0]::bigint;
                EXIT;
            END IF;
        END IF;
        v_next := v_hi;
        -- Fewer than two expired rows a page, most rows live: the index is
        -- cheaper from here (the batch comes back short, and the sweep goes
        -- on by the index). Empty pages do not end the walk.
        IF v_found < 2 * (v_hi - v_lo) THEN
            SELECT pg_catalog.count(*) INTO v_rows
              FROM lock_entry
             WHERE ctid >= v_from
               AND ctid < v_to;
            EXIT WHEN v_rows > 2 * v_found;
        END IF;
        -- A bounded number of advisory locks per transaction (the lock
        -- table is shared): past it the batch comes back short too.
        EXIT WHEN v_locked >= lock_walk_max_ranges();
        v_range := v_range + p_stride;
        v_lo := v_range * lock_walk_range_pages();
    END LOOP;
    IF v_next >= v_pages THEN
        v_next := -1;
    END IF;
    IF v_taken = 0 THEN
        RETURN QUERY SELECT NULL::bigint, v_next, NULL::text[], NULL::text[], NULL::bigint[],
                            NULL::timestamptz[], pg_catalog.now(), 0, v_busy;
        RETURN;
    END IF;
    SELECT c.counted_at > pg_catalog.now() - '1 minute'::pg_catalog.interval,
           pg_catalog.age(c.counted_xmin), pg_catalog.age(c.counted_xmax), c.counted_xip
      INTO v_counted, v_age_xmin, v_age_xmax, v_xip
      FROM lock_held_count AS c
     WHERE c.singleton;
    IF p_skip_locked THEN
        WITH gone AS (
            DELETE FROM lock_entry AS e
             WHERE e.ctid = ANY (v_doomed)
               AND e.expires_at <= pg_catalog.now()
            RETURNING e.lock_key, e.owner_id, e.token, e.expires_at, e.xmin
        )
        SELECT pg_catalog.array_agg(g.lock_key), pg_catalog.array_agg(g.owner_id),
               pg_catalog.array_agg(g.token), pg_catalog.array_agg(g.expires_at),
               pg_catalog.count(*) FILTER (
                   WHERE v_counted
                     AND (pg_catalog.age(g.xmin) > v_age_xmin
                          OR (pg_catalog.age(g.xmin) > v_age_xmax
                              AND g.xmin OPERATOR(pg_catalog.<>) ALL (v_xip))))
          INTO v_keys, v_owners, v_tokens, v_expires, v_subtract
          FROM gone AS g;
    ELSE
        -- One DELETE per span, page by page (a TID range scan); the pages
        -- between two spans (another walker's ranges) are not read.
        FOR i IN 1 .. pg_catalog.cardinality(v_span_lo) LOOP
            v_from := v_span_lo[i];
            v_row := v_span_hi[i];
            WITH gone AS (
                DELETE FROM lock_entry AS e
                 WHERE e.ctid >= v_from
                   AND e.ctid <= v_row
                   AND e.expires_at <= pg_catalog.now()
                   AND pg_catalog.isfinite(e.expires_at)
                RETURNING e.lock_key, e.owner_id, e.token, e.expires_at, e.xmin
            )
            SELECT pg_catalog.array_agg(g.lock_key), pg_catalog.array_agg(g.owner_id),
                   pg_catalog.array_agg(g.token), pg_catalog.array_agg(g.expires_at),
                   pg_catalog.count(*) FILTER (
                       WHERE v_counted
                         AND (pg_catalog.age(g.xmin) > v_age_xmin
                              OR (pg_catalog.age(g.xmin) > v_age_xmax
                                  AND g.xmin OPERATOR(pg_catalog.<>) ALL (v_xip))))
              INTO s_keys, s_owners, s_tokens, s_expires, s_subtract
              FROM gone AS g;
            -- Concatenating with NULL (nothing yet, or a span emptied since
            -- it was counted) gives the other array back.
            v_keys := v_keys || s_keys;
            v_owners := v_owners || s_owners;
            v_tokens := v_tokens || s_tokens;
            v_expires := v_expires || s_expires;
            v_subtract := v_subtract + s_subtract;
        END LOOP;
    END IF;
    IF v_keys IS NULL THEN
        -- Every chosen row changed before the DELETE: nothing to hand off.
        RETURN QUERY SELECT NULL::bigint, v_next, NULL::text[], NULL::text[], NULL::bigint[],
                            NULL::timestamptz[], pg_catalog.now(), lock_reap_waiters(), v_busy;
        RETURN;
    END IF;
    IF v_subtract > 0 THEN
        INSERT INTO lock_held_delta (n) VALUES (v_subtract::pg_catalog.int4);
    END IF;
    INSERT INTO lock_reap_handoff (lock_keys, owner_ids, tokens, expires_at, reaped_at)
    VALUES (v_keys, v_owners, v_tokens, v_expires, pg_catalog.now())
    RETURNING lock_reap_handoff.handoff_id INTO v_id;
    -- The waiters are counted after the DELETE.
    RETURN QUERY SELECT v_id, v_next, v_keys, v_owners, v_tokens, v_expires, pg_catalog.now(),
                        lock_reap_waiters(), v_busy;
END
$$;
ALTER FUNCTION public.lock_reap_walk(p_limit integer, p_from_page bigint, p_skip_locked boolean, p_stride integer, p_phase integer) OWNER TO postgres;
COMMENT ON FUNCTION public.lock_reap_walk(p_limit integer, p_from_page bigint, p_skip_locked boolean, p_stride integer, p_phase integer) IS 'Deletes p_limit expired leases (a few more if rows expire into the batch while it is taken) walking the heap from page p_from_page in ranges no other walker holds (advisory locks), only those whose number is p_phase modulo p_stride (1 and 0: every range; two walkers of one sweeper take 2 and 0, 2 and 1); alone, one DELETE per run of ranges by page range, a row someone holds failing the call after lock_timeout; with p_skip_locked, rows locked first and those others hold skipped. Records them in one lock_reap_handoff row in the same transaction, and returns its id, the page to go on from (-1: the end), the batch as arrays with the statement''s clock, how many sessions wait on its deleted rows and how many others are running a statement. The sweeper commits, then claims the hand-off with lock_handoff_claim and writes its lines. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
CREATE FUNCTION public.lock_release(p_lock_key text, p_token bigint) RETURNS boolean
    LANGUAGE sql
    AS $$
    WITH gone AS (
        DELETE FROM lock_entry
         WHERE lock_key = p_lock_key AND token = p_token AND expires_at > now()
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM gone)
$$;
ALTER FUNCTION public.lock_release(p_lock_key text, p_token bigint) OWNER TO postgres;
COMMENT ON FUNCTION public.lock_release(p_lock_key text, p_token bigint) IS 'Deletes the live lease on p_lock_key held with p_token. Returns true when deleted; false when there is no such live lease (a different token, already released or taken over), and false, leaving the row, after the deadline has passed: the overrun is then reported by the sweeper as lease_expired, never silently erased. NULL arguments: false. SECURITY INVOKER: needs SELECT, DELETE on lock_entry.';
CREATE FUNCTION public.lock_renew(p_lock_key text, p_token bigint, p_ttl_millis bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF p_ttl_millis IS NULL OR p_ttl_millis <= 0 OR p_ttl_millis > 31536000000 THEN
        RAISE EXCEPTION 'lock_renew: ttl must be a positive number of milliseconds, got % (at most 31536000000, one year)', p_ttl_millis
            USING ERRCODE = '22023';
    END IF;
    UPDATE lock_entry
       SET expires_at = now() + p_ttl_millis * interval '1 millisecond'
     WHERE lock_key = p_lock_key AND token = p_token AND expires_at > now();
    RETURN FOUND;
END
$$;
ALTER FUNCTION public.lock_renew(p_lock_key text, p_token bigint, p_ttl_millis bigint) OWNER TO postgres;
COMMENT ON FUNCTION public.lock_renew(p_lock_key text, p_token bigint, p_ttl_millis bigint) IS 'Moves the deadline of the live lease on p_lock_key held with p_token to now() + p_ttl_millis. Returns true when renewed; false when there is no such live lease (released, taken over, a different token, or already expired: an expired lease cannot be renewed, its holder has lost it and the sweeper reports the expiry); false for a NULL key or token. Errors 22023: ttl NULL, <= 0 or over 31536000000 ms. SECURITY INVOKER: needs SELECT, UPDATE on lock_entry.';
CREATE FUNCTION public.lock_sweep_probe(p_max_age_millis bigint) RETURNS TABLE(expired boolean, takeovers boolean, held bigint, busy integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_expired boolean := EXISTS (SELECT 1 FROM lock_entry AS e WHERE e.expires_at <= pg_catalog.now());
    v_takeovers boolean := EXISTS (SELECT 1 FROM lock_expiry_outbox)
                           OR EXISTS (SELECT 1 FROM lock_reap_handoff AS h
                                       WHERE h.written_at < pg_catalog.now() - signal_handoff_grace());
    v_held bigint;
BEGIN
    IF v_expired THEN
        RETURN QUERY SELECT true, v_takeovers, NULL::bigint, lock_reap_busy(3);
        RETURN;
    END IF;
    SELECT c.held - COALESCE((SELECT pg_catalog.sum(d.n) FROM lock_held_delta AS d), 0::pg_catalog.int8)
      INTO v_held
      FROM lock_held_count AS c
     WHERE c.singleton
       AND c.counted_at > pg_catalog.now() - p_max_age_millis * '1 millisecond'::interval;
    IF v_held IS NULL THEN
        SELECT c.held INTO v_held FROM lock_held_count_get(p_max_age_millis) AS c;
    END IF;
    RETURN QUERY SELECT false, v_takeovers, v_held, 0;
END
$$;
ALTER FUNCTION public.lock_sweep_probe(p_max_age_millis bigint) OWNER TO postgres;
CREATE FUNCTION public.lock_walk_lock_class() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 1819767393 $$;
ALTER FUNCTION public.lock_walk_lock_class() OWNER TO postgres;
CREATE FUNCTION public.lock_walk_max_ranges() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 16 $$;
ALTER FUNCTION public.lock_walk_max_ranges() OWNER TO postgres;
CREATE FUNCTION public.lock_walk_range_pages() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 64::pg_catalog.int8 $$;
ALTER FUNCTION public.lock_walk_range_pages() OWNER TO postgres;
CREATE FUNCTION public.queue_setting_audit_change() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
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
ALTER FUNCTION public.queue_setting_audit_change() OWNER TO postgres;
CREATE FUNCTION public.signal_handoff_grace() RETURNS interval
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT '5 seconds'::pg_catalog.interval $$;
ALTER FUNCTION public.signal_handoff_grace() OWNER TO postgres;
CREATE TABLE public._sqlx_migrations (
    version bigint NOT NULL,
    description text NOT NULL,
    installed_on timestamp with time zone DEFAULT now() NOT NULL,
    success boolean NOT NULL,
    checksum bytea NOT NULL,
    execution_time bigint NOT NULL
);
ALTER TABLE public._sqlx_migrations OWNER TO postgres;
CREATE TABLE public.job_dead_letter (
    dead_letter_id uuid DEFAULT gen_random_uuid() NOT NULL,
    job_id uuid NOT NULL,
    job_kind text NOT NULL,
    payload jsonb NOT NULL,
    attempts integer NOT NULL,
    final_error text NOT NULL,
    moved_by text NOT NULL,
    moved_by_role text DEFAULT SESSION_USER NOT NULL,
    moved_at timestamp with time zone DEFAULT now() NOT NULL
);
ALTER TABLE public.job_dead_letter OWNER TO postgres;
CREATE TABLE public.job_kind_lease (
    job_kind text NOT NULL,
    lease_sec integer NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_by text NOT NULL,
    CONSTRAINT job_kind_lease_kind_not_empty CHECK ((job_kind <> ''::text)),
    CONSTRAINT job_kind_lease_seconds_from_1_to_86400 CHECK (((lease_sec >= 1) AND (lease_sec <= 86400)))
);
ALTER TABLE public.job_kind_lease OWNER TO postgres;
CREATE TABLE public.job_kind_lease_audit (
    audit_id bigint NOT NULL,
    job_kind text NOT NULL,
    old_lease_sec integer,
    new_lease_sec integer,
    actor text NOT NULL,
    changed_by_role text DEFAULT SESSION_USER NOT NULL,
    changed_at timestamp with time zone DEFAULT now() NOT NULL
);
ALTER TABLE public.job_kind_lease_audit OWNER TO postgres;
ALTER TABLE public.job_kind_lease_audit ALTER COLUMN audit_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.job_kind_lease_audit_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.job_reap_handoff (
    handoff_id bigint NOT NULL,
    written_at timestamp with time zone DEFAULT now() NOT NULL,
    report text NOT NULL,
    CONSTRAINT job_reap_handoff_report_check CHECK ((report <> ''::text))
)
WITH (autovacuum_vacuum_threshold='50', autovacuum_vacuum_scale_factor='0');
ALTER TABLE ONLY public.job_reap_handoff ALTER COLUMN report SET COMPRESSION lz4;
ALTER TABLE public.job_reap_handoff OWNER TO postgres;
ALTER TABLE public.job_reap_handoff ALTER COLUMN handoff_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.job_reap_handoff_handoff_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.lock_entry (
    lock_key text NOT NULL,
    session_id uuid,
    owner_id text NOT NULL,
    token bigint NOT NULL,
    acquired_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT lock_entry_expires_at_finite CHECK (isfinite(expires_at)),
    CONSTRAINT lock_entry_lock_key_check CHECK ((lock_key <> ''::text))
);
ALTER TABLE public.lock_entry OWNER TO postgres;
CREATE TABLE public.lock_expiry_outbox (
    outbox_id bigint NOT NULL,
    lock_key text NOT NULL,
    owner_id text NOT NULL,
    token bigint NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    taken_over_at timestamp with time zone DEFAULT now() NOT NULL,
    new_token bigint NOT NULL,
    CONSTRAINT lock_expiry_outbox_expires_at_finite CHECK (isfinite(expires_at)),
    CONSTRAINT lock_expiry_outbox_taken_over_at_finite CHECK (isfinite(taken_over_at))
);
ALTER TABLE public.lock_expiry_outbox OWNER TO postgres;
ALTER TABLE public.lock_expiry_outbox ALTER COLUMN outbox_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.lock_expiry_outbox_outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE SEQUENCE public.lock_fencing_token_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;
ALTER TABLE public.lock_fencing_token_seq OWNER TO postgres;
CREATE TABLE public.lock_held_count (
    singleton boolean DEFAULT true NOT NULL,
    held bigint NOT NULL,
    counted_at timestamp with time zone NOT NULL,
    recounts bigint DEFAULT 0 NOT NULL,
    counted_xmin xid,
    counted_xmax xid,
    counted_xip xid[],
    CONSTRAINT lock_held_count_singleton_check CHECK (singleton)
);
ALTER TABLE public.lock_held_count OWNER TO postgres;
CREATE TABLE public.lock_held_delta (
    delta_id bigint NOT NULL,
    n integer NOT NULL,
    CONSTRAINT lock_held_delta_n_check CHECK ((n > 0))
);
ALTER TABLE public.lock_held_delta OWNER TO postgres;
ALTER TABLE public.lock_held_delta ALTER COLUMN delta_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.lock_held_delta_delta_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.lock_reap_handoff (
    handoff_id bigint NOT NULL,
    written_at timestamp with time zone DEFAULT now() NOT NULL,
    lock_keys text[] NOT NULL,
    owner_ids text[] NOT NULL,
    tokens bigint[] NOT NULL,
    expired_at_millis bigint[],
    overdue_millis bigint[],
    expires_at timestamp with time zone[],
    reaped_at timestamp with time zone,
    CONSTRAINT lock_reap_handoff_one_length_each CHECK (((cardinality(lock_keys) > 0) AND (cardinality(owner_ids) = cardinality(lock_keys)) AND (cardinality(tokens) = cardinality(lock_keys)) AND (((expires_at IS NULL) AND (reaped_at IS NULL) AND (cardinality(expired_at_millis) = cardinality(lock_keys)) AND (cardinality(overdue_millis) = cardinality(lock_keys))) OR ((expired_at_millis IS NULL) AND (overdue_millis IS NULL) AND (reaped_at IS NOT NULL) AND (cardinality(expires_at) = cardinality(lock_keys))))))
)
WITH (autovacuum_vacuum_threshold='50', autovacuum_vacuum_scale_factor='0');
ALTER TABLE ONLY public.lock_reap_handoff ALTER COLUMN lock_keys SET COMPRESSION lz4;
ALTER TABLE ONLY public.lock_reap_handoff ALTER COLUMN owner_ids SET COMPRESSION lz4;
ALTER TABLE ONLY public.lock_reap_handoff ALTER COLUMN tokens SET COMPRESSION lz4;
ALTER TABLE ONLY public.lock_reap_handoff ALTER COLUMN expired_at_millis SET COMPRESSION lz4;
ALTER TABLE ONLY public.lock_reap_handoff ALTER COLUMN overdue_millis SET COMPRESSION lz4;
ALTER TABLE ONLY public.lock_reap_handoff ALTER COLUMN expires_at SET COMPRESSION lz4;
ALTER TABLE public.lock_reap_handoff OWNER TO postgres;
ALTER TABLE public.lock_reap_handoff ALTER COLUMN handoff_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.lock_reap_handoff_handoff_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.lock_session (
    session_id uuid DEFAULT gen_random_uuid() NOT NULL,
    owner_id text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    last_heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL
);
ALTER TABLE public.lock_session OWNER TO postgres;
CREATE TABLE public.queue_setting (
    key text NOT NULL,
    value text NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_by text NOT NULL,
    CONSTRAINT queue_setting_boolean_is_true_or_false CHECK (((key <> ALL (ARRAY['queue.job_substrate.enabled'::text, 'queue.lease.reaper_enabled'::text, 'queue.lease.reaper_dry_run_only'::text])) OR (value = ANY (ARRAY['true'::text, 'false'::text])))),
    CONSTRAINT queue_setting_seconds_from_1_to_86400 CHECK (((key <> ALL (ARRAY['queue.retry.backoff_base_sec'::text, 'queue.lease.duration_sec'::text])) OR
CASE
    WHEN (value ~ '^[0-9]{1,5}$'::text) THEN (((value)::integer >= 1) AND ((value)::integer <= 86400))
    ELSE false
END))
);
ALTER TABLE public.queue_setting OWNER TO postgres;
CREATE TABLE public.queue_setting_audit (
    audit_id bigint NOT NULL,
    key text NOT NULL,
    old_value text,
    new_value text,
    actor text NOT NULL,
    changed_by_role text DEFAULT SESSION_USER NOT NULL,
    changed_at timestamp with time zone DEFAULT now() NOT NULL
);
ALTER TABLE public.queue_setting_audit OWNER TO postgres;
ALTER TABLE public.queue_setting_audit ALTER COLUMN audit_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.queue_setting_audit_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
INSERT INTO public._sqlx_migrations VALUES (20261129000100, 'lock leases', '2026-12-07 08:22:34.086002+00', true, '\xa762107ac4785e78aa1e3b53c752be5e12c604952d374a2021b0ca992a883a1c840348aeeb4f592ec438937a6588ac6c', 7608571);
INSERT INTO public._sqlx_migrations VALUES (20261129000200, 'job queue', '2026-12-07 08:22:34.093979+00', true, '\xf1ed76117a23a92e736a05b0b811845b55e97845e54ebe011d0aeb0d2ad3a60030546b5617a33c56a071f2fbc1ef626a', 9444318);
INSERT INTO public._sqlx_migrations VALUES (20261129000300, 'sweeper role', '2026-12-07 08:22:34.103766+00', true, '\xa1eadb5d66c77765e55a94a05d7bae2bd58d8e55f734b6a01358197604598bb153f2315db024dd603238161d729080f8', 1316085);
INSERT INTO public._sqlx_migrations VALUES (20261130000100, 'lock rows never block', '2026-12-07 08:22:34.105401+00', true, '\x18cdf637b8731ce030f285dd216ea35d7301c2d1faf4a14e2cc8764931d173aead1e73ca7a701ec813ef08d5335271e3', 1913522);
INSERT INTO public._sqlx_migrations VALUES (20261130000110, 'job rows never block', '2026-12-07 08:22:34.107642+00', true, '\xc67112829d870949bb3cf4afa83dcb84e4e355033cb57567f6115d2e1f8e7bd950f5699873ec30ae6f30dd96e5247c1e', 2329771);
INSERT INTO public._sqlx_migrations VALUES (20261130000120, 'privilege holes', '2026-12-07 08:22:34.110212+00', true, '\x9d4eb57eb97ce57585bd21e725d1d149f70ba037957e7a3a0048f10cb349ffe8940cab16530133e621e41ea0465864d6', 1152632);
INSERT INTO public._sqlx_migrations VALUES (20261130000300, 'reap walk and shared held count', '2026-12-07 08:22:34.1116+00', true, '\xe681a8f9f8fe5deb19c61dda101bb2d9f9698ae7f8da4c6e9a99f7312e6a4d67da4edbeeb2ddda9a2936a1bcd0608125', 2159888);
INSERT INTO public._sqlx_migrations VALUES (20261130000400, 'job idle question in plpgsql', '2026-12-07 08:22:34.113976+00', true, '\xc94f812e3c50452ae641830025b18e7ee002842b8199dc2438f7849f7e5208766e726b3f16b1eb731a70e8f585e682ad', 661733);
INSERT INTO public._sqlx_migrations VALUES (20261201000100, 'held count follows sweeps', '2026-12-07 08:22:34.114993+00', true, '\x4cec62e8b6a2ccfb936e8506de4bca33b752c487796dcc473757528f680762f14cf9dab88119f2aba0cf5aff75f8fc1b', 4669961);
INSERT INTO public._sqlx_migrations VALUES (20261201000200, 'job lease duration', '2026-12-07 08:22:34.119963+00', true, '\xf0af6baaa5f5fcebb291dac7f25e788f849f46043269e37cd5f0ead6fc91ba3d221ac1d36a61d8b720a793a4e4bf8915', 6825768);
INSERT INTO public._sqlx_migrations VALUES (20261201000400, 'function comments', '2026-12-07 08:22:34.127031+00', true, '\x60ee757e3b6c4f8d91219e7b545e8417ce500e2435fe5d4447c0b76f5ab2c5de4d9a3d44a5b1cd55930dee7469296d29', 811005);
INSERT INTO public._sqlx_migrations VALUES (20261202000100, 'reap handoff', '2026-12-07 08:22:34.128006+00', true, '\x5b4c685fe279f6da17b2fe5caf9caacad8cdba7da7221f7cfcd7b8018e5c05197a785de051d2f7abe0d373e8375dfb9d', 4466825);
INSERT INTO public._sqlx_migrations VALUES (20261202000200, 'job reap hash joins', '2026-12-07 08:22:34.132693+00', true, '\xead1de07303ead6653e72e98140bde958ddaa0816003004c6c7ccd81723d6cb59418f9348eb78a64a7bbfac221f903fa', 452442);
INSERT INTO public._sqlx_migrations VALUES (20261202000300, 'handoff in the reaping call', '2026-12-07 08:22:34.133312+00', true, '\xde75f826a8caa423007e10df4f6def63bd09480824a17609ca38b12761d36ebd890870e15b51a4ebfd477ee0da9c2936', 1185891);
INSERT INTO public._sqlx_migrations VALUES (20261204000100, 'walk past empty pages', '2026-12-07 08:22:34.134752+00', true, '\x3c16223fa06e55c4c5a4b5b4fc2575a40f2817456cefc39fb5d6cc4c5487024291bad9d49988648fa81dad4ce7166773', 889982);
INSERT INTO public._sqlx_migrations VALUES (20261204000200, 'walk without row locks', '2026-12-07 08:22:34.135801+00', true, '\x32d3e67a0e77782f726c8bf5a6a5853960de6fda3c24c79f987961afc79b8ae8035e18d365f38177af93201880952747', 1562000);
INSERT INTO public._sqlx_migrations VALUES (20261204000300, 'walk deletes by page range', '2026-12-07 08:22:34.137605+00', true, '\x8849189dae864e9cf33d129d568f8a5b308c1667e2907e3b9bdfa095113b8347a7748d6a0ab6282e30a0d4f8837bf298', 737596);
INSERT INTO public._sqlx_migrations VALUES (20261205000100, 'walk in strides', '2026-12-07 08:22:34.138515+00', true, '\x2604e76428ee092d7992b3276ddacac645ea740d61f98699646797635bc53a3ac182875b47b000ab24e298ad1c630261', 1057070);
INSERT INTO public._sqlx_migrations VALUES (20261205000200, 'job reaper sees workers', '2026-12-07 08:22:34.139796+00', true, '\x6fe45156e1ad999921235581351703c7f6c248bf95dd2774107df28df67c5136eb1ad70aca17bc50068d2e3b70a400cc', 468186);
INSERT INTO public.lock_entry VALUES ('earlier-expired-1', NULL, 'holder', 101, '2026-12-07 08:22:34.168516+00', '2026-12-07 07:22:34.168516+00');
INSERT INTO public.lock_entry VALUES ('earlier-expired-2', NULL, 'holder', 102, '2026-12-07 08:22:34.168516+00', '2026-12-07 07:22:34.168516+00');
INSERT INTO public.lock_entry VALUES ('earlier-expired-3', NULL, 'holder', 103, '2026-12-07 08:22:34.168516+00', '2026-12-07 07:22:34.168516+00');
INSERT INTO public.lock_entry VALUES ('earlier-expired-4', NULL, 'holder', 104, '2026-12-07 08:22:34.168516+00', '2026-12-07 07:22:34.168516+00');
INSERT INTO public.lock_entry VALUES ('earlier-expired-5', NULL, 'holder', 105, '2026-12-07 08:22:34.168516+00', '2026-12-07 07:22:34.168516+00');
INSERT INTO public.lock_entry VALUES ('earlier-live-1', NULL, 'holder', 201, '2026-12-07 08:22:34.169946+00', '2036-12-07 08:22:34.169946+00');
INSERT INTO public.lock_entry VALUES ('earlier-live-2', NULL, 'holder', 202, '2026-12-07 08:22:34.169946+00', '2036-12-07 08:22:34.169946+00');
INSERT INTO public.lock_entry VALUES ('earlier-live-3', NULL, 'holder', 203, '2026-12-07 08:22:34.169946+00', '2036-12-07 08:22:34.169946+00');
INSERT INTO public.lock_expiry_outbox OVERRIDING SYSTEM VALUE VALUES (1, 'earlier-taken', 'paused', 300, '2026-12-07 06:22:34.170233+00', '2026-12-07 07:22:34.170233+00', 301);
INSERT INTO public.lock_held_count VALUES (true, 0, '-infinity', 0, NULL, NULL, NULL);
INSERT INTO public.lock_reap_handoff OVERRIDING SYSTEM VALUE VALUES (1, '2026-12-07 07:22:34.170625+00', '{earlier-handed-1}', '{dead}', '{400}', '{1796600000000}', '{1500}', NULL, NULL);
INSERT INTO public.lock_reap_handoff OVERRIDING SYSTEM VALUE VALUES (2, '2026-12-07 07:22:34.171078+00', '{earlier-walked-1,earlier-walked-2}', '{dead,dead}', '{500,501}', NULL, NULL, '{"2026-12-01 00:00:00+00","2026-12-01 00:00:01+00"}', '2026-12-01 00:00:02.5+00');
INSERT INTO public.queue_setting VALUES ('queue.job_substrate.enabled', 'false', '2026-12-07 08:22:34.093979+00', 'migration');
INSERT INTO public.queue_setting VALUES ('queue.lease.reaper_enabled', 'false', '2026-12-07 08:22:34.093979+00', 'migration');
INSERT INTO public.queue_setting VALUES ('queue.lease.reaper_dry_run_only', 'true', '2026-12-07 08:22:34.093979+00', 'migration');
INSERT INTO public.queue_setting VALUES ('queue.retry.backoff_base_sec', '10', '2026-12-07 08:22:34.093979+00', 'migration');
INSERT INTO public.queue_setting VALUES ('queue.lease.duration_sec', '300', '2026-12-07 08:22:34.093979+00', 'migration');
SELECT pg_catalog.setval('public.job_kind_lease_audit_audit_id_seq', 1, false);
SELECT pg_catalog.setval('public.job_reap_handoff_handoff_id_seq', 1, false);
SELECT pg_catalog.setval('public.lock_expiry_outbox_outbox_id_seq', 1, true);
SELECT pg_catalog.setval('public.lock_fencing_token_seq', 1, false);
SELECT pg_catalog.setval('public.lock_held_delta_delta_id_seq', 1, false);
SELECT pg_catalog.setval('public.lock_reap_handoff_handoff_id_seq', 2, true);
SELECT pg_catalog.setval('public.queue_setting_audit_audit_id_seq', 1, false);
ALTER TABLE ONLY public._sqlx_migrations
    ADD CONSTRAINT _sqlx_migrations_pkey PRIMARY KEY (version);
ALTER TABLE ONLY public.job_dead_letter
    ADD CONSTRAINT job_dead_letter_pkey PRIMARY KEY (dead_letter_id);
ALTER TABLE ONLY public.job_kind_lease_audit
    ADD CONSTRAINT job_kind_lease_audit_pkey PRIMARY KEY (audit_id);
ALTER TABLE ONLY public.job_kind_lease
    ADD CONSTRAINT job_kind_lease_pkey PRIMARY KEY (job_kind);
ALTER TABLE ONLY public.job_queue
    ADD CONSTRAINT job_queue_pkey PRIMARY KEY (job_id);
ALTER TABLE ONLY public.job_reap_handoff
    ADD CONSTRAINT job_reap_handoff_pkey PRIMARY KEY (handoff_id);
ALTER TABLE ONLY public.lock_entry
    ADD CONSTRAINT lock_entry_pkey PRIMARY KEY (lock_key);
ALTER TABLE ONLY public.lock_expiry_outbox
    ADD CONSTRAINT lock_expiry_outbox_pkey PRIMARY KEY (outbox_id);
ALTER TABLE ONLY public.lock_held_count
    ADD CONSTRAINT lock_held_count_pkey PRIMARY KEY (singleton);
ALTER TABLE ONLY public.lock_held_delta
    ADD CONSTRAINT lock_held_delta_pkey PRIMARY KEY (delta_id);
ALTER TABLE ONLY public.lock_reap_handoff
    ADD CONSTRAINT lock_reap_handoff_pkey PRIMARY KEY (handoff_id);
ALTER TABLE ONLY public.lock_session
    ADD CONSTRAINT lock_session_pkey PRIMARY KEY (session_id);
ALTER TABLE ONLY public.queue_setting_audit
    ADD CONSTRAINT queue_setting_audit_pkey PRIMARY KEY (audit_id);
ALTER TABLE ONLY public.queue_setting
    ADD CONSTRAINT queue_setting_pkey PRIMARY KEY (key);
CREATE INDEX job_dead_letter_job_idx ON public.job_dead_letter USING btree (job_id);
CREATE INDEX job_kind_lease_audit_kind_idx ON public.job_kind_lease_audit USING btree (job_kind, changed_at);
CREATE INDEX job_queue_claimable_idx ON public.job_queue USING btree (scheduled_at) WHERE (state = ANY (ARRAY['queued'::text, 'retry_waiting'::text]));
CREATE INDEX job_queue_lease_until_idx ON public.job_queue USING btree (lease_until) WHERE (state = 'leased'::text);
CREATE INDEX lock_entry_expiry_idx ON public.lock_entry USING btree (expires_at);
CREATE INDEX lock_entry_session_idx ON public.lock_entry USING btree (session_id) WHERE (session_id IS NOT NULL);
CREATE INDEX queue_setting_audit_key_idx ON public.queue_setting_audit USING btree (key, changed_at);
CREATE TRIGGER job_kind_lease_audited AFTER INSERT OR DELETE OR UPDATE ON public.job_kind_lease FOR EACH ROW EXECUTE FUNCTION public.job_kind_lease_audit_change();
CREATE TRIGGER lock_entry_takeover AFTER UPDATE ON public.lock_entry FOR EACH ROW WHEN ((old.token IS DISTINCT FROM new.token)) EXECUTE FUNCTION public.lock_entry_record_takeover();
CREATE TRIGGER queue_setting_audited AFTER INSERT OR DELETE OR UPDATE ON public.queue_setting FOR EACH ROW EXECUTE FUNCTION public.queue_setting_audit_change();
ALTER TABLE ONLY public.lock_entry
    ADD CONSTRAINT lock_entry_session_id_fkey FOREIGN KEY (session_id) REFERENCES public.lock_session(session_id) ON DELETE CASCADE;
GRANT USAGE ON SCHEMA public TO lease_sweeper;
GRANT SELECT(job_id) ON TABLE public.job_queue TO lease_sweeper;
GRANT SELECT(job_kind) ON TABLE public.job_queue TO lease_sweeper;
GRANT SELECT(state) ON TABLE public.job_queue TO lease_sweeper;
GRANT SELECT(attempts) ON TABLE public.job_queue TO lease_sweeper;
GRANT SELECT(max_attempts) ON TABLE public.job_queue TO lease_sweeper;
GRANT SELECT(lease_owner) ON TABLE public.job_queue TO lease_sweeper;
GRANT SELECT(lease_until) ON TABLE public.job_queue TO lease_sweeper;
GRANT SELECT(lease_duration_sec) ON TABLE public.job_queue TO lease_sweeper;
GRANT SELECT(lease_duration_source) ON TABLE public.job_queue TO lease_sweeper;
REVOKE ALL ON FUNCTION public.fn_job_kind_lease_set(p_job_kind text, p_lease_sec integer, p_actor text) FROM PUBLIC;
REVOKE ALL ON FUNCTION public.fn_job_reap_handoff_abandoned() FROM PUBLIC;
GRANT ALL ON FUNCTION public.fn_job_reap_handoff_abandoned() TO lease_sweeper;
REVOKE ALL ON FUNCTION public.fn_job_reap_handoff_claim(p_handoff_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION public.fn_job_reap_handoff_claim(p_handoff_id bigint) TO lease_sweeper;
REVOKE ALL ON FUNCTION public.fn_job_reap_handoff_recover() FROM PUBLIC;
GRANT ALL ON FUNCTION public.fn_job_reap_handoff_recover() TO lease_sweeper;
REVOKE ALL ON FUNCTION public.fn_job_reap_ids(p_only uuid, p_actor text, p_limit integer, p_base bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION public.fn_job_reap_stale_leases_apply(p_actor text, p_limit integer) FROM PUBLIC;
GRANT ALL ON FUNCTION public.fn_job_reap_stale_leases_apply(p_actor text, p_limit integer) TO lease_sweeper;
REVOKE ALL ON FUNCTION public.fn_job_reap_stale_leases_apply_handed_off(p_actor text, p_limit integer) FROM PUBLIC;
GRANT ALL ON FUNCTION public.fn_job_reap_stale_leases_apply_handed_off(p_actor text, p_limit integer) TO lease_sweeper;
GRANT ALL ON FUNCTION public.fn_job_reap_stale_leases_dry_run(p_limit integer) TO lease_sweeper;
GRANT ALL ON FUNCTION public.fn_job_reaper_gate_refusal() TO lease_sweeper;
GRANT ALL ON FUNCTION public.fn_job_reaper_limit_refusal(p_limit integer) TO lease_sweeper;
GRANT ALL ON FUNCTION public.fn_job_stale_lease_count() TO lease_sweeper;
REVOKE ALL ON FUNCTION public.fn_queue_setting_set(p_key text, p_value text, p_actor text) FROM PUBLIC;
REVOKE ALL ON FUNCTION public.job_kind_lease_audit_change() FROM PUBLIC;
REVOKE ALL ON FUNCTION public.lease_floor_div_1000(p_x bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION public.lock_drain_takeovers(p_limit integer) FROM PUBLIC;
GRANT ALL ON FUNCTION public.lock_drain_takeovers(p_limit integer) TO lease_sweeper;
REVOKE ALL ON FUNCTION public.lock_entry_record_takeover() FROM PUBLIC;
REVOKE ALL ON FUNCTION public.lock_handoff_claim(p_handoff_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION public.lock_handoff_claim(p_handoff_id bigint) TO lease_sweeper;
REVOKE ALL ON FUNCTION public.lock_handoff_recover() FROM PUBLIC;
GRANT ALL ON FUNCTION public.lock_handoff_recover() TO lease_sweeper;
REVOKE ALL ON FUNCTION public.lock_held_count_get(p_max_age_millis bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION public.lock_held_count_get(p_max_age_millis bigint) TO lease_sweeper;
REVOKE ALL ON FUNCTION public.lock_held_counted(p_version xid, p_counted_at timestamp with time zone, p_xmin xid, p_xmax xid, p_xip xid[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION public.lock_reap_busy(p_looks integer) FROM PUBLIC;
GRANT ALL ON FUNCTION public.lock_reap_busy(p_looks integer) TO lease_sweeper;
REVOKE ALL ON FUNCTION public.lock_reap_expired(p_limit integer, p_after_millis bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION public.lock_reap_expired(p_limit integer, p_after_millis bigint) TO lease_sweeper;
REVOKE ALL ON FUNCTION public.lock_reap_expired_fast(p_limit integer, p_from timestamp with time zone) FROM PUBLIC;
REVOKE ALL ON FUNCTION public.lock_reap_expired_handed_off(p_limit integer, p_after_millis bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION public.lock_reap_expired_handed_off(p_limit integer, p_after_millis bigint) TO lease_sweeper;
REVOKE ALL ON FUNCTION public.lock_reap_expired_walk(p_limit integer, p_from_page bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION public.lock_reap_expired_walk(p_limit integer, p_from_page bigint) TO lease_sweeper;
REVOKE ALL ON FUNCTION public.lock_reap_expired_walk_handed_off(p_limit integer, p_from_page bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION public.lock_reap_expired_walk_handed_off(p_limit integer, p_from_page bigint) TO lease_sweeper;
REVOKE ALL ON FUNCTION public.lock_reap_waiters() FROM PUBLIC;
REVOKE ALL ON FUNCTION public.lock_reap_walk(p_limit integer, p_from_page bigint, p_skip_locked boolean, p_stride integer, p_phase integer) FROM PUBLIC;
GRANT ALL ON FUNCTION public.lock_reap_walk(p_limit integer, p_from_page bigint, p_skip_locked boolean, p_stride integer, p_phase integer) TO lease_sweeper;
REVOKE ALL ON FUNCTION public.lock_sweep_probe(p_max_age_millis bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION public.lock_sweep_probe(p_max_age_millis bigint) TO lease_sweeper;
REVOKE ALL ON FUNCTION public.lock_walk_lock_class() FROM PUBLIC;
REVOKE ALL ON FUNCTION public.lock_walk_max_ranges() FROM PUBLIC;
REVOKE ALL ON FUNCTION public.lock_walk_range_pages() FROM PUBLIC;
REVOKE ALL ON FUNCTION public.queue_setting_audit_change() FROM PUBLIC;
REVOKE ALL ON FUNCTION public.signal_handoff_grace() FROM PUBLIC;
GRANT SELECT ON TABLE public._sqlx_migrations TO lease_sweeper;
GRANT SELECT ON TABLE public.queue_setting TO lease_sweeper;
