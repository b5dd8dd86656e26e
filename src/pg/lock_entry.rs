//! Statements on `lock_entry` and `lock_expiry_outbox`, and the rows they
//! return.
//!
//! Owns the statement texts (literals calling the SECURITY DEFINER functions
//! in `migrations/`) and decoding their rows into `ExpiredLease`. It owns no
//! transactions, retries or logging: `lock_store` runs these inside the
//! batch transaction.

use sqlx::PgConnection;

use crate::model::{ExpiredLease, ReapedBy};

/// Deletes up to `$1` expired leases, oldest deadline first, and returns them.
///
/// The statement is the SECURITY DEFINER function `lock_reap_expired` in
/// `migrations/` (so the sweeper's role needs no DELETE privilege and can
/// never delete a live lease); its comment there explains the shape: the
/// database clock decides, `FOR UPDATE SKIP LOCKED` splits work between
/// replicas, and rows are deleted by tuple id.
///
/// `$2` resumes the index scan at the deadline (epoch milliseconds) of the
/// newest lease the previous batch of the same sweep reaped, instead of
/// stepping again over the dead index entries the earlier batches left
/// (quadratic in the backlog, see docs/performance.md); NULL starts from the
/// oldest (pre-1970 and -infinity deadlines included), as the first batch of
/// every sweep does.
///
/// A row with `set_aside_error` was NOT deleted: it failed inside the
/// function and was set aside so the rest of the batch could be reaped
/// (contract in migrations/20261130000100_lock_rows_never_block.sql).
pub const REAP_EXPIRED: &str = "
SELECT lock_key, owner_id, token, expired_at_millis, overdue_millis, set_aside_error
  FROM lock_reap_expired($1, $2)";

/// Drains up to `$1` recorded takeovers, oldest first; overdue is measured at
/// the moment of the steal (`lock_drain_takeovers` in `migrations/`).
pub const DRAIN_TAKEOVERS: &str = "
SELECT lock_key, owner_id, token, expired_at_millis, overdue_millis, set_aside_error
  FROM lock_drain_takeovers($1)";

/// Leases currently held, expired-but-unswept ones included.
pub const COUNT_HELD: &str = "SELECT pg_catalog.count(*) FROM lock_entry";

type LeaseRow = (
    String,
    String,
    i64,
    Option<i64>,
    Option<i64>,
    Option<String>,
);

/// A lease the function could not reap: left in place (or in the outbox),
/// reported so the daemon writes one ERROR line naming it and the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAsideLease {
    pub lock_key: String,
    pub owner_id: String,
    pub token: i64,
    pub reaped_by: ReapedBy,
    /// The database's error, with its SQLSTATE.
    pub cause: String,
}

/// What one batch returned: the leases reaped and those set aside.
#[derive(Debug, Default)]
pub struct LeaseBatch {
    pub reaped: Vec<ExpiredLease>,
    pub set_aside: Vec<SetAsideLease>,
}

fn split(rows: Vec<LeaseRow>, reaped_by: ReapedBy) -> LeaseBatch {
    let mut batch = LeaseBatch::default();
    for (lock_key, owner_id, token, expired_at_millis, overdue_millis, error) in rows {
        match (error, expired_at_millis, overdue_millis) {
            (None, Some(expired_at_millis), Some(overdue_millis)) => {
                batch.reaped.push(ExpiredLease {
                    lock_key,
                    owner_id,
                    token,
                    expired_at_millis,
                    overdue_millis,
                    reaped_by,
                })
            }
            (error, _, _) => batch.set_aside.push(SetAsideLease {
                lock_key,
                owner_id,
                token,
                reaped_by,
                cause: error.unwrap_or_else(|| "reaped without a deadline".to_owned()),
            }),
        }
    }
    batch
}

pub async fn reap_expired(
    conn: &mut PgConnection,
    limit: i32,
    after_millis: Option<i64>,
) -> Result<LeaseBatch, sqlx::Error> {
    let rows: Vec<LeaseRow> = sqlx::query_as(REAP_EXPIRED)
        .persistent(false)
        .bind(limit)
        .bind(after_millis)
        .fetch_all(conn)
        .await?;
    Ok(split(rows, ReapedBy::Sweep))
}

pub async fn drain_takeovers(
    conn: &mut PgConnection,
    limit: i32,
) -> Result<LeaseBatch, sqlx::Error> {
    let rows: Vec<LeaseRow> = sqlx::query_as(DRAIN_TAKEOVERS)
        .persistent(false)
        .bind(limit)
        .fetch_all(conn)
        .await?;
    Ok(split(rows, ReapedBy::Takeover))
}

pub async fn count_held(conn: &mut PgConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(COUNT_HELD)
        .persistent(false)
        .fetch_one(conn)
        .await
}
