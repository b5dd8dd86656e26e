//! Helpers that more than one job-queue suite uses (the modules beside it,
//! `lease_duration`, and the dry run for any suite that reads it), one copy each. The gates and settings helpers
//! every suite shares live in `support`.

use std::collections::HashMap;

use serde_json::{Value, json};
use sqlx::PgConnection;

/// Every job row, byte for byte, with the row version that holds it.
pub async fn job_snapshot(conn: &mut PgConnection) -> String {
    sqlx::query_scalar(
        "SELECT coalesce(string_agg(j::text || ' xmin=' || j.xmin::text, E'\\n' ORDER BY j.job_id), '')
           FROM job_queue AS j",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

/// `fn_job_reap_stale_leases_dry_run(limit)`'s JSON (NULL: the function's
/// own refusal of a missing limit).
pub async fn dry_run(conn: &mut PgConnection, limit: Option<i32>) -> Value {
    let text: String = sqlx::query_scalar("SELECT fn_job_reap_stale_leases_dry_run($1)::text")
        .bind(limit)
        .fetch_one(conn)
        .await
        .expect("dry run runs");
    serde_json::from_str(&text).unwrap()
}

/// The JSON every gate and limit refusal returns.
pub fn refusal(reason: &str) -> Value {
    json!({"reason": reason, "refused": true})
}

/// A job's state, attempts, last error and lease owner.
pub async fn job_row(
    conn: &mut PgConnection,
    id: &str,
) -> (String, i32, Option<String>, Option<String>) {
    sqlx::query_as(
        "SELECT state, attempts, last_error, lease_owner FROM job_queue WHERE job_id = $1::uuid",
    )
    .bind(id)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// A JSON object's keys, sorted.
pub fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort_unstable();
    k
}

/// `fn_job_kind_lease_set(kind, seconds, actor)`'s JSON; panics on a refusal.
pub async fn set_kind(
    conn: &mut PgConnection,
    kind: &str,
    seconds: Option<i32>,
    actor: &str,
) -> Value {
    let text: String = sqlx::query_scalar("SELECT fn_job_kind_lease_set($1, $2, $3)::text")
        .bind(kind)
        .bind(seconds)
        .bind(actor)
        .fetch_one(conn)
        .await
        .unwrap_or_else(|e| panic!("setting {kind}={seconds:?}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// Enqueues one job of `kind` with `metadata`; returns its id.
pub async fn enqueue(conn: &mut PgConnection, kind: &str, metadata: Value) -> String {
    sqlx::query_scalar("SELECT fn_job_enqueue($1, p_metadata => $2::text::jsonb)::text")
        .bind(kind)
        .bind(metadata.to_string())
        .fetch_one(conn)
        .await
        .unwrap_or_else(|e| panic!("enqueueing {kind} with {metadata}: {e}"))
}

/// One claim of up to 100 jobs as `worker`: job id → (seconds from now() to
/// lease_until, recorded duration, recorded source). now() is the claim's
/// own, so the seconds are exact.
pub async fn claim(conn: &mut PgConnection, worker: &str) -> HashMap<String, (f64, i32, String)> {
    sqlx::query_as::<_, (String, f64, i32, String)>(
        "SELECT job_id::text, extract(epoch FROM lease_until - now())::float8,
                lease_duration_sec, lease_duration_source
           FROM fn_job_claim($1, NULL, 100)",
    )
    .bind(worker)
    .fetch_all(conn)
    .await
    .expect("claim runs")
    .into_iter()
    .map(|(id, secs, given, source)| (id, (secs, given, source)))
    .collect()
}

/// What a claim records for a job given `secs` from `source`: the seconds
/// to lease_until, the duration and its source.
pub fn given(secs: i32, source: &str) -> (f64, i32, String) {
    (f64::from(secs), secs, source.to_owned())
}

/// job_kind_lease and its audit, byte for byte.
pub async fn kind_snapshot(conn: &mut PgConnection) -> String {
    sqlx::query_scalar(
        "SELECT coalesce((SELECT string_agg(k::text, ',' ORDER BY k.job_kind) FROM job_kind_lease AS k), '')
             || '|' || (SELECT count(*) FROM job_kind_lease_audit)::text",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}
