-- What the sidecar needs of a job queue, applied by every `migrate` (in its
-- one transaction, after the functions) and safe to apply again: where
-- there is a queue, the reaper's two gates, closed (reaping needs an
-- operator to open both, and the substrate's own gate), and what the daemon
-- reads directly (everything else goes through its functions): the gates,
-- and the dry run's columns of job_queue, never payload, metadata or
-- last_error; the per-claim lease durations only where the queue records
-- them. Beside a lock server with no job queue it does nothing and the
-- reaper idles; once a queue exists, the next `migrate` adopts it.
-- `lease-sweeper remove` takes back exactly these (sql/remove.sql).
DO $$
BEGIN
    IF pg_catalog.to_regclass('queue_setting') IS NOT NULL THEN
        INSERT INTO queue_setting (key, value, updated_by) VALUES
            ('queue.lease.reaper_enabled', 'false', 'lease-sweeper migrate'),
            ('queue.lease.reaper_dry_run_only', 'true', 'lease-sweeper migrate')
        ON CONFLICT (key) DO NOTHING;
        GRANT SELECT ON queue_setting TO lease_sweeper;
    END IF;
    IF pg_catalog.to_regclass('job_queue') IS NOT NULL THEN
        GRANT SELECT (job_id, job_kind, state, attempts, max_attempts, lease_owner, lease_until)
            ON job_queue TO lease_sweeper;
        IF fn_job_queue_has_columns('{lease_duration_sec,lease_duration_source}') THEN
            GRANT SELECT (lease_duration_sec, lease_duration_source) ON job_queue TO lease_sweeper;
        END IF;
    END IF;
END
$$;
