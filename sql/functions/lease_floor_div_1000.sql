CREATE OR REPLACE FUNCTION lease_floor_div_1000(p_x bigint)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT (p_x - ((p_x % 1000::pg_catalog.int8) + 1000::pg_catalog.int8) % 1000::pg_catalog.int8) / 1000::pg_catalog.int8
$function$;

REVOKE ALL ON FUNCTION lease_floor_div_1000(bigint) FROM PUBLIC;
