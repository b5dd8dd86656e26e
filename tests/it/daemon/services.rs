//! The two services are independent: a job reaper that cannot make progress
//! never holds up the lock-expiry signal, and catches up once it can.
//! Proven with the real binary and a real lock, without timing.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::{
    Daemon, JobQueueBlock, StatsdCapture, TestDb, count, daemon_env, events, insert_expired,
    insert_stale_jobs, job_passes_seen, open_gates, wait_sweeps,
};

const STALE_JOBS: i64 = 40;

#[tokio::test]
async fn blocked_job_reaper_never_holds_up_expiries() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    insert_stale_jobs(&mut conn, "blocked", STALE_JOBS, 1, 5, 2_000).await;
    open_gates(&mut conn).await;

    let mut block = JobQueueBlock::hold(&db).await;

    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    daemon
        .wait_for_event("sweeper_started", Duration::from_secs(10))
        .await;
    insert_expired(&mut conn, "first-", 15, 50).await;
    daemon
        .wait_for_events("lease_expired", 15, Duration::from_secs(15))
        .await;
    // Several more lock sweeps, and more expiries, while the job loop is stuck.
    wait_sweeps(&statsd, 3).await;
    insert_expired(&mut conn, "second-", 10, 50).await;
    daemon
        .wait_for_events("lease_expired", 25, Duration::from_secs(15))
        .await;
    assert_eq!(
        job_passes_seen(&statsd),
        0,
        "the job reaper finished a pass through a held table lock"
    );
    assert!(events(&daemon.lines(), "job_lease_expired").is_empty());
    assert_eq!(block.leased_jobs().await, STALE_JOBS);

    block.release().await;
    // The job reaper catches up.
    daemon
        .wait_for_events(
            "job_lease_expired",
            STALE_JOBS as usize,
            Duration::from_secs(20),
        )
        .await;

    let (code, _) = daemon.stop().await;
    assert_eq!(code, Some(0));
    let lines = daemon.lines();
    let expired = events(&lines, "lease_expired");
    let keys: HashSet<_> = expired.iter().map(|e| e["lockKey"].clone()).collect();
    assert_eq!(
        (expired.len(), keys.len()),
        (25, 25),
        "each lease exactly once"
    );
    let jobs = events(&lines, "job_lease_expired");
    let ids: HashSet<_> = jobs.iter().map(|e| e["jobId"].clone()).collect();
    assert_eq!(
        (jobs.len(), ids.len()),
        (STALE_JOBS as usize, STALE_JOBS as usize)
    );
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM job_queue WHERE state = 'leased'"
        )
        .await,
        0
    );
    assert!(events(&lines, "sweep_failed").is_empty(), "{lines:#?}");
}
