//! The seam between the sweeper and a lock backend.
//!
//! Owns the `LockStore` trait, the reaped-lease record and the store error
//! type. It does not own timing, logging or metrics (that is `sweeper`) nor
//! any SQL (that is `queries`, used by the PostgreSQL implementation in
//! `postgres`). An etcd backend would implement the same trait.

pub mod postgres;

use std::future::Future;

/// One lease that reached its deadline while still held.
///
/// `lock_key` + `token` is the dedupe key: after a crash between writing a
/// batch's lines and committing it, the same pair can be reported again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredLease {
    pub lock_key: String,
    pub owner_id: String,
    pub token: i64,
    /// The lease's deadline, in milliseconds since the Unix epoch.
    pub expired_at_millis: i64,
    /// How long past its deadline the lease was when it was reaped (sweep) or
    /// stolen (takeover), by the database's clock.
    pub overdue_millis: i64,
    pub reaped_by: ReapedBy,
}

/// How an expired lease left the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReapedBy {
    /// Deleted by a sweeper.
    Sweep,
    /// Stolen by a new acquire before any sweeper saw it; recorded by the
    /// backend at the moment of the steal and drained by a sweeper.
    Takeover,
}

/// What a sweep needs from a lock backend.
///
/// Each reaping method handles at most `limit` leases in one transaction and
/// calls `report` with them *before* committing; if `report` fails the batch
/// is rolled back and nothing is lost. Several replicas may call these at the
/// same time: a lease goes to exactly one of them.
pub trait LockStore: Send {
    /// The `backend` tag on every line and metric (`pg`, later `etcd`).
    fn backend_id(&self) -> &'static str;

    /// Deletes up to `limit` leases whose deadline has passed.
    fn reap_expired(
        &mut self,
        limit: usize,
        report: &mut (dyn FnMut(&[ExpiredLease]) -> std::io::Result<()> + Send),
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Drains up to `limit` recorded takeovers of expired leases.
    fn drain_takeovers(
        &mut self,
        limit: usize,
        report: &mut (dyn FnMut(&[ExpiredLease]) -> std::io::Result<()> + Send),
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Leases currently held (for the `lock.held.current` gauge).
    fn held_count(&mut self) -> impl Future<Output = Result<i64, StoreError>> + Send;
}

/// Why a store call failed. The message names the cause and never a secret.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "cannot connect to the lock database at {target}: {cause} \
         (is the server up and LOCKDB_URL right? `lease-sweeper check` tells)"
    )]
    Connect { target: String, cause: String },
    /// Reachable, but no host is a server the sweeper may use (every one a
    /// hot standby, say): the cause is the whole message.
    #[error("{target}: {cause}")]
    Topology { target: String, cause: String },
    #[error("lock database query `{query}` failed: {cause}")]
    Query { query: &'static str, cause: String },
    #[error("writing the signal lines to stdout failed, batch rolled back (nothing lost): {0}")]
    Report(#[source] std::io::Error),
}
