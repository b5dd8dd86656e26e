-- What each function a lock server, a worker or an operator calls does, in
-- the database itself: `\df+ lock_acquire` (psql) or
-- obj_description('lock_acquire(text,text,bigint,uuid)'::regprocedure)
-- shows the contract without the repository at hand. docs/sql-api.md says
-- the same at length.
--
-- Comments only: no function, privilege or row changes. Functions are named
-- by their full signatures, unqualified, so the comments land on the
-- functions of the schema the earlier migrations installed into (the
-- migrating role's search_path, as for them). A later migration that
-- replaces one of these functions with CREATE OR REPLACE keeps its comment;
-- one that drops and recreates it must comment it again.

-- ---- Lock leases: the lock server's calls ----------------------------------------

COMMENT ON FUNCTION lock_acquire(text, text, bigint, uuid) IS
'Takes the lease on p_lock_key for p_owner_id until now() + p_ttl_millis (database clock), optionally tied to lock_session p_session_id (its leases go with the session, unreported). Returns the new fencing token, strictly greater than every token issued before, or NULL while another live lease holds the key (even one of the same owner). An expired lease still in lock_entry is taken over: its row gets the new owner and token, and the old lease is recorded in lock_expiry_outbox in the same statement, so the sweeper reports it as lease_expired reapedBy=takeover. Errors 22023: NULL or empty key, NULL owner, ttl NULL, <= 0 or over 31536000000 ms (one year); 23503: an unknown session. SECURITY INVOKER: needs SELECT, INSERT, UPDATE on lock_entry and USAGE on lock_fencing_token_seq.';

COMMENT ON FUNCTION lock_renew(text, bigint, bigint) IS
'Moves the deadline of the live lease on p_lock_key held with p_token to now() + p_ttl_millis. Returns true when renewed; false when there is no such live lease (released, taken over, a different token, or already expired: an expired lease cannot be renewed, its holder has lost it and the sweeper reports the expiry); false for a NULL key or token. Errors 22023: ttl NULL, <= 0 or over 31536000000 ms. SECURITY INVOKER: needs SELECT, UPDATE on lock_entry.';

COMMENT ON FUNCTION lock_release(text, bigint) IS
'Deletes the live lease on p_lock_key held with p_token. Returns true when deleted; false when there is no such live lease (a different token, already released or taken over), and false, leaving the row, after the deadline has passed: the overrun is then reported by the sweeper as lease_expired, never silently erased. NULL arguments: false. SECURITY INVOKER: needs SELECT, DELETE on lock_entry.';

-- ---- Lock leases: the sweeper's calls ---------------------------------------------

COMMENT ON FUNCTION lock_reap_expired(integer, bigint) IS
'The sweep: deletes up to p_limit (1-100000, else 22023) leases whose deadline has passed (database clock, checked again on the delete), oldest first, skipping rows another session holds (FOR UPDATE SKIP LOCKED), and returns each with its deadline and lateness in ms. p_after_millis resumes a drain after the newest deadline of the previous batch; NULL starts from the oldest. A row whose delete fails is left in place and returned with set_aside_error. The caller must report every row before committing. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

COMMENT ON FUNCTION lock_drain_takeovers(integer) IS
'Deletes and returns up to p_limit (1-100000, else 22023) recorded takeovers from lock_expiry_outbox, oldest first, lateness measured at the takeover; the sweeper reports each as lease_expired reapedBy=takeover before committing. SECURITY DEFINER; EXECUTE: lease_sweeper only.';

-- ---- The job queue: workers' calls ------------------------------------------------

COMMENT ON FUNCTION fn_job_enqueue(text, jsonb, integer, jsonb) IS
'Queues a job of kind p_job_kind, claimable at once; returns its job_id. p_max_attempts 1-1000; p_metadata.lease_override_sec (whole seconds 1-86400) gives this job its own lease duration. Errors 22023: empty kind, attempts out of range; 23514: a bad lease_override_sec. Allowed while queue.job_substrate.enabled is false.';

COMMENT ON FUNCTION fn_job_claim(text, text[], integer) IS
'Leases up to p_limit (1-10000) claimable jobs (queued or retry_waiting, due), of the kinds p_job_kinds (NULL: any), oldest first, to p_worker, each for its own duration (metadata.lease_override_sec, else its kind''s in job_kind_lease, else queue.lease.duration_sec), and returns the leased rows; rows another claimer holds are skipped. Error 55000 while queue.job_substrate.enabled is not true.';

COMMENT ON FUNCTION fn_job_heartbeat(uuid, text) IS
'Extends the live lease p_worker holds on p_job_id by the job''s own duration (computed as a claim computes it) and returns the new lease_until; NULL when the worker holds no live lease on it (expired, reaped, completed or someone else''s): the worker has lost the job and must stop.';

COMMENT ON FUNCTION fn_job_complete(uuid, text) IS
'Marks the job succeeded when p_worker holds its lease, even one past its deadline as long as no reaper has acted; false otherwise (reaped, re-leased, completed, unknown).';

-- ---- The job queue: operators' calls ----------------------------------------------

COMMENT ON FUNCTION fn_queue_setting_set(text, text, text) IS
'The audited setter of queue_setting (the gates, queue.retry.backoff_base_sec, queue.lease.duration_sec): validates p_key and p_value, records old and new value, p_actor and the session role in queue_setting_audit, and returns the change as JSON. Errors 22023: empty actor, unknown key, a boolean not true/false, seconds not a whole number 1-86400. SECURITY DEFINER; EXECUTE not granted to PUBLIC (grant it to operators). lease-sweeper gates set calls it.';

COMMENT ON FUNCTION fn_job_kind_lease_set(text, integer, text) IS
'The audited setter of job_kind_lease: gives kind p_job_kind (matched exactly) a lease of p_lease_sec seconds (1-86400), or with NULL returns it to queue.lease.duration_sec; records the change in job_kind_lease_audit and returns it as JSON. Errors 22023: empty actor or kind, seconds out of range. SECURITY DEFINER; EXECUTE not granted to PUBLIC nor to lease_sweeper. lease-sweeper leases set / clear call it.';

COMMENT ON FUNCTION fn_job_reap_stale_leases_dry_run(integer) IS
'What the reaper would do now, changing nothing whatever the gates say: stale_lease_count (every job with state leased and lease_until < now()) and, for the p_limit oldest (1-10000, else the limit_out_of_range refusal), each job''s would_action (reset_to_retry_waiting or move_to_dead_letter) and the lease it was given. STABLE, SECURITY INVOKER (needs SELECT on job_queue''s reaper columns). lease-sweeper jobs dry-run calls it.';

COMMENT ON FUNCTION fn_job_reap_stale_leases_apply(text, integer) IS
'Reaps up to p_limit stale job leases, oldest first: back to retry_waiting with exponential backoff, or to job_dead_letter at the last attempt; a job completed or re-leased meanwhile is never touched. Refused, changing nothing, as {"reason": ..., "refused": true}, in this order: actor_required, limit_out_of_range, queue.job_substrate.enabled=false, queue.lease.reaper_enabled=false, queue.lease.reaper_dry_run_only=true. SECURITY DEFINER; EXECUTE not granted to PUBLIC. lease-sweeper jobs apply and the daemon call it.';

COMMENT ON FUNCTION fn_job_reaper_gate_refusal() IS
'NULL when the three gates allow an apply, else the refusal an apply would return now ({"reason": ..., "refused": true}). STABLE, SECURITY INVOKER (needs SELECT on queue_setting).';

COMMENT ON FUNCTION fn_job_stale_lease_count() IS
'The number of stale job leases (state leased, lease_until < now()): the dry run''s stale_lease_count, and the queue.lease.stale.current gauge. STABLE, SECURITY INVOKER.';

COMMENT ON FUNCTION fn_job_move_to_dead_letter(uuid, text, text) IS
'Moves a queued, leased or retry_waiting job to job_dead_letter as it stands, with p_final_error and p_actor, and returns the dead_letter object; refusals as JSON: actor_required, job_not_found, job_not_movable (already succeeded or dead-lettered).';

COMMENT ON FUNCTION fn_job_default_lease_sec() IS
'queue.lease.duration_sec as claims and heartbeats read it: the lease of a job with no override whose kind has no duration of its own (300 when the row is missing).';
