-- The stand-in job substrate: the queue's tables, settings and statements.
--
-- `lease-sweeper migrate` runs this file only where no `job_queue` is on the
-- search path. A queue that already runs keeps its own (docs/adopting.md):
-- the reaper needs its columns, `fn_job_move_to_dead_letter` and
-- `queue_setting`, and adds only its two gates, its functions and its
-- hand-off. Either way these are the queue's: `lease-sweeper remove` leaves
-- them, their rows and their audit alone. With the substrate gate off (its
-- default) the reaper reaps nothing.


CREATE TABLE job_queue (
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

CREATE TABLE job_dead_letter (
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

CREATE TABLE job_kind_lease (
    job_kind text NOT NULL,
    lease_sec integer NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_by text NOT NULL,
    CONSTRAINT job_kind_lease_kind_not_empty CHECK ((job_kind <> ''::text)),
    CONSTRAINT job_kind_lease_seconds_from_1_to_86400 CHECK (((lease_sec >= 1) AND (lease_sec <= 86400)))
);

CREATE TABLE job_kind_lease_audit (
    audit_id bigint NOT NULL,
    job_kind text NOT NULL,
    old_lease_sec integer,
    new_lease_sec integer,
    actor text NOT NULL,
    changed_by_role text DEFAULT SESSION_USER NOT NULL,
    changed_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE job_kind_lease_audit ALTER COLUMN audit_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME job_kind_lease_audit_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE queue_setting (
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

CREATE TABLE queue_setting_audit (
    audit_id bigint NOT NULL,
    key text NOT NULL,
    old_value text,
    new_value text,
    actor text NOT NULL,
    changed_by_role text DEFAULT SESSION_USER NOT NULL,
    changed_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE queue_setting_audit ALTER COLUMN audit_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME queue_setting_audit_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

ALTER TABLE ONLY job_dead_letter
    ADD CONSTRAINT job_dead_letter_pkey PRIMARY KEY (dead_letter_id);

ALTER TABLE ONLY job_kind_lease_audit
    ADD CONSTRAINT job_kind_lease_audit_pkey PRIMARY KEY (audit_id);

ALTER TABLE ONLY job_kind_lease
    ADD CONSTRAINT job_kind_lease_pkey PRIMARY KEY (job_kind);

ALTER TABLE ONLY job_queue
    ADD CONSTRAINT job_queue_pkey PRIMARY KEY (job_id);

ALTER TABLE ONLY queue_setting_audit
    ADD CONSTRAINT queue_setting_audit_pkey PRIMARY KEY (audit_id);

ALTER TABLE ONLY queue_setting
    ADD CONSTRAINT queue_setting_pkey PRIMARY KEY (key);

CREATE INDEX job_dead_letter_job_idx ON job_dead_letter USING btree (job_id);

CREATE INDEX job_kind_lease_audit_kind_idx ON job_kind_lease_audit USING btree (job_kind, changed_at);

CREATE INDEX job_queue_claimable_idx ON job_queue USING btree (scheduled_at) WHERE (state = ANY (ARRAY['queued'::text, 'retry_waiting'::text]));

CREATE INDEX job_queue_lease_until_idx ON job_queue USING btree (lease_until) WHERE (state = 'leased'::text);

CREATE INDEX queue_setting_audit_key_idx ON queue_setting_audit USING btree (key, changed_at);




-- The settings, as the queue starts: every gate closed. The reaper's two
-- gates are the sidecar's (its migration adds them to a queue that lacks
-- them); the stand-in has them from the start, so its audit begins empty.
INSERT INTO queue_setting (key, value, updated_by) VALUES
    ('queue.job_substrate.enabled', 'false', 'migration'),
    ('queue.lease.reaper_enabled', 'false', 'migration'),
    ('queue.lease.reaper_dry_run_only', 'true', 'migration'),
    ('queue.retry.backoff_base_sec', '10', 'migration'),
    ('queue.lease.duration_sec', '300', 'migration');

CREATE OR REPLACE FUNCTION queue_setting_audit_change()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
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
$function$;

REVOKE ALL ON FUNCTION queue_setting_audit_change() FROM PUBLIC;

CREATE OR REPLACE FUNCTION job_kind_lease_audit_change()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
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
$function$;

REVOKE ALL ON FUNCTION job_kind_lease_audit_change() FROM PUBLIC;

CREATE OR REPLACE FUNCTION fn_queue_setting_set(p_key text, p_value text, p_actor text)
 RETURNS jsonb
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
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
$function$;

COMMENT ON FUNCTION fn_queue_setting_set(text, text, text) IS
'The audited setter of queue_setting (the gates, queue.retry.backoff_base_sec, queue.lease.duration_sec): validates p_key and p_value, records old and new value, p_actor and the session role in queue_setting_audit, and returns the change as JSON. Errors 22023: empty actor, unknown key, a boolean not true/false, seconds not a whole number 1-86400. SECURITY DEFINER; EXECUTE not granted to PUBLIC (grant it to operators). lease-sweeper gates set calls it.';

REVOKE ALL ON FUNCTION fn_queue_setting_set(text, text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION fn_job_default_lease_sec()
 RETURNS integer
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
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
$function$;

COMMENT ON FUNCTION fn_job_default_lease_sec() IS
'queue.lease.duration_sec as claims and heartbeats read it: the lease of a job with no override whose kind has no duration of its own (300 when the row is missing).';

CREATE OR REPLACE FUNCTION fn_job_lease_override_sec(p_metadata jsonb)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION fn_job_kind_lease_set(p_job_kind text, p_lease_sec integer, p_actor text)
 RETURNS jsonb
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
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
$function$;

COMMENT ON FUNCTION fn_job_kind_lease_set(text, integer, text) IS
'The audited setter of job_kind_lease: gives kind p_job_kind (matched exactly) a lease of p_lease_sec seconds (1-86400), or with NULL returns it to queue.lease.duration_sec; records the change in job_kind_lease_audit and returns it as JSON. Errors 22023: empty actor or kind, seconds out of range. SECURITY DEFINER; EXECUTE not granted to PUBLIC nor to lease_sweeper. lease-sweeper leases set / clear call it.';

REVOKE ALL ON FUNCTION fn_job_kind_lease_set(text, integer, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION fn_job_enqueue(p_job_kind text, p_payload jsonb DEFAULT '{}'::jsonb, p_max_attempts integer DEFAULT 5, p_metadata jsonb DEFAULT '{}'::jsonb)
 RETURNS uuid
 LANGUAGE plpgsql
AS $function$
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
    $function$;

COMMENT ON FUNCTION fn_job_enqueue(text, jsonb, integer, jsonb) IS
'Queues a job of kind p_job_kind, claimable at once; returns its job_id. p_max_attempts 1-1000; p_metadata.lease_override_sec (whole seconds 1-86400) gives this job its own lease duration. Errors 22023: empty kind, attempts out of range; 23514: a bad lease_override_sec. Allowed while queue.job_substrate.enabled is false.';

CREATE OR REPLACE FUNCTION fn_job_claim(p_worker text, p_job_kinds text[] DEFAULT NULL::text[], p_limit integer DEFAULT 1)
 RETURNS SETOF job_queue
 LANGUAGE plpgsql
AS $function$
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
$function$;

COMMENT ON FUNCTION fn_job_claim(text, text[], integer) IS
'Leases up to p_limit (1-10000) claimable jobs (queued or retry_waiting, due), of the kinds p_job_kinds (NULL: any), oldest first, to p_worker, each for its own duration (metadata.lease_override_sec, else its kind''s in job_kind_lease, else queue.lease.duration_sec), and returns the leased rows; rows another claimer holds are skipped. Error 55000 while queue.job_substrate.enabled is not true.';

CREATE OR REPLACE FUNCTION fn_job_heartbeat(p_job_id uuid, p_worker text)
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
AS $function$
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
$function$;

COMMENT ON FUNCTION fn_job_heartbeat(uuid, text) IS
'Extends the live lease p_worker holds on p_job_id by the job''s own duration (computed as a claim computes it) and returns the new lease_until; NULL when the worker holds no live lease on it (expired, reaped, completed or someone else''s): the worker has lost the job and must stop.';

CREATE OR REPLACE FUNCTION fn_job_complete(p_job_id uuid, p_worker text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
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
$function$;

COMMENT ON FUNCTION fn_job_complete(uuid, text) IS
'Marks the job succeeded when p_worker holds its lease, even one past its deadline as long as no reaper has acted; false otherwise (reaped, re-leased, completed, unknown).';

CREATE OR REPLACE FUNCTION fn_job_dead_letter_object(p_dead_letter_id uuid, p_job_id uuid, p_attempts integer, p_final_error text, p_moved_by text, p_moved_at timestamp with time zone)
 RETURNS jsonb
 LANGUAGE sql
 IMMUTABLE
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
    SELECT pg_catalog.jsonb_build_object(
        'dead_letter_id', p_dead_letter_id,
        'job_id', p_job_id,
        'state', 'dead_letter',
        'refused', false,
        'attempts', p_attempts,
        'final_error', p_final_error,
        'moved_by', p_moved_by,
        'moved_at', p_moved_at)
$function$;

CREATE OR REPLACE FUNCTION fn_job_move_to_dead_letter(p_job_id uuid, p_final_error text, p_actor text)
 RETURNS jsonb
 LANGUAGE plpgsql
AS $function$
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
$function$;

COMMENT ON FUNCTION fn_job_move_to_dead_letter(uuid, text, text) IS
'Moves a queued, leased or retry_waiting job to job_dead_letter as it stands, with p_final_error and p_actor, and returns the dead_letter object; refusals as JSON: actor_required, job_not_found, job_not_movable (already succeeded or dead-lettered).';

-- Every change of a setting or a kind's lease duration is audited.
CREATE TRIGGER job_kind_lease_audited AFTER INSERT OR DELETE OR UPDATE ON job_kind_lease FOR EACH ROW EXECUTE FUNCTION job_kind_lease_audit_change();
CREATE TRIGGER queue_setting_audited AFTER INSERT OR DELETE OR UPDATE ON queue_setting FOR EACH ROW EXECUTE FUNCTION queue_setting_audit_change();

-- Its definers resolve names in the schema it was created in, whichever
-- that is: pg_catalog first, that schema, pg_temp last.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = pg_catalog.current_schema()::pg_catalog.regnamespace
           AND p.proconfig IS NOT NULL
           AND p.proname = ANY ('{queue_setting_audit_change,job_kind_lease_audit_change,fn_queue_setting_set,fn_job_default_lease_sec,fn_job_kind_lease_set,fn_job_dead_letter_object}'::pg_catalog.name[])
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                  f, pg_catalog.current_schema());
    END LOOP;
END
$$;
