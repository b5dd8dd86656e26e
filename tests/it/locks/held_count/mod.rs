//! The shared held-lease count behind `lock.held.current`: one recount per
//! interval for a whole fleet, read by every daemon with one probe; lowered
//! by every sweep at once (on the sweeping daemon in the same pass, on every
//! other at its next reading), by exactly the leases the count included,
//! never by a batch that rolled back, never twice; the lock server's work
//! shown once the count is older than its max age; and never a wait on
//! another daemon, recounting or stuck in its batch.
//!
//! `recount` proves the count's rules (one recount a fleet, never waited
//! for, the lock server's work seen after the max age, an idle pass one
//! probe); `lowered` proves how sweeps lower it.

mod lowered;
mod recount;

use std::time::Duration;

use lease_sweeper::testing::lock_entry::HELD_COUNT_MAX_AGE;
use lease_sweeper::testing::lock_store::PgLockStore;
use lease_sweeper::testing::lock_sweeper::LockSweeper;
use lease_sweeper::testing::metrics::Metrics;
use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;

use super::sweeper;
use crate::support::{StatsdCapture, TestDb, count, wait_until};

pub(super) async fn live(conn: &mut PgConnection, prefix: &str, n: i64) {
    sqlx::query(
        "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
         SELECT $1 || i, 'owner', nextval('lock_fencing_token_seq'), now() + interval '1 hour'
           FROM generate_series(1, $2) AS i",
    )
    .bind(prefix)
    .bind(n)
    .execute(conn)
    .await
    .unwrap();
}

pub(super) async fn recounts(conn: &mut PgConnection) -> i64 {
    count(conn, "SELECT recounts FROM lock_held_count").await
}

/// Makes the stored count older than the interval, as time passing would.
pub(super) async fn age_the_count(conn: &mut PgConnection) {
    age_the_count_by(conn, HELD_COUNT_MAX_AGE.as_millis() as i64 + 1_000).await;
}

pub(super) async fn age_the_count_by(conn: &mut PgConnection, ms: i64) {
    sqlx::query(
        "UPDATE lock_held_count SET counted_at = counted_at - $1 * interval '1 millisecond'",
    )
    .bind(ms)
    .execute(conn)
    .await
    .unwrap();
}

/// Batches recorded since the last recount, and the leases they subtract.
pub(super) async fn deltas(conn: &mut PgConnection) -> (i64, i64) {
    sqlx::query_as("SELECT count(*), coalesce(sum(n), 0)::bigint FROM lock_held_delta")
        .fetch_one(conn)
        .await
        .unwrap()
}

pub(super) async fn held_now(conn: &mut PgConnection) -> i64 {
    count(conn, "SELECT count(*) FROM lock_entry").await
}

/// `held_count`'s answer (held, recounted) when that call recounted.
pub(super) fn recounted(held: i64) -> (i64, bool) {
    (held, true)
}

/// `held_count`'s answer (held, recounted) when that call read the stored
/// count.
pub(super) fn stored(held: i64) -> (i64, bool) {
    (held, false)
}

/// One daemon's lock sweep with its own StatsD listener, so each daemon's
/// gauge can be read on its own.
pub(super) struct Replica {
    sweeper: LockSweeper<PgLockStore>,
    metrics: Metrics,
    statsd: StatsdCapture,
}

impl Replica {
    pub(super) async fn new(db: &TestDb) -> Self {
        let statsd = StatsdCapture::start().await;
        let (sweeper, _, metrics) = sweeper(db, &statsd);
        Self {
            sweeper,
            metrics,
            statsd,
        }
    }

    /// One pass, its gauge flushed as the daemon's loop does: (swept, held,
    /// the gauge StatsD received).
    pub(super) async fn pass(&mut self) -> (u64, i64, u64) {
        let outcome = self
            .sweeper
            .sweep_once(&CancellationToken::new())
            .await
            .unwrap();
        let held = outcome.held.expect("a finished pass reports the gauge");
        let before = self.statsd.lines().len();
        self.metrics.flush();
        wait_until(Duration::from_secs(10), "the gauge datagram", || async {
            self.statsd.lines()[before..]
                .iter()
                .any(|l| l.starts_with("lock.held.current:"))
        })
        .await;
        let gauge = self
            .statsd
            .gauge("lock.held.current", "#backend:pg")
            .unwrap();
        (outcome.swept, held, gauge)
    }
}
