-- A lease its holder renewed after its deadline, before any sweep deleted
-- it (a lock server's extend may not check the deadline): the holder was in
-- its critical section without a valid lease, so the expiry happened, though
-- the lease is held again. Recorded in the renewing statement, with the
-- deadline that had passed and when the renewal came, for a sweeper to
-- report as lease_expired reapedBy=renewal. The trigger's WHEN clause
-- (sql/lock_entry_hooks.sql) calls this only for the same token moving a
-- passed deadline to one ahead.
CREATE OR REPLACE FUNCTION lock_entry_record_renewal()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO lock_expiry_outbox (lock_key, owner_id, token, expires_at, taken_over_at, reaped_by)
    VALUES (OLD.lock_key, OLD.owner_id, OLD.token::pg_catalog.text, OLD.expires_at, pg_catalog.now(), 'renewal');
    RETURN NULL;
END
$function$;

REVOKE ALL ON FUNCTION lock_entry_record_renewal() FROM PUBLIC;
