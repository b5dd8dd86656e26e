-- The fleet's expiry wave (scripts/bench.d/fleet.sh): :n leases whose
-- deadlines are spread evenly over :spread seconds starting :lead seconds
-- from now, so they expire at a steady :n / :spread per second. Keys are
-- `fleet/<g>`, apart from the live leases of load_leases.sql (`orders/…`),
-- so every lease_expired line the fleet writes can be told from a live one
-- swept by mistake. No session: a session expiry is another event.
\set ON_ERROR_STOP 1
INSERT INTO lock_entry (lock_key, session_id, owner_id, token, acquired_at, expires_at)
SELECT 'fleet/' || g,
       NULL,
       'fleet-client/worker-' || (g % 64),
       nextval('lock_fencing_token_seq'),
       now(),
       now() + (:lead + (g - 1)::float8 / :n * :spread) * interval '1 second'
  FROM generate_series(1, :n) AS g;
