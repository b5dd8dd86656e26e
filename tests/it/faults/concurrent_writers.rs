//! Other writers on the sweeper's rows: a session holding row locks on
//! expired leases, lock servers taking leases over while no sweeper ran, and
//! a worker claiming a job again after its lease expired. Each proves every
//! real expiry is reported once, with the identity a consumer deduplicates
//! by, and nothing waits on another session's locks.
//!
//! It does not cover crashes or stops (`faults::signals`). Each test prints
//! its `FIGURES` line (`--nocapture`) for docs/reliability.md.

use std::time::{Duration, Instant};

use lease_sweeper::testing::lock_sweeper::BATCH_SIZE;
use sqlx::PgConnection;

use crate::faults::support::{
    SWEEPER_BACKENDS_WAITING, check_reports, error_lines, lease_lines, leases, reported,
    reported_with_prefix, wait_output,
};
use crate::support::{
    Daemon, StatsdCapture, TestDb, count, daemon_env, events, insert_expired, open_gates,
    wait_until,
};

/// The sweeper's backends of `db` that are blocked on a lock right now.
async fn blocked_sweepers(conn: &mut PgConnection, db: &TestDb) -> i64 {
    sqlx::query_scalar(SWEEPER_BACKENDS_WAITING)
        .bind(&db.name)
        .fetch_one(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn row_locked_leases_skipped_then_reported() {
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

#[tokio::test]
async fn two_expiries_of_one_job_reported_twice() {
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
async fn takeover_backlog_drained_in_batches() {
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
