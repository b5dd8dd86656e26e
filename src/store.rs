//! The seams between the services and their backends: `LockStore` (a
//! sweep's stages) and `JobQueue` (a reaper pass's calls), what they return,
//! and the error every call returns, scrubbed of secrets with the driver's
//! error as its source. No SQL (`pg`), no timing, logging or metrics (`sweep`).

use std::fmt;
use std::future::Future;

use crate::model::{ExpiredLease, JobAction};

/// Where a store writes a batch's lines, and whom it tells once they are
/// committed. A closure that writes lines is one that needs no telling.
pub trait Reporter<T>: Send {
    /// Writes lines (a batch, or a chunk of one) and flushes them; an error
    /// means "do not commit".
    fn lines(&mut self, rows: &[T]) -> std::io::Result<()>;

    /// Every line written since the last call belongs to a batch now
    /// committed (its last record is gone): what they count may be sent.
    /// A store calls it after each commit that follows lines, so a call
    /// that commits several batches has each counted as it commits; neither
    /// service counts anything else.
    fn committed(&mut self) {}
}

impl<T, F> Reporter<T> for F
where
    F: FnMut(&[T]) -> std::io::Result<()> + Send,
{
    fn lines(&mut self, rows: &[T]) -> std::io::Result<()> {
        self(rows)
    }
}

/// How a store is handed its `Reporter`.
pub type Report<'a, T> = &'a mut dyn Reporter<T>;

/// What one reaping call took off the table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Leases taken off the table, for the drain rule (what was reported went
    /// through `report`).
    pub n: usize,
    /// The transactions that took them: one a batch, and a call may take
    /// more than one (two walkers, or a walk the index took over from).
    pub batches: u32,
    /// Lock-server calls that were queued behind the batch when it ended: the
    /// sweep takes smaller batches while there are any.
    pub waiters: u32,
    /// Other sessions running a statement when the batch ended (the workload
    /// beside the sweeper; 0 when the backend cannot tell): the sweep paces
    /// a backlog while there are any.
    pub busy: u32,
}

/// What the sweeper knows of the workload beside it, which decides how a
/// reaping call takes its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// No other session is busy: the fastest drain. A backlog's rows are
    /// deleted without being locked first (a row someone holds fails the
    /// batch after a short wait, and the sweep goes on the careful way), and
    /// a full batch's lines may be written while the next batch is taken
    /// (by the next `reap_expired`, or by `finish`).
    Idle,
    /// Others are running statements: a row another session holds is
    /// skipped, never waited on, and the lines are written before the call
    /// returns, so the daemon and the database take turns.
    Busy,
}

/// A lock backend, as a sweep uses it.
///
/// A sweep is three stages, each a type, so no caller can run them out of
/// order or carry one sweep's answers into the next:
///
/// 1. `begin_sweep` opens the sweep. A backend may ask here, in one cheap
///    statement, whether anything expired or was taken over and how many
///    leases are held (`PgLockStore` does); the returned value owns that
///    answer until the sweep ends.
/// 2. `ExpiryStage::reap_expired`, called until a batch comes back short
///    (fewer than its `limit`) or the sweep stops early, then `finish`
///    (which writes the lines a `Workload::Idle` call left), then
///    `into_takeovers`.
/// 3. `TakeoverStage::drain_takeovers`, called until a batch comes back
///    short, then `held_count`, which ends the sweep.
///
/// A stage dropped early (an error) abandons the sweep; the next
/// `begin_sweep` starts from nothing. A batch whose lines were still to be
/// written then is recovered by a later sweep, of any replica, and reported
/// once (`reapedBy=sweep`), only later.
///
/// Each reaping call takes at most `limit` leases off the table and calls
/// `report` with them before their last durable record is gone, so a crash
/// can repeat a line but never lose one; if `report` fails, that record
/// stays and a later call reports the leases. The leases themselves are
/// released first: nothing the lock server does waits while their lines
/// are written (`PgLockStore` commits the deletion together with a
/// hand-off row and deletes that row once the lines are out). Several
/// replicas may sweep at the same time: a lease goes to exactly one of
/// them.
pub trait LockStore: Send {
    /// One sweep's first stage; it may borrow the store's connection.
    type Sweep<'s>: ExpiryStage
    where
        Self: 's;

    /// The `backend` tag on every line and metric (`pg`, later `etcd`).
    fn backend_id(&self) -> &'static str;

    /// Opens a sweep.
    fn begin_sweep(&mut self) -> impl Future<Output = Result<Self::Sweep<'_>, StoreError>> + Send;
}

/// A sweep's first stage: leases whose deadline has passed.
pub trait ExpiryStage: Send {
    /// The stage that follows.
    type Takeovers: TakeoverStage;

    /// Deletes up to `limit` leases whose deadline has passed; how many it
    /// took, for the drain rule, whether lock-server calls waited on it and
    /// whether others were busy. It goes about it as `workload` says; the
    /// lines of a batch an earlier call left are written by this one.
    fn reap_expired(
        &mut self,
        limit: usize,
        workload: Workload,
        report: Report<'_, ExpiredLease>,
    ) -> impl Future<Output = Result<Reaped, StoreError>> + Send;

    /// Others at work when the sweep began, as its first question saw them:
    /// sessions running a statement, or at least one when takeovers wait to
    /// be reported (a lock server re-acquiring expired keys); 0 when nothing
    /// had expired, or when the backend cannot tell. The first batch can
    /// already be a careful one.
    fn busy(&self) -> u32;

    /// Writes the lines of a batch still waiting for them.
    fn finish(
        &mut self,
        report: Report<'_, ExpiredLease>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Ends the reaping of expired leases.
    fn into_takeovers(self) -> Self::Takeovers;
}

/// A sweep's second and last stage: recorded takeovers, then the gauge.
pub trait TakeoverStage: Send {
    /// Drains up to `limit` recorded takeovers of expired leases, and any
    /// batch a sweeper took off the table but did not get to report (it
    /// died, or its output failed): its leases come as `reapedBy=sweep`.
    /// How many leases it reported.
    fn drain_takeovers(
        &mut self,
        limit: usize,
        report: Report<'_, ExpiredLease>,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Leases currently held (for the `lock.held.current` gauge), this
    /// sweep's deletions already subtracted. Ends the sweep.
    fn held_count(self) -> impl Future<Output = Result<i64, StoreError>> + Send;
}

/// A job queue, as the job reaper uses it.
///
/// A pass starts with `gates`: whether the gates allow reaping (with the
/// stale-lease count when they refuse, so a gated pass is that one call)
/// and whether an abandoned hand-off waits. It then calls `recover` until it
/// returns 0 if one waited (whatever the gates say now: those jobs were
/// reaped while they allowed it), `apply_batch` until a batch comes back
/// short or refused if they allow, and `stale_count` for the gauge when
/// `gates` did not give it. The reaping rules (the gates, backoff, dead
/// letters) are the queue's: `apply_batch` reads the gates again and
/// refuses, changing nothing, if they closed since.
///
/// As for leases, each reaping call writes its actions' lines through
/// `report` before their last durable record is gone (a crash can repeat a
/// line, never lose one), and releases the jobs first; several reapers may
/// run at once, and a job goes to exactly one of them.
pub trait JobQueue: Send {
    /// The `backend` tag on every line and metric.
    fn backend_id(&self) -> &'static str;

    /// The first answer of a pass.
    fn gates(&mut self) -> impl Future<Output = Result<PassStart, StoreError>> + Send;

    /// Writes the lines of one abandoned hand-off and deletes it; the number
    /// of actions, 0 when none waits.
    fn recover(
        &mut self,
        report: Report<'_, JobAction>,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Reaps at most `limit` stale jobs as `actor` (recorded on every dead
    /// letter), their lines written through `report`.
    fn apply_batch(
        &mut self,
        actor: &str,
        limit: usize,
        report: Report<'_, JobAction>,
    ) -> impl Future<Output = Result<ApplyBatch, StoreError>> + Send;

    /// Stale job leases right now.
    fn stale_count(&mut self) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// The first answer of a pass: the gates, and whether an abandoned
/// hand-off waits (`JobQueue::recover`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassStart {
    pub gates: Gates,
    pub abandoned: bool,
}

/// What the gates say at the start of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gates {
    /// All three allow reaping.
    Allow,
    /// They refuse, for `reason`; `stale` is the stale-lease count read with
    /// them.
    Refuse { reason: String, stale: u64 },
}

/// One apply call that did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyBatch {
    /// The gates allowed it and it committed.
    Applied {
        /// Jobs reaped, for the drain rule (what was reported went through
        /// `report`).
        n: usize,
        /// Other sessions at work as the batch ended (the workers; 0 when
        /// the backend cannot tell): the reaper paces a backlog while there
        /// are any.
        busy: u32,
    },
    /// The gates closed since they were read; nothing changed.
    Refused(String),
}

/// Which database work a failure interrupted: the words an operator reads
/// first in `sweep_failed` / `job_reap_failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    LockLeases,
    JobQueue,
    /// The xmin horizon check (`sweep::horizon_check`), which reads catalogs only.
    Horizon,
}

impl fmt::Display for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Work::LockLeases => "lock leases",
            Work::JobQueue => "job queue",
            Work::Horizon => "xmin horizon check",
        })
    }
}

/// The driver's error, kept as the source of a `StoreError`. Boxed so this
/// module does not name the driver.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why a store call failed. `Display` names the work, the statement and the
/// cause (scrubbed of secrets); `source()` is the driver's own error.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{work}: cannot connect to {target}: {cause} ({hint})")]
    Connect {
        work: Work,
        target: String,
        cause: String,
        /// What to check (a password, a role, a database, TLS, or whether
        /// the server is reachable at all).
        hint: &'static str,
    },
    /// Reachable, but no host is a server the services may use (every one a
    /// hot standby, say): the cause is the whole message.
    #[error("{work}: {target}: {cause}")]
    Topology {
        work: Work,
        target: String,
        cause: String,
    },
    #[error("{work}: `{query}` failed: {cause}")]
    Query {
        work: Work,
        query: &'static str,
        cause: String,
        #[source]
        source: Option<Cause>,
    },
    #[error("{work}: `{query}` returned what this version cannot read: {cause}")]
    Decode {
        work: Work,
        query: &'static str,
        cause: String,
    },
    #[error(
        "{work}: writing the signal lines to stdout failed, nothing lost: the batch stays recorded and is reported again by a later pass: {source}"
    )]
    Report {
        work: Work,
        #[source]
        source: std::io::Error,
    },
}

impl StoreError {
    /// The work that failed.
    pub fn work(&self) -> Work {
        match self {
            StoreError::Connect { work, .. }
            | StoreError::Topology { work, .. }
            | StoreError::Query { work, .. }
            | StoreError::Decode { work, .. }
            | StoreError::Report { work, .. } => *work,
        }
    }
}
