-- A lease an acquire took over after its deadline, before any sweep did:
-- the old lease is recorded in the acquiring statement, for a sweeper to
-- report as lease_expired reapedBy=takeover. The trigger's WHEN clause
-- (sql/lock_entry_hooks.sql) calls this only for a token that changed on a
-- row whose deadline had passed; tokens are kept as their text.
CREATE OR REPLACE FUNCTION lock_entry_record_takeover()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO lock_expiry_outbox (lock_key, owner_id, token, expires_at, taken_over_at, new_token, reaped_by)
    VALUES (OLD.lock_key, OLD.owner_id, OLD.token::pg_catalog.text, OLD.expires_at, pg_catalog.now(),
            NEW.token::pg_catalog.text, 'takeover');
    RETURN NULL;
END
$function$;

REVOKE ALL ON FUNCTION lock_entry_record_takeover() FROM PUBLIC;
