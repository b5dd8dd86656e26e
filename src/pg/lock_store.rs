//! The PostgreSQL lock backend (`backend=pg`): the lock sweep's statements
//! (literals calling the SECURITY DEFINER functions of `sql/functions/`),
//! the one row they return, and the transactions a batch runs them in, on
//! the sweep's own connection. Owns the `lease_set_aside` line only it sees.
//! Not connecting, the transaction guards or the order of lines and commit
//! (`conn`), nor when to sweep and what else to log (`sweep::lock_sweeper`).
//!
//! Every way a lease leaves has the same two steps. Its record is made
//! durable first: a sweep's batch commits its deletion with a hand-off row
//! (`lock_reap_batch`), and the lock server's own statements write a
//! takeover or late release to the outbox (`sql/lock_entry_hooks.sql`).
//! Then one transaction retires the record and writes the lines
//! (`conn::report_then_commit`): a claim of the sweep's own hand-off
//! (`lock_handoff_claim`), an abandoned hand-off recovered
//! (`lock_handoff_recover`), or the outbox drained (`lock_drain_takeovers`).

use std::time::Duration;

use sqlx::{FromRow, PgConnection};

use crate::config::DbTarget;
use crate::model::{ExpiredLease, ReapedBy};
use crate::pg::conn::{self, BatchFailure, Db};
use crate::store::{LockStore, Probe, Reporter, StoreError, Work};

/// `HELD_COUNT_MAX_AGE` in ms as a literal, so the probe's text
/// (`SWEEP_PROBE`) can carry it without building SQL at run time.
macro_rules! held_count_max_age_ms {
    () => {
        3000
    };
}

/// How old the shared held-lease count may be before a caller recounts it.
///
/// Sweeps need no recount: every batch records the leases it deleted
/// (`lock_held_delta`) and every reading subtracts them, so a sweep is in
/// the sweeping daemon's gauge in the same pass and in every other daemon's
/// at its next pass. What only a recount sees is the lock server's work:
/// acquisitions, releases, and sweeps of leases written after the count.
/// Those reach every daemon's `lock.held.current` within this age plus two
/// sweep periods (`SWEEP_DELAY` and a pass each; the second one when a daemon
/// reads while another is recounting and gets the previous count rather than
/// wait): 3 s + 2 x 1 s = 5 s on an idle fleet. The recount is a full scan,
/// done once per interval by one daemon of the whole fleet.
pub const HELD_COUNT_MAX_AGE: Duration = Duration::from_millis(held_count_max_age_ms!());

/// What a sweep asks first, in one statement (`lock_sweep_probe` in
/// `sql/functions/`): is any lease expired, is any expiry recorded, and the
/// shared held count (counted at most `HELD_COUNT_MAX_AGE` ago, less what
/// was swept since; NULL when something is expired: the sweep reads it
/// after deleting). Sent alone with the simple protocol (`conn::probe_row`):
/// one round trip, the argument a compile-time literal.
pub const SWEEP_PROBE: &str = concat!(
    "SELECT expired, takeovers, held FROM lock_sweep_probe(",
    held_count_max_age_ms!(),
    ")"
);

/// A row of `lock_drain_takeovers` or `lock_handoff_recover`, or one lease
/// of `lock_reap_batch`'s arrays (`BatchRow::taken`): one lease (reaped:
/// both millisecond fields set; set aside: `set_aside_error`), the columns
/// a statement does not return left at their default.
#[derive(Debug, FromRow)]
struct LeaseRow {
    lock_key: Option<String>,
    owner_id: Option<String>,
    token: Option<String>,
    expired_at_millis: Option<i64>,
    overdue_millis: Option<i64>,
    #[sqlx(default)]
    set_aside_error: Option<String>,
    /// `None`: swept.
    #[sqlx(default)]
    reaped_by: Option<String>,
    #[sqlx(default)]
    fallback_cause: Option<String>,
}

/// What one statement returned: the leases to report, those set aside, and,
/// for a sweep's batch, its hand-off and why it was taken row by row.
#[derive(Debug, Default)]
pub struct Taken {
    pub leases: Vec<ExpiredLease>,
    /// Rows of leases the function could not reap: left in place (or in
    /// the outbox), each logged once as `lease_set_aside`.
    set_aside: Vec<LeaseRow>,
    /// The hand-off row holding `leases` (a sweep's batch that reaped any).
    pub handoff_id: Option<i64>,
    /// The set-based statement's failure, when the batch fell back to its
    /// row-by-row pass.
    pub fallback: Option<String>,
}

/// The rows of one statement as leases: the one conversion. A row without
/// a key (none of the statements returns one) is skipped; a `reaped_by`
/// this build does not know is a decode error, not a lost lease.
fn leases(rows: Vec<LeaseRow>) -> Result<Taken, sqlx::Error> {
    let mut out = Taken::default();
    for mut row in rows {
        out.fallback = out.fallback.or(row.fallback_cause.take());
        if row.lock_key.is_none() {
            continue;
        }
        let reaped_by = match row.reaped_by.as_deref() {
            None => ReapedBy::Sweep,
            Some(text) => ReapedBy::parse(text)
                .ok_or_else(|| sqlx::Error::Decode(format!("unknown reaped_by {text:?}").into()))?,
        };
        match (
            row.set_aside_error.is_none(),
            row.expired_at_millis,
            row.overdue_millis,
        ) {
            (true, Some(expired_at_millis), Some(overdue_millis)) => {
                out.leases.push(ExpiredLease {
                    lock_key: row.lock_key.unwrap_or_default(),
                    owner_id: row.owner_id.unwrap_or_default(),
                    token: row.token.unwrap_or_default(),
                    expired_at_millis,
                    overdue_millis,
                    reaped_by,
                })
            }
            _ => out.set_aside.push(row),
        }
    }
    Ok(out)
}

async fn fetch_leases(
    conn: &mut PgConnection,
    query: sqlx::query::QueryAs<'_, sqlx::Postgres, LeaseRow, sqlx::postgres::PgArguments>,
) -> Result<Taken, sqlx::Error> {
    leases(query.persistent(false).fetch_all(conn).await?)
}

/// What `lock_reap_batch` returns: one row for the whole batch, the
/// hand-off's leases as the hand-off keeps them, in parallel arrays, and
/// the leases set aside likewise. One row of arrays rather than a row per
/// lease because the server sends and the daemon decodes one value per
/// column instead of one per lease (docs/performance.md measures the
/// difference); `taken` turns it into the `LeaseRow`s every other lock
/// statement returns, the one place the arrays are taken apart.
#[derive(Debug, FromRow)]
struct BatchRow {
    handoff_id: Option<i64>,
    lock_keys: Option<Vec<Option<String>>>,
    owner_ids: Option<Vec<Option<String>>>,
    tokens: Option<Vec<Option<String>>>,
    expired_at_millis: Option<Vec<i64>>,
    overdue_millis: Option<Vec<i64>>,
    set_aside_keys: Option<Vec<Option<String>>>,
    set_aside_owner_ids: Option<Vec<Option<String>>>,
    set_aside_tokens: Option<Vec<Option<String>>>,
    set_aside_errors: Option<Vec<Option<String>>>,
    fallback_cause: Option<String>,
}

impl BatchRow {
    /// The batch as `LeaseRow`s (the reaped leases, then those set aside)
    /// through the one conversion, with the batch's hand-off and fallback
    /// cause, which belong to the batch, not to each lease. Arrays of
    /// unequal length (which the function never returns) are a decode
    /// error, not leases made up or dropped.
    fn taken(self) -> Result<Taken, sqlx::Error> {
        let reaped = self.lock_keys.unwrap_or_default();
        let set_aside = self.set_aside_keys.unwrap_or_default();
        let same = |n: usize, len: usize| {
            if n == len {
                Ok(())
            } else {
                Err(sqlx::Error::Decode(
                    "lock_reap_batch returned arrays of unequal length".into(),
                ))
            }
        };
        let owners = self.owner_ids.unwrap_or_default();
        let tokens = self.tokens.unwrap_or_default();
        let expired = self.expired_at_millis.unwrap_or_default();
        let overdue = self.overdue_millis.unwrap_or_default();
        for len in [owners.len(), tokens.len(), expired.len(), overdue.len()] {
            same(reaped.len(), len)?;
        }
        let aside_owners = self.set_aside_owner_ids.unwrap_or_default();
        let aside_tokens = self.set_aside_tokens.unwrap_or_default();
        let aside_errors = self.set_aside_errors.unwrap_or_default();
        for len in [aside_owners.len(), aside_tokens.len(), aside_errors.len()] {
            same(set_aside.len(), len)?;
        }
        let lease = |lock_key, owner_id, token| LeaseRow {
            lock_key,
            owner_id,
            token,
            expired_at_millis: None,
            overdue_millis: None,
            set_aside_error: None,
            reaped_by: None,
            fallback_cause: None,
        };
        let mut rows = Vec::with_capacity(reaped.len() + set_aside.len());
        for (((k, o), t), (e, d)) in reaped
            .into_iter()
            .zip(owners)
            .zip(tokens)
            .zip(expired.into_iter().zip(overdue))
        {
            rows.push(LeaseRow {
                expired_at_millis: Some(e),
                overdue_millis: Some(d),
                ..lease(k, o, t)
            });
        }
        for (((k, o), t), x) in set_aside
            .into_iter()
            .zip(aside_owners)
            .zip(aside_tokens)
            .zip(aside_errors)
        {
            rows.push(LeaseRow {
                set_aside_error: x,
                ..lease(k, o, t)
            });
        }
        let mut taken = leases(rows)?;
        taken.handoff_id = self.handoff_id;
        taken.fallback = self.fallback_cause;
        Ok(taken)
    }
}

/// One batch of the sweep, in the caller's transaction: deletes up to
/// `limit` expired leases in deadline order from `after_millis` (epoch ms:
/// the newest deadline the sweep's previous batch reaped; `None`: the
/// oldest, pre-1970 and -infinity included), rows other sessions hold
/// skipped (`FOR UPDATE SKIP LOCKED`, so replicas split the work), and
/// records them in one hand-off row (`lock_reap_batch` in `sql/functions/`
/// holds the statement and explains its shape: the database clock decides,
/// rows are deleted by tuple id). The sweeper's role needs no DELETE
/// privilege and can never delete a live lease.
///
/// Resuming at `after_millis` spares each batch the dead index entries the
/// earlier ones left at the head of the index, which would make a drain
/// quadratic in its backlog; a lease passed over (held by another session
/// when its batch ran) is reaped by the next sweep, which starts from the
/// oldest.
pub async fn reap_batch(
    conn: &mut PgConnection,
    limit: usize,
    after_millis: Option<i64>,
) -> Result<Taken, sqlx::Error> {
    let batch: BatchRow = sqlx::query_as(
        "SELECT handoff_id, lock_keys, owner_ids, tokens, expired_at_millis, overdue_millis,
                set_aside_keys, set_aside_owner_ids, set_aside_tokens, set_aside_errors,
                fallback_cause
           FROM lock_reap_batch($1, $2)",
    )
    .bind(conn::limit_param(limit))
    .bind(after_millis)
    .persistent(false)
    .fetch_one(conn)
    .await?;
    batch.taken()
}

/// Asks `SWEEP_PROBE`, decoded straight into the seam's answer. Its values
/// come as text (simple protocol), which sqlx decodes for these types; its
/// `takeovers` column is `Probe::recorded`, and PostgreSQL misses nothing.
pub async fn sweep_probe(conn: &mut PgConnection) -> Result<Probe, sqlx::Error> {
    let row = conn::probe_row(conn, SWEEP_PROBE).await?;
    let (expired, recorded, held) = FromRow::from_row(&row)?;
    Ok(Probe {
        expired,
        recorded,
        held,
        missed: 0,
    })
}

/// Leases currently held, expired-but-unswept ones included, from the count
/// the fleet shares (`lock_held_count_get` in `sql/functions/`): the stored
/// count less the leases every batch committed since it has swept, read in
/// one statement, and a `count(*)` only by the one caller that finds the
/// stored count older than `max_age_millis` and wins its row. Returns the
/// count and whether this call recounted.
pub async fn held_count(
    conn: &mut PgConnection,
    max_age_millis: i64,
) -> Result<(i64, bool), sqlx::Error> {
    sqlx::query_as("SELECT held, recounted FROM lock_held_count_get($1)")
        .persistent(false)
        .bind(max_age_millis)
        .fetch_one(conn)
        .await
}

/// The lock sweep's store: its one connection, which nothing else uses, so
/// a job backlog or a catalog read never delays a lease's line.
pub struct PgLockStore {
    /// The sweep's own connection, reopened after any failure.
    db: Db,
    /// Where the next batch of this pass starts: the newest deadline the
    /// last batch took, so a drain walks the backlog in deadline order
    /// without reading what it took again. Reset by each pass's probe.
    after: Option<i64>,
    /// Why the last batch (a sweep's, or the outbox's) fell back to its
    /// row-by-row pass, until the sweeper takes it
    /// (`LockStore::take_fallback`).
    fallback: Option<String>,
}

impl PgLockStore {
    pub fn new(target: DbTarget) -> Self {
        Self {
            db: Db::new(target, Work::LockLeases),
            after: None,
            fallback: None,
        }
    }
}

/// Where the next batch of a drain starts: at the newest deadline the last
/// one reaped, or where it was when that batch reaped nothing.
fn resume_at(after: Option<i64>, newest_millis: Option<i64>) -> Option<i64> {
    newest_millis.or(after)
}

/// One sweep batch. First transaction: delete and hand off, commit, so the
/// deleted leases' row locks, which an acquire of their key waits on, end
/// before any line is written. Second: claim the hand-off, write the lines,
/// commit (`conn::claim_then_report`). Returns the batch (its leases, for
/// the count and where the next one starts); why it fell back, if it did,
/// is in `fallback` from the first commit on, so a batch whose lines then
/// fail is counted too.
async fn reap_in_tx(
    conn: &mut PgConnection,
    limit: usize,
    after: Option<i64>,
    report: &mut dyn Reporter<ExpiredLease>,
    fallback: &mut Option<String>,
) -> Result<Taken, BatchFailure> {
    let mut tx = conn::begin(conn).await?;
    let mut batch = reap_batch(&mut tx, limit, after)
        .await
        .map_err(|e| BatchFailure::Query("lock_reap_batch", e))?;
    conn::commit(tx).await?;
    *fallback = batch.fallback.take();
    log_set_aside(&batch.set_aside);
    if let Some(id) = batch.handoff_id {
        let claim = "SELECT lock_handoff_claim($1)";
        conn::claim_then_report(conn, claim, "lock_handoff_claim", id, &batch.leases, report)
            .await?;
    }
    Ok(batch)
}

/// Retires recorded expiries (an abandoned hand-off with
/// `lock_handoff_recover`, the outbox with `lock_drain_takeovers`) in one
/// transaction: the statement
/// deletes them, their lines are written, then it commits. The number
/// reported; why the outbox's batch fell back to its row-by-row pass, if it
/// did, goes to `fallback`.
async fn retire_in_tx(
    conn: &mut PgConnection,
    what: &'static str,
    query: sqlx::query::QueryAs<'_, sqlx::Postgres, LeaseRow, sqlx::postgres::PgArguments>,
    report: &mut dyn Reporter<ExpiredLease>,
    fallback: &mut Option<String>,
) -> Result<usize, BatchFailure> {
    let mut tx = conn::begin(conn).await?;
    let mut retired = fetch_leases(&mut tx, query)
        .await
        .map_err(|e| BatchFailure::Query(what, e))?;
    // Set before the lines: a batch that fell back and whose lines then
    // fail still fell back.
    if let Some(cause) = retired.fallback.take() {
        *fallback = Some(cause);
    }
    log_set_aside(&retired.set_aside);
    conn::report_then_commit(tx, &retired.leases, report).await?;
    Ok(retired.leases.len())
}

/// One ERROR line per lease the database set aside (a row whose delete failed
/// inside the reaping function): it was not deleted, every other lease of
/// its batch was; the next sweep retries it. Its `reaped_by` was checked
/// when it was read (`leases`).
fn log_set_aside(rows: &[LeaseRow]) {
    for row in rows {
        tracing::error!(
            lockKey = row.lock_key.as_deref().unwrap_or_default(),
            token = row.token.as_deref().unwrap_or_default(),
            ownerId = row.owner_id.as_deref().unwrap_or_default(),
            reapedBy = row.reaped_by.as_deref().unwrap_or(ReapedBy::Sweep.as_str()),
            cause = row
                .set_aside_error
                .as_deref()
                .unwrap_or("reaped without a deadline"),
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
        let probe = sweep_probe(conn).await;
        probe.map_err(|e| self.db.query_failed("lock_sweep_probe", e))
    }

    async fn reap_batch(
        &mut self,
        limit: usize,
        report: &mut dyn Reporter<ExpiredLease>,
    ) -> Result<usize, StoreError> {
        let after = self.after;
        let fallback = &mut self.fallback;
        let batch = self
            .db
            .batch(async |c| reap_in_tx(c, limit, after, report, fallback).await)
            .await?;
        let newest = batch.leases.iter().map(|l| l.expired_at_millis).max();
        self.after = resume_at(after, newest);
        Ok(batch.leases.len())
    }

    fn take_fallback(&mut self) -> Option<String> {
        self.fallback.take()
    }

    /// Abandoned hand-offs first (their leases expired before any takeover
    /// still recorded), one a transaction, then the outbox with what is left
    /// of `limit`. A hand-off is abandoned when it is older than
    /// `signal_handoff_grace()` and no one holds it; the outbox's rows are
    /// takeovers, late releases and late renewals, oldest first, each with
    /// how it left the table or came back to life, overdue measured at that
    /// moment.
    async fn drain_recorded(
        &mut self,
        limit: usize,
        report: &mut dyn Reporter<ExpiredLease>,
    ) -> Result<usize, StoreError> {
        let Self { db, fallback, .. } = self;
        let mut done = 0;
        while done < limit {
            let recovered = db
                .batch(async |c| {
                    let query = sqlx::query_as(
                        "SELECT lock_key, owner_id, token, expired_at_millis, overdue_millis
                           FROM lock_handoff_recover()",
                    );
                    retire_in_tx(c, "lock_handoff_recover", query, report, fallback).await
                })
                .await?;
            if recovered == 0 {
                break;
            }
            done += recovered;
        }
        if done < limit {
            let left = limit - done;
            done += db
                .batch(async |c| {
                    let query = sqlx::query_as(
                        "SELECT lock_key, owner_id, token, expired_at_millis, overdue_millis,
                                set_aside_error, reaped_by, fallback_cause
                           FROM lock_drain_takeovers($1)",
                    )
                    .bind(conn::limit_param(left));
                    retire_in_tx(c, "lock_drain_takeovers", query, report, fallback).await
                })
                .await?;
        }
        Ok(done)
    }

    async fn held_count(&mut self) -> Result<i64, StoreError> {
        let max_age = HELD_COUNT_MAX_AGE.as_millis() as i64;
        let conn = self.db.conn().await?;
        match conn::in_tx(conn, async |c| held_count(c, max_age).await).await {
            Ok((held, _recounted)) => Ok(held),
            Err(e) => Err(self.db.query_failed("lock_held_count_get", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::SWEEP_DELAY;

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

    /// What docs/metrics-and-logs.md promises for `lock.held.current`: an
    /// acquisition or release is in every daemon's gauge within the max age
    /// plus two sweep periods, at most 5 s on an idle fleet.
    #[test]
    fn the_gauge_shows_the_lock_servers_work_within_five_seconds() {
        assert!(
            HELD_COUNT_MAX_AGE + 2 * SWEEP_DELAY <= std::time::Duration::from_secs(5),
            "{HELD_COUNT_MAX_AGE:?} + 2 x {SWEEP_DELAY:?}"
        );
    }
}
