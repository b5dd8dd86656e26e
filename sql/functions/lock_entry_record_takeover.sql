CREATE OR REPLACE FUNCTION lock_entry_record_takeover()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
BEGIN
    -- A new token on an existing key is a steal; it is an expiry only if the
    -- old lease had reached its deadline (it always has, via lock_acquire).
    IF OLD.expires_at <= pg_catalog.now() THEN
        INSERT INTO lock_expiry_outbox (lock_key, owner_id, token, expires_at, taken_over_at, new_token)
        VALUES (OLD.lock_key, OLD.owner_id, OLD.token, OLD.expires_at, pg_catalog.now(), NEW.token);
    END IF;
    RETURN NULL;
END
$function$;

REVOKE ALL ON FUNCTION lock_entry_record_takeover() FROM PUBLIC;
