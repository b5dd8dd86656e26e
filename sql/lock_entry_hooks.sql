-- The sidecar's three triggers on the lock server's `lock_entry`: each
-- records, in the lock server's own statement, an expired lease that leaves
-- the table, or comes back to life, by another way than a sweep, so that a
-- sweeper reports it once (lock_expiry_outbox). Live leases call none of
-- the functions: the WHEN clauses are checked per row without a call.
--
-- `migrate` applies this file when it changed, in its own short transaction
-- that waits at most a moment for the table's lock (a trigger takes SHARE
-- ROW EXCLUSIVE on lock_entry, which lock-server writes queued behind it
-- would wait for) and tries again, so no lock-server call queues behind a
-- long transaction because of it. The lock server's own triggers stay as
-- they are; these run beside them.

-- A takeover: an acquire gave an expired lease's row a new token. Whatever
-- the token's type, a new lease is a token that changed.
CREATE OR REPLACE TRIGGER lock_entry_takeover
    AFTER UPDATE ON lock_entry
    FOR EACH ROW
    WHEN (OLD.token IS DISTINCT FROM NEW.token
          AND OLD.expires_at <= pg_catalog.now())
    EXECUTE FUNCTION lock_entry_record_takeover();

-- A late renewal: the holder kept its token and moved a deadline that had
-- already passed to one still ahead (an extend that does not check the
-- deadline; the holder woke after it). The lease is held again, but it was
-- not held while the holder was away: an expiry. A renewal in time (the
-- old deadline ahead), one that leaves the deadline passed (the sweep
-- reports that lease), and a takeover (the token changed) call nothing.
CREATE OR REPLACE TRIGGER lock_entry_late_renewal
    AFTER UPDATE ON lock_entry
    FOR EACH ROW
    WHEN (OLD.token IS NOT DISTINCT FROM NEW.token
          AND OLD.expires_at <= pg_catalog.now()
          AND NEW.expires_at > pg_catalog.now())
    EXECUTE FUNCTION lock_entry_record_renewal();

-- A late release: the holder deleted its row after the deadline. Not a
-- live lease's release (deadline ahead), not a session's cascade (the
-- foreign key's trigger deletes at depth 1), not the sweep's own delete
-- (lock_reap_batch sets lease_sweeper.reaping while it deletes).
CREATE OR REPLACE TRIGGER lock_entry_late_release
    AFTER DELETE ON lock_entry
    FOR EACH ROW
    WHEN (OLD.expires_at <= pg_catalog.now()
          AND pg_catalog.pg_trigger_depth() = 0
          AND pg_catalog.current_setting('lease_sweeper.reaping', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION lock_entry_record_release();
