//! Statements on the job queue and its gates: calls of the SQL functions in
//! `migrations/20261129000200_job_queue.sql`, each returning that function's
//! JSON as text.
//!
//! JSON travels as text (`::text`) so the crate needs no sqlx JSON feature and
//! the CLI can print exactly what the database said. Callers own the
//! transactions and decode the JSON (`crate::jobs` has the shapes).

use sqlx::PgConnection;

/// Why an apply would be refused by the gates right now (`{"reason", "refused"}`),
/// or NULL when all three allow it. Reads three rows of `queue_setting`.
pub const GATE_REFUSAL: &str = "SELECT fn_job_reaper_gate_refusal()::text";

/// The read-only dry run: `$1` = limit (1..10000).
pub const DRY_RUN: &str = "SELECT fn_job_reap_stale_leases_dry_run($1)::text";

/// The reaping apply: `$1` = actor, `$2` = limit (1..10000). Mutates only when
/// the gates allow; otherwise returns a refusal and changes nothing.
pub const APPLY: &str = "SELECT fn_job_reap_stale_leases_apply($1, $2)::text";

/// Every queue setting with who changed it last, plus what the gates say now.
///
/// Built-ins are `pg_catalog.`-qualified: `gates` is often run by a
/// superuser, and an unqualified `jsonb_agg` or `jsonb_build_object` resolves
/// to a better-matching overload any role with CREATE on `public` may plant
/// (tests/it/holes.rs).
pub const SHOW_GATES: &str = "
SELECT pg_catalog.jsonb_build_object(
           'settings', coalesce((SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                                            'key', key,
                                            'value', value,
                                            'updated_at', updated_at,
                                            'updated_by', updated_by) ORDER BY key)
                                   FROM queue_setting), '[]'::pg_catalog.jsonb),
           'apply_allowed', fn_job_reaper_gate_refusal() IS NULL,
           'apply_refusal', fn_job_reaper_gate_refusal())::text";

/// The audited setter: `$1` = key, `$2` = value, `$3` = actor. Rejects an
/// unknown key, an ill-typed value or an empty actor with SQLSTATE 22023.
pub const SET_GATE: &str = "SELECT fn_queue_setting_set($1, $2, $3)::text";

/// SQLSTATE `invalid_parameter_value`: how the setter says "rejected".
pub const REJECTED_SQLSTATE: &str = "22023";

pub async fn gate_refusal(conn: &mut PgConnection) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(GATE_REFUSAL).fetch_one(conn).await
}

pub async fn dry_run(conn: &mut PgConnection, limit: i32) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(DRY_RUN)
        .bind(limit)
        .fetch_one(conn)
        .await
}

pub async fn apply(
    conn: &mut PgConnection,
    actor: &str,
    limit: i32,
) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(APPLY)
        .bind(actor)
        .bind(limit)
        .fetch_one(conn)
        .await
}

pub async fn show_gates(conn: &mut PgConnection) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(SHOW_GATES).fetch_one(conn).await
}

pub async fn set_gate(
    conn: &mut PgConnection,
    key: &str,
    value: &str,
    actor: &str,
) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(SET_GATE)
        .bind(key)
        .bind(value)
        .bind(actor)
        .fetch_one(conn)
        .await
}
