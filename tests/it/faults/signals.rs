//! SIGKILL and SIGTERM against the real binary mid-drain: a kill inside the
//! crash window (lines flushed, their hand-off not yet deleted), a graceful stop
//! mid-drain, and a stop while a COMMIT hangs. Each proves nothing deleted
//! goes unreported and a duplicate only repeats the one uncommitted batch.
//!
//! It does not cover the database going away (`faults::outage`) or StatsD
//! (`faults::statsd`). Each test prints its `FIGURES` line (`--nocapture`)
//! for docs/reliability.md.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use lease_sweeper::testing::lock_sweeper::BATCH_SIZE;

use crate::faults::support::{
    SWEEPER_BACKENDS, SWEEPER_BACKENDS_WAITING, check_reports, hold_commit_of_batch_deleting,
    lease_lines, leases, release_held_commit, reported, wait_sql,
};
use crate::support::{
    Daemon, StatsdCapture, TestDb, count, daemon_env, events, insert_expired, wait_until,
};

#[tokio::test]
async fn sigkill_mid_backlog_loses_nothing() {
    const LEASES: i64 = 200_000;
    const MARKER: &str = "backlog-100000";
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "backlog-", LEASES, 60_000).await;
    let inserted = leases(&mut conn).await;
    assert_eq!(inserted.len(), LEASES as usize);
    hold_commit_of_batch_deleting(&mut conn, &db, MARKER).await;

    let statsd_a = StatsdCapture::start().await;
    let port_a = statsd_a.port.to_string();
    let started = Instant::now();
    let mut a = Daemon::spawn(&daemon_env(&db.url, &port_a));
    wait_until(Duration::from_secs(60), "the marker's line", || async {
        a.count_lines(|l| l.contains(" lockKey=backlog-100000 ")) > 0
    })
    .await;
    let held = Instant::now();
    wait_sql(
        &mut conn,
        &db,
        SWEEPER_BACKENDS_WAITING,
        "the commit to wait",
        |n| n == 1,
    )
    .await;
    a.signal(libc::SIGKILL);
    let (code, _) = a.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code, None, "killed by a signal");
    wait_sql(
        &mut conn,
        &db,
        SWEEPER_BACKENDS,
        "the server to drop the dead client",
        |n| n == 0,
    )
    .await;
    release_held_commit(&mut conn).await;
    eprintln!(
        "crash window held open for {} ms",
        held.elapsed().as_millis()
    );

    let a_reports = reported(&a.lines(), true);
    let a_keys = check_reports("the killed sweeper", &a_reports, &inserted);
    let left = leases(&mut conn).await;
    let deleted: HashSet<&String> = inserted.keys().filter(|k| !left.contains_key(*k)).collect();
    assert!(
        !deleted.is_empty() && deleted.len() < inserted.len(),
        "killed mid-drain: {} of {LEASES} left",
        left.len()
    );
    // Nothing was deleted without its line.
    for key in &deleted {
        assert!(a_keys.contains(*key), "{key} deleted but never reported");
    }
    // The crash window: lines written and flushed, the deletion of their
    // hand-off rolled back.
    let window: HashSet<&String> = a_keys.iter().filter(|k| left.contains_key(*k)).collect();
    assert!(
        window.contains(&MARKER.to_owned()),
        "the held batch rolled back"
    );
    assert!(
        window.len() <= BATCH_SIZE,
        "{} lines of an uncommitted batch, more than one batch",
        window.len()
    );
    // Each committed batch was counted when it committed, before the kill.
    statsd_a
        .wait_counter("lock.lease.expired", "#backend:pg", deleted.len() as u64)
        .await;
    let a_counted = statsd_a.counter("lock.lease.expired", "#backend:pg");
    assert_eq!(
        a_counted,
        deleted.len() as u64,
        "exactly the committed leases"
    );

    let statsd_b = StatsdCapture::start().await;
    let port_b = statsd_b.port.to_string();
    let mut b = Daemon::spawn(&daemon_env(&db.url, &port_b));
    wait_until(
        Duration::from_secs(60),
        "the rest of the backlog",
        || async { lease_lines(&b) >= left.len() },
    )
    .await;
    let drained = started.elapsed();
    let (code, _) = b.stop().await;
    assert_eq!(code, Some(0));
    let b_reports = reported(&b.lines(), false);
    let b_keys = check_reports("the fresh replica", &b_reports, &inserted);

    let left_keys: HashSet<String> = left.keys().cloned().collect();
    assert_eq!(
        b_keys, left_keys,
        "the replica reports exactly what was left"
    );
    let union: HashSet<&String> = a_keys.union(&b_keys).collect();
    assert_eq!(union.len(), inserted.len(), "no lease lost");
    let duplicates: HashSet<&String> = a_keys.intersection(&b_keys).collect();
    assert_eq!(
        duplicates, window,
        "duplicates are exactly the crash window"
    );
    // check_reports tied every report to the lease's own token, so each
    // duplicate repeats the dedupe key lockKey+token exactly.
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
    statsd_b
        .wait_counter("lock.lease.expired", "#backend:pg", b_keys.len() as u64)
        .await;
    assert_eq!(
        statsd_b.counter("lock.lease.expired", "#backend:pg"),
        b_keys.len() as u64
    );
    eprintln!(
        "FIGURES sigkill: leases={LEASES} reported_before_kill={} committed_before_kill={} \
         crash_window_duplicates={} (same lockKey+token) replica_reported={} lost=0 \
         statsd_counted_by_killed={} total={:.1}s",
        a_keys.len(),
        deleted.len(),
        duplicates.len(),
        b_keys.len(),
        a_counted,
        drained.as_secs_f64()
    );
}

#[tokio::test]
async fn sigterm_mid_drain_exits_0_all_reported() {
    const LEASES: i64 = 100_000;
    const STOP_AFTER: usize = 10_000;
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "drain-", LEASES, 60_000).await;
    let inserted = leases(&mut conn).await;

    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    wait_until(Duration::from_secs(60), "the first lines", || async {
        lease_lines(&daemon) >= STOP_AFTER
    })
    .await;
    daemon.signal(libc::SIGTERM);
    let (code, took) = daemon.wait_exit(Duration::from_secs(10)).await;

    assert_eq!(code, Some(0), "{}", daemon.lines()[..20].join("\n"));
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let lines = daemon.lines();
    let keys = check_reports("the stopped sweeper", &reported(&lines, false), &inserted);
    let left = leases(&mut conn).await;
    let deleted: Vec<&String> = inserted.keys().filter(|k| !left.contains_key(*k)).collect();
    for key in &deleted {
        assert!(keys.contains(*key), "{key} deleted without its line");
    }
    // The batch in flight finished: nothing reported is still in the table.
    let repeated = keys.iter().filter(|k| left.contains_key(*k)).count();
    assert_eq!(repeated, 0, "a graceful stop leaves no crash window");
    assert!(!left.is_empty(), "the rest remain for the next sweeper");
    assert_eq!(deleted.len() + left.len(), LEASES as usize);
    assert_eq!(events(&lines, "sweeper_stopped").len(), 1);
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", deleted.len() as u64)
        .await;
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        deleted.len() as u64,
        "counted at shutdown, exactly"
    );
    eprintln!(
        "FIGURES sigterm: leases={LEASES} reported={} deleted={} left_for_next={} exit=0 stop_took={}ms",
        keys.len(),
        deleted.len(),
        left.len(),
        took.as_millis()
    );
}

#[tokio::test]
async fn sigterm_abandons_hung_commit_after_grace() {
    const LEASES: i64 = 20_000;
    const MARKER: &str = "hang-10000";
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "hang-", LEASES, 60_000).await;
    let inserted = leases(&mut conn).await;
    hold_commit_of_batch_deleting(&mut conn, &db, MARKER).await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut a = Daemon::spawn(&daemon_env(&db.url, &port));
    wait_sql(
        &mut conn,
        &db,
        SWEEPER_BACKENDS_WAITING,
        "the commit to hang",
        |n| n == 1,
    )
    .await;

    a.signal(libc::SIGTERM);
    let (code, took) = a.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code, Some(0), "{}", a.lines().join("\n"));
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let a_lines = a.lines();
    assert_eq!(events(&a_lines, "sweep_abandoned_at_shutdown").len(), 1);
    wait_sql(
        &mut conn,
        &db,
        SWEEPER_BACKENDS,
        "the server to drop the client",
        |n| n == 0,
    )
    .await;
    release_held_commit(&mut conn).await;
    let a_keys = check_reports("the stopped sweeper", &reported(&a_lines, false), &inserted);
    let left = leases(&mut conn).await;
    for key in inserted.keys().filter(|k| !left.contains_key(*k)) {
        assert!(a_keys.contains(key), "{key} deleted without its line");
    }
    let window: HashSet<&String> = a_keys.iter().filter(|k| left.contains_key(*k)).collect();
    assert!(window.contains(&MARKER.to_owned()) && window.len() <= BATCH_SIZE);

    let mut b = Daemon::spawn(&daemon_env(&db.url, &port));
    wait_until(Duration::from_secs(30), "the rest", || async {
        lease_lines(&b) >= left.len()
    })
    .await;
    assert_eq!(b.stop().await.0, Some(0));
    let b_keys = check_reports("the next sweeper", &reported(&b.lines(), false), &inserted);
    let duplicates: HashSet<&String> = a_keys.intersection(&b_keys).collect();
    assert_eq!(duplicates, window, "only the abandoned batch is repeated");
    assert_eq!(
        a_keys.union(&b_keys).count(),
        inserted.len(),
        "no lease lost"
    );
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
    eprintln!(
        "FIGURES sigterm_hung_commit: leases={LEASES} stop_took={}ms (grace 2000ms) \
         abandoned_batch_repeated={} lost=0",
        took.as_millis(),
        duplicates.len()
    );
}
