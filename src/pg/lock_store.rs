//! The PostgreSQL lock backend (`backend=pg`).
//!
//! Owns the transaction around each batch, which is where "at least once,
//! never lost" is made: delete with RETURNING, report the rows (the caller
//! writes and flushes their lines), and only then commit. A failed report or
//! a dropped connection rolls the batch back, so the rows stay for the next
//! sweep. The statements themselves are in `lock_entry`; when to sweep and
//! what to log are the lock sweeper's (`sweep::lock_sweeper`), except one
//! ERROR line per lease the database set aside (`lease_set_aside`), which
//! only this layer sees: it never reaches the sweeper as a reaped lease.

use crate::config::DbTarget;
use crate::model::ExpiredLease;
use crate::pg::conn::{self, BatchFailure, Db};
use crate::pg::lock_entry as locks;
use crate::store::{LockStore, StoreError, Work};

type Report<'a> = crate::store::Report<'a, ExpiredLease>;

pub struct PgLockStore {
    db: Db,
    /// Where the next expired-lease batch resumes (epoch milliseconds): the
    /// newest deadline of the previous batch while a sweep is draining full
    /// batches, None (from the oldest, pre-1970 and -infinity included) at
    /// the start of each sweep.
    resume_after_millis: Option<i64>,
}

/// Which of the two deleting statements a batch runs.
#[derive(Clone, Copy)]
enum Reap {
    Expired,
    Takeovers,
}

impl PgLockStore {
    pub fn new(target: DbTarget) -> Self {
        Self {
            db: Db::new(target, Work::LockLeases),
            resume_after_millis: None,
        }
    }

    async fn batch(
        &mut self,
        kind: Reap,
        limit: usize,
        report: Report<'_>,
    ) -> Result<usize, StoreError> {
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        let conn = self.db.conn().await?;
        let after = self.resume_after_millis;
        // Until this batch comes back full, the next one starts from the oldest.
        self.resume_after_millis = None;
        match batch_in_tx(conn, kind, limit, after, report).await {
            Ok((n, newest)) => {
                // A batch with a row set aside is short (n counts reaped
                // rows only), so the sweep stops and the next one retries
                // the row once: no loop over a row that keeps failing.
                if matches!(kind, Reap::Expired) && i32::try_from(n).is_ok_and(|n| n >= limit) {
                    self.resume_after_millis = newest;
                }
                Ok(n)
            }
            Err(failure) => Err(self.db.batch_failed(failure)),
        }
    }
}

/// Delete (or drain), report, commit; returns how many and the newest
/// deadline among them.
async fn batch_in_tx(
    conn: &mut sqlx::PgConnection,
    kind: Reap,
    limit: i32,
    after_millis: Option<i64>,
    report: Report<'_>,
) -> Result<(usize, Option<i64>), BatchFailure> {
    let mut tx = conn::begin(conn).await?;
    let batch = match kind {
        Reap::Expired => locks::reap_expired(&mut tx, limit, after_millis)
            .await
            .map_err(|e| BatchFailure::Query("lock_reap_expired", e))?,
        Reap::Takeovers => locks::drain_takeovers(&mut tx, limit)
            .await
            .map_err(|e| BatchFailure::Query("lock_drain_takeovers", e))?,
    };
    log_set_aside(&batch.set_aside);
    let leases = batch.reaped;
    conn::report_then_commit(tx, &leases, report).await?;
    let newest = leases.iter().map(|l| l.expired_at_millis).max();
    Ok((leases.len(), newest))
}

/// One ERROR line per lease the database set aside (issue 11): it was not
/// deleted, every other lease of its batch was; the next sweep retries it.
fn log_set_aside(rows: &[locks::SetAsideLease]) {
    for row in rows {
        tracing::error!(
            lockKey = %row.lock_key,
            token = row.token,
            ownerId = %row.owner_id,
            reapedBy = row.reaped_by.as_str(),
            cause = %row.cause,
            "lease_set_aside"
        );
    }
}

impl LockStore for PgLockStore {
    fn backend_id(&self) -> &'static str {
        "pg"
    }

    async fn reap_expired(
        &mut self,
        limit: usize,
        report: Report<'_>,
    ) -> Result<usize, StoreError> {
        self.batch(Reap::Expired, limit, report).await
    }

    async fn drain_takeovers(
        &mut self,
        limit: usize,
        report: Report<'_>,
    ) -> Result<usize, StoreError> {
        self.batch(Reap::Takeovers, limit, report).await
    }

    async fn held_count(&mut self) -> Result<i64, StoreError> {
        let conn = self.db.conn().await?;
        match conn::in_tx(conn, async |c| locks::count_held(c).await).await {
            Ok(n) => Ok(n),
            Err(e) => Err(self.db.query_failed("count(*) FROM lock_entry", e)),
        }
    }
}
