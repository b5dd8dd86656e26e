//! Helpers of the job-queue suites (`jobs_sql`, `jobs_daemon`, `jobs_cli`)
//! that more than one of them uses. The gates and settings helpers every
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

/// The JSON every gate and limit refusal returns.
pub fn refusal(reason: &str) -> Value {
    json!({"reason": reason, "refused": true})
}
