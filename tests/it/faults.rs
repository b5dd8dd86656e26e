//! Faults against the real binary, a real PostgreSQL and real UDP: crashes,
//! graceful stops mid-drain, a database that is down or crashes, row locks
//! held for a long time, a StatsD agent that is gone, and a host clock that is
//! wrong.
//!
//! Each test checks the accounting invariant: every lease deleted or taken
//! over is reported at least once, nothing is reported that did not expire,
//! and a duplicate only ever repeats the same `lockKey`+`token` from a crash
//! window. Each prints its measured figures (`eprintln!`, shown with
//! `--nocapture`) so docs/reliability.md can quote them.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use lease_sweeper::testing::lock_sweeper::BATCH_SIZE;
use lease_sweeper::testing::sweep::SWEEP_DELAY;
use lease_sweeper::testing::throwaway::{StopMode, ThrowawayPg};
use sqlx::{Connection as _, PgConnection};

use crate::support::{
    Daemon, NotifySocket, StatsdCapture, TestDb, acquire, blocking, count, daemon_env, events,
    insert_expired, open_gates, wait_until,
};

/// `(lockKey, token)` of every `lease_expired` line, in output order.
///
/// Every line must decode, except that a process killed with SIGKILL may have
/// left its very last line half-written (`allow_torn_tail`); that line's
/// batch was never committed, so the next sweeper reports it again.
fn reported(lines: &[String], allow_torn_tail: bool) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(pairs) = lease_sweeper::testing::logfmt::decode_line(line) else {
            assert!(
                allow_torn_tail && i + 1 == lines.len(),
                "line {i} of {} does not decode: {line:?}",
                lines.len()
            );
            eprintln!("torn last line after SIGKILL ({} bytes)", line.len());
            continue;
        };
        let f: HashMap<String, String> = pairs.into_iter().collect();
        if f.get("message").map(String::as_str) == Some("lease_expired") {
            assert_eq!(f["level"], "warn", "{line}");
            out.push((f["lockKey"].clone(), f["token"].parse().expect("token")));
        }
    }
    out
}

/// Cheap count of signal lines, for polling while 100,000s of lines arrive.
fn lease_lines(daemon: &Daemon) -> usize {
    daemon.count_lines(|l| l.contains(" message=lease_expired "))
}

/// Every lease in the table: key → token.
async fn leases(conn: &mut PgConnection) -> HashMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>("SELECT lock_key, token FROM lock_entry")
        .fetch_all(conn)
        .await
        .expect("reading lock_entry")
        .into_iter()
        .collect()
}

/// Asserts that each report names an inserted lease with its own token, and
/// that one process never reports the same lease twice. Returns the keys.
fn check_reports(
    who: &str,
    reports: &[(String, i64)],
    inserted: &HashMap<String, i64>,
) -> HashSet<String> {
    let mut keys = HashSet::with_capacity(reports.len());
    for (key, token) in reports {
        assert_eq!(
            inserted.get(key),
            Some(token),
            "{who} reported {key:?}/{token}, which was never an expired lease"
        );
        assert!(keys.insert(key.clone()), "{who} reported {key:?} twice");
    }
    keys
}

/// Holds the COMMIT of the batch that deletes `key` until the test releases
/// advisory lock 4242: a deferred constraint trigger runs at commit time,
/// after the daemon has written and flushed that batch's lines. Killing the
/// daemon then is the crash window, hit deterministically rather than by luck.
/// `client_connection_check_interval` lets the server notice the dead client
/// while it waits and roll the batch back, as it would after a host crash.
async fn hold_commit_of_batch_deleting(conn: &mut PgConnection, db: &TestDb, key: &str) {
    sqlx::raw_sql(
        "CREATE FUNCTION test_hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE CONSTRAINT TRIGGER test_crash_window AFTER DELETE ON lock_entry
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
           WHEN (OLD.lock_key = '{key}') EXECUTE FUNCTION test_hold_commit();
         ALTER DATABASE {} SET client_connection_check_interval = '100ms';
         SELECT pg_advisory_lock(4242);",
        db.name
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
}

async fn release_held_commit(conn: &mut PgConnection) {
    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(conn)
        .await
        .unwrap();
}

/// Polls a one-number query (bound to `db`'s name as `$1`) every 20 ms
/// until `ok` accepts its value.
async fn wait_sql(
    conn: &mut PgConnection,
    db: &TestDb,
    sql: &'static str,
    what: &str,
    ok: impl Fn(i64) -> bool,
) {
    crate::support::poll(Duration::from_secs(20), what, async || {
        let v: i64 = sqlx::query_scalar(sql)
            .bind(&db.name)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        if ok(v) {
            Ok(())
        } else {
            Err(format!("last {v}"))
        }
    })
    .await
}

/// The daemon's connections (its `application_name`) to the test database.
const SWEEPER_BACKENDS: &str = "SELECT count(*) FROM pg_stat_activity
  WHERE datname = $1 AND application_name = 'lease-sweeper'";
/// Those of them waiting on a lock.
const SWEEPER_BACKENDS_WAITING: &str = "SELECT count(*) FROM pg_stat_activity
  WHERE datname = $1 AND application_name = 'lease-sweeper' AND wait_event_type = 'Lock'";

#[tokio::test]
async fn sigkill_mid_backlog_then_a_fresh_replica_loses_nothing_and_repeats_at_most_one_batch() {
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
    // The crash window: lines written and flushed, batch rolled back.
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
async fn sigterm_mid_drain_exits_0_within_5s_and_leaves_no_deleted_lease_unreported() {
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

/// Every diagnostic line at ERROR, as (event, error text).
fn error_lines(lines: &[String]) -> Vec<(String, String)> {
    lines
        .iter()
        .map(|l| crate::support::fields(l))
        .filter(|f| f.get("level").map(String::as_str) == Some("error"))
        .map(|f| {
            (
                f.get("message").cloned().unwrap_or_default(),
                f.get("error").cloned().unwrap_or_default(),
            )
        })
        .collect()
}

/// Reports of leases whose key starts with `prefix`.
fn reported_with_prefix(lines: &[String], prefix: &str) -> Vec<(String, i64)> {
    reported(lines, false)
        .into_iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .collect()
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

/// Waits until `ok` holds for the daemon's output; on timeout, fails with
/// that output so the cause is visible.
async fn wait_output(
    daemon: &Daemon,
    timeout: Duration,
    what: &str,
    ok: impl Fn(&[String]) -> bool,
) {
    crate::support::poll(timeout, what, || async {
        let lines = daemon.lines();
        if ok(&lines) {
            Ok(())
        } else {
            Err(format!("daemon output:\n{}", lines.join("\n")))
        }
    })
    .await
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
async fn a_database_down_at_start_is_logged_once_with_its_cause_and_recovered_from_by_itself() {
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
async fn postgres_crashing_mid_run_is_survived_and_leases_that_expired_meanwhile_are_reported() {
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

/// The sweeper's backends of `db` that are blocked on a lock right now.
async fn blocked_sweepers(conn: &mut PgConnection, db: &TestDb) -> i64 {
    sqlx::query_scalar(SWEEPER_BACKENDS_WAITING)
        .bind(&db.name)
        .fetch_one(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn expired_leases_row_locked_by_another_session_are_skipped_not_waited_on_and_reported_once_released()
 {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "free-", 30, 1_000).await;
    insert_expired(&mut conn, "held-", 10, 1_000).await;
    let mut inserted = leases(&mut conn).await;
    // A session (a stuck admin query, a lock server mid-acquire) holds the
    // row locks of ten expired leases and does not let go.
    let mut locker = db.connect().await;
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    let locked: Vec<String> = sqlx::query_scalar(
        "SELECT lock_key FROM lock_entry WHERE lock_key LIKE 'held-%' FOR UPDATE",
    )
    .fetch_all(&mut locker)
    .await
    .unwrap();
    assert_eq!(locked.len(), 10);
    let locked_at = Instant::now();

    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let a = Daemon::spawn(&daemon_env(&db.url, &port));
    let b = Daemon::spawn(&daemon_env(&db.url, &port));
    let both = |prefix: &'static str| {
        let (a, b) = (&a, &b);
        move || {
            let mut r = reported_with_prefix(&a.lines(), prefix);
            r.extend(reported_with_prefix(&b.lines(), prefix));
            r.len()
        }
    };
    let free = both("free-");
    wait_until(Duration::from_secs(10), "the unlocked leases", || async {
        free() == 30
    })
    .await;
    // Later expiries keep being reported while the locks are held: the
    // replicas go on sweeping instead of queueing behind the locked rows.
    let mut later_latencies = Vec::new();
    for round in 0..3 {
        let prefix: &'static str = ["later0-", "later1-", "later2-"][round];
        // The tokens as inserted: a replica may reap one before a read-back.
        inserted.extend(insert_expired(&mut conn, prefix, 5, 10).await);
        let t = Instant::now();
        let later = both(prefix);
        wait_until(Duration::from_secs(10), "later leases", || async {
            later() == 5
        })
        .await;
        later_latencies.push(t.elapsed().as_millis());
        assert_eq!(
            blocked_sweepers(&mut conn, &db).await,
            0,
            "no sweeper waits on a row lock"
        );
    }
    assert_eq!(both("held-")(), 0, "locked rows are skipped while locked");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM lock_entry WHERE lock_key LIKE 'held-%'"
        )
        .await,
        10
    );
    let held_for = locked_at.elapsed();

    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    let released = Instant::now();
    let held = both("held-");
    wait_until(Duration::from_secs(10), "the released leases", || async {
        held() == 10
    })
    .await;
    let after_release = released.elapsed();

    let (mut a, mut b) = (a, b);
    a.signal(libc::SIGTERM);
    b.signal(libc::SIGTERM);
    assert_eq!(a.wait_exit(Duration::from_secs(10)).await.0, Some(0));
    assert_eq!(b.wait_exit(Duration::from_secs(10)).await.0, Some(0));
    let mut all = reported(&a.lines(), false);
    all.extend(reported(&b.lines(), false));
    let keys = check_reports("the two replicas", &all, &inserted);
    assert_eq!(
        keys.len(),
        30 + 10 + 15,
        "each lease exactly once across replicas"
    );
    assert!(error_lines(&a.lines()).is_empty() && error_lines(&b.lines()).is_empty());
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
    eprintln!(
        "FIGURES row_locks: leases=55 locked=10 replicas=2 locks_held_for={}ms \
         later_expiries_reported_within_ms={later_latencies:?} blocked_sweepers=0 \
         locked_reported_after_release_within={}ms duplicates=0",
        held_for.as_millis(),
        after_release.as_millis()
    );
}

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
async fn a_statsd_port_with_no_listener_never_slows_or_stops_the_sweep() {
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
async fn an_unresolvable_statsd_host_is_warned_about_once_and_never_slows_or_stops_the_sweep() {
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

/// Set to `1` to skip the host-clock test where libfaketime is missing; without
/// it, a missing libfaketime fails that test.
const SKIP_FAKETIME: &str = "LEASE_SWEEPER_SKIP_FAKETIME";

/// libfaketime's preload library, where Debian's `faketime` package puts it.
fn libfaketime() -> Option<std::path::PathBuf> {
    let mut candidates: Vec<std::path::PathBuf> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketime.so.1"))
        .collect();
    candidates.push("/usr/lib/faketime/libfaketime.so.1".into());
    candidates.push("/usr/local/lib/faketime/libfaketime.so.1".into());
    candidates.into_iter().find(|p| p.is_file())
}

/// Milliseconds since the Unix epoch of an RFC 3339 UTC `ts` such as
/// `2026-11-29T20:45:58.123Z`.
fn ts_millis(ts: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| ts[r].parse::<i64>().expect("ts digits");
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 24 + n(11..13)) * 60 + n(14..16)) * 60_000 + n(17..19) * 1000 + n(20..23)
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Runs the real binary with its host clock shifted by `shift` (libfaketime
/// syntax) against leases live for 30 more minutes, leases 5 s overdue and
/// leases 30 min overdue. Returns (host clock skew seen, overdue reported).
async fn sweep_under_faketime(lib: &std::path::Path, shift: &str, skew_ms: i64) -> (i64, Vec<i64>) {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let live = acquire(&mut conn, "live-", 10, 1_800_000).await;
    let inserted_at = Instant::now();
    insert_expired(&mut conn, "recent-", 5, 5_000).await;
    insert_expired(&mut conn, "old-", 5, 1_800_000).await;
    let deadlines: HashMap<String, i64> = sqlx::query_as(
        "SELECT lock_key, floor(extract(epoch FROM expires_at) * 1000)::bigint FROM lock_entry",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let lib = lib.to_string_lossy().into_owned();
    let mut env = daemon_env(&db.url, &port);
    env.extend([("LD_PRELOAD", lib.as_str()), ("FAKETIME", shift)]);
    let mut daemon = Daemon::spawn(&env);
    wait_output(
        &daemon,
        Duration::from_secs(15),
        "the expired leases",
        |l| reported(l, false).len() == 10,
    )
    .await;
    let first = crate::support::fields(&daemon.lines()[0]);
    let seen_skew = ts_millis(&first["ts"]) - now_millis();
    assert!(
        (seen_skew - skew_ms).abs() < 60_000,
        "faketime {shift} did not take effect: the daemon's clock is off by {seen_skew} ms"
    );
    // The gauge sent after that sweep counts the live leases it left.
    wait_until(
        Duration::from_secs(10),
        "a gauge of the live leases",
        || async { statsd.gauge("lock.held.current", "#backend:pg") == Some(10) },
    )
    .await;
    assert_eq!(daemon.stop().await.0, Some(0));
    let since_insert = inserted_at.elapsed().as_millis() as i64;

    let lines = daemon.lines();
    let mut overdue = Vec::new();
    for f in events(&lines, "lease_expired") {
        let key = &f["lockKey"];
        assert!(!key.starts_with("live-"), "deleted a live lease: {f:?}");
        assert_eq!(f["expiredAtMillis"], deadlines[key].to_string(), "{f:?}");
        let ago = if key.starts_with("recent-") {
            5_000
        } else {
            1_800_000
        };
        let o: i64 = f["overdueMillis"].parse().unwrap();
        assert!(
            (ago..=ago + since_insert + 1_000).contains(&o),
            "overdueMillis {o} for a lease {ago} ms overdue (by the database): {f:?}"
        );
        overdue.push(o);
    }
    assert_eq!(overdue.len(), 10);
    assert_eq!(leases(&mut conn).await, live, "every live lease untouched");
    (seen_skew, overdue)
}

#[tokio::test]
async fn a_host_clock_an_hour_ahead_or_behind_never_deletes_a_live_lease_and_reports_database_overdue()
 {
    let Some(lib) = libfaketime() else {
        // A missing tool must not pass as a proof: skipping is a choice the
        // runner states, never a default.
        assert!(
            std::env::var_os(SKIP_FAKETIME).is_some_and(|v| v == "1"),
            "libfaketime is not installed, so the host-clock test cannot run: \
             install it (apt-get install faketime), or set {SKIP_FAKETIME}=1 to skip this test"
        );
        eprintln!("SKIPPED: libfaketime not installed and {SKIP_FAKETIME}=1");
        return;
    };
    for (shift, skew) in [("+1h", 3_600_000), ("-1h", -3_600_000)] {
        let (seen, overdue) = sweep_under_faketime(&lib, shift, skew).await;
        eprintln!(
            "FIGURES clock {shift}: host_clock_skew={seen}ms live_deleted=0 \
             overdueMillis(5 s and 30 min overdue)={overdue:?}"
        );
    }
}

#[tokio::test]
async fn sigterm_while_a_commit_hangs_abandons_it_after_the_grace_and_the_next_sweeper_repeats_only_that_batch()
 {
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

#[tokio::test]
/// Counts used to sit in the buffer until the whole drain ended: a SIGKILL
/// mid-drain lost 95,000 committed counts. Now each batch's count is sent
/// right after its commit.
async fn counts_of_committed_batches_reach_statsd_while_a_long_drain_is_still_running() {
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
    let committed = 30_000 - count(&mut conn, "SELECT count(*) FROM lock_entry").await;
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

#[tokio::test]
async fn a_job_whose_lease_expires_on_two_attempts_is_reported_twice_with_one_job_id_and_distinct_attempts()
 {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    open_gates(&mut conn).await;
    let job: String = sqlx::query_scalar(
        "INSERT INTO job_queue (job_kind, state, attempts, max_attempts, lease_owner, lease_until)
         VALUES ('twice', 'leased', 0, 5, 'worker-1', now() - interval '1 s') RETURNING job_id::text",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    wait_output(&daemon, Duration::from_secs(10), "the first reap", |l| {
        events(l, "job_lease_expired").len() == 1
    })
    .await;
    // A worker claims it again (its backoff skipped) and dies again.
    sqlx::query(
        "UPDATE job_queue SET state = 'leased', lease_owner = 'worker-2',
                lease_until = now() - interval '1 s', scheduled_at = now()
          WHERE job_id = $1::uuid",
    )
    .bind(&job)
    .execute(&mut conn)
    .await
    .unwrap();
    wait_output(&daemon, Duration::from_secs(10), "the second reap", |l| {
        events(l, "job_lease_expired").len() == 2
    })
    .await;
    assert_eq!(daemon.stop().await.0, Some(0));
    let lines = daemon.lines();
    let reaped: Vec<(String, String, String)> = events(&lines, "job_lease_expired")
        .iter()
        .map(|f| {
            (
                f["jobId"].clone(),
                f["attempts"].clone(),
                f["leaseOwner"].clone(),
            )
        })
        .collect();
    // Two real expiries of one job: a consumer deduplicating by jobId alone
    // would drop the second; jobId + attempts tells them apart.
    assert_eq!(
        reaped,
        vec![
            (job.clone(), "1".to_owned(), "worker-1".to_owned()),
            (job.clone(), "2".to_owned(), "worker-2".to_owned()),
        ]
    );
}

#[tokio::test]
async fn takeovers_recorded_while_no_sweeper_ran_are_drained_in_batches_by_the_first_to_start() {
    const STOLEN: i64 = 12_000;
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "stolen-", STOLEN, 60_000).await;
    let before = leases(&mut conn).await;
    // No sweeper runs; a lock server steals every expired lease (the same
    // row update lock_acquire's ON CONFLICT does, set-based for speed). The
    // trigger records each steal in the outbox, in the same statement.
    sqlx::query(
        "UPDATE lock_entry SET owner_id = 'new-holder', token = nextval('lock_fencing_token_seq'),
                acquired_at = now(), expires_at = now() + interval '1 hour'
          WHERE expires_at <= now()",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let outbox = count(&mut conn, "SELECT count(*) FROM lock_expiry_outbox").await;
    assert_eq!(outbox, STOLEN, "one outbox row per steal");
    let bytes = count(
        &mut conn,
        "SELECT pg_total_relation_size('lock_expiry_outbox')",
    )
    .await;
    let after_steal = leases(&mut conn).await;

    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let started = Instant::now();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    wait_until(Duration::from_secs(30), "the outbox drained", || async {
        lease_lines(&daemon) >= STOLEN as usize
    })
    .await;
    let drained = started.elapsed();
    assert_eq!(daemon.stop().await.0, Some(0));

    let lines = daemon.lines();
    let keys = check_reports("the sweeper", &reported(&lines, false), &before);
    assert_eq!(
        keys.len(),
        STOLEN as usize,
        "each old lease once, with its old token"
    );
    assert!(
        events(&lines, "lease_expired")
            .iter()
            .all(|f| f["reapedBy"] == "takeover" && f["ownerId"].starts_with("owner-")),
        "reported as takeovers of the old holders"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_expiry_outbox").await,
        0
    );
    assert_eq!(
        leases(&mut conn).await,
        after_steal,
        "the new leases untouched"
    );
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", STOLEN as u64)
        .await;
    eprintln!(
        "FIGURES outbox_backlog: takeovers={STOLEN} outbox_bytes={bytes} ({} B/row) \
         drained_by_first_sweeper_in={}ms batches={}",
        bytes / STOLEN,
        drained.as_millis(),
        (STOLEN as usize).div_ceil(BATCH_SIZE)
    );
}
