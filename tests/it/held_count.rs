//! The shared held-lease count behind `lock.held.current`: one recount per
//! interval for a whole fleet, read by every daemon with one probe, exact
//! once a recount has run after a sweep, and never a wait on the daemon that
//! is recounting.

use std::time::Duration;

use lease_sweeper::output::events::EventLog;
use lease_sweeper::output::metrics::Metrics;
use lease_sweeper::pg::lock_entry as locks;
use lease_sweeper::pg::lock_store::{HELD_COUNT_MAX_AGE, PgLockStore};
use lease_sweeper::sweep::lock_sweeper::LockSweeper;
use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;

use crate::support::{StatsdCapture, TestDb, assert_fails_with, count, insert_expired};

async fn live(conn: &mut PgConnection, prefix: &str, n: i64) {
    sqlx::query(
        "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
         SELECT $1 || i, 'owner', nextval('lock_fencing_token_seq'), now() + interval '1 hour'
           FROM generate_series(1, $2) AS i",
    )
    .bind(prefix)
    .bind(n)
    .execute(conn)
    .await
    .unwrap();
}

async fn recounts(conn: &mut PgConnection) -> i64 {
    count(conn, "SELECT recounts FROM lock_held_count").await
}

/// Makes the stored count older than the interval, as time passing would.
async fn age_the_count(conn: &mut PgConnection) {
    sqlx::query(
        "UPDATE lock_held_count SET counted_at = counted_at - $1 * interval '1 millisecond'",
    )
    .bind(HELD_COUNT_MAX_AGE.as_millis() as i64 + 1_000)
    .execute(conn)
    .await
    .unwrap();
}

fn sweeper(db: &TestDb, statsd: &StatsdCapture) -> LockSweeper<PgLockStore> {
    let (log, _) = EventLog::in_memory();
    LockSweeper::new(
        PgLockStore::new(db.target()),
        log,
        Metrics::new(statsd.target()),
    )
}

#[tokio::test]
async fn a_fleet_of_daemons_recounts_once_per_interval_not_once_per_daemon() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    live(&mut conn, "live-", 40).await;
    let mut fleet: Vec<_> = (0..4).map(|_| sweeper(&db, &statsd)).collect();
    let token = CancellationToken::new();

    // Three rounds of sweeps by four daemons: twelve readings, one count.
    for _ in 0..3 {
        for daemon in &mut fleet {
            let outcome = daemon.sweep_once(&token).await.unwrap();
            assert_eq!(outcome.held, Some(40));
        }
    }
    assert_eq!(recounts(&mut conn).await, 1, "one recount for the fleet");

    // Once the count is older than the interval, the next reader (and only
    // it) recounts.
    age_the_count(&mut conn).await;
    for daemon in &mut fleet {
        assert_eq!(daemon.sweep_once(&token).await.unwrap().held, Some(40));
    }
    assert_eq!(recounts(&mut conn).await, 2);
}

#[tokio::test]
async fn the_count_is_exact_after_a_sweep_once_the_interval_has_passed() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    live(&mut conn, "live-", 7).await;
    insert_expired(&mut conn, "gone-", 30, 1_000).await;
    let mut a = sweeper(&db, &statsd);
    let mut b = sweeper(&db, &statsd);
    let token = CancellationToken::new();

    // A fresh database has never been counted: the first reading recounts
    // after its sweep, so it is exact at once.
    let first = a.sweep_once(&token).await.unwrap();
    assert_eq!((first.swept, first.held), (30, Some(7)));

    // Within the interval the count may be stale by what changed since
    // (documented: at most HELD_COUNT_MAX_AGE plus one count) ...
    live(&mut conn, "more-", 5).await;
    insert_expired(&mut conn, "late-", 3, 1_000).await;
    let stale = b.sweep_once(&token).await.unwrap();
    assert_eq!((stale.swept, stale.held), (3, Some(7)));
    // ... and exact on the first reading after it, whichever daemon reads.
    age_the_count(&mut conn).await;
    let fresh = a.sweep_once(&token).await.unwrap();
    assert_eq!((fresh.swept, fresh.held), (0, Some(12)));
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_entry").await,
        12
    );
    assert_eq!(recounts(&mut conn).await, 2);
}

#[tokio::test]
async fn a_daemon_never_waits_for_the_one_that_is_recounting() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    live(&mut conn, "live-", 3).await;
    let (held, recounted) = locks::held_count(&mut conn, 60_000).await.unwrap();
    assert_eq!((held, recounted), (3, true));
    live(&mut conn, "more-", 2).await;

    // Another daemon is in the middle of a recount: it holds the row.
    let mut recounter = db.connect().await;
    sqlx::query("BEGIN").execute(&mut recounter).await.unwrap();
    sqlx::query("SELECT 1 FROM lock_held_count FOR UPDATE")
        .execute(&mut recounter)
        .await
        .unwrap();

    // A reader that finds the count stale (max age 0) gets the previous
    // count at once instead of queueing behind the row lock.
    let mut reader = db.connect().await;
    let read = tokio::time::timeout(Duration::from_secs(5), locks::held_count(&mut reader, 0))
        .await
        .expect("the reader waited for the recounting daemon")
        .unwrap();
    assert_eq!(read, (3, false));

    sqlx::query("ROLLBACK")
        .execute(&mut recounter)
        .await
        .unwrap();
    assert_eq!(locks::held_count(&mut reader, 0).await.unwrap(), (5, true));
}

#[tokio::test]
async fn the_sweeper_role_reads_the_count_only_through_the_function() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    live(&mut conn, "live-", 2).await;
    sqlx::query("SET ROLE lease_sweeper")
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(locks::held_count(&mut conn, 0).await.unwrap(), (2, true));
    assert_fails_with(&mut conn, "UPDATE lock_held_count SET held = 0", "42501").await;
    assert_fails_with(&mut conn, "SELECT * FROM lock_held_count_get(-1)", "22023").await;
}
