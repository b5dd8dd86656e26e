-- `lease-sweeper remove`: takes the sidecar out of the database again.
--
-- One transaction, run with a short lock_timeout and tried again by the
-- command (dropping the triggers takes lock_entry's SHARE ROW EXCLUSIVE lock
-- for the rest of this transaction, a few milliseconds). The triggers go
-- first, so no expiry can be recorded after the check below; if the check
-- refuses, everything rolls back and the triggers stay.
--
-- What goes: what `migrate` added (sql/lock_entry_hooks.sql's triggers,
-- every function of sql/functions/, the tables and type of migrations/, the
-- reaper's two gate rows, the grants to lease_sweeper, the expiry index if
-- `migrate` built it, the sidecar's history). What stays, exactly as it was:
-- the lock server's and the queue's tables, rows, sequences, triggers and
-- history, and the cluster-wide role lease_sweeper (other databases may use
-- it: `DROP ROLE lease_sweeper` once none does).

DROP TRIGGER IF EXISTS lock_entry_takeover ON lock_entry;
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

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc AS p
          JOIN lease_sweeper_sql AS s ON s.name = p.proname::pg_catalog.text
         WHERE p.pronamespace = pg_catalog.current_schema()::pg_catalog.regnamespace
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', f);
    END LOOP;
    -- The expiry index, when `migrate` built it (its comment says so).
    IF pg_catalog.obj_description(pg_catalog.to_regclass('lock_entry_expiry_idx'), 'pg_class')
       = 'built by lease-sweeper migrate' THEN
        DROP INDEX lock_entry_expiry_idx;
    END IF;
END
$$;

DROP TABLE lock_expiry_outbox, lock_reap_handoff, lock_held_count, lock_held_delta,
           job_reap_handoff, lease_sweeper_sql, lease_sweeper_migrations;
DROP TYPE lock_reaped_lease;

DELETE FROM queue_setting
 WHERE key IN ('queue.lease.reaper_enabled', 'queue.lease.reaper_dry_run_only');

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'lease_sweeper') THEN
        -- Revoking a table's privilege revokes its column privileges too.
        REVOKE ALL ON queue_setting, job_queue FROM lease_sweeper;
        EXECUTE pg_catalog.format('REVOKE USAGE ON SCHEMA %I FROM lease_sweeper', pg_catalog.current_schema());
    END IF;
END
$$;
