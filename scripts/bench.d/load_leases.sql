-- Loads :n leases into lock_entry. psql variables:
--   n      how many
--   past   'true': every lease already expired (deadlines spread over the
--          last hour, in random order relative to insertion, the
--          pessimistic case for an index-order drain);
--          'false': every lease live for the next hour (idle case);
--   spread when > 0 (seconds): deadlines spread evenly over `spread`
--          seconds starting `lead` seconds from now (lag case: leases
--          expire at a steady n/spread per second), overriding `past`;
--   lead   seconds before the first deadline (covers the load itself);
--   prefix the keys' first segment (default `orders`), so two loads into one
--          table do not collide.
-- One lease in 16 belongs to a session, as on a lock server with sessions.
\set ON_ERROR_STOP 1
\if :{?prefix}
\else
\set prefix orders
\endif
INSERT INTO lock_session (session_id, owner_id, expires_at)
SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(s), 12, '0'))::uuid,
       'host-' || (s % 8) || '/worker-' || s, now() + interval '1 day'
  FROM generate_series(1, 64) AS s
ON CONFLICT DO NOTHING;

INSERT INTO lock_entry (lock_key, session_id, owner_id, token, acquired_at, expires_at)
SELECT :'prefix' || '/' || md5(g::text) || '/' || g,
       CASE WHEN g % 16 = 0
            THEN ('00000000-0000-4000-8000-' || lpad(to_hex(1 + g % 64), 12, '0'))::uuid END,
       'host-' || (g % 8) || '/worker-' || (g % 64),
       nextval('lock_fencing_token_seq'),
       now() - interval '20 minutes',
       CASE WHEN :spread > 0 THEN now() + (:lead + g::float8 / :n * :spread) * interval '1 second'
            WHEN :past THEN now() - random() * interval '1 hour' - interval '1 second'
            ELSE now() + interval '1 hour' + random() * interval '10 minutes' END
  FROM generate_series(1, :n) AS g;
