//! Expiries the lock server records itself (an acquire taking an expired
//! key over, a release after the deadline): each reported once, with the
//! token and owner of the lease that expired, beside the sweep's own
//! deletions and on its one connection.

use std::collections::HashSet;

use lease_sweeper::testing::progress::Progress;
use lease_sweeper::testing::sweep::run;
use tokio_util::sync::CancellationToken;

use super::{sweeper, sweeper_connections};
use crate::support::{StatsdCapture, TestDb, count, events, fields, insert_expired};

#[tokio::test]
async fn takeover_reported_once() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let old: i64 = sqlx::query_scalar("SELECT lock_acquire('invoice:42', 'paused', 1)")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    // Not a wait for sweeps: let the 1 ms lease expire so it can be stolen.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let new: i64 = sqlx::query_scalar("SELECT lock_acquire('invoice:42', 'thief', 60000)")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(new > old);
    let (mut sweeper, log, metrics) = sweeper(&db, &statsd);

    let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();
    metrics.flush();

    assert_eq!(
        (outcome.swept, outcome.taken_over, outcome.held),
        (0, 1, Some(1))
    );
    let lines = log.lines();
    let expired = events(&lines, "lease_expired");
    assert_eq!(expired.len(), 1, "{lines:?}");
    assert_eq!(expired[0]["lockKey"], "invoice:42");
    assert_eq!(expired[0]["token"], old.to_string());
    assert_eq!(expired[0]["reapedBy"], "takeover");
    assert_eq!(expired[0]["ownerId"], "paused");
    assert!(expired[0]["overdueMillis"].parse::<i64>().unwrap() >= 1);
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", 1)
        .await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_expiry_outbox").await,
        0
    );
    // The new holder's lease is live and untouched; a renewal is not a takeover.
    let renewed: bool = sqlx::query_scalar("SELECT lock_renew('invoice:42', $1, 60000)")
        .bind(new)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(renewed);
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_expiry_outbox").await,
        0
    );
}

#[tokio::test]
async fn late_release_still_reported() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let token: i64 = sqlx::query_scalar("SELECT lock_acquire('late', 'slow', 1)")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    // Not a wait for sweeps: let the 1 ms lease expire before its release.
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    let released: bool = sqlx::query_scalar("SELECT lock_release('late', $1)")
        .bind(token)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(!released, "an expired lease cannot be released");
    let (mut sweeper, log, _) = sweeper(&db, &statsd);
    assert_eq!(
        sweeper
            .sweep_once(&CancellationToken::new())
            .await
            .unwrap()
            .swept,
        1
    );
    assert_eq!(
        events(&log.lines(), "lease_expired")[0]["token"],
        token.to_string()
    );
}

#[tokio::test]
async fn stealing_acquires_report_each_token_once() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let stop = CancellationToken::new();
    let (log_a, log_b) = {
        let (a, log_a, metrics_a) = sweeper(&db, &statsd);
        let (b, log_b, metrics_b) = sweeper(&db, &statsd);
        let progress = Progress::new(2);
        tokio::spawn(run(a, metrics_a, progress.beat(0), stop.clone()));
        tokio::spawn(run(b, metrics_b, progress.beat(1), stop.clone()));
        (log_a, log_b)
    };
    // A lock server hammering 20 keys with 5 ms leases it never renews or
    // releases: each lease is either swept or stolen, never both.
    let mut conn = db.connect().await;
    let mut issued = HashSet::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(2_500);
    while std::time::Instant::now() < deadline {
        for k in 0..20 {
            let token: Option<i64> = sqlx::query_scalar("SELECT lock_acquire($1, 'flaky', 5)")
                .bind(format!("hot-{k}"))
                .fetch_one(&mut conn)
                .await
                .unwrap();
            issued.extend(token);
        }
        // Pacing, not a wait for sweeps: the 5 ms leases expire between
        // rounds, so each round steals some and leaves the rest to sweep.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    crate::support::wait_until(
        std::time::Duration::from_secs(10),
        "every lease reported",
        || {
            let (a, b) = (log_a.clone(), log_b.clone());
            let n = issued.len();
            async move { a.lines().len() + b.lines().len() >= n }
        },
    )
    .await;
    stop.cancel();

    let mut reported = HashSet::new();
    let mut by_takeover = 0;
    for line in log_a.lines().iter().chain(&log_b.lines()) {
        let f = fields(line);
        let token: i64 = f["token"].parse().unwrap();
        assert!(reported.insert(token), "token {token} reported twice");
        by_takeover += usize::from(f["reapedBy"] == "takeover");
    }
    assert_eq!(
        reported, issued,
        "every issued token reported once, none invented"
    );
    assert!(
        by_takeover > 0,
        "the race produced no takeover at all ({} leases)",
        issued.len()
    );
}

/// A backlog beside takeovers waiting to be reported (a lock server
/// re-acquiring a storm's keys): each lease and the takeover once, on one
/// connection.
#[tokio::test]
async fn backlog_beside_waiting_takeovers_each_once() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let n = 2_000;
    let tokens = insert_expired(&mut conn, "stormed-", n, 1_000).await;
    let stolen: Option<i64> =
        sqlx::query_scalar("SELECT lock_acquire('stormed-1', 'caller', 60000)")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(stolen.is_some(), "the caller takes the expired key over");
    let (mut sweeper, log, _) = sweeper(&db, &statsd);

    let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

    assert_eq!(
        (outcome.swept, outcome.taken_over),
        (n as u64 - 1, 1),
        "every other lease swept, the stolen one reported as taken over"
    );
    assert_eq!(sweeper_connections(&mut conn).await, 1, "one connection");
    let lines = log.lines();
    let reported: HashSet<(String, String)> = events(&lines, "lease_expired")
        .into_iter()
        .map(|f| (f["lockKey"].clone(), f["token"].clone()))
        .collect();
    let expected: HashSet<(String, String)> = tokens
        .into_iter()
        .map(|(key, token)| (key, token.to_string()))
        .collect();
    assert_eq!(lines.len(), n as usize, "one line a lease");
    assert_eq!(reported, expected, "each lease once, with its own token");
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_expiry_outbox").await,
        0
    );
}
