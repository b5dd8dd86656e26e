CREATE OR REPLACE FUNCTION signal_handoff_grace()
 RETURNS interval
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT '5 seconds'::pg_catalog.interval $function$;

REVOKE ALL ON FUNCTION signal_handoff_grace() FROM PUBLIC;
