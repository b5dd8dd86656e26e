-- `lease-sweeper remove`: takes the sidecar out of the database again.
--
-- One transaction, run with a short lock_timeout and tried again by the
-- command: dropping the triggers takes lock_entry's SHARE ROW EXCLUSIVE lock,
-- and dropping the expiry index, where `migrate` built it, its ACCESS
-- EXCLUSIVE lock, which also stops the lock server's reads of lock_entry;
-- both are held for the rest of this transaction, a few milliseconds. The
-- triggers go first, so no expiry can be recorded after the check below; if
-- the check refuses, everything rolls back and the triggers stay.
--
-- What goes: what `migrate` added (sql/lock_entry_hooks.sql's triggers,
-- the tables of migrations/, the reaper's two gate rows where it inserted
-- them and their audit, the grants to lease_sweeper, the expiry index if
-- `migrate` built it, the sidecar's history). Then, in the same
-- transaction, `remove` runs sql/sidecar_functions.sql keeping nothing,
-- which drops every function the database records (whichever release
-- installed it), and last drops that record, lease_sweeper_sql, and the
-- type lock_reaped_lease, which an earlier build's function returned. What
-- stays, exactly as it was:
-- the lock server's and the queue's tables, rows, sequences, triggers and
-- history, and the cluster-wide role lease_sweeper (other databases may use
-- it: `DROP ROLE lease_sweeper` once none does).

DROP TRIGGER IF EXISTS lock_entry_takeover ON lock_entry;
DROP TRIGGER IF EXISTS lock_entry_late_renewal ON lock_entry;
DROP TRIGGER IF EXISTS lock_entry_late_release ON lock_entry;

DO $$
DECLARE
    v_recorded bigint := (SELECT pg_catalog.count(*) FROM lock_expiry_outbox);
    v_locks bigint := (SELECT pg_catalog.count(*) FROM lock_reap_handoff);
    v_jobs bigint := (SELECT pg_catalog.count(*) FROM job_reap_handoff);
BEGIN
    IF v_recorded + v_locks + v_jobs > 0 THEN
        RAISE EXCEPTION 'refusing to remove the sidecar: % recorded expiries (takeovers or late releases), % lock batches and % job batches have not been reported yet, and their lines would be lost; start lease-sweeper run on any host until lease-sweeper check says nothing waits (a minute is plenty), stop it, then run lease-sweeper remove again', v_recorded, v_locks, v_jobs
            USING ERRCODE = '55000';
    END IF;
END
$$;

-- The expiry index, when `migrate` built it (its comment says so).
DO $$
BEGIN
    IF pg_catalog.obj_description(pg_catalog.to_regclass('lock_entry_expiry_idx'), 'pg_class')
       = 'built by lease-sweeper migrate' THEN
        DROP INDEX lock_entry_expiry_idx;
    END IF;
END
$$;

-- Every table but the record of the functions, which sql/sidecar_functions.sql
-- reads after this file to drop them. No function of the sidecar returns
-- these tables' rows, so none depends on them.
DROP TABLE lock_expiry_outbox, lock_reap_handoff, lock_held_count, lock_held_delta,
           job_reap_handoff, lease_sweeper_migrations;

-- The reaper's two gate rows, only where `migrate` inserted them: a row it
-- inserted says so (updated_by) until an operator sets it, and is then the
-- operator's setting, kept. A queue that had the keys already, and the
-- stand-in queue (it has them from the start), keep theirs. Where the queue
-- audits its settings (queue_setting_audit, the job-queue document's shape),
-- the rows recording migrate's inserts go too (written in the same
-- transaction, so at the row's updated_at), and so do the rows the audit
-- trigger writes for these deletions (written by this transaction): the
-- audit is as it was before `migrate`.
DO $$
DECLARE
    c_gates CONSTANT text[] := ARRAY['queue.lease.reaper_enabled', 'queue.lease.reaper_dry_run_only'];
    v_audited boolean;
    v_deleted text[];
BEGIN
    IF pg_catalog.to_regclass('queue_setting') IS NULL THEN
        RETURN;  -- a lock server without a job queue: migrate inserted nothing
    END IF;
    v_audited := pg_catalog.to_regclass('queue_setting_audit') IS NOT NULL
        AND (SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute AS a
              WHERE a.attrelid = pg_catalog.to_regclass('queue_setting_audit') AND NOT a.attisdropped
                AND a.attname IN ('key', 'old_value', 'new_value', 'changed_at')) = 4;
    IF v_audited THEN
        DELETE FROM queue_setting_audit AS a
         USING queue_setting AS s
         WHERE s.key = ANY (c_gates) AND s.updated_by = 'lease-sweeper migrate'
           AND a.key = s.key AND a.old_value IS NULL AND a.new_value = s.value
           AND a.changed_at = s.updated_at;
    END IF;
    WITH gone AS (
        DELETE FROM queue_setting AS s
         WHERE s.key = ANY (c_gates) AND s.updated_by = 'lease-sweeper migrate'
        RETURNING s.key)
    SELECT pg_catalog.array_agg(gone.key) INTO v_deleted FROM gone;
    IF v_audited AND v_deleted IS NOT NULL THEN
        DELETE FROM queue_setting_audit AS a
         WHERE a.key = ANY (v_deleted) AND a.new_value IS NULL
           AND a.xmin = pg_catalog.pg_current_xact_id()::pg_catalog.xid;
    END IF;
END
$$;

-- Every privilege lease_sweeper holds in this schema besides on the
-- sidecar's own objects (dropped above): what `migrate` granted it, the
-- schema's USAGE and SELECT on the queue's settings and on columns of
-- job_queue. Revoking leaves each ACL as it was before the grant; one that
-- was the owner's default (NULL) stays written out, the same privileges.
DO $$
DECLARE
    v_rel regclass;
    v_column name;
    v_function regprocedure;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'lease_sweeper') THEN
        RETURN;
    END IF;
    FOR v_rel IN
        SELECT c.oid::regclass FROM pg_catalog.pg_class AS c
         WHERE c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace
           AND EXISTS (SELECT 1 FROM pg_catalog.aclexplode(c.relacl) AS x
                        WHERE x.grantee = 'lease_sweeper'::pg_catalog.regrole)
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON TABLE %s FROM lease_sweeper', v_rel);
    END LOOP;
    FOR v_rel, v_column IN
        SELECT a.attrelid::regclass, a.attname FROM pg_catalog.pg_attribute AS a
          JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid
         WHERE c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace
           AND EXISTS (SELECT 1 FROM pg_catalog.aclexplode(a.attacl) AS x
                        WHERE x.grantee = 'lease_sweeper'::pg_catalog.regrole)
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL (%I) ON TABLE %s FROM lease_sweeper', v_column, v_rel);
    END LOOP;
    FOR v_function IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = pg_catalog.current_schema()::pg_catalog.regnamespace
           AND EXISTS (SELECT 1 FROM pg_catalog.aclexplode(p.proacl) AS x
                        WHERE x.grantee = 'lease_sweeper'::pg_catalog.regrole)
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM lease_sweeper', v_function);
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_namespace AS n, pg_catalog.aclexplode(n.nspacl) AS x
                WHERE n.oid = pg_catalog.current_schema()::pg_catalog.regnamespace
                  AND x.grantee = 'lease_sweeper'::pg_catalog.regrole) THEN
        EXECUTE pg_catalog.format('REVOKE USAGE ON SCHEMA %I FROM lease_sweeper', pg_catalog.current_schema());
    END IF;
END
$$;
