-- Every SECURITY DEFINER function of the sidecar resolves names in the
-- schema it was installed into and nowhere a caller could plant an object:
-- pg_catalog first, then that schema, pg_temp last. The files in functions/
-- say `public`; where `migrate` installs elsewhere (a lock server whose
-- tables live in another schema on the search path), this follows it.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc AS p
          JOIN lease_sweeper_sql AS s ON s.name = p.proname::pg_catalog.text
         WHERE p.pronamespace = pg_catalog.current_schema()::pg_catalog.regnamespace
           AND p.proconfig IS NOT NULL
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                  f, pg_catalog.current_schema());
    END LOOP;
END
$$;
