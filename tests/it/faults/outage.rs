//! PostgreSQL unavailable, on a cluster of the test's own: down when the
//! daemon starts, and crashing (`-m immediate`) mid-run. Each proves the
//! daemon stays up, logs each distinct cause once, recovers by itself and
//! reports every lease that expired meanwhile.
//!
//! It does not cover the daemon itself dying (`faults::signals`). Each test
//! prints its `FIGURES` line (`--nocapture`) for docs/reliability.md.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use lease_sweeper::testing::throwaway::{StopMode, ThrowawayPg};
use sqlx::{Connection as _, PgConnection};

use crate::faults::support::{check_reports, error_lines, reported_with_prefix, wait_output};
use crate::support::{
    Daemon, NotifySocket, StatsdCapture, acquire, blocking, count, events, insert_expired,
    wait_until,
};

/// A cluster of this test's own, migrated, that it may stop and restart.
///
/// Commits are durable here (`synchronous_commit=on`, unlike the shared
/// throwaway cluster): the leases a lock server acquired just before a crash
/// must survive it, or there is nothing to report afterwards.
async fn own_cluster() -> (ThrowawayPg, String) {
    let pg = blocking(|| ThrowawayPg::start_with(&[("synchronous_commit", "on")]))
        .await
        .expect("starting a throwaway PostgreSQL");
    let url = pg.url("postgres");
    let mut conn = PgConnection::connect(&url).await.unwrap();
    lease_sweeper::testing::migrate::migrate(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    (pg, url)
}

/// Asserts that an error persisting across many sweeps was logged once per
/// distinct cause, never repeated (the repeat interval is 60 s).
fn assert_no_error_flood(lines: &[String]) -> usize {
    let errors = error_lines(lines);
    let distinct: HashSet<&(String, String)> = errors.iter().collect();
    assert_eq!(
        distinct.len(),
        errors.len(),
        "an unchanged error was logged twice: {errors:#?}"
    );
    errors.len()
}

/// How many failing passes of each loop an outage lasts at least (counted by
/// the watchdog pings, since a failing pass sends no gauge).
const OUTAGE_PASSES: usize = 3;

/// What recovering from an outage looked like.
struct Recovery {
    pg: ThrowawayPg,
    /// How long PostgreSQL took to accept connections again.
    restart: Duration,
    /// From PostgreSQL ready to every lease of the outage reported.
    after_ready: Duration,
    lines: Vec<String>,
    /// Distinct leases of the outage the daemon reported.
    reported: usize,
    /// ERROR lines in the whole run.
    error_lines: usize,
}

/// Restarts PostgreSQL after an outage and holds the daemon to recovering by
/// itself: every lease in `meanwhile` is reported, `sweep_recovered` is
/// logged, SIGTERM still exits 0, errors did not flood and no row is left.
async fn restart_and_recover(
    mut pg: ThrowawayPg,
    daemon: &mut Daemon,
    url: &str,
    meanwhile: &HashMap<String, i64>,
) -> Recovery {
    let restarted = Instant::now();
    pg = blocking(move || {
        pg.start_again().expect("restarting PostgreSQL");
        pg
    })
    .await;
    let restart = restarted.elapsed();
    wait_output(
        daemon,
        Duration::from_secs(15),
        "the leases that expired meanwhile",
        |l| reported_with_prefix(l, "meanwhile-").len() == meanwhile.len(),
    )
    .await;
    let after_ready = restarted.elapsed() - restart;
    daemon
        .wait_for_event("sweep_recovered", Duration::from_secs(5))
        .await;
    let (code, _) = daemon.stop().await;
    assert_eq!(code, Some(0));

    let lines = daemon.lines();
    let keys = check_reports(
        "the daemon",
        &reported_with_prefix(&lines, "meanwhile-"),
        meanwhile,
    );
    assert_eq!(keys.len(), meanwhile.len());
    let error_lines = assert_no_error_flood(&lines);
    let mut conn = PgConnection::connect(url).await.unwrap();
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
    Recovery {
        pg,
        restart,
        after_ready,
        lines,
        reported: keys.len(),
        error_lines,
    }
}

#[tokio::test]
async fn down_at_start_logged_once_and_recovered() {
    let (mut pg, url) = own_cluster().await;
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let meanwhile = acquire(&mut conn, "meanwhile-", 20, 500).await;
    conn.close().await.unwrap();
    pg = blocking(move || {
        pg.stop(StopMode::Fast);
        pg
    })
    .await;

    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let notify = NotifySocket::bind();
    let mut daemon = Daemon::spawn(&notify.daemon_env(&url, &port));
    daemon
        .wait_for_event("sweep_failed", Duration::from_secs(10))
        .await;
    notify.wait_watchdogs(OUTAGE_PASSES).await; // the outage: sweeps keep failing
    assert!(daemon.child.try_wait().unwrap().is_none(), "stays up");
    let lines = daemon.lines();
    let failed = events(&lines, "sweep_failed");
    assert_eq!(failed.len(), 1, "{lines:#?}");
    assert_eq!(failed[0]["level"], "error");
    assert!(
        failed[0]["error"].starts_with("lock leases: cannot connect to")
            && failed[0]["error"].contains("No such file or directory"),
        "the real cause, not a pool timeout: {:?}",
        failed[0]["error"]
    );

    let r = restart_and_recover(pg, &mut daemon, &url, &meanwhile).await;
    let recovered = &events(&r.lines, "sweep_recovered")[0];
    eprintln!(
        "FIGURES db_down_at_start: leases_expired_meanwhile={} reported={} failed_sweeps={} \
         error_lines={} down_for={}ms recovery_after_ready={}ms",
        meanwhile.len(),
        r.reported,
        recovered["failedSweeps"],
        r.error_lines,
        recovered["downMillis"],
        r.after_ready.as_millis()
    );
    drop(r.pg);
}

#[tokio::test]
async fn crash_mid_run_survived_nothing_lost() {
    let (mut pg, url) = own_cluster().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let notify = NotifySocket::bind();
    let mut daemon = Daemon::spawn(&notify.daemon_env(&url, &port));
    let mut conn = PgConnection::connect(&url).await.unwrap();
    insert_expired(&mut conn, "before-", 5, 10).await;
    wait_until(Duration::from_secs(10), "the first sweep", || async {
        reported_with_prefix(&daemon.lines(), "before-").len() == 5
    })
    .await;
    // Live for 2 s: still live when the server goes down (even on a loaded
    // machine), expired long before it comes back.
    const TTL: Duration = Duration::from_millis(2_000);
    let acquired = tokio::time::Instant::now();
    let meanwhile = acquire(&mut conn, "meanwhile-", 20, TTL.as_millis() as i64).await;
    drop(conn);
    pg = blocking(move || {
        pg.stop(StopMode::Immediate);
        pg
    })
    .await;
    assert!(
        reported_with_prefix(&daemon.lines(), "meanwhile-").is_empty(),
        "still live when the server crashed"
    );
    daemon
        .wait_for_event("sweep_failed", Duration::from_secs(10))
        .await;
    notify.wait_watchdogs(OUTAGE_PASSES).await; // the outage: sweeps keep failing
    // Not a wait for sweeps: the leases must have expired before the server
    // is back, so they are reported as having expired meanwhile.
    tokio::time::sleep_until(acquired + TTL).await;
    assert!(daemon.child.try_wait().unwrap().is_none(), "stays up");

    let r = restart_and_recover(pg, &mut daemon, &url, &meanwhile).await;
    let failed = events(&r.lines, "sweep_failed");
    assert!(
        (1..=3).contains(&failed.len()),
        "one line per distinct cause (broken connection, refused, starting up): {failed:#?}"
    );
    assert!(failed.iter().all(|f| f["level"] == "error"));
    let recovered = &events(&r.lines, "sweep_recovered")[0];
    eprintln!(
        "FIGURES db_crash_mid_run: leases_expired_meanwhile={} reported={} failed_sweeps={} \
         error_lines={} (sweep_failed={}) down_for={}ms postgres_restart={}ms \
         recovery_after_ready={}ms",
        meanwhile.len(),
        r.reported,
        recovered["failedSweeps"],
        r.error_lines,
        failed.len(),
        recovered["downMillis"],
        r.restart.as_millis(),
        r.after_ready.as_millis()
    );
    for (event, error) in error_lines(&r.lines) {
        eprintln!("  error line: {event}: {error}");
    }
    drop(r.pg);
}
