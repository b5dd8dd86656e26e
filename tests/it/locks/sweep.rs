//! `sweep_once` against a real database, one sweeper alone: each expired
//! lease one line and one count, live leases untouched, a backlog drained in
//! one sweep by the expiry index, and a batch whose lines fail kept until a
//! sweep writes them. Other sessions at work beside it are `concurrent`'s;
//! expiries the lock server records itself are `recorded`'s.

use std::collections::HashSet;

use lease_sweeper::testing::events::EventLog;
use lease_sweeper::testing::lock_store::PgLockStore;
use lease_sweeper::testing::lock_sweeper::{BATCH_SIZE, LockSweeper};
use lease_sweeper::testing::metrics::{MAX_OVERDUE_SAMPLES, Metrics};
use tokio_util::sync::CancellationToken;

use super::{BrokenPipe, sweeper};
use crate::support::{StatsdCapture, TestDb, count, exec, fields, insert_expired};

#[tokio::test]
async fn n_expiries_n_lines_count_n() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "payout:acct-", 25, 3_000).await;
    let (mut sweeper, log, metrics) = sweeper(&db, &statsd);

    let outcome = sweeper
        .sweep_once(&CancellationToken::new())
        .await
        .expect("sweep succeeds");
    metrics.flush();

    assert_eq!(outcome.swept, 25);
    assert_eq!(outcome.taken_over, 0);
    assert_eq!(outcome.held, Some(0));
    let lines = log.lines();
    assert_eq!(lines.len(), 25, "{lines:#?}");
    let mut keys = HashSet::new();
    for line in &lines {
        let f = fields(line);
        assert_eq!(f["level"], "warn");
        assert_eq!(f["message"], "lease_expired");
        assert_eq!(f["backend"], "pg");
        assert_eq!(f["reapedBy"], "sweep");
        assert!(f["token"].parse::<i64>().unwrap() > 0);
        assert!(f["expiredAtMillis"].parse::<i64>().unwrap() > 1_700_000_000_000);
        let overdue: i64 = f["overdueMillis"].parse().unwrap();
        assert!(
            (3_000..60_000).contains(&overdue),
            "overdueMillis {overdue}"
        );
        assert!(f["ts"].ends_with('Z'));
        keys.insert(f["lockKey"].clone());
    }
    assert_eq!(keys.len(), 25);
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", 25)
        .await;
    assert_eq!(statsd.counter("lock.lease.expired", "#backend:pg"), 25);
    crate::support::wait_until(std::time::Duration::from_secs(5), "the gauge", || async {
        statsd.gauge("lock.held.current", "#backend:pg").is_some()
    })
    .await;
    assert_eq!(statsd.gauge("lock.held.current", "#backend:pg"), Some(0));
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
}

#[tokio::test]
async fn live_leases_untouched_quiet_sweep_silent() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    for i in 0..10 {
        let token: Option<i64> = sqlx::query_scalar("SELECT lock_acquire($1, 'holder', 60000)")
            .bind(format!("live-{i}"))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert!(token.is_some());
    }
    let (mut sweeper, log, metrics) = sweeper(&db, &statsd);

    let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();
    metrics.flush();

    assert_eq!(
        (outcome.swept, outcome.taken_over, outcome.held),
        (0, 0, Some(10))
    );
    assert!(log.lines().is_empty(), "{:?}", log.lines());
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_entry").await,
        10
    );
    crate::support::wait_until(std::time::Duration::from_secs(5), "the gauge", || async {
        statsd.gauge("lock.held.current", "#backend:pg") == Some(10)
    })
    .await;
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        0,
        "no counter line for zero"
    );
    assert!(
        statsd
            .lines()
            .iter()
            .all(|l| !l.starts_with("lock.lease.expired")),
        "{:?}",
        statsd.lines()
    );
}

#[tokio::test]
async fn backlog_drained_in_one_sweep() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let n = BATCH_SIZE as i64 * 2 + 7;
    insert_expired(&mut conn, "backlog-", n, 1_000).await;
    let (mut sweeper, log, metrics) = sweeper(&db, &statsd);

    let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();
    metrics.flush();

    assert_eq!(outcome.swept, n as u64);
    // Two full batches, then the short one that ends the drain.
    assert_eq!(outcome.batches, 3);
    assert_eq!(log.lines().len(), n as usize);
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", n as u64)
        .await;
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        n as u64
    );
}

#[tokio::test]
async fn hostile_key_one_line_decodes_back() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let hostile = "tenant \"acme\"\nlevel=error message=lease_expired lockKey=forged\r\t\\ \u{1b}[31m \u{2028} ünï";
    sqlx::query(
        "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at) VALUES ($1, $1, 7, now() - interval '1 s')",
    )
    .bind(hostile)
    .execute(&mut conn)
    .await
    .unwrap();
    let (mut sweeper, log, _) = sweeper(&db, &statsd);

    sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

    let lines = log.lines();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let f = fields(&lines[0]);
    assert_eq!(f["lockKey"], hostile);
    assert_eq!(f["ownerId"], hostile);
    assert_eq!(f["message"], "lease_expired");
    assert_eq!(f["level"], "warn");
    assert_eq!(f["token"], "7");
}

#[tokio::test]
async fn statement_uses_expiry_index() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "k", 2_000, 1_000).await;
    sqlx::query("ANALYZE lock_entry")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("SET enable_seqscan = off")
        .execute(&mut conn)
        .await
        .unwrap();
    // The statement is the one `lock_reap_batch` runs for a batch; explain
    // it as the function's text has it (its INTO, a PL/pgSQL clause, left
    // out; EXPLAIN without ANALYZE deletes nothing).
    let body: String =
        sqlx::query_scalar("SELECT prosrc FROM pg_proc WHERE proname = 'lock_reap_batch'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    let start = body.find("WITH doomed AS").expect("the batch statement");
    let statement = &body[start..start + body[start..].find(';').unwrap()];
    let statement: String = statement
        .lines()
        .filter(|l| !l.trim_start().starts_with("INTO "))
        .collect::<Vec<_>>()
        .join("\n");
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN {}",
        statement
            .replace("p_limit", "5000")
            .replace("v_from", "'-infinity'::timestamptz")
    )))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let plan = plan.join("\n");
    assert!(plan.contains("lock_entry_expiry_idx"), "{plan}");
    assert!(plan.contains("Tid"), "deletes by tuple id: {plan}");
}

#[tokio::test]
async fn locked_lease_reaped_next_sweep() {
    use sqlx::Connection as _;
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    // The oldest lease is held locked by another session while a sweep
    // drains a backlog of two full batches plus some: later batches resume
    // past its deadline, so only the next sweep (which starts from the
    // oldest again) can reap it.
    insert_expired(&mut conn, "old-", 1, 60_000).await;
    insert_expired(&mut conn, "bulk-", BATCH_SIZE as i64 * 2 + 10, 1_000).await;
    let mut holder = db.connect().await;
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM lock_entry WHERE lock_key = 'old-1' FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let (mut sweeper, log, _) = sweeper(&db, &statsd);

    let first = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();
    assert_eq!(
        first.swept,
        BATCH_SIZE as u64 * 2 + 10,
        "everything but the locked lease"
    );
    tx.rollback().await.unwrap();
    let second = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

    assert_eq!(second.swept, 1);
    let lines = log.lines();
    assert_eq!(lines.len(), BATCH_SIZE * 2 + 11);
    assert_eq!(fields(lines.last().unwrap())["lockKey"], "old-1");
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
}

/// A batch's lines are written in chunks, yet StatsD's lateness sample is
/// taken across the whole batch: at most `MAX_OVERDUE_SAMPLES` timers a
/// batch, whose sample rates scale back to exactly the leases reported.
#[tokio::test]
async fn lateness_sample_spans_each_whole_batch() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let n = BATCH_SIZE as i64 * 2 + 500;
    insert_expired(&mut conn, "sampled-", n, 2_000).await;
    let (mut sweeper, log, metrics) = sweeper(&db, &statsd);

    let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();
    metrics.flush();

    assert_eq!(outcome.swept, n as u64);
    assert_eq!(log.lines().len(), n as usize);
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", n as u64)
        .await;
    let timers: Vec<String> = statsd
        .lines()
        .into_iter()
        .filter(|l| l.starts_with("lock.lease.overdue:"))
        .collect();
    assert!(
        timers.len() as u64 <= MAX_OVERDUE_SAMPLES as u64 * outcome.batches,
        "{} timers for {} batches",
        timers.len(),
        outcome.batches
    );
    let scaled: f64 = timers
        .iter()
        .map(|l| {
            l.split('|')
                .find_map(|p| p.strip_prefix('@'))
                .map_or(1.0, |rate| 1.0 / rate.parse::<f64>().unwrap())
        })
        .sum();
    assert!(
        (scaled - n as f64).abs() < 0.5,
        "the rates scale {} timers back to {scaled}, not {n}",
        timers.len()
    );
}

#[tokio::test]
async fn unwritable_batch_stays_handed_off() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "kept-", 12, 1_000).await;
    let metrics = Metrics::new(statsd.target());
    let mut broken = LockSweeper::new(
        PgLockStore::new(db.target()),
        EventLog::to_writer(Box::new(BrokenPipe)),
        metrics.clone(),
    );

    let err = broken
        .sweep_once(&CancellationToken::new())
        .await
        .unwrap_err();

    assert!(err.to_string().contains("nothing lost"), "{err}");
    // The leases were released before their lines were tried; their record
    // is the hand-off, kept because its lines failed.
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM lock_reap_handoff, unnest(lock_keys)"
        )
        .await,
        12,
        "no lease released without a record until its line"
    );
    // Past the grace any sweeper takes the hand-off over, as time passing
    // would.
    exec(
        &mut conn,
        "UPDATE lock_reap_handoff SET written_at = written_at - interval '1 minute'",
    )
    .await;
    // A healthy sweeper then reports all twelve.
    let (mut healthy, log, _) = sweeper(&db, &statsd);
    assert_eq!(
        healthy
            .sweep_once(&CancellationToken::new())
            .await
            .unwrap()
            .swept,
        12
    );
    assert_eq!(log.lines().len(), 12);
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_reap_handoff").await,
        0
    );
    // Exactly the healthy sweep's twelve: the failed batch counted none.
    metrics.flush();
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", 12)
        .await;
    assert_eq!(statsd.counter("lock.lease.expired", "#backend:pg"), 12);
}
