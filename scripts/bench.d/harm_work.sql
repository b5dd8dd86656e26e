-- Loads :n claimable jobs of kind `work` for the workers of the harm step
-- (harm_job.pgbench), scheduled over the last half hour in insertion order.
\set ON_ERROR_STOP 1
INSERT INTO job_queue (job_kind, payload, metadata, scheduled_at, created_at, updated_at)
SELECT 'work',
       jsonb_build_object('order', g, 'customer', 'c-' || (g % 997)),
       jsonb_build_object('trace', md5(g::text)),
       now() - interval '30 minutes' + g * interval '1 millisecond',
       now() - interval '30 minutes', now() - interval '30 minutes'
  FROM generate_series(1, :n) AS g;
