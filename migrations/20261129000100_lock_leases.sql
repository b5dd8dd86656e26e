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
$$;

-- Renew: extends a live lease held with this token. An expired lease cannot be
-- renewed: its holder has lost it, and the sweeper will report the expiry.
CREATE FUNCTION lock_renew(p_lock_key text, p_token bigint, p_ttl_millis bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
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

-- The sweeper's two deleting statements, as functions that can only ever
-- delete what has expired. They are SECURITY DEFINER so the sweeper's role
-- needs EXECUTE on them instead of a table-wide DELETE (which would let it
-- delete a live lease); EXECUTE is revoked from PUBLIC because whoever calls
-- them must report what they return (the caller writes the lease_expired
-- lines before committing).
--
-- Hardening of the definer bodies: search_path is pinned with pg_temp last,
-- every function call is pg_catalog-qualified (EXTRACT is by the grammar),
-- and every operator has operands of exactly the built-in's types, so no
-- overload a role creates in public can be a better match and run as owner.
--
-- Shape (see queries::locks and docs/decisions.md): rows are chosen oldest
-- deadline first with FOR UPDATE SKIP LOCKED, so replicas split the work and
-- never wait on each other or on an acquire stealing a row; the delete is by
-- tuple id (ctid = ANY(ARRAY(…))), which avoids the hash semi-join over a
-- sequential scan that `lock_key IN (subquery)` is planned as; the deadline is
-- checked again on the delete itself. The database clock decides expiry and
-- lateness, so a sidecar with a wrong clock can neither delete a live lease
-- nor misreport how late it was.
--
-- p_after_millis resumes the index scan where the previous batch of the same
-- sweep stopped (the newest deadline it reaped, epoch ms, floored as
-- expired_at_millis is). Without it every batch starts at the head of
-- lock_entry_expiry_idx and steps over the dead entries the batches before it
-- left: a 1,000,000-lease drain took 16-18 s instead of 6.6-6.9 s
-- (docs/performance.md). 0 means "from the oldest", which the first batch of
-- every sweep passes, so a lease skipped because another replica held it is
-- reaped by the next sweep at the latest: never lost, at most one sweep late.
CREATE FUNCTION lock_reap_expired(p_limit integer, p_after_millis bigint DEFAULT 0)
RETURNS TABLE (lock_key text, owner_id text, token bigint, expired_at_millis bigint, overdue_millis bigint)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    WITH doomed AS (
        SELECT ctid
          FROM lock_entry
         WHERE expires_at <= pg_catalog.now()
           AND expires_at >= '1970-01-01 00:00:00+00'::pg_catalog.timestamptz
                             + p_after_millis::pg_catalog.float8 * '1 millisecond'::pg_catalog.interval
         ORDER BY expires_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    )
    DELETE FROM lock_entry AS e
     WHERE e.ctid = ANY (ARRAY(SELECT ctid FROM doomed))
       AND e.expires_at <= pg_catalog.now()
    RETURNING e.lock_key,
              e.owner_id,
              e.token,
              pg_catalog.floor(EXTRACT(epoch FROM e.expires_at) * 1000::numeric)::bigint,
              pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.now() - e.expires_at) * 1000::numeric)::bigint
$$;

-- Drains recorded takeovers, oldest first; lateness is measured at the
-- moment of the steal.
CREATE FUNCTION lock_drain_takeovers(p_limit integer)
RETURNS TABLE (lock_key text, owner_id text, token bigint, expired_at_millis bigint, overdue_millis bigint)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
    DELETE FROM lock_expiry_outbox AS o
     WHERE o.outbox_id = ANY (ARRAY(
            SELECT outbox_id
              FROM lock_expiry_outbox
             ORDER BY outbox_id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED))
    RETURNING o.lock_key,
              o.owner_id,
              o.token,
              pg_catalog.floor(EXTRACT(epoch FROM o.expires_at) * 1000::numeric)::bigint,
              pg_catalog.floor(EXTRACT(epoch FROM o.taken_over_at - o.expires_at) * 1000::numeric)::bigint
$$;

REVOKE ALL ON FUNCTION lock_reap_expired(integer, bigint), lock_drain_takeovers(integer) FROM PUBLIC;
