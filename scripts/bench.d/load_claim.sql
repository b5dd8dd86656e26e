-- Loads 10,000 claimable jobs of 10 kinds (kind-0 .. kind-9, interleaved)
-- and opens the substrate gate, for the claim step. With -v mixed=true, 1
-- job in 10 carries metadata.lease_override_sec (60..659 s) and the 5
-- even-numbered kinds get a duration of their own (30, 150, 270, 390, 510 s);
-- with mixed=false neither, which is how every claim leased before. Every
-- job's metadata has a trace id either way, so the override lookup searches
-- a real object, not an empty one.
\set ON_ERROR_STOP 1
SELECT fn_queue_setting_set('queue.job_substrate.enabled', 'true', 'bench');

INSERT INTO job_queue (job_kind, payload, metadata, scheduled_at, created_at, updated_at)
SELECT 'kind-' || (g % 10),
       jsonb_build_object('order', g, 'customer', 'c-' || (g % 997)),
       CASE WHEN :mixed AND g % 10 = 3
            THEN jsonb_build_object('trace', md5(g::text), 'lease_override_sec', 60 + g % 600)
            ELSE jsonb_build_object('trace', md5(g::text)) END,
       now() - interval '1 hour' + g * interval '1 millisecond',
       now() - interval '1 hour', now() - interval '1 hour'
  FROM generate_series(1, 10000) AS g;

SELECT fn_job_kind_lease_set('kind-' || k, 30 + k * 60, 'bench')
  FROM generate_series(0, 9, 2) AS k
 WHERE :mixed;
