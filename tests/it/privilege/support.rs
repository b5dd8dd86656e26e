//! Helpers the least-privilege suites share (`role`,
//! `definer_hijack`): how a LOGIN role is granted the shipped
//! role, a live job, a job's state, and a refusal for want of privilege.
//! The roles and database helpers every suite shares live in `support`.

use sqlx::PgConnection;

/// How docs/least-privilege.md tells an operator to create the daemon's
/// LOGIN role: granted the migration-created `lease_sweeper`.
pub const GRANTED: &str = "IN ROLE lease_sweeper";

/// A job leased to a live worker for another hour.
pub async fn insert_live_job(conn: &mut PgConnection) -> String {
    sqlx::query_scalar(
        "INSERT INTO job_queue (job_kind, payload, state, attempts, max_attempts, lease_owner, lease_until)
         VALUES ('live', '{}'::jsonb, 'leased', 0, 5, 'busy-worker', now() + interval '1 hour')
         RETURNING job_id::text",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

pub async fn job_state(conn: &mut PgConnection, id: &str) -> String {
    sqlx::query_scalar("SELECT state FROM job_queue WHERE job_id = $1::uuid")
        .bind(id)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Asserts that `sql`, run as the restricted role, is refused with SQLSTATE
/// 42501 (insufficient_privilege).
pub async fn assert_denied(conn: &mut PgConnection, sql: &'static str) {
    let err = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await
        .expect_err(&format!("must be denied: {sql}"));
    let code = err.as_database_error().and_then(|e| e.code());
    assert_eq!(code.as_deref(), Some("42501"), "{sql}: {err}");
}
