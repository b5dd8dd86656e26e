//! The seam between the services and a database: the `LockStore` trait and
//! the error every store call returns.
//!
//! Owns what a lock backend must do (reap in batches, report before commit,
//! count) and how a failure is described: which work failed (lock leases or
//! job queue), which statement, and the cause, without a secret, keeping the
//! driver's error as the source. It does not own timing, logging or metrics
//! (`sweep`) nor any SQL (`pg`). An etcd backend would implement the same
//! trait.

use std::fmt;
use std::future::Future;

use crate::model::ExpiredLease;

/// Writes a batch's lines and flushes them; an error means "do not commit".
pub type Report<'a, T> = &'a mut (dyn FnMut(&[T]) -> std::io::Result<()> + Send);

/// What one reaping call took off the table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Leases taken off the table, for the drain rule (what was reported went
    /// through `report`).
    pub n: usize,
    /// Lock-server calls that were queued behind the batch when it ended: the
    /// sweep takes smaller batches while there are any.
    pub waiters: u32,
}

/// What a sweep needs from a lock backend.
///
/// Each reaping method takes at most `limit` leases off the table and calls
/// `report` with them before their last durable record is gone, so a crash
/// can repeat a line but never lose one; if `report` fails, that record
/// stays and a later call reports the leases. The leases themselves are
/// released first: nothing the lock server does waits while their lines
/// are written (`PgLockStore` commits the deletion together with a
/// hand-off row and deletes that row once the lines are out). Several
/// replicas may call these at the same time: a lease goes to exactly one of
/// them. Each returns how many leases it took, for the drain rule; what it
/// reported went through `report`.
pub trait LockStore: Send {
    /// The `backend` tag on every line and metric (`pg`, later `etcd`).
    fn backend_id(&self) -> &'static str;

    /// Deletes up to `limit` leases whose deadline has passed.
    fn reap_expired(
        &mut self,
        limit: usize,
        report: Report<'_, ExpiredLease>,
    ) -> impl Future<Output = Result<Reaped, StoreError>> + Send;

    /// Drains up to `limit` recorded takeovers of expired leases, and any
    /// batch a sweeper took off the table but did not get to report (it
    /// died, or its output failed): its leases come as `reapedBy=sweep`.
    fn drain_takeovers(
        &mut self,
        limit: usize,
        report: Report<'_, ExpiredLease>,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Leases currently held (for the `lock.held.current` gauge).
    fn held_count(&mut self) -> impl Future<Output = Result<i64, StoreError>> + Send;
}

/// Which database work a failure interrupted: the words an operator reads
/// first in `sweep_failed` / `job_reap_failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    LockLeases,
    JobQueue,
    /// The xmin horizon check (`sweep::horizon`), which reads catalogs only.
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
