-- Lease durations per job kind and per job.
--
-- A claim or a heartbeat used to lease every job for queue.lease.duration_sec.
-- Now each job leases for, in this order:
--   1. its metadata.lease_override_sec (a whole number of seconds, 1..86400);
--   2. its kind's duration in job_kind_lease (set with fn_job_kind_lease_set);
--   3. queue.lease.duration_sec (default 300).
-- The reaper is unchanged: it still only asks lease_until < now().
--
-- 1. job_kind_lease: one row per kind that has its own duration (no row: the
--    kind falls back to queue.lease.duration_sec). Changed through the
--    audited setter fn_job_kind_lease_set (SECURITY DEFINER, not executable
--    by PUBLIC: the owner grants it to the operators' role, never to
--    lease_sweeper). Every change, the setter's or a direct write, is
--    recorded in job_kind_lease_audit by a trigger, as queue_setting's are.
-- 2. The per-job override is refused at the door by the named constraint
--    job_queue_lease_override_sec_whole_from_1_to_86400; a database already
--    holding such rows gets an error naming them and the fix before it is
--    added. fn_job_enqueue takes the metadata as a fourth, optional argument.
-- 3. fn_job_claim and fn_job_heartbeat lease each job for its own duration
--    and record what they gave in lease_duration_sec / lease_duration_source
--    ('override', 'kind' or 'default'): the duration of the job's latest
--    lease, kept after the lease ends. The dry run reports both, so an
--    operator sees what a stale job had been given without reading its
--    metadata (which the sweeper role may not read).
--
-- Privileges: claim and heartbeat stay SECURITY INVOKER, so a worker now
-- needs SELECT on job_kind_lease too. Every role that may read queue_setting
-- (which claiming already needed) is granted it here, so workers keep
-- claiming across the upgrade; the sweeper role is not (it never claims).
--
-- Hardening as in the earlier job migrations: definers pin search_path
-- (pg_temp last), calls are pg_catalog-qualified or use operand types that
-- match a pg_catalog operator exactly.

-- 1. Kind durations and their audit.
CREATE TABLE job_kind_lease (
    -- Matched exactly against job_queue.job_kind (not trimmed: ' a' and 'a'
    -- are different kinds there too).
    job_kind   text        PRIMARY KEY CONSTRAINT job_kind_lease_kind_not_empty CHECK (job_kind <> ''),
    lease_sec  integer     NOT NULL
               CONSTRAINT job_kind_lease_seconds_from_1_to_86400 CHECK (lease_sec BETWEEN 1 AND 86400),
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text        NOT NULL
);

-- A sibling of queue_setting_audit rather than rows in it: its values are
-- seconds (integer), and its subject is a job kind, a name workers choose,
-- which could collide with a setting key in one shared "key" column.
-- new_lease_sec NULL means the kind's duration was cleared.
CREATE TABLE job_kind_lease_audit (
    audit_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_kind        text        NOT NULL,
    old_lease_sec   integer,
    new_lease_sec   integer,
    actor           text        NOT NULL,
    changed_by_role text        NOT NULL DEFAULT session_user,
    changed_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_kind_lease_audit_kind_idx ON job_kind_lease_audit (job_kind, changed_at);

REVOKE ALL ON job_kind_lease, job_kind_lease_audit FROM PUBLIC;

-- The actor is the setter's p_actor (the same transaction-local setting
-- fn_queue_setting_set uses, cleared again by the setter), else
-- "direct <op> by <role>".
CREATE FUNCTION job_kind_lease_audit_change() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
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
REVOKE ALL ON FUNCTION job_kind_lease_audit_change() FROM PUBLIC;

CREATE TRIGGER job_kind_lease_audited
    AFTER INSERT OR UPDATE OR DELETE ON job_kind_lease
    FOR EACH ROW EXECUTE FUNCTION job_kind_lease_audit_change();

-- Sets one kind's lease duration, or clears it with p_lease_sec NULL (the
-- kind then leases for queue.lease.duration_sec). Refuses, with SQLSTATE
-- 22023, a message naming the bad part and nothing changed: an empty actor,
-- an empty kind, seconds outside 1..86400. Returns {"job_kind",
-- "old_lease_sec", "lease_sec", "default_sec", "updated_by", "updated_at"}
-- (lease_sec NULL after a clear; default_sec is queue.lease.duration_sec).
-- Clearing a kind that has no duration changes nothing and audits nothing.
CREATE FUNCTION fn_job_kind_lease_set(p_job_kind text, p_lease_sec integer, p_actor text)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
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
REVOKE ALL ON FUNCTION fn_job_kind_lease_set(text, integer, text) FROM PUBLIC;

-- queue.lease.duration_sec, the duration of every job without an override
-- whose kind has none (300 when the row is missing). Total: a value that is
-- not a number of seconds (possible only with the constraint dropped) also
-- reads as 300 rather than failing every claim.
CREATE FUNCTION fn_job_default_lease_sec()
RETURNS integer
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, public, pg_temp
AS $$
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
$$;

-- 2. The per-job override, refused at the door unless it is a JSON number
-- holding a whole number of seconds from 1 to 86400 (300 and 300.0 both
-- are). The same rule is written three times below: this check of the rows
-- already there, the constraint, and fn_job_lease_override_sec, which reads
-- it for claim and heartbeat.
DO $$
DECLARE
    v_n    bigint;
    v_rows text;
BEGIN
    SELECT pg_catalog.count(*) INTO v_n
      FROM job_queue AS j
     WHERE NOT CASE WHEN j.metadata -> 'lease_override_sec' IS NULL THEN true
                    WHEN pg_catalog.jsonb_typeof(j.metadata -> 'lease_override_sec') = 'number'
                    THEN (j.metadata -> 'lease_override_sec')::numeric BETWEEN 1 AND 86400
                         AND (j.metadata -> 'lease_override_sec')::numeric
                             = pg_catalog.trunc((j.metadata -> 'lease_override_sec')::numeric)
                    ELSE false END;
    IF v_n > 0 THEN
        SELECT pg_catalog.string_agg(pg_catalog.format('%s (lease_override_sec %s)', s.job_id, s.v), ', ')
          INTO v_rows
          FROM (SELECT j.job_id, j.metadata -> 'lease_override_sec' AS v
                  FROM job_queue AS j
                 WHERE NOT CASE WHEN j.metadata -> 'lease_override_sec' IS NULL THEN true
                                WHEN pg_catalog.jsonb_typeof(j.metadata -> 'lease_override_sec') = 'number'
                                THEN (j.metadata -> 'lease_override_sec')::numeric BETWEEN 1 AND 86400
                                     AND (j.metadata -> 'lease_override_sec')::numeric
                                         = pg_catalog.trunc((j.metadata -> 'lease_override_sec')::numeric)
                                ELSE false END
                 ORDER BY j.job_id LIMIT 5) AS s;
        RAISE EXCEPTION 'job_queue holds % job(s) whose metadata.lease_override_sec is not a whole number of seconds from 1 to 86400 (first 5 by job_id: %); fix: give each a valid number of seconds, or remove the key from all of them: UPDATE job_queue SET metadata = metadata - ''lease_override_sec'' WHERE metadata -> ''lease_override_sec'' IS NOT NULL AND NOT CASE WHEN jsonb_typeof(metadata -> ''lease_override_sec'') = ''number'' THEN (metadata -> ''lease_override_sec'')::numeric BETWEEN 1 AND 86400 AND (metadata -> ''lease_override_sec'')::numeric %% 1 = 0 ELSE false END; then run lease-sweeper migrate again', v_n, v_rows
            USING ERRCODE = '23514';
    END IF;
END
$$;

ALTER TABLE job_queue ADD CONSTRAINT job_queue_lease_override_sec_whole_from_1_to_86400
    CHECK (CASE WHEN metadata -> 'lease_override_sec' IS NULL THEN true
                WHEN pg_catalog.jsonb_typeof(metadata -> 'lease_override_sec') = 'number'
                THEN (metadata -> 'lease_override_sec')::numeric BETWEEN 1 AND 86400
                     AND (metadata -> 'lease_override_sec')::numeric
                         = pg_catalog.trunc((metadata -> 'lease_override_sec')::numeric)
                ELSE false END) NOT VALID;
ALTER TABLE job_queue VALIDATE CONSTRAINT job_queue_lease_override_sec_whole_from_1_to_86400;

-- What the latest claim or heartbeat gave the job. NULL for a job never
-- leased through them (or leased before this migration).
ALTER TABLE job_queue
    ADD COLUMN lease_duration_sec integer
        CONSTRAINT job_queue_lease_duration_sec_from_1_to_86400 CHECK (lease_duration_sec BETWEEN 1 AND 86400),
    ADD COLUMN lease_duration_source text
        CONSTRAINT job_queue_lease_duration_source_known
        CHECK (lease_duration_source IN ('override', 'kind', 'default'));

-- The job's valid override in seconds, else NULL. Total for any jsonb (the
-- constraint above makes a present but invalid value impossible, unless it
-- is dropped by hand; such a value is ignored, never an error that would stop
-- every claim). A LANGUAGE sql IMMUTABLE expression with no SET clause, so
-- PostgreSQL inlines it into the claim's statement instead of calling it per
-- row; every operator and function in it is pg_catalog's, named so.
CREATE FUNCTION fn_job_lease_override_sec(p_metadata jsonb)
RETURNS integer
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

-- fn_job_enqueue gains p_metadata. A parameter with a default cannot be
-- added in place, so the three-argument function is replaced by the
-- four-argument one; every call it accepted means the same now, and the
-- EXECUTE grants it carried (an owner may have revoked PUBLIC's and granted
-- producers') are carried over.
DO $$
DECLARE
    v_acl   pg_catalog.aclitem[];
    v_owner pg_catalog.oid;
    g       record;
BEGIN
    SELECT p.proacl, p.proowner INTO v_acl, v_owner
      FROM pg_catalog.pg_proc AS p
     WHERE p.oid = 'fn_job_enqueue(text, jsonb, integer)'::pg_catalog.regprocedure;

    DROP FUNCTION fn_job_enqueue(text, jsonb, integer);

    -- Queues a job for immediate claiming; p_metadata may carry
    -- lease_override_sec. Allowed while the substrate gate is off, so
    -- producers can fill the queue before workers are enabled.
    CREATE FUNCTION fn_job_enqueue(p_job_kind text, p_payload jsonb DEFAULT '{}'::jsonb,
                                   p_max_attempts integer DEFAULT 5, p_metadata jsonb DEFAULT '{}'::jsonb)
    RETURNS uuid
    LANGUAGE plpgsql VOLATILE
    AS $fn$
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
    $fn$;

    IF v_acl IS NULL THEN
        RETURN;  -- never granted or revoked: the default, as the new function has
    END IF;
    REVOKE ALL ON FUNCTION fn_job_enqueue(text, jsonb, integer, jsonb) FROM PUBLIC;
    FOR g IN
        SELECT a.grantee, a.is_grantable
          FROM pg_catalog.aclexplode(v_acl) AS a
         WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> v_owner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION fn_job_enqueue(text, jsonb, integer, jsonb) TO %s%s',
            CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)::pg_catalog.text) END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;

-- 3. Claim and heartbeat.
--
-- Leases up to p_limit claimable jobs (queued or retry_waiting and due), of
-- the given kinds or any kind when p_job_kinds is NULL, to p_worker, each
-- until now() + its own duration (override, else kind, else
-- queue.lease.duration_sec), recorded in lease_duration_sec/_source. Jobs
-- another worker is claiming are skipped, never waited on. Refuses (SQLSTATE
-- 55000) while queue.job_substrate.enabled is not true. Returns the leased
-- rows. The kind durations are joined once for the whole batch (a hash join
-- on a table of a few rows), not looked up per job.
CREATE OR REPLACE FUNCTION fn_job_claim(p_worker text, p_job_kinds text[] DEFAULT NULL, p_limit integer DEFAULT 1)
RETURNS SETOF job_queue
LANGUAGE plpgsql VOLATILE
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

-- Extends the lease of a job p_worker holds to now() + the job's own
-- duration, as fn_job_claim computes it (so a kind duration changed since
-- the claim applies from the next heartbeat). Returns the new lease_until,
-- or NULL when the worker no longer holds a live lease on it (expired,
-- reaped, completed or someone else's): the worker has lost the job and must
-- stop.
CREATE OR REPLACE FUNCTION fn_job_heartbeat(p_job_id uuid, p_worker text)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
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

-- Claimers keep claiming: whoever may read queue_setting (claim's gate
-- check) may read the kind durations. Not the sweeper role, which only reads
-- queue_setting for the gates and never claims.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee
          FROM pg_catalog.pg_class AS c,
               pg_catalog.aclexplode(c.relacl) AS a
         WHERE c.oid = 'queue_setting'::pg_catalog.regclass
           AND a.privilege_type = 'SELECT'
           AND a.grantee <> c.relowner
           AND a.grantee NOT IN (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'lease_sweeper')
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON job_kind_lease TO %s',
            CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)::pg_catalog.text) END);
    END LOOP;
END
$$;

-- 4. The dry run reports, per job, what its latest lease was given.
DROP FUNCTION fn_job_dry_run_object(uuid, text, text, timestamptz, integer, integer);

-- One job of the dry run: the shape of 20261130000110 plus
-- lease_duration_sec and lease_duration_source (NULL for a job not leased
-- through fn_job_claim or fn_job_heartbeat since they record it).
CREATE FUNCTION fn_job_dry_run_object(p_job_id uuid, p_job_kind text, p_lease_owner text, p_lease_until timestamptz,
                                      p_attempts integer, p_max_attempts integer,
                                      p_lease_duration_sec integer, p_lease_duration_source text)
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
        'lease_duration_sec', p_lease_duration_sec,
        'lease_duration_source', p_lease_duration_source,
        'overdue_seconds', CASE WHEN pg_catalog.isfinite(p_lease_until)
                                THEN pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.now() - p_lease_until))::pg_catalog.int8
                                ELSE '9223372036854775807'::pg_catalog.int8 END,
        'would_action', CASE WHEN p_attempts >= p_max_attempts - 1
                             THEN 'move_to_dead_letter'
                             ELSE 'reset_to_retry_waiting' END)
$$;

-- The dry run as in 20261130000110 (set-aside fallback included), reading
-- the two recorded lease columns too.
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

-- The sweeper role's dry run reads the two new columns (still not metadata).
GRANT SELECT (lease_duration_sec, lease_duration_source) ON job_queue TO lease_sweeper;

-- Follow the installing schema, as migrations/20261130000120_privilege_holes.sql
-- asks of every later migration that creates a pinned definer (idempotent).
DO $$
DECLARE
    v_schema text := pg_catalog.current_schema();
    f        record;
BEGIN
    IF v_schema IS NULL THEN
        RAISE EXCEPTION 'no schema to install into: search_path names no existing schema; set it (e.g. ?options=-c%%20search_path%%3Dpublic) and run lease-sweeper migrate again'
            USING ERRCODE = '3F000';
    END IF;
    IF v_schema = 'public' THEN
        RETURN;
    END IF;
    FOR f IN
        SELECT p.oid::pg_catalog.regprocedure AS fn
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = v_schema::pg_catalog.regnamespace
           AND 'search_path=pg_catalog, public, pg_temp' OPERATOR(pg_catalog.=) ANY (p.proconfig)
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f.fn, v_schema);
    END LOOP;
END
$$;
