-- fn_job_claim as migrations/20261129000200_job_queue.sql wrote it, before
-- lease durations per kind and per job: every job leases for
-- queue.lease.duration_sec. Installed as bench_job_claim_before so the claim
-- step can time the old body and the new one on the same data in one run.
CREATE FUNCTION bench_job_claim_before(p_worker text, p_job_kinds text[] DEFAULT NULL, p_limit integer DEFAULT 1)
RETURNS SETOF job_queue
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_duration integer;
BEGIN
    IF p_worker IS NULL OR btrim(p_worker) = '' THEN
        RAISE EXCEPTION 'fn_job_claim: worker is required' USING ERRCODE = '22023';
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'fn_job_claim: limit must be from 1 to 10000, got %', p_limit USING ERRCODE = '22023';
    END IF;
    IF coalesce((SELECT value FROM queue_setting WHERE key = 'queue.job_substrate.enabled'), 'false') <> 'true' THEN
        RAISE EXCEPTION 'fn_job_claim: refused: queue.job_substrate.enabled=false' USING ERRCODE = '55000';
    END IF;
    v_duration := coalesce((SELECT value::integer FROM queue_setting WHERE key = 'queue.lease.duration_sec'), 300);
    RETURN QUERY
    WITH picked AS (
        SELECT job_id
          FROM job_queue
         WHERE state IN ('queued', 'retry_waiting')
           AND scheduled_at <= now()
           AND (p_job_kinds IS NULL OR job_kind = ANY (p_job_kinds))
         ORDER BY scheduled_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    )
    UPDATE job_queue AS j
       SET state = 'leased',
           lease_owner = p_worker,
           lease_until = now() + v_duration::float8 * interval '1 second',
           updated_at = now()
      FROM picked
     WHERE j.job_id = picked.job_id
    RETURNING j.*;
END
$$;
