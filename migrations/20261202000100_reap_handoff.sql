-- A reaped batch is handed off before its lines are written, so the lock
-- server and the workers never wait on the sweeper's output.
--
-- Before, a batch deleted its leases (or reset its jobs), had the daemon
-- write and flush one line per row, and only then committed: every row lock
-- of the batch was held for as long as writing the lines took. An acquire of
-- one of those keys (clients re-acquire a dead holder's keys, so in an
-- expiry storm many do) waited for the whole batch's output: about 100 ms
-- for 5,000 lines under journald, and without bound when stdout is blocked.
--
-- Now each batch is two transactions on the daemon's one connection:
--   1. The reaping statement as before, then one row here holding the whole
--      batch (lock_handoff_put / fn_job_reap_handoff_put); COMMIT. The row
--      locks on lock_entry / job_queue last for those two statements.
--   2. The hand-off row is claimed (deleted, so locked until this
--      transaction ends: lock_handoff_claim), the lines are written and
--      flushed, COMMIT. A claim that finds nothing means another sweeper
--      recovered the batch and wrote its lines: this one writes none.
-- So a lease's last durable record (its row, then its hand-off row) is gone
-- only after its line was written: at least once across kill -9. A hand-off
-- left behind (the daemon died, its stdout failed, its connection broke) is
-- recovered by any sweeper once it is older than signal_handoff_grace(),
-- one hand-off per transaction, FOR UPDATE SKIP LOCKED: its lines are
-- written once, by whoever deletes it. The grace only keeps other sweepers
-- off a batch its writer is about to claim (about a millisecond after the
-- commit); exactness does not depend on it.
--
-- One row per batch, not one per lease: the hand-off costs one insert and
-- one delete per 5,000 leases, not 5,000 of each.
--
-- Hardening as in every migration: SECURITY DEFINER with search_path
-- pinned (pg_temp last), pg_catalog-qualified calls, EXECUTE revoked from
-- PUBLIC and granted to lease_sweeper, no privilege on the tables.

CREATE TABLE lock_reap_handoff (
    handoff_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    written_at        timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- The batch's leases as the reaping function returned them, in order;
    -- element i of every array is one lease.
    lock_keys         text[]      NOT NULL,
    owner_ids         text[]      NOT NULL,
    tokens            bigint[]    NOT NULL,
    expired_at_millis bigint[]    NOT NULL,
    overdue_millis    bigint[]    NOT NULL,
    CONSTRAINT lock_reap_handoff_one_length_each CHECK (
        pg_catalog.cardinality(lock_keys) > 0
        AND pg_catalog.cardinality(owner_ids) = pg_catalog.cardinality(lock_keys)
        AND pg_catalog.cardinality(tokens) = pg_catalog.cardinality(lock_keys)
        AND pg_catalog.cardinality(expired_at_millis) = pg_catalog.cardinality(lock_keys)
        AND pg_catalog.cardinality(overdue_millis) = pg_catalog.cardinality(lock_keys))
);
REVOKE ALL ON TABLE lock_reap_handoff FROM PUBLIC;

CREATE TABLE job_reap_handoff (
    handoff_id bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    written_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- fn_job_reap_stale_leases_apply's report, as it returned it.
    report     text        NOT NULL CHECK (report <> '')
);
REVOKE ALL ON TABLE job_reap_handoff FROM PUBLIC;

-- Each row lives about a millisecond plus the time its lines take; the
-- tables stay a few pages, but every batch leaves a dead row (and TOAST
-- chunks), so vacuum them often.
ALTER TABLE lock_reap_handoff SET (autovacuum_vacuum_threshold = 50, autovacuum_vacuum_scale_factor = 0);
ALTER TABLE job_reap_handoff SET (autovacuum_vacuum_threshold = 50, autovacuum_vacuum_scale_factor = 0);

-- How old a hand-off must be before a sweeper other than its writer takes
-- it over. Plain SQL and IMMUTABLE so the probes inline it.
CREATE FUNCTION signal_handoff_grace() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '5 seconds'::pg_catalog.interval $$;
REVOKE ALL ON FUNCTION signal_handoff_grace() FROM PUBLIC;

CREATE FUNCTION lock_handoff_put(p_lock_keys text[], p_owner_ids text[], p_tokens bigint[],
                                 p_expired_at_millis bigint[], p_overdue_millis bigint[])
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    INSERT INTO lock_reap_handoff (lock_keys, owner_ids, tokens, expired_at_millis, overdue_millis)
    VALUES (p_lock_keys, p_owner_ids, p_tokens, p_expired_at_millis, p_overdue_millis)
    RETURNING handoff_id
$$;

-- Deletes the hand-off (its row lock then lasts until the caller's COMMIT,
-- so no other sweeper can recover it meanwhile); false when it is gone.
CREATE FUNCTION lock_handoff_claim(p_handoff_id bigint)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM lock_reap_handoff AS h WHERE h.handoff_id = p_handoff_id
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM gone)
$$;

-- Deletes the oldest hand-off older than the grace that no one holds, and
-- returns its leases in their order (none when there is none).
CREATE FUNCTION lock_handoff_recover()
RETURNS TABLE (lock_key text, owner_id text, token bigint, expired_at_millis bigint,
               overdue_millis bigint)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM lock_reap_handoff AS h
         WHERE h.handoff_id = (SELECT o.handoff_id
                                 FROM lock_reap_handoff AS o
                                WHERE o.written_at < pg_catalog.now() - signal_handoff_grace()
                                ORDER BY o.handoff_id
                                LIMIT 1
                                  FOR UPDATE SKIP LOCKED)
        RETURNING h.lock_keys, h.owner_ids, h.tokens, h.expired_at_millis, h.overdue_millis
    )
    SELECT u.k, u.o, u.t, u.e, u.d
      FROM gone AS g,
           ROWS FROM (pg_catalog.unnest(g.lock_keys), pg_catalog.unnest(g.owner_ids),
                      pg_catalog.unnest(g.tokens), pg_catalog.unnest(g.expired_at_millis),
                      pg_catalog.unnest(g.overdue_millis))
               WITH ORDINALITY AS u (k, o, t, e, d, i)
     ORDER BY u.i
$$;

CREATE FUNCTION fn_job_reap_handoff_put(p_report text)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    INSERT INTO job_reap_handoff (report) VALUES (p_report) RETURNING handoff_id
$$;

CREATE FUNCTION fn_job_reap_handoff_claim(p_handoff_id bigint)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM job_reap_handoff AS h WHERE h.handoff_id = p_handoff_id
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM gone)
$$;

-- Deletes the oldest job hand-off older than the grace that no one holds and
-- returns its report (no row when there is none).
CREATE FUNCTION fn_job_reap_handoff_recover()
RETURNS TABLE (report text)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
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

-- Whether a job hand-off waits for recovery: asked in the job reaper's first
-- statement of every pass (no statement is added to an idle pass).
CREATE FUNCTION fn_job_reap_handoff_abandoned()
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM job_reap_handoff AS o
                    WHERE o.written_at < pg_catalog.now() - signal_handoff_grace())
$$;

-- As in 20261201000100, and `takeovers` is also true while a lock hand-off
-- waits for recovery: both are "something recorded to drain", and the sweep
-- drains both in the same step.
CREATE OR REPLACE FUNCTION lock_sweep_probe(p_max_age_millis bigint)
RETURNS TABLE (expired boolean, takeovers boolean, held bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
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
        RETURN QUERY SELECT true, v_takeovers, NULL::bigint;
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
    RETURN QUERY SELECT false, v_takeovers, v_held;
END
$$;

REVOKE ALL ON FUNCTION
    lock_handoff_put(text[], text[], bigint[], bigint[], bigint[]),
    lock_handoff_claim(bigint),
    lock_handoff_recover(),
    fn_job_reap_handoff_put(text),
    fn_job_reap_handoff_claim(bigint),
    fn_job_reap_handoff_recover(),
    fn_job_reap_handoff_abandoned()
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    lock_handoff_put(text[], text[], bigint[], bigint[], bigint[]),
    lock_handoff_claim(bigint),
    lock_handoff_recover(),
    fn_job_reap_handoff_put(text),
    fn_job_reap_handoff_claim(bigint),
    fn_job_reap_handoff_recover(),
    fn_job_reap_handoff_abandoned()
    TO lease_sweeper;

COMMENT ON FUNCTION lock_handoff_put(text[], text[], bigint[], bigint[], bigint[]) IS
'Records one reaped batch (element i of each array is one lease, in the order lock_reap_expired or lock_reap_expired_walk returned them) in lock_reap_handoff, in the transaction that deleted them, and returns its id; the sweeper commits, then claims it with lock_handoff_claim and writes its lines. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
COMMENT ON FUNCTION lock_handoff_claim(bigint) IS
'Deletes hand-off p_handoff_id and returns true, or false when it is gone (another sweeper recovered it and wrote its lines). The caller writes the lines before committing. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
COMMENT ON FUNCTION lock_handoff_recover() IS
'Deletes the oldest lock hand-off older than signal_handoff_grace() that no other transaction holds and returns its leases, to be reported as lease_expired reapedBy=sweep before committing. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
COMMENT ON FUNCTION fn_job_reap_handoff_put(text) IS
'Records one apply report in job_reap_handoff, in the transaction that applied it, and returns its id. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
COMMENT ON FUNCTION fn_job_reap_handoff_claim(bigint) IS
'Deletes job hand-off p_handoff_id and returns true, or false when it is gone. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
COMMENT ON FUNCTION fn_job_reap_handoff_recover() IS
'Deletes the oldest job hand-off older than signal_handoff_grace() that no other transaction holds and returns its report, whose actions are written as job_lease_expired lines before committing. SECURITY DEFINER; EXECUTE: lease_sweeper only.';
COMMENT ON FUNCTION fn_job_reap_handoff_abandoned() IS
'Whether a job hand-off older than signal_handoff_grace() waits for recovery. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

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
           AND 'search_path=pg_catalog, public, pg_temp' = ANY (p.proconfig)
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f.fn, v_schema);
    END LOOP;
END
$$;
