-- Loads :n live leases (deadlines an hour away) on the keys that follow the
-- first :after, named as load_leases.sql names its keys ('orders/<md5 of
-- g>/<g>'), so that they never collide with a storm load_leases.sql wrote
-- for keys 1..:after. One lease in 16 belongs to one of its sessions.
\set ON_ERROR_STOP 1
INSERT INTO lock_entry (lock_key, session_id, owner_id, token, acquired_at, expires_at)
SELECT 'orders/' || md5(g::text) || '/' || g,
       CASE WHEN g % 16 = 0
            THEN ('00000000-0000-4000-8000-' || lpad(to_hex(1 + g % 64), 12, '0'))::uuid END,
       'host-' || (g % 8) || '/worker-' || (g % 64),
       nextval('lock_fencing_token_seq'),
       now() - interval '20 minutes',
       now() + interval '1 hour' + random() * interval '10 minutes'
  FROM generate_series(:after + 1, :after + :n) AS g;
