//! The PostgreSQL lock backend (`backend=pg`): a sweep's stages over
//! `lock_entry`'s statements. Owns each batch's two transactions (delete and
//! hand off, commit; then claim, report, commit), the probe that makes an
//! idle sweep one statement, how a backlog is found (index or heap walk), and
//! the `lease_set_aside` line only it sees. Not the statements (`lock_entry`)
//! nor when to sweep and what else to log (`sweep::lock_sweeper`).

use crate::config::DbTarget;
use crate::model::ExpiredLease;
use crate::pg::conn::{self, BatchFailure, Db};
use crate::pg::lock_entry::{self as locks, HELD_COUNT_MAX_AGE};
use crate::store::{ExpiryStage, LockStore, Reaped, StoreError, TakeoverStage, Work};

type Report<'a> = crate::store::Report<'a, ExpiredLease>;

pub struct PgLockStore {
    db: Db,
}

/// A sweep's first stage (`ExpiryStage`): what its probe found and where
/// its next batch starts.
pub struct PgSweep<'s> {
    store: &'s mut PgLockStore,
    probe: Probe,
    /// The probe was asked since the last batch (`begin_sweep` asks it for
    /// the first one).
    probed: bool,
    next: Next,
    /// The walk ran out of its page budget during this sweep (expired rows
    /// are sparse): the rest of the sweep uses the index.
    sparse: bool,
}

/// A sweep's second stage (`TakeoverStage`): the probe's answer, for
/// whether takeovers wait and for the held count.
pub struct PgTakeovers<'s> {
    store: &'s mut PgLockStore,
    probe: Probe,
}

/// The answer of `lock_sweep_probe`, asked before the first batch of a
/// sweep, so an idle sweep costs one statement instead of two transactions
/// and a count.
#[derive(Clone, Copy, Debug)]
struct Probe {
    takeovers: bool,
    held: Option<i64>,
    /// Nothing was deleted since the probe, so its held count still stands.
    unchanged: bool,
}

/// Where the next expired-lease batch starts. The first batch of every sweep
/// is `Oldest` (by the index, with no lower bound: pre-1970 deadlines
/// included); a full batch means a backlog, drained by walking the heap
/// (`Walk`) or, where expired rows are sparse, by resuming the index scan at
/// the newest deadline reaped (`After`). Any short batch or error goes back to
/// `Oldest`, so a lease passed over (locked by another replica, expired behind
/// the walk, or set aside) is reaped by the next sweep at the latest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    Oldest,
    After(i64),
    Walk(i64),
}

/// Which of the deleting statements a batch runs.
#[derive(Clone, Copy)]
enum Reap {
    /// By the expiry index, after this deadline (epoch ms; `None`: all).
    Index {
        after_millis: Option<i64>,
    },
    /// By the heap, from this page.
    Walk {
        from_page: i64,
    },
    Takeovers,
}

/// What a committed batch did.
struct Done {
    /// Leases reaped and reported (set-aside ones are not counted, so a
    /// batch with one is short and ends the drain: no loop over a row that
    /// keeps failing).
    n: usize,
    /// The newest deadline reaped (index batches).
    newest_millis: Option<i64>,
    /// Where a walk goes next (walk batches; -1 at the end of the table).
    next_page: Option<i64>,
    /// Lock-server calls queued behind the batch when it ended.
    waiters: u32,
}

impl Done {
    fn reaped(&self) -> Reaped {
        Reaped {
            n: self.n,
            waiters: self.waiters,
        }
    }
}

impl PgLockStore {
    pub fn new(target: DbTarget) -> Self {
        Self {
            db: Db::new(target, Work::LockLeases),
        }
    }

    async fn batch(
        &mut self,
        kind: Reap,
        limit: usize,
        report: Report<'_>,
    ) -> Result<Done, StoreError> {
        let conn = self.db.conn().await?;
        batch_in_tx(conn, kind, limit, report)
            .await
            .map_err(|failure| self.db.batch_failed(failure))
    }

    /// Asks whether anything expired or was taken over, and the shared count:
    /// one simple-protocol round trip (`conn::probe_row`).
    async fn probe(&mut self) -> Result<Probe, StoreError> {
        let conn = self.db.conn().await?;
        match locks::sweep_probe(conn).await {
            Ok(found) => Ok(Probe {
                takeovers: found.takeovers,
                held: found.held,
                unchanged: !found.expired,
            }),
            Err(e) => Err(self.db.query_failed("lock_sweep_probe", e)),
        }
    }
}

impl PgSweep<'_> {
    /// One batch by the expiry index, after `after_millis` (`None`: all).
    async fn index_batch(
        &mut self,
        after_millis: Option<i64>,
        limit: usize,
        report: Report<'_>,
    ) -> Result<Reaped, StoreError> {
        let done = self
            .store
            .batch(Reap::Index { after_millis }, limit, report)
            .await?;
        self.next = if done.n < limit {
            self.sparse = false;
            Next::Oldest
        } else if after_millis.is_none() && !self.sparse {
            Next::Walk(0)
        } else {
            match done.newest_millis {
                Some(newest) => Next::After(newest),
                None => Next::Oldest,
            }
        };
        Ok(done.reaped())
    }

    async fn reap(&mut self, limit: usize, report: Report<'_>) -> Result<Reaped, StoreError> {
        match self.next {
            Next::Oldest => self.index_batch(None, limit, report).await,
            Next::After(after) => self.index_batch(Some(after), limit, report).await,
            Next::Walk(from_page) => {
                let walked = self
                    .store
                    .batch(Reap::Walk { from_page }, limit, report)
                    .await;
                let done = match walked {
                    Ok(done) => done,
                    // A walk batch that failed rolled back whole (a row that
                    // cannot be deleted, say). The index reap sets such a row
                    // aside instead of failing, so it takes over this sweep;
                    // if the database is gone, it fails too, as it should.
                    Err(StoreError::Query { .. }) => {
                        self.sparse = true;
                        self.next = Next::Oldest;
                        return self.index_batch(None, limit, report).await;
                    }
                    Err(e) => return Err(e),
                };
                let next_page = done.next_page.unwrap_or(-1);
                if done.n >= limit && next_page >= 0 {
                    self.next = Next::Walk(next_page);
                    return Ok(done.reaped());
                }
                self.next = Next::Oldest;
                if next_page < 0 {
                    // The whole table was walked: this sweep's drain is done.
                    self.sparse = false;
                    return Ok(done.reaped());
                }
                // The page budget ran out first: too few expired rows per
                // page for the walk to pay; the index takes over at once.
                self.sparse = true;
                let more = self.index_batch(None, limit, report).await?;
                Ok(Reaped {
                    n: done.n + more.n,
                    waiters: done.waiters.max(more.waiters),
                })
            }
        }
    }
}

/// Delete (or drain), report, commit. A takeover's record is the outbox row
/// its transaction deletes, which no lock-server call waits on: report, then
/// commit. Deleted leases hold row locks an acquire of their key waits on:
/// the reaping call hands them off, the transaction commits, and only then
/// are their lines written, under the claim of the hand-off.
async fn batch_in_tx(
    conn: &mut sqlx::PgConnection,
    kind: Reap,
    limit: usize,
    report: Report<'_>,
) -> Result<Done, BatchFailure> {
    let mut tx = conn::begin(conn).await?;
    let (batch, next_page) = match kind {
        Reap::Index { after_millis } => {
            let batch = locks::reap_expired(&mut tx, limit, after_millis)
                .await
                .map_err(|e| BatchFailure::Query("lock_reap_expired_handed_off", e))?;
            (batch, None)
        }
        Reap::Walk { from_page } => {
            let (batch, next) = locks::reap_expired_walk(&mut tx, limit, from_page)
                .await
                .map_err(|e| BatchFailure::Query("lock_reap_walk", e))?;
            (batch, Some(next))
        }
        Reap::Takeovers => {
            let drained = locks::drain_takeovers(&mut tx, limit)
                .await
                .map_err(|e| BatchFailure::Query("lock_drain_takeovers", e))?;
            log_set_aside(&drained.set_aside);
            conn::report_then_commit(tx, &drained.reaped, report).await?;
            return Ok(Done {
                n: drained.reaped.len(),
                newest_millis: None,
                next_page: None,
                waiters: 0,
            });
        }
    };
    log_set_aside(&batch.set_aside);
    conn::commit(tx).await?;
    if let Some(id) = batch.handoff_id {
        let claim = async |c: &mut sqlx::PgConnection| locks::handoff_claim(c, id).await;
        conn::claim_then_report(conn, "lock_handoff_claim", claim, &batch.leases, report).await?;
    }
    Ok(Done {
        n: batch.leases.len(),
        newest_millis: batch.leases.iter().map(|l| l.expired_at_millis).max(),
        next_page,
        waiters: batch.waiters,
    })
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
            token = row.token,
            ownerId = %row.owner_id,
            reapedBy = row.reaped_by.as_str(),
            cause = %row.cause,
            "lease_set_aside"
        );
    }
}

impl LockStore for PgLockStore {
    type Sweep<'s> = PgSweep<'s>;

    fn backend_id(&self) -> &'static str {
        "pg"
    }

    async fn begin_sweep(&mut self) -> Result<PgSweep<'_>, StoreError> {
        // Asked before the first batch: an idle sweep ends on this answer.
        let probe = self.probe().await?;
        Ok(PgSweep {
            store: self,
            probe,
            probed: true,
            next: Next::Oldest,
            sparse: false,
        })
    }
}

impl<'s> ExpiryStage for PgSweep<'s> {
    type Takeovers = PgTakeovers<'s>;

    async fn reap_expired(
        &mut self,
        limit: usize,
        report: Report<'_>,
    ) -> Result<Reaped, StoreError> {
        if self.next == Next::Oldest {
            // Back at the oldest after a full batch (a walk that reached
            // the end of the table, say): ask again whether anything is left.
            if !self.probed {
                self.probe = self.store.probe().await?;
            }
            self.probed = false;
            if self.probe.unchanged {
                return Ok(Reaped::default());
            }
        }
        let result = self.reap(limit, report).await;
        self.probe.unchanged = false;
        if result.is_err() {
            // After an error the next batch starts from the oldest again.
            self.next = Next::Oldest;
            self.sparse = false;
        }
        result
    }

    fn into_takeovers(self) -> Self::Takeovers {
        PgTakeovers {
            store: self.store,
            probe: self.probe,
        }
    }
}

impl TakeoverStage for PgTakeovers<'_> {
    async fn drain_takeovers(
        &mut self,
        limit: usize,
        report: Report<'_>,
    ) -> Result<usize, StoreError> {
        if !self.probe.takeovers {
            return Ok(0);
        }
        self.probe.unchanged = false;
        // Abandoned hand-offs first (the probe's `takeovers` covers both):
        // their leases expired before any takeover still recorded.
        let db = &mut self.store.db;
        let mut n = 0;
        loop {
            let conn = db.conn().await?;
            let recovered = recover_in_tx(conn, report)
                .await
                .map_err(|failure| db.batch_failed(failure))?;
            if recovered == 0 {
                break;
            }
            n += recovered;
        }
        Ok(n + self.store.batch(Reap::Takeovers, limit, report).await?.n)
    }

    async fn held_count(self) -> Result<i64, StoreError> {
        // The sweep ends here: its probe, if nothing changed since, answers.
        if let Probe {
            unchanged: true,
            held: Some(held),
            ..
        } = self.probe
        {
            return Ok(held);
        }
        let max_age = HELD_COUNT_MAX_AGE.as_millis() as i64;
        let db = &mut self.store.db;
        let conn = db.conn().await?;
        match conn::in_tx(conn, async |c| locks::held_count(c, max_age).await).await {
            Ok(count) => Ok(count.held),
            Err(e) => Err(db.query_failed("lock_held_count_get", e)),
        }
    }
}
