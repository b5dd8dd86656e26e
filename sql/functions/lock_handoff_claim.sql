CREATE OR REPLACE FUNCTION lock_handoff_claim(p_handoff_id bigint)
 RETURNS boolean
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
    WITH gone AS (
        DELETE FROM lock_reap_handoff AS h WHERE h.handoff_id = p_handoff_id
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM gone)
$function$;

COMMENT ON FUNCTION lock_handoff_claim(bigint) IS
'Deletes hand-off p_handoff_id and returns true, or false when it is gone (another sweeper recovered it and wrote its lines). The caller writes the lines before committing. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

REVOKE ALL ON FUNCTION lock_handoff_claim(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_handoff_claim(bigint) TO lease_sweeper;
