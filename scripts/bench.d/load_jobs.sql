-- Loads :n stale leased jobs into job_queue and opens the reaper's gates.
-- Mixed outcomes: attempts cycles 0..4 with max_attempts 5, so one job in
-- five is at its last attempt (dead letter) and four in five are reset with
-- backoffs of base * 2^0 .. 2^3. Leases ran out 1 s to 10 min ago; payloads
-- are small JSON objects, as a job queue's usually are.
\set ON_ERROR_STOP 1
SELECT fn_queue_setting_set('queue.job_substrate.enabled', 'true', 'bench');
SELECT fn_queue_setting_set('queue.lease.reaper_enabled', 'true', 'bench');
SELECT fn_queue_setting_set('queue.lease.reaper_dry_run_only', 'false', 'bench');

INSERT INTO job_queue (job_kind, payload, state, attempts, max_attempts, scheduled_at,
                       lease_owner, lease_until, created_at, updated_at)
SELECT 'kind-' || (g % 7),
       jsonb_build_object('order', g, 'customer', 'c-' || (g % 997)),
       'leased', g % 5, 5, now() - interval '1 hour',
       'worker-' || (g % 32) || '@host-' || (g % 4),
       now() - interval '1 second' - random() * interval '10 minutes',
       now() - interval '1 hour', now() - interval '20 minutes'
  FROM generate_series(1, :n) AS g;
