-- What a sweep asks first, in one statement: is any lease expired, is any
-- expiry recorded (a takeover, a late release, or a hand-off its writer
-- abandoned), and the shared held count (NULL when something is expired:
-- the sweep reads it after deleting). An idle sweep is this statement alone.
CREATE OR REPLACE FUNCTION lock_sweep_probe(p_max_age_millis bigint)
 RETURNS TABLE(expired boolean, takeovers boolean, held bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_expired boolean := EXISTS (SELECT 1 FROM lock_entry AS e WHERE e.expires_at <= pg_catalog.now());
    v_takeovers boolean := EXISTS (SELECT 1 FROM lock_expiry_outbox)
                           OR EXISTS (SELECT 1 FROM lock_reap_handoff AS h
                                       WHERE h.written_at < pg_catalog.now() - signal_handoff_grace());
    v_held bigint;
BEGIN
    IF v_expired THEN
        RETURN QUERY SELECT true, v_takeovers, NULL::bigint;
        RETURN;
    END IF;
    SELECT c.held - COALESCE((SELECT pg_catalog.sum(d.n) FROM lock_held_delta AS d), 0::pg_catalog.int8)
      INTO v_held
      FROM lock_held_count AS c
     WHERE c.singleton
       AND c.counted_at > pg_catalog.now() - p_max_age_millis * '1 millisecond'::interval;
    IF v_held IS NULL THEN
        SELECT c.held INTO v_held FROM lock_held_count_get(p_max_age_millis) AS c;
    END IF;
    RETURN QUERY SELECT false, v_takeovers, v_held;
END
$function$;

COMMENT ON FUNCTION lock_sweep_probe(bigint) IS
'A sweep''s first question: whether any lease is expired, whether any takeover, late release or abandoned hand-off waits, and (when nothing is expired) the shared held count, recounted when older than p_max_age_millis. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

REVOKE ALL ON FUNCTION lock_sweep_probe(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_sweep_probe(bigint) TO lease_sweeper;
