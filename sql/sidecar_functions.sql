-- The sidecar's functions as this database records them (lease_sweeper_sql),
-- every overload of each in the schema the sidecar is installed into: the
-- one loop over them, for `migrate` and for `remove`.
--
-- The names kept come in the transaction's setting lease_sweeper.kept, one
-- comma between two names. `migrate` keeps the functions the binary ships,
-- the triggers' record (lock_entry_hooks) and any function it keeps one
-- release longer for the daemons of the release before; `remove` keeps
-- none.
--
-- A function not kept is dropped and its record forgotten, so for `migrate`
-- sql/functions/ is the whole truth. A kept one with a setting (every
-- SECURITY DEFINER function, and only those) has its search_path pinned:
-- pg_catalog first, then the schema it was installed into, pg_temp last,
-- so it resolves names nowhere a caller could plant an object. The files
-- in functions/ say `public`; where `migrate` installs elsewhere (a lock
-- server whose tables live in another schema on the search path), this
-- follows it.
--
-- Run in the caller's one transaction: a failure rolls all of it back.
DO $$
DECLARE
    v_kept text[] := pg_catalog.string_to_array(pg_catalog.current_setting('lease_sweeper.kept'), ',');
    f regprocedure;
    v_keep boolean;
    v_setting text[];
BEGIN
    FOR f, v_keep, v_setting IN
        SELECT p.oid::regprocedure, s.name = ANY (v_kept), p.proconfig
          FROM pg_catalog.pg_proc AS p
          JOIN lease_sweeper_sql AS s ON s.name = p.proname::pg_catalog.text
         WHERE p.pronamespace = pg_catalog.current_schema()::pg_catalog.regnamespace
    LOOP
        IF NOT v_keep THEN
            EXECUTE pg_catalog.format('DROP FUNCTION %s', f);
        ELSIF v_setting IS NOT NULL THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                      f, pg_catalog.current_schema());
        END IF;
    END LOOP;
    DELETE FROM lease_sweeper_sql AS s WHERE s.name <> ALL (v_kept);
END
$$;
