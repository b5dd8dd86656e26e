-- A lease its holder deleted after its deadline, before any sweep did (a
-- lock server's own deleteIfOwner may not check the deadline): the expiry
-- happened, and this records it in the deleting statement, for a sweeper to
-- report as lease_expired reapedBy=release. The trigger's WHEN clause
-- (sql/lock_entry_hooks.sql) leaves out live leases, session cascades and
-- the sweep's own deletions, so none of them calls this.
CREATE OR REPLACE FUNCTION lock_entry_record_release()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO lock_expiry_outbox (lock_key, owner_id, token, expires_at, taken_over_at, reaped_by)
    VALUES (OLD.lock_key, OLD.owner_id, OLD.token::pg_catalog.text, OLD.expires_at, pg_catalog.now(), 'release');
    RETURN NULL;
END
$function$;

REVOKE ALL ON FUNCTION lock_entry_record_release() FROM PUBLIC;
