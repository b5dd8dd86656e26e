-- Lock leases: the lock server's tables and its reference statements.
--
-- The sweeper only ever deletes rows whose deadline has passed (by this
-- database's clock) and drains lock_expiry_outbox. Everything else here is
-- the lock server's, shipped as functions so tests and the demo can act as
-- one. lock_acquire never depends on a sweeper having run: it steals an
-- expired row on its own.

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
    expires_at  timestamptz NOT NULL
);

-- The sweep's predicate is `expires_at <= now()` in deadline order.
CREATE INDEX lock_entry_expiry_idx ON lock_entry (expires_at);
CREATE INDEX lock_entry_session_idx ON lock_entry (session_id) WHERE session_id IS NOT NULL;

-- Expired leases stolen by an acquire before any sweep deleted them. Written
-- in the same statement as the steal (trigger below), drained by sweepers,
-- which report each as lease_expired reapedBy=takeover. While no sweeper runs
-- it grows by one row per takeover; the first sweeper to start drains it.
CREATE TABLE lock_expiry_outbox (
    outbox_id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lock_key      text        NOT NULL,
    owner_id      text        NOT NULL,
    token         bigint      NOT NULL,
    expires_at    timestamptz NOT NULL,
    taken_over_at timestamptz NOT NULL DEFAULT now(),
    new_token     bigint      NOT NULL
);

CREATE FUNCTION lock_entry_record_takeover() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- A new token on an existing key is a steal; it is an expiry only if the
    -- old lease had reached its deadline (it always has, via lock_acquire).
    IF OLD.expires_at <= now() THEN
        INSERT INTO lock_expiry_outbox (lock_key, owner_id, token, expires_at, taken_over_at, new_token)
        VALUES (OLD.lock_key, OLD.owner_id, OLD.token, OLD.expires_at, now(), NEW.token);
    END IF;
    RETURN NULL;
END
$$;

-- The WHEN clause keeps renewals (same token) free of any trigger call.
CREATE TRIGGER lock_entry_takeover
    AFTER UPDATE ON lock_entry
    FOR EACH ROW
    WHEN (OLD.token IS DISTINCT FROM NEW.token)
    EXECUTE FUNCTION lock_entry_record_takeover();

-- Acquire: insert, or steal a row whose lease has expired. Returns the new
-- fencing token, or NULL while another live lease holds the key.
CREATE FUNCTION lock_acquire(p_lock_key text, p_owner_id text, p_ttl_millis bigint,
                             p_session_id uuid DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_token bigint;
BEGIN
    IF p_lock_key IS NULL OR p_lock_key = '' THEN
        RAISE EXCEPTION 'lock_acquire: lock key must be a non-empty string' USING ERRCODE = '22023';
    END IF;
    IF p_owner_id IS NULL THEN
        RAISE EXCEPTION 'lock_acquire: owner id must not be NULL' USING ERRCODE = '22023';
    END IF;
    IF p_ttl_millis IS NULL OR p_ttl_millis <= 0 THEN
        RAISE EXCEPTION 'lock_acquire: ttl must be a positive number of milliseconds, got %', p_ttl_millis
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
$$;

-- Renew: extends a live lease held with this token. An expired lease cannot be
-- renewed: its holder has lost it, and the sweeper will report the expiry.
CREATE FUNCTION lock_renew(p_lock_key text, p_token bigint, p_ttl_millis bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF p_ttl_millis IS NULL OR p_ttl_millis <= 0 THEN
        RAISE EXCEPTION 'lock_renew: ttl must be a positive number of milliseconds, got %', p_ttl_millis
            USING ERRCODE = '22023';
    END IF;
    UPDATE lock_entry
       SET expires_at = now() + p_ttl_millis * interval '1 millisecond'
     WHERE lock_key = p_lock_key AND token = p_token AND expires_at > now();
    RETURN FOUND;
END
$$;

-- Release: deletes a live lease held with this token. Releasing after the
-- deadline returns false and leaves the row, so the overrun is still reported
-- as lease_expired rather than silently erased.
CREATE FUNCTION lock_release(p_lock_key text, p_token bigint)
RETURNS boolean
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM lock_entry
         WHERE lock_key = p_lock_key AND token = p_token AND expires_at > now()
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM gone)
$$;
