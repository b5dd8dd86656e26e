//! The lock batch's fallback, visible: when one row's delete fails, the
//! batch's one set-based statement fails with it, and the batch is taken row
//! by row, so the row is set aside and every other lease is reaped (a
//! sweep's batch and the outbox's drain alike). The daemon says so once per
//! cause (`lock_batch_fallback`, WARN, with the statement's error) and
//! counts every batch that fell back (`lock.batch.fallback`).

use crate::support::bad_rows::{daemon_with_statsd_until, keys, legal_hold};
use crate::support::{StatsdCapture, TestDb, events, exec, insert_expired};

const FALLBACK: &str = "lock.batch.fallback";
const PG: &str = "#backend:pg";

/// A trigger refusing one lease's delete, as an operator's legal hold might:
/// the thirty others are reported once each in the first sweep, the refused
/// one is set aside in every sweep's batch, and each such batch is counted
/// while the cause is logged once.
#[tokio::test]
async fn refused_row_falls_back_once_logged_every_batch_counted() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    legal_hold(&mut conn, "held1", &["lock_entry"]).await;
    insert_expired(&mut conn, "ordinary-", 30, 1_000).await;
    insert_expired(&mut conn, "held", 1, 2_000).await;

    let (lines, statsd) = daemon_with_statsd_until(&db, "three batches fell back", |l, s| {
        events(l, "lease_expired").len() >= 30
            && events(l, "lease_set_aside").len() >= 3
            && s.counter(FALLBACK, PG) >= 3
    })
    .await;

    let reported = keys(&lines, "lease_expired", "lockKey");
    let expected: Vec<String> = {
        let mut k: Vec<String> = (1..=30).map(|i| format!("ordinary-{i}")).collect();
        k.sort();
        k
    };
    assert_eq!(reported, expected, "the thirty others, each once");

    fell_back_for_held1(&lines, &statsd).await;

    // Left in place, not lost.
    let left: Vec<String> =
        sqlx::query_scalar("SELECT lock_key FROM lock_entry WHERE expires_at <= now()")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(left, vec!["held1"]);
}

/// Without a failing row no batch falls back: no line, and the counter
/// stays at zero while leases are reaped.
#[tokio::test]
async fn ordinary_batches_never_fall_back() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "ordinary-", 30, 1_000).await;

    let (lines, statsd) = daemon_with_statsd_until(&db, "thirty reported", |l, s| {
        events(l, "lease_expired").len() >= 30 && s.counter("lock.lease.expired", PG) >= 30
    })
    .await;

    assert!(events(&lines, "lock_batch_fallback").is_empty());
    assert_eq!(statsd.counter(FALLBACK, PG), 0);
}

/// The outbox's drain falls back the same way: a trigger refusing one
/// recorded takeover's delete sets that one aside, the others are reported,
/// and the daemon says why once and counts the batch.
#[tokio::test]
async fn refused_outbox_row_falls_back_logged_and_counted() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    legal_hold(&mut conn, "held1", &["lock_expiry_outbox"]).await;
    insert_expired(&mut conn, "steal-", 4, 1_000).await;
    insert_expired(&mut conn, "held", 1, 1_000).await;
    exec(
        &mut conn,
        "SELECT lock_acquire(lock_key, 'thief', 60000) FROM lock_entry",
    )
    .await;

    let (lines, statsd) = daemon_with_statsd_until(&db, "the outbox fell back", |l, s| {
        events(l, "lease_expired").len() >= 4
            && !events(l, "lease_set_aside").is_empty()
            && s.counter(FALLBACK, PG) >= 1
    })
    .await;

    let reported = keys(&lines, "lease_expired", "lockKey");
    assert_eq!(reported, ["steal-1", "steal-2", "steal-3", "steal-4"]);
    fell_back_for_held1(&lines, &statsd).await;
}

/// What a run whose only failing row is `held1` shows: every batch that fell
/// back set `held1` aside (one `lease_set_aside` line each) and is counted
/// once, and one WARN names the cause (the trigger's message and SQLSTATE).
async fn fell_back_for_held1(lines: &[String], statsd: &StatsdCapture) {
    let aside = events(lines, "lease_set_aside");
    assert!(aside.iter().all(|f| f["lockKey"] == "held1"), "{aside:?}");
    statsd.wait_counter(FALLBACK, PG, aside.len() as u64).await;
    assert_eq!(
        statsd.counter(FALLBACK, PG),
        aside.len() as u64,
        "one count per batch that fell back"
    );
    let warned = events(lines, "lock_batch_fallback");
    assert_eq!(warned.len(), 1, "one line for one cause: {warned:?}");
    assert_eq!(warned[0]["level"], "warn");
    assert_eq!(warned[0]["backend"], "pg");
    assert!(
        warned[0]["cause"].contains("legal hold on held1")
            && warned[0]["cause"].contains("SQLSTATE P0001"),
        "{:?}",
        warned[0]
    );
}
