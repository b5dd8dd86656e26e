//! The job queue's operator gates and the apply call, as tests drive them.

use sqlx::PgConnection;

/// The three job-reaper gates.
pub const SUBSTRATE: &str = "queue.job_substrate.enabled";
pub const REAPER: &str = "queue.lease.reaper_enabled";
pub const DRY_ONLY: &str = "queue.lease.reaper_dry_run_only";

/// Changes one queue setting through the audited setter, as an operator
/// would (actor `test-operator`); returns the setter's JSON.
pub async fn set_setting(conn: &mut PgConnection, key: &str, value: &str) -> serde_json::Value {
    let text: String =
        sqlx::query_scalar("SELECT fn_queue_setting_set($1, $2, 'test-operator')::text")
            .bind(key)
            .bind(value)
            .fetch_one(conn)
            .await
            .unwrap_or_else(|e| panic!("setting {key}={value}: {e}"));
    serde_json::from_str(&text).expect("the setter returns JSON")
}

/// Puts the three job-reaper gates in these positions, in gate order.
pub async fn set_gates(conn: &mut PgConnection, substrate: bool, reaper: bool, dry_only: bool) {
    for (key, on) in [
        (SUBSTRATE, substrate),
        (REAPER, reaper),
        (DRY_ONLY, dry_only),
    ] {
        set_setting(conn, key, if on { "true" } else { "false" }).await;
    }
}

/// All three gates in the "reap" position.
pub async fn open_gates(conn: &mut PgConnection) {
    set_gates(conn, true, true, false).await;
}

/// Runs the job reaper's apply as `conn`'s role; returns its JSON (the
/// report, or the refusal).
pub async fn apply_stale_leases(
    conn: &mut PgConnection,
    actor: &str,
    limit: Option<i32>,
) -> serde_json::Value {
    let text: String = sqlx::query_scalar("SELECT fn_job_reap_stale_leases_apply($1, $2)::text")
        .bind(actor)
        .bind(limit)
        .fetch_one(conn)
        .await
        .expect("apply runs");
    serde_json::from_str(&text).expect("apply returns JSON")
}
