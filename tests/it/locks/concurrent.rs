//! Sweeping beside other sessions at work: a session busy on the same
//! database, and other sweepers draining the same backlog. Each lease is
//! reported exactly once, on the sweep's one connection.

use std::collections::HashSet;

use lease_sweeper::testing::lock_sweeper::BATCH_SIZE;
use tokio_util::sync::CancellationToken;

use super::{sweeper, sweeper_connections};
use crate::support::{BusyNeighbour, StatsdCapture, TestDb, count, events, fields, insert_expired};

/// `n` leases swept, one line each, no key twice, and every hand-off
/// claimed once its lines were out.
async fn assert_each_once_none_left(
    conn: &mut sqlx::PgConnection,
    lines: &[String],
    n: i64,
    swept: u64,
) {
    assert_eq!(swept, n as u64);
    let keys: HashSet<String> = events(lines, "lease_expired")
        .into_iter()
        .map(|f| f["lockKey"].clone())
        .collect();
    assert_eq!((lines.len(), keys.len()), (n as usize, n as usize));
    assert_eq!(
        count(conn, "SELECT count(*) FROM lock_reap_handoff").await,
        0,
        "every hand-off claimed once its lines were out"
    );
}

/// A backlog of several batches is drained on the sweep's one connection,
/// beside a session running a statement as alone: full batches, each lease
/// once, nothing left.
#[tokio::test]
async fn backlog_on_one_connection_beside_a_busy_session() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let n = BATCH_SIZE as i64 * 5 / 2;
    insert_expired(&mut conn, "overlap-", n, 1_000).await;
    let neighbour = BusyNeighbour::start(&db).await;
    let (mut sweeper, log, _) = sweeper(&db, &statsd);

    let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

    assert_each_once_none_left(&mut conn, &log.lines(), n, outcome.swept).await;
    assert_eq!(outcome.batches, 3, "full batches, then the short one");
    assert_eq!(sweeper_connections(&mut conn).await, 1, "one connection");
    neighbour.stop(&mut conn).await;
}

#[tokio::test]
async fn three_sweepers_report_each_once() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "shared-", 10_000, 1_000).await;
    let (mut a, log_a, m_a) = sweeper(&db, &statsd);
    let (mut b, log_b, m_b) = sweeper(&db, &statsd);
    let (mut c, log_c, m_c) = sweeper(&db, &statsd);
    let token = CancellationToken::new();

    let (ra, rb, rc) = tokio::join!(
        a.sweep_once(&token),
        b.sweep_once(&token),
        c.sweep_once(&token)
    );
    for m in [m_a, m_b, m_c] {
        m.flush();
    }

    let total = ra.unwrap().swept + rb.unwrap().swept + rc.unwrap().swept;
    assert_eq!(total, 10_000);
    let mut seen = HashSet::new();
    for line in log_a
        .lines()
        .iter()
        .chain(&log_b.lines())
        .chain(&log_c.lines())
    {
        let key = fields(line)["lockKey"].clone();
        assert!(seen.insert(key.clone()), "{key} reported twice");
    }
    assert_eq!(seen.len(), 10_000);
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", 10_000)
        .await;
    assert_eq!(statsd.counter("lock.lease.expired", "#backend:pg"), 10_000);
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
}
