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
/// (quadratic in the backlog, see docs/performance.md); 0 starts from the
/// oldest, as the first batch of every sweep does.
pub const REAP_EXPIRED: &str = "
SELECT lock_key, owner_id, token, expired_at_millis, overdue_millis
  FROM lock_reap_expired($1, $2)";

/// Drains up to `$1` recorded takeovers, oldest first; overdue is measured at
/// the moment of the steal (`lock_drain_takeovers` in `migrations/`).
pub const DRAIN_TAKEOVERS: &str = "
SELECT lock_key, owner_id, token, expired_at_millis, overdue_millis
  FROM lock_drain_takeovers($1)";

/// Leases currently held, expired-but-unswept ones included.
pub const COUNT_HELD: &str = "SELECT count(*) FROM lock_entry";

type LeaseRow = (String, String, i64, i64, i64);

fn lease(row: LeaseRow, reaped_by: ReapedBy) -> ExpiredLease {
    let (lock_key, owner_id, token, expired_at_millis, overdue_millis) = row;
    ExpiredLease {
        lock_key,
        owner_id,
        token,
        expired_at_millis,
        overdue_millis,
        reaped_by,
    }
}

pub async fn reap_expired(
    conn: &mut PgConnection,
    limit: i32,
    after_millis: i64,
) -> Result<Vec<ExpiredLease>, sqlx::Error> {
    let rows: Vec<LeaseRow> = sqlx::query_as(REAP_EXPIRED)
        .persistent(false)
        .bind(limit)
        .bind(after_millis)
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| lease(r, ReapedBy::Sweep))
        .collect())
}

pub async fn drain_takeovers(
    conn: &mut PgConnection,
    limit: i32,
) -> Result<Vec<ExpiredLease>, sqlx::Error> {
    let rows: Vec<LeaseRow> = sqlx::query_as(DRAIN_TAKEOVERS)
        .persistent(false)
        .bind(limit)
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| lease(r, ReapedBy::Takeover))
        .collect())
}

pub async fn count_held(conn: &mut PgConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(COUNT_HELD)
        .persistent(false)
        .fetch_one(conn)
        .await
}
