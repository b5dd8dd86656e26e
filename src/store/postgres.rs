//! The PostgreSQL lock backend (`backend=pg`).
//!
//! Owns the transaction around each batch, which is where "at least once,
//! never lost" is made: delete with RETURNING, report the rows (the caller
//! writes and flushes their lines), and only then commit. A failed report or
//! a dropped connection rolls the batch back, so the rows stay for the next
//! sweep. The statements themselves are in `queries::locks`.

use sqlx::Connection as _;

use crate::config::DbTarget;
use crate::db::{BatchFailure, Db};
use crate::queries::locks;
use crate::store::{ExpiredLease, LockStore, StoreError};

type Report<'a> = &'a mut (dyn FnMut(&[ExpiredLease]) -> std::io::Result<()> + Send);

/// How old the shared held-lease count may be before a caller recounts it:
/// the `lock.held.current` gauge is at most this (plus one count) stale. Ten
/// seconds is the flush interval of Etsy statsd and the Datadog agent, so a
/// fresher count would never be seen; the recount is a full scan, done once
/// per interval by one daemon of the whole fleet (docs/performance.md).
pub const HELD_COUNT_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(10);

pub struct PgLockStore {
    db: Db,
    /// Where the next expired-lease batch starts.
    next: Next,
    /// The walk ran out of its page budget during this sweep (expired rows
    /// are sparse): the rest of the sweep uses the index.
    sparse: bool,
    /// What this sweep's probe found, until the sweep has used it.
    probe: Option<Probe>,
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
/// is `Oldest`; a full batch means a backlog, drained by walking the heap
/// (`Walk`) or, where expired rows are sparse, by resuming the index scan at
/// the newest deadline reaped (`After`). Any short batch or error goes back to
/// `Oldest`, so a lease passed over (locked by another replica, or expired
/// behind the walk) is reaped by the next sweep at the latest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    Oldest,
    After(i64),
    Walk(i64),
}

/// Which of the deleting statements a batch runs.
#[derive(Clone, Copy)]
enum Batch {
    Expired { after_millis: i64 },
    Walk { from_page: i64 },
    Takeovers,
}

impl PgLockStore {
    pub fn new(target: DbTarget) -> Self {
        Self {
            db: Db::new(target),
            next: Next::Oldest,
            sparse: false,
            probe: None,
        }
    }

    async fn batch(
        &mut self,
        kind: Batch,
        limit: i32,
        report: Report<'_>,
    ) -> Result<Done, StoreError> {
        let conn = self.db.conn().await?;
        match batch_in_tx(conn, kind, limit, report).await {
            Ok(done) => Ok(done),
            Err(failure) => Err(self.db.batch_failed(failure)),
        }
    }

    /// One batch by the expiry index, from `after_millis` (0: the oldest).
    async fn index_batch(
        &mut self,
        after_millis: i64,
        limit: i32,
        report: Report<'_>,
    ) -> Result<usize, StoreError> {
        let done = self
            .batch(Batch::Expired { after_millis }, limit, report)
            .await?;
        self.next = if done.n < limit as usize {
            self.sparse = false;
            Next::Oldest
        } else if after_millis == 0 && !self.sparse {
            Next::Walk(0)
        } else {
            Next::After(done.newest_millis.unwrap_or(0))
        };
        Ok(done.n)
    }

    async fn reap(&mut self, limit: i32, report: Report<'_>) -> Result<usize, StoreError> {
        match self.next {
            Next::Oldest => self.index_batch(0, limit, report).await,
            Next::After(after) => self.index_batch(after, limit, report).await,
            Next::Walk(from_page) => {
                let done = match self.batch(Batch::Walk { from_page }, limit, report).await {
                    Ok(done) => done,
                    // A walk batch that failed rolled back whole (a row that
                    // cannot be deleted, say). The index reap sets such a row
                    // aside instead of failing, so it takes over this sweep;
                    // if the database is gone, it fails too, as it should.
                    Err(StoreError::Query { .. }) => {
                        self.sparse = true;
                        self.next = Next::Oldest;
                        return self.index_batch(0, limit, report).await;
                    }
                    Err(e) => return Err(e),
                };
                let next_page = done.next_page.unwrap_or(-1);
                if done.n >= limit as usize && next_page >= 0 {
                    self.next = Next::Walk(next_page);
                    return Ok(done.n);
                }
                self.next = Next::Oldest;
                if next_page < 0 {
                    // The whole table was walked: this sweep's drain is done.
                    self.sparse = false;
                    return Ok(done.n);
                }
                // The page budget ran out first: too few expired rows per
                // page for the walk to pay; the index takes over at once.
                self.sparse = true;
                let more = self.index_batch(0, limit, report).await?;
                Ok(done.n + more)
            }
        }
    }
}

/// What a committed batch did.
struct Done {
    n: usize,
    /// The newest deadline reaped (index batches).
    newest_millis: Option<i64>,
    /// Where a walk goes next (walk batches).
    next_page: Option<i64>,
}

/// Delete, report, commit: the order that makes a line precede its commit.
/// Any early return drops the transaction, which rolls it back.
async fn batch_in_tx(
    conn: &mut sqlx::PgConnection,
    kind: Batch,
    limit: i32,
    report: Report<'_>,
) -> Result<Done, BatchFailure> {
    let mut tx = conn
        .begin()
        .await
        .map_err(|e| BatchFailure::Query("BEGIN", e))?;
    let mut next_page = None;
    let leases = match kind {
        Batch::Expired { after_millis } => locks::reap_expired(&mut tx, limit, after_millis)
            .await
            .map_err(|e| BatchFailure::Query("reap_expired", e))?,
        Batch::Walk { from_page } => {
            let (leases, next) = locks::reap_expired_walk(&mut tx, limit, from_page)
                .await
                .map_err(|e| BatchFailure::Query("reap_expired_walk", e))?;
            next_page = Some(next);
            leases
        }
        Batch::Takeovers => locks::drain_takeovers(&mut tx, limit)
            .await
            .map_err(|e| BatchFailure::Query("drain_takeovers", e))?,
    };
    if !leases.is_empty() {
        report(&leases).map_err(BatchFailure::Report)?;
    }
    tx.commit()
        .await
        .map_err(|e| BatchFailure::Query("COMMIT", e))?;
    Ok(Done {
        n: leases.len(),
        newest_millis: leases.iter().map(|l| l.expired_at_millis).max(),
        next_page,
    })
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
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        if self.next == Next::Oldest {
            // The first batch of a sweep: ask first whether there is anything.
            let max_age = HELD_COUNT_MAX_AGE.as_millis() as i64;
            let conn = self.db.conn().await?;
            let (expired, takeovers, held) = match locks::sweep_probe(conn, max_age).await {
                Ok(answer) => answer,
                Err(e) => return Err(self.db.query_failed("sweep_probe", e)),
            };
            self.probe = Some(Probe {
                takeovers,
                held,
                unchanged: !expired,
            });
            if !expired {
                return Ok(0);
            }
        }
        let result = self.reap(limit, report).await;
        if let Some(p) = self.probe.as_mut() {
            p.unchanged = false;
        }
        if result.is_err() {
            // After an error the next batch starts from the oldest again.
            self.next = Next::Oldest;
            self.sparse = false;
        }
        result
    }

    async fn drain_takeovers(
        &mut self,
        limit: usize,
        report: Report<'_>,
    ) -> Result<usize, StoreError> {
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        if let Some(p) = self.probe.as_mut() {
            if !p.takeovers {
                return Ok(0);
            }
            p.unchanged = false;
        }
        let n = self.batch(Batch::Takeovers, limit, report).await?.n;
        Ok(n)
    }

    async fn held_count(&mut self) -> Result<i64, StoreError> {
        // The sweep ends here: its probe, if nothing changed since, answers.
        if let Some(Probe {
            unchanged: true,
            held: Some(held),
            ..
        }) = self.probe.take()
        {
            return Ok(held);
        }
        let conn = self.db.conn().await?;
        let max_age = HELD_COUNT_MAX_AGE.as_millis() as i64;
        match locks::held_count(conn, max_age).await {
            Ok((n, _recounted)) => Ok(n),
            Err(e) => Err(self.db.query_failed("held_count", e)),
        }
    }
}
