//! The job reaper's daemon path: one `reap_once` pass in process (lines,
//! counts and the stale gauge, across batches and with a gate closed), and
//! the real binary logging each refusal once and reaping with the gates open.

use std::collections::HashSet;
use std::time::Duration;

use lease_sweeper::testing::events::{EventLog, MemoryLog};
use lease_sweeper::testing::job_queue::{ApplyBatch, JobQueue, PgJobQueue};
use lease_sweeper::testing::job_reaper::{JOB_BATCH_SIZE, JobReaper};
use lease_sweeper::testing::metrics::Metrics;
use lease_sweeper::testing::model::JobAction;

use crate::jobs::support::job_snapshot;
use crate::support::{
    BusyNeighbour, Daemon, REAPER, SUBSTRATE, StatsdCapture, TestDb, daemon_env, events, fields,
    insert_stale_jobs, open_gates, set_gates, set_setting, wait_job_passes, wait_until,
};

/// A job reaper in process on `db`, its lines kept in memory and its
/// metrics sent to `statsd`, as `sweep.rs` builds a lock sweeper.
fn reaper(db: &TestDb, statsd: &StatsdCapture) -> (JobReaper<PgJobQueue>, MemoryLog, Metrics) {
    let (log, lines) = EventLog::in_memory();
    let metrics = Metrics::new(statsd.target());
    let reaper = JobReaper::new(
        PgJobQueue::new(db.target()),
        log,
        metrics.clone(),
        "lease-sweeper@test-host".into(),
    );
    (reaper, lines, metrics)
}

#[tokio::test]
async fn reap_once_line_per_action() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let total = JOB_BATCH_SIZE as i64 + 500;
    insert_stale_jobs(&mut conn, "reset", total - 300, 1, 5, 4_000).await;
    insert_stale_jobs(&mut conn, "dead", 300, 2, 3, 4_000).await;
    open_gates(&mut conn).await;
    let (mut reaper, lines, metrics) = reaper(&db, &statsd);

    let outcome = reaper
        .reap_once(&tokio_util::sync::CancellationToken::new())
        .await
        .expect("reap succeeds");
    metrics.flush();

    assert_eq!(
        (outcome.reset, outcome.dead_lettered, outcome.stale),
        (total as u64 - 300, 300, 0)
    );
    assert_eq!(outcome.refused, None);
    let lines = lines.lines();
    assert_eq!(lines.len() as i64, total, "one line per action");
    let dlq: HashSet<String> =
        sqlx::query_scalar("SELECT dead_letter_id::text FROM job_dead_letter")
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let mut ids = HashSet::new();
    for line in &lines {
        let f = fields(line);
        assert_eq!(
            (f["level"].as_str(), f["message"].as_str()),
            ("warn", "job_lease_expired")
        );
        assert!(ids.insert(f["jobId"].clone()), "job reported twice");
        assert!(f["leaseOwner"].starts_with("worker-"));
        assert!(f["overdueMillis"].parse::<i64>().unwrap() >= 4_000);
        assert_eq!(f["backend"], "pg");
        match f["jobKind"].as_str() {
            "reset" => {
                assert_eq!(f["action"], "reset_to_retry_waiting");
                assert_eq!(
                    (f["attempts"].as_str(), f["maxAttempts"].as_str()),
                    ("2", "5")
                );
                assert_eq!(f["backoffSec"], "20");
                assert!(!f.contains_key("deadLetterId"));
            }
            "dead" => {
                assert_eq!(f["action"], "moved_to_dead_letter");
                assert_eq!(
                    (f["attempts"].as_str(), f["maxAttempts"].as_str()),
                    ("3", "3")
                );
                assert!(dlq.contains(&f["deadLetterId"]), "{line}");
                assert!(!f.contains_key("backoffSec"));
            }
            other => panic!("unexpected jobKind {other}"),
        }
    }
    let reset_tags = "#backend:pg,action:reset_to_retry_waiting";
    let dead_tags = "#backend:pg,action:moved_to_dead_letter";
    statsd
        .wait_counter("queue.lease.reaped", reset_tags, total as u64 - 300)
        .await;
    statsd
        .wait_counter("queue.lease.reaped", dead_tags, 300)
        .await;
    assert_eq!(
        statsd.counter("queue.lease.reaped", reset_tags),
        total as u64 - 300
    );
    assert_eq!(statsd.counter("queue.lease.reaped", dead_tags), 300);
    // The gauge rides in a later datagram than the per-batch counts.
    wait_until(Duration::from_secs(5), "the stale gauge", || async {
        statsd
            .gauge("queue.lease.stale.current", "#backend:pg")
            .is_some()
    })
    .await;
    assert_eq!(
        statsd.gauge("queue.lease.stale.current", "#backend:pg"),
        Some(0)
    );
}

#[tokio::test]
async fn reap_once_gated_reports_gauge_only() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    insert_stale_jobs(&mut conn, "waiting", 7, 0, 5, 1_000).await;
    set_gates(&mut conn, true, true, true).await; // staged: enabled, dry-run-only
    let before = job_snapshot(&mut conn).await;
    let (mut reaper, lines, metrics) = reaper(&db, &statsd);

    let outcome = reaper
        .reap_once(&tokio_util::sync::CancellationToken::new())
        .await
        .unwrap();
    metrics.flush();

    assert_eq!(
        outcome.refused.as_deref(),
        Some("queue.lease.reaper_dry_run_only=true")
    );
    assert_eq!(
        (outcome.reset, outcome.dead_lettered, outcome.stale),
        (0, 0, 7)
    );
    assert!(lines.lines().is_empty());
    assert_eq!(job_snapshot(&mut conn).await, before);
    wait_until(Duration::from_secs(10), "the gauge", || async {
        statsd.gauge("queue.lease.stale.current", "#backend:pg") == Some(7)
    })
    .await;
    assert_eq!(
        statsd.counter(
            "queue.lease.reaped",
            "#backend:pg,action:reset_to_retry_waiting"
        ),
        0
    );
}

#[tokio::test]
async fn gated_logs_each_refusal_once() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut conn = db.connect().await;
    let stale = insert_stale_jobs(&mut conn, "gated", 4, 0, 5, 1_000).await;
    let before = job_snapshot(&mut conn).await;
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));

    wait_job_passes(&statsd, 4).await;
    // Both in one transaction, so no sweep sees the state in between.
    let mut tx = sqlx::Connection::begin(&mut conn).await.unwrap();
    set_setting(&mut tx, SUBSTRATE, "true").await;
    set_setting(&mut tx, REAPER, "true").await;
    tx.commit().await.unwrap();
    // A line for the new refusal reason.
    daemon
        .wait_for_events("job_reaper_gated", 2, Duration::from_secs(10))
        .await;
    wait_job_passes(&statsd, 3).await;
    let (code, lines) = daemon.stop().await;
    let gated = events(&lines, "job_reaper_gated");
    let reasons: Vec<&str> = gated.iter().map(|g| g["reason"].as_str()).collect();
    assert_eq!(
        reasons,
        [
            "queue.job_substrate.enabled=false",
            "queue.lease.reaper_dry_run_only=true"
        ],
        "one line per change of gate state: {lines:#?}"
    );
    assert!(gated.iter().all(|g| g["level"] == "info"));
    assert!(gated[0]["actor"].starts_with("lease-sweeper@"));
    assert!(events(&lines, "job_reaper_armed").is_empty());
    assert!(events(&lines, "job_lease_expired").is_empty());
    assert_eq!(job_snapshot(&mut conn).await, before, "nothing reaped");
    assert_eq!(
        statsd.gauge("queue.lease.stale.current", "#backend:pg"),
        Some(stale.len() as u64)
    );
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn open_gates_line_and_count_per_action() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut conn = db.connect().await;
    let reset = insert_stale_jobs(&mut conn, "retry_me", 20, 0, 5, 1_000).await;
    let dead = insert_stale_jobs(&mut conn, "bury_me", 10, 4, 5, 1_000).await;
    open_gates(&mut conn).await;
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));

    daemon
        .wait_for_events("job_lease_expired", 30, Duration::from_secs(20))
        .await;
    // A few more sweeps: nothing is reported twice.
    wait_job_passes(&statsd, 3).await;
    let (code, lines) = daemon.stop().await;
    let expired = events(&lines, "job_lease_expired");
    assert_eq!(expired.len(), 30, "{lines:#?}");
    let ids: HashSet<&str> = expired.iter().map(|e| e["jobId"].as_str()).collect();
    let want: HashSet<&str> = reset.iter().chain(&dead).map(String::as_str).collect();
    assert_eq!(ids, want);
    assert!(expired.iter().all(|e| e["level"] == "warn"));
    let resets = expired
        .iter()
        .filter(|e| e["action"] == "reset_to_retry_waiting")
        .count();
    assert_eq!(resets, 20);
    assert_eq!(events(&lines, "job_reaper_armed").len(), 1);
    assert!(events(&lines, "job_reaper_gated").is_empty());
    statsd
        .wait_counter(
            "queue.lease.reaped",
            "#backend:pg,action:moved_to_dead_letter",
            10,
        )
        .await;
    assert_eq!(
        statsd.counter(
            "queue.lease.reaped",
            "#backend:pg,action:reset_to_retry_waiting"
        ),
        20
    );
    assert_eq!(
        statsd.counter(
            "queue.lease.reaped",
            "#backend:pg,action:moved_to_dead_letter"
        ),
        10
    );
    assert_eq!(
        statsd.gauge("queue.lease.stale.current", "#backend:pg"),
        Some(0)
    );
    let actor: String = sqlx::query_scalar("SELECT DISTINCT moved_by FROM job_dead_letter")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(actor.starts_with("lease-sweeper@"), "{actor}");
    assert_eq!(code, Some(0));
}

/// An apply batch takes as much beside a worker at work as alone: the
/// reaper never holds back because other sessions exist.
#[tokio::test]
async fn apply_batch_takes_the_same_beside_workers() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_stale_jobs(&mut conn, "reset", 20, 1, 5, 4_000).await;
    open_gates(&mut conn).await;
    let mut queue = PgJobQueue::new(db.target());
    let mut none = |_: &[JobAction]| Ok(());
    let alone = queue
        .apply_batch("lease-sweeper@test-host", 10, &mut none)
        .await
        .unwrap();
    assert_eq!(alone, ApplyBatch::Applied { n: 10 });

    let worker = BusyNeighbour::start(&db).await;
    let beside = queue
        .apply_batch("lease-sweeper@test-host", 10, &mut none)
        .await
        .unwrap();
    assert_eq!(beside, ApplyBatch::Applied { n: 10 });
    let nothing_left = queue
        .apply_batch("lease-sweeper@test-host", 10, &mut none)
        .await
        .unwrap();
    assert_eq!(nothing_left, ApplyBatch::Applied { n: 0 });

    worker.stop(&mut conn).await;
}
