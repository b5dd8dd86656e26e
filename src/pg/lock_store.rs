//! The PostgreSQL lock backend (`backend=pg`): a sweep's stages over
//! `lock_entry`'s statements. Owns each batch's two transactions (delete and
//! hand off, commit; then claim, report, commit), the writer connection that
//! lets the second overlap the next batch's first, the second walker's
//! connection, the probe that makes an idle sweep one statement, how a
//! backlog is found (index, one heap walker or two), and the
//! `lease_set_aside` line only it sees. Not the statements (`lock_entry`)
//! nor when to sweep, how fast and what else to log (`sweep::lock_sweeper`).

use crate::config::DbTarget;
use crate::model::ExpiredLease;
use crate::pg::conn::{self, BatchFailure, Db};
use crate::pg::lock_entry::{self as locks, HELD_COUNT_MAX_AGE, Ranges};
use crate::store::{ExpiryStage, LockStore, Reaped, StoreError, TakeoverStage, Work, Workload};

type Report<'a> = crate::store::Report<'a, ExpiredLease>;

pub struct PgLockStore {
    db: Db,
    /// A second connection, opened by the first batch whose lines are
    /// written while the next batch is taken (`Workload::Idle`), and
    /// closed by the first sweep that needs none: a daemon holds it only
    /// while it drains a backlog.
    writer: Db,
    /// The second walker's connection, opened and closed the same way: a
    /// backlog walked alone on the server is walked by two (`Next::Pair`).
    second: Db,
}

/// A sweep's first stage (`ExpiryStage`): what its probe found and where
/// its next batch starts.
pub struct PgSweep<'s> {
    store: &'s mut PgLockStore,
    cursor: Cursor,
    /// Batches handed off and committed whose lines are still to be written
    /// (`Workload::Idle`), in the order they were taken.
    pending: Vec<AwaitingLines>,
    /// The writer connection was used during this sweep.
    overlapped: bool,
}

/// Where a sweep is: what its probe found and where its next batch starts.
struct Cursor {
    probe: Probe,
    /// The probe was asked since the last batch (`begin_sweep` asks it for
    /// the first one).
    probed: bool,
    next: Next,
    /// The walk stopped at a sparse stretch or failed during this sweep:
    /// the rest of the sweep uses the index.
    sparse: bool,
    /// Two walkers took a batch each during this sweep.
    paired: bool,
}

/// A batch taken off the table and handed off (committed with its hand-off
/// row), whose lines are yet to be written under a claim of that row.
struct AwaitingLines {
    handoff_id: i64,
    leases: Vec<ExpiredLease>,
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
    /// Others were at work (asked only when something had expired):
    /// sessions running a statement, at least one if takeovers wait.
    busy: u32,
    /// Nothing was deleted since the probe, so its held count still stands.
    unchanged: bool,
}

/// Where the next expired-lease batch starts. The first batch of every sweep
/// is `Oldest` (by the index, with no lower bound: pre-1970 deadlines
/// included); a full batch means a backlog, drained by walking the heap
/// (`Walk`, `Pair`) or, where expired rows are sparse, by resuming the index
/// scan at the newest deadline reaped (`After`). Any short batch or error
/// goes back to `Oldest`, so a lease passed over (locked by another replica,
/// expired behind the walk, or set aside) is reaped by the next sweep at the
/// latest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    Oldest,
    After(i64),
    /// One walker, from this page, in these ranges. Alone on the server, a
    /// walker of every range becomes a pair.
    Walk(i64, Ranges),
    /// Two walkers at once, each on its own connection and in alternate
    /// ranges, from these pages: one walker's statements are the drain's
    /// floor, and two that take alternate ranges never read the same page.
    /// Only while no one else is busy: beside a workload, one careful walker.
    Pair([i64; 2]),
}

/// Which of the reaping statements a batch runs.
#[derive(Clone, Copy)]
enum Reap {
    /// By the expiry index, after this deadline (epoch ms; `None`: all).
    Index { after_millis: Option<i64> },
    /// By the heap, from this page, in these ranges; locking each row first
    /// and skipping those others hold, or deleting at once.
    Walk {
        from_page: i64,
        skip_locked: bool,
        ranges: Ranges,
    },
}

/// What a committed batch did.
struct Done {
    /// Leases reaped (set-aside ones are not counted, so a batch with one is
    /// short and ends the drain: no loop over a row that keeps failing).
    n: usize,
    /// The newest deadline reaped (index batches).
    newest_millis: Option<i64>,
    /// Where a walk goes next (walk batches; -1 at the end of the table).
    next_page: Option<i64>,
    /// Lock-server calls queued behind the batch when it ended.
    waiters: u32,
    /// Other sessions running a statement when it ended (walk batches).
    busy: u32,
    /// The batch, if it was handed off: its lines are still to be written.
    handed_off: Option<AwaitingLines>,
}

/// What one reaping call took: one batch, or a walk batch and the index
/// batch that took over from it in the same call.
#[derive(Default)]
struct Taken {
    reaped: Reaped,
    /// In the order they were taken.
    handed_off: Vec<AwaitingLines>,
}

impl Taken {
    fn add(&mut self, done: Done) {
        self.reaped.n += done.n;
        self.reaped.batches += u32::from(done.n > 0);
        self.reaped.waiters = self.reaped.waiters.max(done.waiters);
        self.reaped.busy = self.reaped.busy.max(done.busy);
        self.handed_off.extend(done.handed_off);
    }
}

impl PgLockStore {
    pub fn new(target: DbTarget) -> Self {
        Self {
            db: Db::new(target.clone(), Work::LockLeases),
            writer: Db::new(target.clone(), Work::LockLeases),
            second: Db::new(target, Work::LockLeases),
        }
    }
}

/// One batch on `db`: delete, hand off and commit, its lines left to
/// `write_handed_off`.
async fn batch(db: &mut Db, kind: Reap, limit: usize) -> Result<Done, StoreError> {
    db.batch(async |c| reap_in_tx(c, kind, limit).await).await
}

/// Writes a handed-off batch's lines on `db` under a claim of its hand-off
/// row (`conn::claim_then_report`): none when another sweeper recovered it
/// first and wrote them.
async fn write_handed_off(
    db: &mut Db,
    batch: AwaitingLines,
    report: Report<'_>,
) -> Result<(), StoreError> {
    let id = batch.handoff_id;
    let claim = async |c: &mut sqlx::PgConnection| locks::handoff_claim(c, id).await;
    db.batch(async |c| {
        conn::claim_then_report(c, "lock_handoff_claim", claim, &batch.leases, report).await
    })
    .await
    .map(|_| ())
}

/// Writes handed-off batches' lines one batch after another, each under its
/// own claim, so a crash repeats at most the lines of the one being written.
async fn write_all_handed_off(
    db: &mut Db,
    batches: Vec<AwaitingLines>,
    report: Report<'_>,
) -> Result<(), StoreError> {
    for batch in batches {
        write_handed_off(db, batch, report).await?;
    }
    Ok(())
}

/// Asks whether anything expired or was taken over, and the shared count:
/// one simple-protocol round trip (`conn::probe_row`).
async fn probe(db: &mut Db) -> Result<Probe, StoreError> {
    let conn = db.conn().await?;
    match locks::sweep_probe(conn).await {
        Ok(found) => Ok(Probe {
            takeovers: found.takeovers,
            held: found.held,
            // Takeovers waiting to be reported are a lock server re-acquiring
            // expired keys (a storm's callers), at work on this very table
            // even when the activity look falls between its statements.
            busy: u32::try_from(found.busy)
                .unwrap_or(0)
                .max(u32::from(found.expired && found.takeovers)),
            unchanged: !found.expired,
        }),
        Err(e) => Err(db.query_failed("lock_sweep_probe", e)),
    }
}

impl Cursor {
    /// One batch by the expiry index, after `after_millis` (`None`: all).
    async fn index_batch(
        &mut self,
        db: &mut Db,
        after_millis: Option<i64>,
        limit: usize,
    ) -> Result<Done, StoreError> {
        let done = batch(db, Reap::Index { after_millis }, limit).await?;
        self.next = if done.n < limit {
            self.sparse = false;
            Next::Oldest
        } else if after_millis.is_none() && !self.sparse {
            Next::Walk(0, Ranges::ALL)
        } else {
            match done.newest_millis {
                Some(newest) => Next::After(newest),
                None => Next::Oldest,
            }
        };
        Ok(done)
    }

    /// Takes the next batch (two when a walk hands over to the index, or
    /// when two walkers take one each), its lines not yet written.
    async fn take(
        &mut self,
        db: &mut Db,
        second: &mut Db,
        limit: usize,
        workload: Workload,
    ) -> Result<Taken, StoreError> {
        let mut taken = Taken::default();
        match (self.next, workload) {
            (Next::Oldest, _) => taken.add(self.index_batch(db, None, limit).await?),
            (Next::After(after), _) => taken.add(self.index_batch(db, Some(after), limit).await?),
            (Next::Walk(from_page, Ranges::ALL), Workload::Idle) => {
                self.walk_pair(db, second, [from_page; 2], limit, &mut taken)
                    .await?
            }
            (Next::Walk(from_page, ranges), _) => {
                self.walk(db, from_page, ranges, limit, workload, &mut taken)
                    .await?
            }
            (Next::Pair(pages), Workload::Idle) => {
                self.walk_pair(db, second, pages, limit, &mut taken).await?
            }
            // Others are busy now: one careful walker of every range, from
            // the page the pair had reached least far (the other walker's
            // ranges in between are read again, and hold nothing).
            (Next::Pair(pages), Workload::Busy) => {
                let from_page = pages[0].min(pages[1]);
                self.walk(db, from_page, Ranges::ALL, limit, workload, &mut taken)
                    .await?
            }
        }
        Ok(taken)
    }

    /// One walker's batch. Beside a busy workload the walk skips the rows
    /// others hold (it locks each first); alone it deletes without that
    /// second write.
    async fn walk(
        &mut self,
        db: &mut Db,
        from_page: i64,
        ranges: Ranges,
        limit: usize,
        workload: Workload,
        taken: &mut Taken,
    ) -> Result<(), StoreError> {
        let walk = Reap::Walk {
            from_page,
            skip_locked: workload == Workload::Busy,
            ranges,
        };
        let done = match batch(db, walk, limit).await {
            Ok(done) => done,
            Err(StoreError::Query { .. }) => return self.walk_failed(db, limit, taken).await,
            Err(e) => return Err(e),
        };
        let went = Walked::from(&done, limit);
        taken.add(done);
        match went {
            Walked::On(next_page) => {
                self.next = Next::Walk(next_page, ranges);
                Ok(())
            }
            Walked::ToTheEnd => self.walk_done(),
            Walked::ToASparseRange => self.walk_sparse(db, limit, taken).await,
        }
    }

    /// A batch from each of two walkers at once, in alternate ranges, on two
    /// connections. Whatever one of them did, the other's committed batch is
    /// kept.
    async fn walk_pair(
        &mut self,
        db: &mut Db,
        second: &mut Db,
        pages: [i64; 2],
        limit: usize,
        taken: &mut Taken,
    ) -> Result<(), StoreError> {
        self.paired = true;
        let walk = |phase: usize| Reap::Walk {
            from_page: pages[phase],
            skip_locked: false,
            ranges: Ranges::every_other(phase),
        };
        let (first, other) = tokio::join!(batch(db, walk(0), limit), batch(second, walk(1), limit));
        let mut went = [Walked::ToTheEnd; 2];
        let mut failed = false;
        for (phase, done) in [first, other].into_iter().enumerate() {
            match done {
                Ok(done) => {
                    went[phase] = Walked::from(&done, limit);
                    taken.add(done);
                }
                Err(StoreError::Query { .. }) => failed = true,
                // A batch the other walker committed is reported from its
                // hand-off row by a later sweep (`lock_handoff_recover`).
                Err(e) => return Err(e),
            }
        }
        if failed {
            return self.walk_failed(db, limit, taken).await;
        }
        match went {
            [Walked::On(first), Walked::On(other)] => {
                self.next = Next::Pair([first, other]);
                Ok(())
            }
            // One walker reached the end of the table: the other goes on
            // alone, in its own ranges (the first one's are done).
            [Walked::On(page), Walked::ToTheEnd] => {
                self.next = Next::Walk(page, Ranges::every_other(0));
                Ok(())
            }
            [Walked::ToTheEnd, Walked::On(page)] => {
                self.next = Next::Walk(page, Ranges::every_other(1));
                Ok(())
            }
            [Walked::ToTheEnd, Walked::ToTheEnd] => self.walk_done(),
            _ => self.walk_sparse(db, limit, taken).await,
        }
    }

    /// A walk batch that failed rolled back whole (a row that cannot be
    /// deleted, or one another session holds). The index reap sets such a row
    /// aside or skips it instead of failing, so it takes over this sweep; if
    /// the database is gone, it fails too, as it should. Someone holding rows
    /// is someone busy: the next batches are careful ones.
    async fn walk_failed(
        &mut self,
        db: &mut Db,
        limit: usize,
        taken: &mut Taken,
    ) -> Result<(), StoreError> {
        self.sparse = true;
        self.next = Next::Oldest;
        taken.add(self.index_batch(db, None, limit).await?);
        taken.reaped.busy = taken.reaped.busy.max(1);
        Ok(())
    }

    /// The whole table was walked: this sweep's drain is done.
    fn walk_done(&mut self) -> Result<(), StoreError> {
        self.next = Next::Oldest;
        self.sparse = false;
        Ok(())
    }

    /// The walk stopped at a sparse range: too few expired rows per page for
    /// it to pay; the index takes over at once.
    async fn walk_sparse(
        &mut self,
        db: &mut Db,
        limit: usize,
        taken: &mut Taken,
    ) -> Result<(), StoreError> {
        self.next = Next::Oldest;
        self.sparse = true;
        taken.add(self.index_batch(db, None, limit).await?);
        Ok(())
    }
}

/// How a walker's batch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Walked {
    /// Full, with more of the table after it: the next batch starts here.
    On(i64),
    /// The walker reached the end of the table.
    ToTheEnd,
    /// Short before the end: the walker met a sparse range.
    ToASparseRange,
}

impl Walked {
    fn from(done: &Done, limit: usize) -> Walked {
        match done.next_page.unwrap_or(-1) {
            page if page < 0 => Walked::ToTheEnd,
            page if done.n >= limit => Walked::On(page),
            _ => Walked::ToASparseRange,
        }
    }
}

/// Delete and hand off, commit. Deleted leases hold row locks an acquire of
/// their key waits on: the reaping call hands them off and the transaction
/// commits; their lines are written afterwards, under a claim of the
/// hand-off (`write_handed_off`).
async fn reap_in_tx(
    conn: &mut sqlx::PgConnection,
    kind: Reap,
    limit: usize,
) -> Result<Done, BatchFailure> {
    let mut tx = conn::begin(conn).await?;
    let (batch, next_page) = match kind {
        Reap::Index { after_millis } => {
            let batch = locks::reap_expired(&mut tx, limit, after_millis)
                .await
                .map_err(|e| BatchFailure::Query("lock_reap_expired_handed_off", e))?;
            (batch, None)
        }
        Reap::Walk {
            from_page,
            skip_locked,
            ranges,
        } => {
            let (batch, next) =
                locks::reap_expired_walk(&mut tx, limit, from_page, skip_locked, ranges)
                    .await
                    .map_err(|e| BatchFailure::Query("lock_reap_walk", e))?;
            (batch, Some(next))
        }
    };
    log_set_aside(&batch.set_aside);
    conn::commit(tx).await?;
    Ok(Done {
        n: batch.leases.len(),
        newest_millis: batch.leases.iter().map(|l| l.expired_at_millis).max(),
        next_page,
        waiters: batch.waiters,
        busy: batch.busy,
        handed_off: batch.handoff_id.map(|handoff_id| AwaitingLines {
            handoff_id,
            leases: batch.leases,
        }),
    })
}

/// Drains recorded takeovers, reports them, commits. A takeover's record is
/// the outbox row its transaction deletes, which no lock-server call waits
/// on: its lines are written before the commit. The number reported.
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
        let probe = probe(&mut self.db).await?;
        Ok(PgSweep {
            store: self,
            cursor: Cursor {
                probe,
                probed: true,
                next: Next::Oldest,
                sparse: false,
                paired: false,
            },
            pending: Vec::new(),
            overlapped: false,
        })
    }
}

impl<'s> ExpiryStage for PgSweep<'s> {
    type Takeovers = PgTakeovers<'s>;

    async fn reap_expired(
        &mut self,
        limit: usize,
        workload: Workload,
        report: Report<'_>,
    ) -> Result<Reaped, StoreError> {
        let PgSweep {
            store,
            cursor,
            pending,
            overlapped,
        } = self;
        let PgLockStore { db, writer, second } = &mut **store;
        if cursor.next == Next::Oldest {
            // Back at the oldest after a full batch (a walk that reached
            // the end of the table, say): ask again whether anything is left.
            if !cursor.probed {
                cursor.probe = probe(db).await?;
            }
            cursor.probed = false;
            if cursor.probe.unchanged {
                return Ok(Reaped::default());
            }
        }
        let last = std::mem::take(pending);
        let taken = if last.is_empty() {
            cursor.take(db, second, limit, workload).await
        } else if workload == Workload::Idle {
            // The last batches' lines on the writer while these are taken:
            // the daemon writes while the database deletes.
            *overlapped = true;
            let (taken, written) = tokio::join!(
                cursor.take(db, second, limit, workload),
                write_all_handed_off(writer, last, report)
            );
            written?;
            taken
        } else {
            write_all_handed_off(db, last, report).await?;
            cursor.take(db, second, limit, workload).await
        };
        cursor.probe.unchanged = false;
        let taken = match taken {
            Ok(taken) => taken,
            Err(e) => {
                // After an error the next batch starts from the oldest again.
                cursor.next = Next::Oldest;
                cursor.sparse = false;
                return Err(e);
            }
        };
        // Full batches with more to come may wait for the next ones to be
        // written; anything else is written now, in the order it was taken.
        if workload == Workload::Idle && taken.reaped.n >= limit {
            *pending = taken.handed_off;
        } else {
            write_all_handed_off(db, taken.handed_off, report).await?;
        }
        Ok(taken.reaped)
    }

    fn busy(&self) -> u32 {
        self.cursor.probe.busy
    }

    async fn finish(&mut self, report: Report<'_>) -> Result<(), StoreError> {
        let last = std::mem::take(&mut self.pending);
        write_all_handed_off(&mut self.store.db, last, report).await?;
        // A sweep that needed no writer (no second walker) closes its
        // connection: a daemon holds them only while it drains.
        if !self.overlapped {
            self.store.writer.reset();
        }
        if !self.cursor.paired {
            self.store.second.reset();
        }
        Ok(())
    }

    fn into_takeovers(self) -> Self::Takeovers {
        PgTakeovers {
            store: self.store,
            probe: self.cursor.probe,
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
            let recovered = db.batch(async |c| recover_in_tx(c, report).await).await?;
            if recovered == 0 {
                break;
            }
            n += recovered;
        }
        let drained = db
            .batch(async |c| takeovers_in_tx(c, limit, report).await)
            .await?;
        Ok(n + drained)
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
