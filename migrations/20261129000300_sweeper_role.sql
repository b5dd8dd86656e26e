-- The daemon's own role, `lease_sweeper`: exactly what `lease-sweeper run`
-- and its preflight `lease-sweeper check` need, and nothing else.
--
-- It is NOLOGIN: operators grant it to the LOGIN role each sweeper host
-- connects as (docs/least-privilege.md):
--
--     CREATE ROLE sweeper_host_a LOGIN PASSWORD '…' IN ROLE lease_sweeper;
--     -- or, for an existing role:  GRANT lease_sweeper TO sweeper_host_a;
--
-- What it may do, and why (one line per need):
--   lock_entry          SELECT                count held leases (lock.held.current)
--   lock_reap_expired(integer, bigint), lock_drain_takeovers(integer)
--                       EXECUTE               the sweep's only way to delete: SECURITY DEFINER
--                                             functions that delete nothing but expired leases
--                                             and recorded takeovers
--   queue_setting       SELECT                the gates (fn_job_reaper_gate_refusal is
--                                             SECURITY INVOKER) and `lease-sweeper gates`
--   job_queue           SELECT (job_id, job_kind, state, attempts, max_attempts,
--                               lease_owner, lease_until)
--                                             the dry run behind queue.lease.stale.current
--                                             (SECURITY INVOKER); not payloads
--   fn_job_reaper_gate_refusal(), fn_job_reaper_limit_refusal(integer),
--   fn_job_reap_stale_leases_dry_run(integer),
--   fn_job_reap_stale_leases_apply(text, integer)
--                       EXECUTE               the reaper; apply is SECURITY DEFINER, so the
--                                             role needs no write privilege on job_queue
--   _sqlx_migrations    SELECT                `check` compares applied and built migrations
--   the schema          USAGE
--
-- What it may not do: insert, renew or steal leases (no INSERT or UPDATE on
-- any table; lock_acquire/renew/release run with the caller's rights),
-- touch jobs or dead letters except through the reaper's apply, change a queue
-- setting (fn_queue_setting_set is not executable by PUBLIC and is not
-- granted), create objects anywhere, log in by itself.
--
-- It holds no DELETE or UPDATE on any table, so it cannot delete, release
-- or lock a live lease (DELETE is a table-wide privilege; the definer
-- functions above are how it deletes, and they only delete what expired).
--
-- Roles are cluster-wide and every database of a cluster runs this migration
-- (the test suite runs it in dozens at once), so creating the role is
-- idempotent and tolerates a concurrent creator; the grants are per database.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'lease_sweeper') THEN
        BEGIN
            CREATE ROLE lease_sweeper NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE
                NOREPLICATION NOBYPASSRLS;
        EXCEPTION
            -- Another database's migration created it between our check and now.
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                -- The remedy is in the message itself: `migrate` shows the
                -- message but not a HINT.
                RAISE EXCEPTION 'creating role lease_sweeper needs CREATEROLE, which % lacks; have an administrator run CREATE ROLE lease_sweeper NOLOGIN once per cluster, then run lease-sweeper migrate again', current_user
                    USING ERRCODE = '42501';
        END;
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO lease_sweeper', current_schema());
END
$$;

GRANT SELECT ON lock_entry TO lease_sweeper;
GRANT EXECUTE ON FUNCTION lock_reap_expired(integer, bigint), lock_drain_takeovers(integer) TO lease_sweeper;

GRANT SELECT ON queue_setting TO lease_sweeper;
-- Column-level: the dry run's columns, never payload, metadata or last_error.
GRANT SELECT (job_id, job_kind, state, attempts, max_attempts, lease_owner, lease_until)
    ON job_queue TO lease_sweeper;
GRANT EXECUTE ON FUNCTION
    fn_job_reaper_gate_refusal(),
    fn_job_reaper_limit_refusal(integer),
    fn_job_reap_stale_leases_dry_run(integer),
    fn_job_reap_stale_leases_apply(text, integer)
    TO lease_sweeper;

GRANT SELECT ON _sqlx_migrations TO lease_sweeper;
