//! StatsD faults: a port nobody listens on and a host that does not resolve
//! never slow or stop the sweep, and the counts of committed batches reach
//! StatsD while a long drain is still running.
//!
//! It does not cover the counts a killed process already sent
//! (`faults::signals`). Each test prints its `FIGURES` line (`--nocapture`)
//! for docs/reliability.md.

use std::time::{Duration, Instant};

use lease_sweeper::testing::lock_sweeper::BATCH_SIZE;
use lease_sweeper::testing::sweep::SWEEP_DELAY;

use crate::faults::support::{
    SWEEPER_BACKENDS_WAITING, error_lines, hold_commit_of_batch_deleting, leases,
    release_held_commit, reported, reported_with_prefix, wait_output, wait_sql,
};
use crate::support::{Daemon, StatsdCapture, TestDb, count, daemon_env, events, insert_expired};

/// How overdue the leases of the StatsD scenarios are when inserted.
const INSERTED_OVERDUE_MS: i64 = 10;

/// What a healthy daemon may add to `SWEEP_DELAY` before a lease is reported:
/// the rest of the pass in flight when the lease expired (milliseconds on
/// these tables), a StatsD flush that must not wait on anything, and the
/// scheduling delay of a 2-core machine running other builds. A flush that
/// waited on a DNS lookup (2 s) or a send timeout would exceed it.
const REPORT_SLACK: Duration = Duration::from_millis(1_000);

/// One StatsD failure mode: the daemon sweeps three rounds of leases as if
/// nothing were wrong: each lease is reported within one sweep delay plus
/// `REPORT_SLACK` of expiring, by the database's clock (`overdueMillis`);
/// it stays up, warns at most once, and stops promptly.
async fn sweeps_unaffected_with_statsd_at(host: &str, port: &str) -> (usize, Vec<u128>, Duration) {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let mut daemon = Daemon::spawn(&[
        ("LOCKDB_URL", db.url.as_str()),
        ("STATSD_HOST", host),
        ("STATSD_PORT", port),
    ]);
    let mut latencies = Vec::new();
    for round in 0..3 {
        let prefix: &'static str = ["r0-", "r1-", "r2-"][round];
        insert_expired(&mut conn, prefix, 10, INSERTED_OVERDUE_MS).await;
        let t = Instant::now();
        wait_output(&daemon, Duration::from_secs(10), "the round's lines", |l| {
            reported_with_prefix(l, prefix).len() == 10
        })
        .await;
        latencies.push(t.elapsed().as_millis());
    }
    assert!(daemon.child.try_wait().unwrap().is_none(), "stays up");
    daemon.signal(libc::SIGTERM);
    let (code, took) = daemon.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code, Some(0));
    let lines = daemon.lines();
    assert_eq!(reported(&lines, false).len(), 30, "every line, once");
    // overdueMillis is the database's now() at the deleting transaction less
    // the deadline, so it is exact whatever the test's own timing: a lease
    // that expired just after a sweep began waits out that pass and one
    // SWEEP_DELAY, never more.
    let bound = INSERTED_OVERDUE_MS + (SWEEP_DELAY + REPORT_SLACK).as_millis() as i64;
    for f in events(&lines, "lease_expired") {
        let overdue: i64 = f["overdueMillis"].parse().unwrap();
        assert!(
            (INSERTED_OVERDUE_MS..=bound).contains(&overdue),
            "reported {overdue} ms after expiry, beyond one sweep delay ({} ms) plus \
             {} ms slack: StatsD slowed the sweep: {f:?}",
            SWEEP_DELAY.as_millis(),
            REPORT_SLACK.as_millis()
        );
    }
    assert!(error_lines(&lines).is_empty(), "{lines:#?}");
    let warnings = events(&lines, "statsd_unavailable");
    assert!(warnings.len() <= 1, "not a flood: {warnings:#?}");
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
    (warnings.len(), latencies, took)
}

#[tokio::test]
async fn no_listener_never_slows_the_sweep() {
    let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port().to_string();
    drop(closed);
    let (warnings, latencies, stop) = sweeps_unaffected_with_statsd_at("127.0.0.1", &port).await;
    eprintln!(
        "FIGURES statsd_closed_port: statsd_unavailable_warnings={warnings} \
         expiry_to_line_ms={latencies:?} stop={}ms",
        stop.as_millis()
    );
}

#[tokio::test]
async fn unresolvable_host_warned_once() {
    let (warnings, latencies, stop) =
        sweeps_unaffected_with_statsd_at("statsd.invalid", "8125").await;
    assert_eq!(warnings, 1, "the failure is reported once");
    assert!(stop < Duration::from_secs(5), "stop took {stop:?}");
    eprintln!(
        "FIGURES statsd_unresolvable: statsd_unavailable_warnings={warnings} \
         expiry_to_line_ms={latencies:?} stop={}ms",
        stop.as_millis()
    );
}

#[tokio::test]
/// Counts used to sit in the buffer until the whole drain ended: a SIGKILL
/// mid-drain lost 95,000 committed counts. Now each batch's count is sent
/// right after its commit.
async fn committed_counts_arrive_mid_drain() {
    const MARKER: &str = "slow-15001";
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "slow-", 30_000, 60_000).await;
    hold_commit_of_batch_deleting(&mut conn, &db, MARKER).await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    wait_sql(
        &mut conn,
        &db,
        SWEEPER_BACKENDS_WAITING,
        "the drain to pause",
        |n| n == 1,
    )
    .await;
    // Committed: neither in the table nor in a hand-off whose lines wait.
    let committed = 30_000 - leases(&mut conn).await.len() as i64;
    assert!(
        committed >= BATCH_SIZE as i64,
        "batches committed before the pause"
    );

    let waited = Instant::now();
    let arrived = tokio::time::timeout(Duration::from_secs(3), async {
        while statsd.counter("lock.lease.expired", "#backend:pg") < committed as u64 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let counted = statsd.counter("lock.lease.expired", "#backend:pg");
    release_held_commit(&mut conn).await;
    let _ = daemon.stop().await;
    eprintln!(
        "FIGURES statsd_mid_drain: committed={committed} counted_within_{}ms={counted}",
        waited.elapsed().as_millis()
    );
    assert!(
        arrived.is_ok(),
        "{committed} leases committed and reported, {counted} counted after 3 s"
    );
}
