//! Helpers of the job-queue suites (`jobs_sql`, `jobs_daemon`, `jobs_cli`,
//! and the dry run for any suite that reads it) that more than one uses. The gates and settings helpers every
//! suite shares live in `support`.

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
