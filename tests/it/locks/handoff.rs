//! A reaped batch is handed off and committed before its lines are written:
//! while the daemon's stdout is blocked mid-batch, the lock server acquires
//! the batch's keys and a late worker completes a reaped job without waiting
//! on it, and every line still comes out once when stdout drains. Killed
//! while blocked, the daemon loses nothing: the next one recovers the
//! hand-off.
//!
//! Stdout is blocked for real: a pipe nobody reads fills its 64 KiB buffer,
//! as a stalled journald or log collector does. The other side of the seam
//! (a stub store, the drain rule) is `sweep::lock_sweeper`'s unit
//! tests.

use std::collections::HashSet;
use std::time::Duration;

use lease_sweeper::testing::job_reaper::JOB_BATCH_SIZE;
use sqlx::PgConnection;

use crate::support::{
    Daemon, StatsdCapture, TestDb, count, daemon_env, events, exec, insert_expired,
    insert_stale_jobs, open_gates, poll, wait_until,
};

/// A batch whose lines fill a pipe's buffer (64 KiB) many times over.
const LEASES: i64 = 500;

/// A lock wait longer than this fails the statement (SQLSTATE 55P03): what
/// "does not wait on the sweeper" means here.
const NO_WAIT: &str = "SET lock_timeout = '500ms'";

async fn handoffs(conn: &mut PgConnection, table: &'static str) -> i64 {
    let sql = match table {
        "lock" => "SELECT count(*) FROM lock_reap_handoff",
        _ => "SELECT count(*) FROM job_reap_handoff",
    };
    count(conn, sql).await
}

/// Keys of the `lease_expired` lines, asserting none repeats.
fn reported_once(lines: &[String]) -> HashSet<String> {
    let mut keys = HashSet::new();
    for f in events(lines, "lease_expired") {
        assert!(
            keys.insert(f["lockKey"].clone()),
            "{} reported twice",
            f["lockKey"]
        );
    }
    keys
}

#[tokio::test]
async fn acquire_does_not_wait_for_lines() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let inserted = insert_expired(&mut conn, "storm-", LEASES, 5_000).await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn_with_blocked_stdout(&daemon_env(&db.url, &port));

    // The batch is deleted and committed while its lines cannot be written.
    poll(
        Duration::from_secs(20),
        "the batch deleted and handed off",
        async || {
            let left = count(&mut conn, "SELECT count(*) FROM lock_entry").await;
            let handed = handoffs(&mut conn, "lock").await;
            (left == 0 && handed == 1)
                .then_some(())
                .ok_or(format!("{left} leases left, {handed} hand-offs"))
        },
    )
    .await;
    exec(&mut conn, NO_WAIT).await;
    for i in [1, LEASES / 2, LEASES] {
        let token: Option<i64> = sqlx::query_scalar("SELECT lock_acquire($1, 'new-holder', 60000)")
            .bind(format!("storm-{i}"))
            .fetch_one(&mut conn)
            .await
            .expect("an acquire of a reaped key returns without waiting");
        assert!(token.is_some(), "storm-{i} is free again");
    }
    // Still blocked: the hand-off is held until its lines are out.
    assert_eq!(handoffs(&mut conn, "lock").await, 1);

    daemon.unblock_stdout();
    wait_until(Duration::from_secs(20), "every line", || async {
        events(&daemon.lines(), "lease_expired").len() >= LEASES as usize
    })
    .await;
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", LEASES as u64)
        .await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    let keys = reported_once(&lines);
    let expected: HashSet<String> = inserted.keys().cloned().collect();
    assert_eq!(keys, expected, "each expired lease reported once");
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        LEASES as u64
    );
    assert_eq!(handoffs(&mut conn, "lock").await, 0);
    // The three new leases are live and untouched.
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 3);
}

#[tokio::test]
async fn kill_while_lines_blocked_loses_none() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let inserted = insert_expired(&mut conn, "killed-", LEASES, 5_000).await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut blocked = Daemon::spawn_with_blocked_stdout(&daemon_env(&db.url, &port));
    poll(
        Duration::from_secs(20),
        "the batch handed off",
        async || {
            let handed = handoffs(&mut conn, "lock").await;
            (handed == 1)
                .then_some(())
                .ok_or(format!("{handed} hand-offs"))
        },
    )
    .await;
    blocked.signal(libc::SIGKILL);
    let (code, _) = blocked.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code, None, "killed by a signal");
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        0,
        "nothing counted for lines never written"
    );

    // Its hand-off outlives it, and the next daemon writes its lines.
    let mut next = Daemon::spawn(&daemon_env(&db.url, &port));
    poll(Duration::from_secs(30), "the recovered batch", async || {
        let lines = next.lines();
        (events(&lines, "lease_expired").len() >= LEASES as usize)
            .then_some(())
            .ok_or_else(|| lines.join("\n"))
    })
    .await;
    let (code, lines) = next.stop().await;
    assert_eq!(code, Some(0));
    let keys = reported_once(&lines);
    let expected: HashSet<String> = inserted.keys().cloned().collect();
    assert_eq!(keys, expected, "the whole batch, once");
    assert!(
        events(&lines, "lease_expired")
            .iter()
            .all(|f| f["reapedBy"] == "sweep"),
        "recovered leases were swept"
    );
    assert_eq!(handoffs(&mut conn, "lock").await, 0);
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        LEASES as u64
    );
}

#[tokio::test]
async fn late_worker_does_not_wait_for_reap() {
    const JOBS: i64 = JOB_BATCH_SIZE as i64;
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let ids = insert_stale_jobs(&mut conn, "work", JOBS, 0, 5, 5_000).await;
    open_gates(&mut conn).await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn_with_blocked_stdout(&daemon_env(&db.url, &port));

    poll(
        Duration::from_secs(20),
        "the batch applied and handed off",
        async || {
            let leased = count(
                &mut conn,
                "SELECT count(*) FROM job_queue WHERE state = 'leased'",
            )
            .await;
            let handed = handoffs(&mut conn, "job").await;
            (leased == 0 && handed == 1)
                .then_some(())
                .ok_or(format!("{leased} jobs leased, {handed} hand-offs"))
        },
    )
    .await;
    exec(&mut conn, NO_WAIT).await;
    // `worker-1` still thinks it holds its job: its completion is refused
    // (the reaper acted), at once.
    let completed: bool = sqlx::query_scalar("SELECT fn_job_complete($1::uuid, 'worker-1')")
        .bind(&ids[0])
        .fetch_one(&mut conn)
        .await
        .expect("a completion of a reaped job returns without waiting");
    assert!(!completed, "the reaper acted first");

    daemon.unblock_stdout();
    wait_until(Duration::from_secs(20), "every job line", || async {
        events(&daemon.lines(), "job_lease_expired").len() >= JOBS as usize
    })
    .await;
    statsd
        .wait_counter(
            "queue.lease.reaped",
            "#backend:pg,action:reset_to_retry_waiting",
            JOBS as u64,
        )
        .await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    let reported: Vec<String> = events(&lines, "job_lease_expired")
        .into_iter()
        .map(|f| f["jobId"].clone())
        .collect();
    let unique: HashSet<&String> = reported.iter().collect();
    assert_eq!(reported.len(), JOBS as usize, "one line per job");
    assert_eq!(unique.len(), JOBS as usize);
    assert_eq!(handoffs(&mut conn, "job").await, 0);
}
