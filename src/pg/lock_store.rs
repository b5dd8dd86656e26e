//! The PostgreSQL lock backend (`backend=pg`): a sweep's calls over
//! `lock_entry`'s statements, on one connection. Owns each batch's two
//! transactions (delete and hand off, commit; then claim the hand-off,
//! write its lines, commit) and the `lease_set_aside` line only it sees.
//! Not the statements (`lock_entry`) nor when to sweep and what else to log
//! (`sweep::lock_sweeper`).

use crate::config::DbTarget;
use crate::model::ExpiredLease;
use crate::pg::conn::{self, BatchFailure, Db};
use crate::pg::lock_entry::{self as locks, HELD_COUNT_MAX_AGE};
use crate::store::{LockStore, Probe, StoreError, Work};

type Report<'a> = crate::store::Report<'a, ExpiredLease>;

/// The lock sweep's store: its one connection, which nothing else uses, so
/// a job backlog or a catalog read never delays a lease's line.
pub struct PgLockStore {
    db: Db,
    /// Where the next batch of this pass starts: the newest deadline the
    /// last batch took, so a drain walks the backlog in deadline order
    /// without reading what it took again. Reset by each pass's probe.
    after: Option<i64>,
}

impl PgLockStore {
    pub fn new(target: DbTarget) -> Self {
        Self {
            db: Db::new(target, Work::LockLeases),
            after: None,
        }
    }
}

/// What one batch took: how many leases, and the newest deadline among
/// them (epoch ms), where the next batch starts.
struct Taken {
    n: usize,
    newest_millis: Option<i64>,
}

/// Where the next batch of a drain starts: at the newest deadline the last
/// one reaped, or where it was when that batch reaped nothing.
fn resume_at(after: Option<i64>, newest_millis: Option<i64>) -> Option<i64> {
    newest_millis.or(after)
}

/// Delete and hand off, commit; then claim the hand-off, write the lines,
/// commit. The deleted leases' row locks, which an acquire of their key
/// waits on, end with the first commit; the lines are written under the
/// claim, so the hand-off is gone only once they are out. A claim that
/// finds nothing means another sweeper recovered the batch (this one was
/// slower than `signal_handoff_grace()`) and wrote its lines: none here.
async fn reap_in_tx(
    conn: &mut sqlx::PgConnection,
    limit: usize,
    after: Option<i64>,
    report: Report<'_>,
) -> Result<Taken, BatchFailure> {
    let mut tx = conn::begin(conn).await?;
    let batch = locks::reap_batch(&mut tx, limit, after)
        .await
        .map_err(|e| BatchFailure::Query("lock_reap_batch", e))?;
    log_set_aside(&batch.set_aside);
    conn::commit(tx).await?;
    let done = Taken {
        n: batch.leases.len(),
        newest_millis: batch.leases.iter().map(|l| l.expired_at_millis).max(),
    };
    if let Some(id) = batch.handoff_id {
        let claim = async |c: &mut sqlx::PgConnection| locks::handoff_claim(c, id).await;
        conn::claim_then_report(conn, "lock_handoff_claim", claim, &batch.leases, report).await?;
    }
    Ok(done)
}

/// Drains recorded takeovers and late releases, reports them, commits. A
/// record is an outbox row, which no lock-server call waits on: its lines
/// are written before the commit. The number reported.
async fn takeovers_in_tx(
    conn: &mut sqlx::PgConnection,
    limit: usize,
    report: Report<'_>,
) -> Result<usize, BatchFailure> {
    let mut tx = conn::begin(conn).await?;
    let drained = locks::drain_takeovers(&mut tx, limit)
        .await
        .map_err(|e| BatchFailure::Query("lock_drain_takeovers", e))?;
    log_set_aside(&drained.set_aside);
    conn::report_then_commit(tx, &drained.reaped, report).await?;
    Ok(drained.reaped.len())
}

/// Reports and deletes one hand-off another sweeper (or this one, before a
/// crash or a failed write) left behind; the number of leases, 0 when none
/// waits.
async fn recover_in_tx(
    conn: &mut sqlx::PgConnection,
    report: Report<'_>,
) -> Result<usize, BatchFailure> {
    let mut tx = conn::begin(conn).await?;
    let leases = locks::handoff_recover(&mut tx)
        .await
        .map_err(|e| BatchFailure::Query("lock_handoff_recover", e))?;
    conn::report_then_commit(tx, &leases, report).await?;
    Ok(leases.len())
}

/// One ERROR line per lease the database set aside (a row whose delete failed
/// inside the reaping function): it was not deleted, every other lease of
/// its batch was; the next sweep retries it.
fn log_set_aside(rows: &[locks::SetAsideLease]) {
    for row in rows {
        tracing::error!(
            lockKey = %row.lock_key,
            token = %row.token,
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

    /// One simple-protocol round trip (`conn::probe_row`).
    async fn probe(&mut self) -> Result<Probe, StoreError> {
        self.after = None;
        let conn = self.db.conn().await?;
        match locks::sweep_probe(conn).await {
            Ok(found) => Ok(Probe {
                expired: found.expired,
                recorded: found.takeovers,
                held: found.held,
                missed: 0,
            }),
            Err(e) => Err(self.db.query_failed("lock_sweep_probe", e)),
        }
    }

    async fn reap_batch(&mut self, limit: usize, report: Report<'_>) -> Result<usize, StoreError> {
        let after = self.after;
        let taken = self
            .db
            .batch(async |c| reap_in_tx(c, limit, after, report).await)
            .await?;
        self.after = resume_at(after, taken.newest_millis);
        Ok(taken.n)
    }

    async fn drain_recorded(
        &mut self,
        limit: usize,
        report: Report<'_>,
    ) -> Result<usize, StoreError> {
        // Abandoned hand-offs first: their leases expired before any
        // takeover still recorded.
        loop {
            let recovered = self
                .db
                .batch(async |c| recover_in_tx(c, report).await)
                .await?;
            if recovered == 0 {
                break;
            }
        }
        self.db
            .batch(async |c| takeovers_in_tx(c, limit, report).await)
            .await
    }

    async fn held_count(&mut self) -> Result<i64, StoreError> {
        let max_age = HELD_COUNT_MAX_AGE.as_millis() as i64;
        let conn = self.db.conn().await?;
        match conn::in_tx(conn, async |c| locks::held_count(c, max_age).await).await {
            Ok(count) => Ok(count.held),
            Err(e) => Err(self.db.query_failed("lock_held_count_get", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_resumes_at_the_newest_deadline_or_stays_put() {
        assert_eq!(resume_at(None, Some(5)), Some(5));
        assert_eq!(resume_at(Some(5), Some(9)), Some(9));
        assert_eq!(
            resume_at(Some(5), None),
            Some(5),
            "an empty batch moves nothing"
        );
        assert_eq!(resume_at(None, None), None);
    }
}
