//! The seams between the services and their backends: `LockStore` (a
//! sweep's calls) and `JobQueue` (a reaper pass's calls), what they return,
//! and the error every call returns, scrubbed of secrets with the driver's
//! error as its source. No SQL (`pg`), no timing, logging or metrics (`sweep`).

use std::fmt;
use std::future::Future;

use crate::model::{ExpiredLease, JobAction};

/// Where a store writes a batch's lines, and whom it tells once they are
/// committed. A closure that writes lines is one that needs no telling.
pub trait Reporter<T>: Send {
    /// Writes a batch's lines and flushes them; an error means "do not
    /// commit".
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

/// A sweep's first answer (`LockStore::probe`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Probe {
    /// Some lease is past its deadline.
    pub expired: bool,
    /// Some expiry is recorded and not yet reported: a takeover, a late
    /// release, or a batch a sweeper took off the table but did not get to
    /// report (it died, or its output failed).
    pub recorded: bool,
    /// Leases held, when nothing had expired (the count then stands for the
    /// sweep); `None` when `expired`: read with `held_count` after reaping.
    pub held: Option<i64>,
    /// Revisions the backend could not read before they were gone (etcd
    /// compacted them; expiries among them go unreported), already logged
    /// by the store; counted by the sweeper.
    pub missed: u64,
}

/// A lock backend, as a sweep uses it. A sweep calls, in this order:
///
/// 1. `probe`: one cheap question. An idle sweep ends on its answer.
/// 2. While `expired`: `reap_batch`, each from where the last one left
///    off (where that is, is the store's own business), until one comes
///    back short (fewer than `limit`).
/// 3. While `recorded`: `drain_recorded`, until one comes back short.
/// 4. `held_count`, unless the probe's count stands.
///
/// A reaping call takes at most `limit` expiries, in the order they
/// happened, and makes them durable first: it records them (PostgreSQL
/// commits their deletion with a hand-off record; etcd, where the backend
/// itself deleted them, commits a claim), then calls `report` (their
/// lines, written and flushed), then retires that record. So no lock-server
/// call waits on the daemon's output, and a lease's line is written before
/// its last durable record is gone: a crash can repeat a line, never lose
/// one. If `report` fails, the record stays, and a later sweep (of any
/// replica) reports it. Several replicas may sweep at once: a lease goes to
/// exactly one of them.
pub trait LockStore: Send {
    /// The `backend` tag on every line and metric (`pg` or `etcd`).
    fn backend_id(&self) -> &'static str;

    /// What is there to do, and the held count if nothing expired.
    fn probe(&mut self) -> impl Future<Output = Result<Probe, StoreError>> + Send;

    /// One batch of expiries, reported through `report`, each batch of a
    /// pass from where the last one left off; how many it took (a lease
    /// PostgreSQL set aside is not counted, so a batch with one is short and
    /// ends the drain; an expiry another etcd sidecar claimed is).
    fn reap_batch(
        &mut self,
        limit: usize,
        report: &mut dyn Reporter<ExpiredLease>,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Why the last `reap_batch` or `drain_recorded` took its batch row by
    /// row (its one set-based statement failed: the database's message and
    /// SQLSTATE), or `None`; taken, so each batch that fell back is told
    /// once. Only PostgreSQL has such a pass.
    fn take_fallback(&mut self) -> Option<String> {
        None
    }

    /// Reports abandoned hand-offs (`reapedBy=sweep`), then recorded
    /// takeovers and late releases, about `limit` leases in all (a hand-off
    /// is reported whole); how many it reported, so a drain that comes back
    /// short has emptied the record and one that does not is called again.
    fn drain_recorded(
        &mut self,
        limit: usize,
        report: &mut dyn Reporter<ExpiredLease>,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Leases currently held (the `lock.held.current` gauge), this sweep's
    /// deletions already subtracted.
    fn held_count(&mut self) -> impl Future<Output = Result<i64, StoreError>> + Send;
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
        report: &mut dyn Reporter<JobAction>,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Reaps at most `limit` stale jobs as `actor` (recorded on every dead
    /// letter), their lines written through `report`.
    fn apply_batch(
        &mut self,
        actor: &str,
        limit: usize,
        report: &mut dyn Reporter<JobAction>,
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
        /// The driver's own error, boxed so this module does not name the
        /// driver.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
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
