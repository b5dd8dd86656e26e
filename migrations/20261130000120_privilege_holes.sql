-- Privilege holes (issue 11, security read items 2, 4, 5).
--
-- 5. The takeover trigger becomes SECURITY DEFINER with a pinned
--    search_path: it writes lock_expiry_outbox with its owner's rights, so a
--    lock server's role needs no privilege on the outbox (and so cannot forge
--    a takeover), and a session's own TEMP TABLE lock_expiry_outbox cannot
--    swallow its takeovers (pg_temp is searched last).
-- 4. A pre-existing role named lease_sweeper is reused only if it is the
--    NOLOGIN, attribute-free role these migrations create, and, unless it was
--    adopted (the comment below marks it), has no members. Anything else
--    stops the migration with what was found and what to do.
-- 2. The definer functions follow the schema they are installed in: their
--    pinned search_path names that schema instead of public (a database
--    migrated with search_path = locks used to have them act on public's
--    same-named tables as their owner).
--
-- Later migrations that create or replace a function with
-- `SET search_path = pg_catalog, public, pg_temp` must end with the same
-- DO block as section 2 below (it is idempotent), or the function acts on
-- public in a database installed elsewhere.

-- 5. The takeover trigger.
CREATE OR REPLACE FUNCTION lock_entry_record_takeover() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    -- A new token on an existing key is a steal; it is an expiry only if the
    -- old lease had reached its deadline (it always has, via lock_acquire).
    IF OLD.expires_at <= pg_catalog.now() THEN
        INSERT INTO lock_expiry_outbox (lock_key, owner_id, token, expires_at, taken_over_at, new_token)
        VALUES (OLD.lock_key, OLD.owner_id, OLD.token, OLD.expires_at, pg_catalog.now(), NEW.token);
    END IF;
    RETURN NULL;
END
$$;
-- Triggers fire whatever EXECUTE says; nobody needs to call it directly.
REVOKE ALL ON FUNCTION lock_entry_record_takeover() FROM PUBLIC;

-- 4. The role.
DO $$
DECLARE
    c_marker  CONSTANT text := 'lease-sweeper daemon role: NOLOGIN, members are sweeper hosts (docs/least-privilege.md)';
    v_role    pg_catalog.pg_roles;
    v_comment text;
    v_members text;
BEGIN
    SELECT * INTO v_role FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'lease_sweeper';
    IF NOT FOUND THEN
        RETURN;  -- 20261129000300 creates it; nothing to check.
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

-- 2. Follow the installing schema.
DO $$
DECLARE
    v_schema text := pg_catalog.current_schema();
    f        record;
BEGIN
    IF v_schema IS NULL THEN
        RAISE EXCEPTION 'no schema to install into: search_path names no existing schema; set it (e.g. ?options=-c%%20search_path%%3Dpublic) and run lease-sweeper migrate again'
            USING ERRCODE = '3F000';
    END IF;
    IF v_schema = 'public' THEN
        RETURN;
    END IF;
    FOR f IN
        SELECT p.oid::pg_catalog.regprocedure AS fn
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = v_schema::pg_catalog.regnamespace
           AND 'search_path=pg_catalog, public, pg_temp' OPERATOR(pg_catalog.=) ANY (p.proconfig)
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f.fn, v_schema);
    END LOOP;
END
$$;
