-- The sidecar's own tables, type, role and grants, as the first release
-- (0.1.0) has them.
--
-- `lease-sweeper migrate` applies this after it has made sure a lock server
-- schema (`lock_entry`) is there, adopted or created from
-- sql/lock_server.sql (with the stand-in job queue of sql/job_substrate.sql
-- only in a database that had neither), and before it applies the functions
-- in sql/functions/ and the triggers in sql/lock_entry_hooks.sql. Its
-- history is `lease_sweeper_migrations`, never a table another tool may keep
-- (`_sqlx_migrations`, flyway_schema_history).
--
-- Every statement tolerates what a build before the first release left in
-- the database (IF NOT EXISTS, and the changes to its tables below), so such
-- a database upgrades in place; `migrate` forgets that build's history row
-- (version 20261207000100) before it runs this.
--
-- From the first release on, a migration only adds (expand): whatever the
-- previous release's daemon reads or calls keeps working, and goes (contract)
-- a release later.
--
-- Nothing here creates, alters, constrains or grants on a lock server or
-- queue table: what the sidecar needs of a job queue (its two gate rows, the
-- SELECT for `lease_sweeper`) is sql/job_queue_access.sql, applied by every
-- `migrate` where there is a queue, so a queue that comes later is adopted
-- by the next `migrate`.

-- The daemon's role: NOLOGIN, granted to the login role each host connects
-- as (docs/least-privilege.md). Roles are cluster-wide and every database of
-- a cluster runs this (the test suite in dozens at once), so creating it is
-- idempotent and tolerates a concurrent creator.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'lease_sweeper') THEN
        BEGIN
            CREATE ROLE lease_sweeper NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE
                NOREPLICATION NOBYPASSRLS;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'creating role lease_sweeper needs CREATEROLE, which % lacks; have an administrator run CREATE ROLE lease_sweeper NOLOGIN once per cluster, then run lease-sweeper migrate again', current_user
                    USING ERRCODE = '42501';
        END;
    END IF;
    EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA %I TO lease_sweeper', pg_catalog.current_schema());
END
$$;

-- A role named lease_sweeper that was already there is reused only if it is
-- the NOLOGIN, attribute-free role created above and, unless an
-- administrator adopted it (the comment below marks it), has no members:
-- whoever can log in as it, or holds it, would get this database's sweep
-- privileges. Anything else stops the migration with what was found and what
-- to do.
DO $$
DECLARE
    c_marker  CONSTANT text := 'lease-sweeper daemon role: NOLOGIN, members are sweeper hosts (docs/least-privilege.md)';
    v_role    pg_catalog.pg_roles;
    v_comment text;
    v_members text;
BEGIN
    SELECT * INTO v_role FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'lease_sweeper';
    IF NOT FOUND THEN
        RETURN;  -- created just above by another database's migration racing this one
    END IF;
    IF v_role.rolcanlogin OR v_role.rolsuper OR v_role.rolcreatedb OR v_role.rolcreaterole
       OR v_role.rolreplication OR v_role.rolbypassrls THEN
        RAISE EXCEPTION 'role lease_sweeper exists but is not the NOLOGIN role lease-sweeper creates (it has%); refusing to grant it this database''s sweep privileges, since whoever can log in as it (a known password?) would hold them. Fix: if it is yours, ALTER ROLE lease_sweeper NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD NULL; otherwise rename it (ALTER ROLE lease_sweeper RENAME TO ...). In this database DROP OWNED BY lease_sweeper; revokes what an earlier migration granted it. Then run lease-sweeper migrate again',
            CASE WHEN v_role.rolcanlogin THEN ' LOGIN' ELSE '' END
            || CASE WHEN v_role.rolsuper THEN ' SUPERUSER' ELSE '' END
            || CASE WHEN v_role.rolcreatedb THEN ' CREATEDB' ELSE '' END
            || CASE WHEN v_role.rolcreaterole THEN ' CREATEROLE' ELSE '' END
            || CASE WHEN v_role.rolreplication THEN ' REPLICATION' ELSE '' END
            || CASE WHEN v_role.rolbypassrls THEN ' BYPASSRLS' ELSE '' END
            USING ERRCODE = '42501';
    END IF;
    v_comment := pg_catalog.shobj_description(v_role.oid, 'pg_authid');
    IF v_comment IS NOT DISTINCT FROM c_marker THEN
        RETURN;  -- ours (created here and marked, or adopted by an administrator)
    END IF;
    SELECT pg_catalog.string_agg(pg_catalog.quote_ident(m.rolname::pg_catalog.text), ', ' ORDER BY m.rolname)
      INTO v_members
      FROM pg_catalog.pg_auth_members AS a
      JOIN pg_catalog.pg_roles AS m ON m.oid = a.member
     WHERE a.roleid = v_role.oid;
    IF v_members IS NOT NULL THEN
        RAISE EXCEPTION 'role lease_sweeper existed before this migration marked it, and has members (%) who would receive this database''s sweep privileges; refusing to reuse it unchecked. Fix: if you granted them (the sweeper hosts of docs/least-privilege.md), adopt the role once per cluster with COMMENT ON ROLE lease_sweeper IS %; otherwise REVOKE lease_sweeper FROM each of them, and in this database DROP OWNED BY lease_sweeper; revokes what an earlier migration granted it. Then run lease-sweeper migrate again',
            v_members, pg_catalog.quote_literal(c_marker)
            USING ERRCODE = '42501';
    END IF;
    -- NOLOGIN, no attributes, no members: safe to adopt. Marking needs
    -- CREATEROLE; an owner without it leaves the role unmarked (safe as it
    -- is), and the check above runs again next time.
    BEGIN
        EXECUTE pg_catalog.format('COMMENT ON ROLE lease_sweeper IS %L', c_marker);
    EXCEPTION
        WHEN insufficient_privilege THEN NULL;
        -- Another database's migration is marking it at the same moment.
        WHEN unique_violation OR internal_error THEN NULL;
    END;
END
$$;

-- Expired leases that left lock_entry, or came back to life, by another way
-- than a sweep, recorded in the same statement by the triggers of
-- sql/lock_entry_hooks.sql and drained by sweepers, which report each as
-- lease_expired with this `reaped_by`: `takeover` (an acquire stole the
-- expired row; `new_token` is the thief's), `release` (the holder deleted its
-- row after its deadline) or `renewal` (the holder moved its passed deadline
-- forward and holds the lease still). `taken_over_at` is when that happened.
-- Tokens are kept as their text, whatever type the lock server's token
-- column has (NULL where its token is NULL). While no sweeper runs it grows
-- by one row per such event; the first sweeper to start drains it.
CREATE TABLE IF NOT EXISTS lock_expiry_outbox (
    outbox_id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lock_key      text        NOT NULL,
    owner_id      text        NOT NULL,
    token         text,
    expires_at    timestamptz NOT NULL,
    taken_over_at timestamptz NOT NULL DEFAULT now(),
    new_token     text,
    reaped_by     text        NOT NULL DEFAULT 'takeover',
    CONSTRAINT lock_expiry_outbox_expires_at_finite CHECK (isfinite(expires_at)),
    CONSTRAINT lock_expiry_outbox_taken_over_at_finite CHECK (isfinite(taken_over_at))
);
-- A build before the first release kept bigint tokens and two reasons.
ALTER TABLE lock_expiry_outbox ALTER COLUMN token DROP NOT NULL,
                               ALTER COLUMN token TYPE text USING token::text,
                               ALTER COLUMN new_token DROP NOT NULL,
                               ALTER COLUMN new_token TYPE text USING new_token::text;
ALTER TABLE lock_expiry_outbox
    ADD COLUMN IF NOT EXISTS reaped_by text NOT NULL DEFAULT 'takeover';
ALTER TABLE lock_expiry_outbox DROP CONSTRAINT IF EXISTS lock_expiry_outbox_reaped_by;
ALTER TABLE lock_expiry_outbox ADD CONSTRAINT lock_expiry_outbox_reaped_by
    CHECK (reaped_by IN ('takeover', 'release', 'renewal'));
REVOKE ALL ON TABLE lock_expiry_outbox FROM PUBLIC;

-- A swept batch, committed with its deletion before its lines are written,
-- so no lock-server call waits on the daemon's output; deleted (claimed)
-- once they are written, or recovered by any sweeper once older than
-- signal_handoff_grace(). Element i of every array is one lease.
CREATE TABLE IF NOT EXISTS lock_reap_handoff (
    handoff_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    written_at        timestamptz NOT NULL DEFAULT pg_catalog.now(),
    lock_keys         text[]      NOT NULL,
    owner_ids         text[]      NOT NULL,
    tokens            text[]      NOT NULL,
    expired_at_millis bigint[],
    overdue_millis    bigint[]
);
-- An earlier build also wrote a second row shape (deadlines as timestamps
-- and the statement's clock); its rows are turned into this one.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
                WHERE attrelid = 'lock_reap_handoff'::pg_catalog.regclass
                  AND attname = 'reaped_at' AND NOT attisdropped) THEN
        ALTER TABLE lock_reap_handoff DROP CONSTRAINT IF EXISTS lock_reap_handoff_one_length_each;
        UPDATE lock_reap_handoff AS h
           SET expired_at_millis = ARRAY(SELECT (pg_catalog.floor(EXTRACT(epoch FROM x) * 1000))::pg_catalog.int8
                                           FROM pg_catalog.unnest(h.expires_at) WITH ORDINALITY AS u (x, i) ORDER BY i),
               overdue_millis = ARRAY(SELECT (pg_catalog.floor(EXTRACT(epoch FROM h.reaped_at - x) * 1000))::pg_catalog.int8
                                        FROM pg_catalog.unnest(h.expires_at) WITH ORDINALITY AS u (x, i) ORDER BY i)
         WHERE h.expires_at IS NOT NULL;
        ALTER TABLE lock_reap_handoff DROP COLUMN expires_at, DROP COLUMN reaped_at;
    END IF;
END
$$;
-- Tokens as their text (a build before the first release kept bigint).
ALTER TABLE lock_reap_handoff ALTER COLUMN tokens TYPE text[] USING tokens::text[];
ALTER TABLE lock_reap_handoff ALTER COLUMN expired_at_millis SET NOT NULL,
                              ALTER COLUMN overdue_millis SET NOT NULL;
ALTER TABLE lock_reap_handoff DROP CONSTRAINT IF EXISTS lock_reap_handoff_one_length_each;
ALTER TABLE lock_reap_handoff ADD CONSTRAINT lock_reap_handoff_one_length_each CHECK (
    pg_catalog.cardinality(lock_keys) > 0
    AND pg_catalog.cardinality(owner_ids) = pg_catalog.cardinality(lock_keys)
    AND pg_catalog.cardinality(tokens) = pg_catalog.cardinality(lock_keys)
    AND pg_catalog.cardinality(expired_at_millis) = pg_catalog.cardinality(lock_keys)
    AND pg_catalog.cardinality(overdue_millis) = pg_catalog.cardinality(lock_keys));
-- A batch's arrays compress well and are written once.
ALTER TABLE lock_reap_handoff ALTER COLUMN lock_keys SET COMPRESSION lz4,
                              ALTER COLUMN owner_ids SET COMPRESSION lz4,
                              ALTER COLUMN tokens SET COMPRESSION lz4,
                              ALTER COLUMN expired_at_millis SET COMPRESSION lz4,
                              ALTER COLUMN overdue_millis SET COMPRESSION lz4;
-- One insert and one delete a batch: vacuumed often, whatever its size.
ALTER TABLE lock_reap_handoff SET (autovacuum_vacuum_threshold = 50, autovacuum_vacuum_scale_factor = 0);
REVOKE ALL ON TABLE lock_reap_handoff FROM PUBLIC;

-- The fleet's shared count of held leases (lock.held.current): one
-- timestamped count, recounted by one daemon per interval, less what every
-- batch since has swept (lock_held_delta, written in the batch's statement).
CREATE TABLE IF NOT EXISTS lock_held_count (
    singleton    boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    held         bigint      NOT NULL,
    counted_at   timestamptz NOT NULL,
    recounts     bigint      NOT NULL DEFAULT 0,
    counted_xmin xid,
    counted_xmax xid,
    counted_xip  xid[]
);
INSERT INTO lock_held_count (held, counted_at) VALUES (0, '-infinity') ON CONFLICT DO NOTHING;
REVOKE ALL ON TABLE lock_held_count FROM PUBLIC;

CREATE TABLE IF NOT EXISTS lock_held_delta (
    delta_id bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    n        integer NOT NULL CHECK (n > 0)
);
REVOKE ALL ON TABLE lock_held_delta FROM PUBLIC;

-- A reaped job batch's report, handed off as lock_reap_handoff is.
CREATE TABLE IF NOT EXISTS job_reap_handoff (
    handoff_id bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    written_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    report     text        NOT NULL CHECK (report <> '')
);
ALTER TABLE job_reap_handoff ALTER COLUMN report SET COMPRESSION lz4;
ALTER TABLE job_reap_handoff SET (autovacuum_vacuum_threshold = 50, autovacuum_vacuum_scale_factor = 0);
REVOKE ALL ON TABLE job_reap_handoff FROM PUBLIC;

-- The row the reaping functions collect a batch in before they return it,
-- so a row that cannot be deleted is set aside without losing the others.
-- The functions that return its token as bigint (a build before the first
-- release) go first: they are created again, returning text, right after.
DROP FUNCTION IF EXISTS
    lock_reap_batch(integer, bigint),
    lock_reap_expired(integer, bigint),
    lock_drain_takeovers(integer),
    lock_handoff_recover();
DO $$
BEGIN
    IF pg_catalog.to_regtype('lock_reaped_lease') IS NULL THEN
        CREATE TYPE lock_reaped_lease AS (
            lock_key text, owner_id text, token text, expired_at_millis bigint,
            overdue_millis bigint, set_aside_error text, reaped_by text);
    ELSE
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
                        WHERE attrelid = (SELECT typrelid FROM pg_catalog.pg_type
                                           WHERE oid = 'lock_reaped_lease'::pg_catalog.regtype)
                          AND attname = 'reaped_by' AND NOT attisdropped) THEN
            ALTER TYPE lock_reaped_lease ADD ATTRIBUTE reaped_by text;
        END IF;
        ALTER TYPE lock_reaped_lease ALTER ATTRIBUTE token TYPE text;
    END IF;
END
$$;

-- Which text of each of sql/functions/ and of sql/lock_entry_hooks.sql this
-- database has: `migrate` applies a file again only when it changed.
CREATE TABLE IF NOT EXISTS lease_sweeper_sql (
    name       text        PRIMARY KEY,
    sha256     text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
REVOKE ALL ON TABLE lease_sweeper_sql FROM PUBLIC;

-- `check` compares what this database has applied with what it was built with.
GRANT SELECT ON lease_sweeper_sql, lease_sweeper_migrations TO lease_sweeper;

-- The functions of builds before the first release that no build ships any
-- more, by the signatures they had. A daemon of such a build fails its
-- passes from here until it is restarted with a release; the daemons
-- already upgraded sweep meanwhile, and nothing is lost: rows and hand-offs
-- wait in the tables. From the first release on, `migrate` drops a function
-- only a release after the binary stopped shipping it.
DROP FUNCTION IF EXISTS
    lock_reap_busy(integer),
    lock_reap_waiters(),
    lock_reap_walk(integer, bigint, boolean, integer, integer),
    lock_reap_expired_walk(integer, bigint),
    lock_reap_expired_walk_handed_off(integer, bigint),
    lock_walk_lock_class(),
    lock_walk_max_ranges(),
    lock_walk_range_pages(),
    lock_reap_expired_handed_off(integer, bigint),
    lock_handoff_put(text[], text[], bigint[], bigint[], bigint[]),
    lock_sweep_probe(bigint),
    lock_reap_expired_fast(integer, timestamptz),
    fn_job_reap_handoff_put(text),
    fn_job_reap_stale_leases_apply_handed_off(text, integer);
-- Of those, and of the four dropped before the type above changed, the ones
-- sql/functions/ still ships are created again by the same `migrate` only if
-- their recorded text is forgotten here.
DELETE FROM lease_sweeper_sql
 WHERE name IN ('lock_sweep_probe', 'fn_job_reap_stale_leases_apply_handed_off', 'lock_reap_batch',
                'lock_reap_expired', 'lock_drain_takeovers', 'lock_handoff_recover');

-- An earlier build kept its history in _sqlx_migrations. Its rows there are
-- this project's own (each version with its description); the table goes
-- when nothing else is left in it.
DO $$
BEGIN
    IF pg_catalog.to_regclass('_sqlx_migrations') IS NOT NULL THEN
        DELETE FROM _sqlx_migrations AS m
         WHERE (m.version, m.description) IN (
            (20261129000100, 'lock leases'), (20261129000200, 'job queue'),
            (20261129000300, 'sweeper role'), (20261130000100, 'lock rows never block'),
            (20261130000110, 'job rows never block'), (20261130000120, 'privilege holes'),
            (20261130000300, 'reap walk and shared held count'),
            (20261130000400, 'job idle question in plpgsql'),
            (20261201000100, 'held count follows sweeps'), (20261201000200, 'job lease duration'),
            (20261201000400, 'function comments'), (20261202000100, 'reap handoff'),
            (20261202000200, 'job reap hash joins'), (20261202000300, 'handoff in the reaping call'),
            (20261204000100, 'walk past empty pages'), (20261204000200, 'walk without row locks'),
            (20261204000300, 'walk deletes by page range'), (20261205000100, 'walk in strides'),
            (20261205000200, 'job reaper sees workers'));
        IF NOT EXISTS (SELECT 1 FROM _sqlx_migrations) THEN
            DROP TABLE _sqlx_migrations;
        END IF;
    END IF;
END
$$;
