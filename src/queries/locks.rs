//! Statements on `lock_entry` and `lock_expiry_outbox`.

use sqlx::PgConnection;

use crate::store::{ExpiredLease, ReapedBy};

/// Deletes up to `$1` expired leases, oldest deadline first, and returns them.
///
/// * The database clock decides: `expires_at <= now()`, and the overdue time
///   is computed here, so a sidecar with a wrong clock can never delete a
///   live lease or misreport how late it was.
/// * `FOR UPDATE SKIP LOCKED` lets replicas split the work: a row another
///   sweeper (or an acquire stealing it) holds is skipped, never waited on
///   and never counted twice.
/// * `ctid = ANY(ARRAY(...))` instead of `lock_key IN (subquery)`: the `IN`
///   form was planned as a hash semi-join over a sequential scan of the whole
///   table for every batch (SPEC §6); the array form probes by tuple id.
/// * The deadline is checked again on the delete itself for belt and braces.
pub const REAP_EXPIRED: &str = "
WITH doomed AS (
    SELECT ctid
      FROM lock_entry
     WHERE expires_at <= now()
     ORDER BY expires_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
)
DELETE FROM lock_entry AS e
 WHERE e.ctid = ANY (ARRAY(SELECT ctid FROM doomed))
   AND e.expires_at <= now()
RETURNING e.lock_key,
          e.owner_id,
          e.token,
          floor(extract(epoch FROM e.expires_at) * 1000)::bigint AS expired_at_millis,
          floor(extract(epoch FROM now() - e.expires_at) * 1000)::bigint AS overdue_millis";

/// Drains up to `$1` recorded takeovers, oldest first; overdue is measured at
/// the moment of the steal.
pub const DRAIN_TAKEOVERS: &str = "
DELETE FROM lock_expiry_outbox AS o
 WHERE o.outbox_id = ANY (ARRAY(
        SELECT outbox_id
          FROM lock_expiry_outbox
         ORDER BY outbox_id
         LIMIT $1
           FOR UPDATE SKIP LOCKED))
RETURNING o.lock_key,
          o.owner_id,
          o.token,
          floor(extract(epoch FROM o.expires_at) * 1000)::bigint AS expired_at_millis,
          floor(extract(epoch FROM o.taken_over_at - o.expires_at) * 1000)::bigint AS overdue_millis";

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
    limit: i64,
) -> Result<Vec<ExpiredLease>, sqlx::Error> {
    let rows: Vec<LeaseRow> = sqlx::query_as(REAP_EXPIRED)
        .bind(limit)
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| lease(r, ReapedBy::Sweep))
        .collect())
}

pub async fn drain_takeovers(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<ExpiredLease>, sqlx::Error> {
    let rows: Vec<LeaseRow> = sqlx::query_as(DRAIN_TAKEOVERS)
        .bind(limit)
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| lease(r, ReapedBy::Takeover))
        .collect())
}

pub async fn count_held(conn: &mut PgConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(COUNT_HELD).fetch_one(conn).await
}
