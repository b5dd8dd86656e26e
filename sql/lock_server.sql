-- The stand-in lock server: its tables and its reference statements.
--
-- `lease-sweeper migrate` runs this file only where no `lock_entry` is on
-- the search path (a new install, the demo, the tests), so that they have a
-- lock server to sweep. Beside a lock server that already runs, its own
-- migration tool made these tables and nothing here runs: the sidecar adopts
-- them (docs/adopting.md). Either way they are the lock server's:
-- `lease-sweeper remove` leaves them, their rows and their history alone.
--
-- lock_acquire never depends on a sweeper having run: it steals an expired
-- row on its own, as a lock server's own tryInsert does.

CREATE TABLE lock_session (
    session_id        uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    owner_id          text        NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL
);

-- Fencing tokens: strictly increasing across all keys, never reused.
CREATE SEQUENCE lock_fencing_token_seq AS bigint;

CREATE TABLE lock_entry (
    lock_key    text        PRIMARY KEY CHECK (lock_key <> ''),
    -- NULL for leases not tied to a session. A dead session's rows go with it
    -- (ON DELETE CASCADE); that is a session event, not a lease expiry.
    session_id  uuid        REFERENCES lock_session (session_id) ON DELETE CASCADE,
    owner_id    text        NOT NULL,
    token       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    CONSTRAINT lock_entry_expires_at_finite CHECK (isfinite(expires_at))
);

-- The sweep's predicate is `expires_at <= now()` in deadline order.
CREATE INDEX lock_entry_expiry_idx ON lock_entry (expires_at);
CREATE INDEX lock_entry_session_idx ON lock_entry (session_id) WHERE session_id IS NOT NULL;

CREATE OR REPLACE FUNCTION lock_acquire(p_lock_key text, p_owner_id text, p_ttl_millis bigint, p_session_id uuid DEFAULT NULL::uuid)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_token bigint;
BEGIN
    IF p_lock_key IS NULL OR p_lock_key = '' THEN
        RAISE EXCEPTION 'lock_acquire: lock key must be a non-empty string' USING ERRCODE = '22023';
    END IF;
    IF p_owner_id IS NULL THEN
        RAISE EXCEPTION 'lock_acquire: owner id must not be NULL' USING ERRCODE = '22023';
    END IF;
    IF p_ttl_millis IS NULL OR p_ttl_millis <= 0 OR p_ttl_millis > 31536000000 THEN
        RAISE EXCEPTION 'lock_acquire: ttl must be a positive number of milliseconds, got % (at most 31536000000, one year)', p_ttl_millis
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO lock_entry AS e (lock_key, session_id, owner_id, token, acquired_at, expires_at)
    VALUES (p_lock_key, p_session_id, p_owner_id, nextval('lock_fencing_token_seq'), now(),
            now() + p_ttl_millis * interval '1 millisecond')
    ON CONFLICT (lock_key) DO UPDATE
        SET session_id  = EXCLUDED.session_id,
            owner_id    = EXCLUDED.owner_id,
            token       = EXCLUDED.token,
            acquired_at = EXCLUDED.acquired_at,
            expires_at  = EXCLUDED.expires_at
        WHERE e.expires_at <= now()
    RETURNING token INTO v_token;
    RETURN v_token;
END
$function$;

COMMENT ON FUNCTION lock_acquire(text, text, bigint, uuid) IS
'Takes the lease on p_lock_key for p_owner_id until now() + p_ttl_millis (database clock), optionally tied to lock_session p_session_id (its leases go with the session, unreported). Returns the new fencing token, strictly greater than every token issued before, or NULL while another live lease holds the key (even one of the same owner). An expired lease still in lock_entry is taken over: its row gets the new owner and token, and the old lease is recorded in lock_expiry_outbox in the same statement, so the sweeper reports it as lease_expired reapedBy=takeover. Errors 22023: NULL or empty key, NULL owner, ttl NULL, <= 0 or over 31536000000 ms (one year); 23503: an unknown session. SECURITY INVOKER: needs SELECT, INSERT, UPDATE on lock_entry and USAGE on lock_fencing_token_seq.';

CREATE OR REPLACE FUNCTION lock_renew(p_lock_key text, p_token bigint, p_ttl_millis bigint)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF p_ttl_millis IS NULL OR p_ttl_millis <= 0 OR p_ttl_millis > 31536000000 THEN
        RAISE EXCEPTION 'lock_renew: ttl must be a positive number of milliseconds, got % (at most 31536000000, one year)', p_ttl_millis
            USING ERRCODE = '22023';
    END IF;
    UPDATE lock_entry
       SET expires_at = now() + p_ttl_millis * interval '1 millisecond'
     WHERE lock_key = p_lock_key AND token = p_token AND expires_at > now();
    RETURN FOUND;
END
$function$;

COMMENT ON FUNCTION lock_renew(text, bigint, bigint) IS
'Moves the deadline of the live lease on p_lock_key held with p_token to now() + p_ttl_millis. Returns true when renewed; false when there is no such live lease (released, taken over, a different token, or already expired: an expired lease cannot be renewed, its holder has lost it and the sweeper reports the expiry); false for a NULL key or token. Errors 22023: ttl NULL, <= 0 or over 31536000000 ms. SECURITY INVOKER: needs SELECT, UPDATE on lock_entry.';

CREATE OR REPLACE FUNCTION lock_release(p_lock_key text, p_token bigint)
 RETURNS boolean
 LANGUAGE sql
AS $function$
    WITH gone AS (
        DELETE FROM lock_entry
         WHERE lock_key = p_lock_key AND token = p_token AND expires_at > now()
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM gone)
$function$;

COMMENT ON FUNCTION lock_release(text, bigint) IS
'Deletes the live lease on p_lock_key held with p_token. Returns true when deleted; false when there is no such live lease (a different token, already released or taken over), and false, leaving the row, after the deadline has passed: the overrun is then reported by the sweeper as lease_expired, never silently erased. NULL arguments: false. SECURITY INVOKER: needs SELECT, DELETE on lock_entry.';

