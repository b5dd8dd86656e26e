-- `lease-sweeper migrate`: drops the functions this database records in
-- lease_sweeper_sql that the binary no longer ships, every overload of each
-- in the sidecar's schema, and forgets their records, so sql/functions/ is
-- the whole truth.
--
-- Run in the transaction that also applies the versioned migrations and the
-- functions the binary ships: a failure rolls all of it back. The names the
-- binary keeps (its functions, the triggers' record `lock_entry_hooks`, and
-- any function it keeps one release longer for the daemons of the release
-- before) come in the transaction's setting lease_sweeper.kept, one comma
-- between two names, set by `migrate` just before.
DO $$
DECLARE
    v_kept text[] := pg_catalog.string_to_array(pg_catalog.current_setting('lease_sweeper.kept'), ',');
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc AS p
          JOIN lease_sweeper_sql AS s ON s.name = p.proname::pg_catalog.text
         WHERE p.pronamespace = pg_catalog.current_schema()::pg_catalog.regnamespace
           AND s.name <> ALL (v_kept)
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', f);
    END LOOP;
    DELETE FROM lease_sweeper_sql AS s WHERE s.name <> ALL (v_kept);
END
$$;
