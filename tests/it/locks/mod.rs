//! The lock sweep against a real database: every expired lease reported
//! exactly once, alone (`sweep`), beside other sessions and sweepers
//! (`concurrent`) and when the lock server records the expiry itself
//! (`recorded`); the hand-off that keeps lines off the lock server's path,
//! the shared held-lease count, a lock server's own schema and statements,
//! the rows the schema refuses or sets aside, and the batch that falls back
//! to taking them row by row (`fallback`). Job leases are `jobs`'s; faults
//! from outside are `faults`'s.

mod bad_rows;
mod concurrent;
mod fallback;
mod handoff;
mod held_count;
mod recorded;
mod sweep;

use lease_sweeper::testing::events::{EventLog, MemoryLog};
use lease_sweeper::testing::lock_store::PgLockStore;
use lease_sweeper::testing::lock_sweeper::LockSweeper;
use lease_sweeper::testing::metrics::Metrics;

use crate::support::{StatsdCapture, TestDb, count};

/// A lock sweeper on `db` as the daemon builds one, its lines kept in memory
/// and its metrics sent to `statsd`; the metrics handle flushes them.
fn sweeper(db: &TestDb, statsd: &StatsdCapture) -> (LockSweeper<PgLockStore>, MemoryLog, Metrics) {
    let (log, lines) = EventLog::in_memory();
    let metrics = Metrics::new(statsd.target());
    (
        LockSweeper::new(PgLockStore::new(db.target()), log, metrics.clone()),
        lines,
        metrics,
    )
}

/// The sweepers' connections on this test's database.
async fn sweeper_connections(conn: &mut sqlx::PgConnection) -> i64 {
    count(
        conn,
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = 'lease-sweeper'",
    )
    .await
}

/// A stdout that refuses every line, as a closed pipe does.
struct BrokenPipe;

impl std::io::Write for BrokenPipe {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
