//! How sweeps lower the count: every daemon's gauge at once (the sweeping
//! one in the same pass, the others at their next reading), by exactly the
//! leases the count included, never by a batch that rolled back or whose
//! lines failed, never twice, on every reaping path.

use std::time::Duration;

use lease_sweeper::testing::events::EventLog;
use lease_sweeper::testing::lock_entry::{self as locks, HELD_COUNT_MAX_AGE};
use lease_sweeper::testing::lock_store::PgLockStore;
use lease_sweeper::testing::lock_sweeper::{BATCH_SIZE, LockSweeper};
use lease_sweeper::testing::metrics::Metrics;
use lease_sweeper::testing::store::StoreError;
use sqlx::Connection as _;
use tokio_util::sync::CancellationToken;

use super::{Replica, age_the_count, deltas, held_now, live, recounted, recounts, stored};
use crate::locks::BrokenPipe;
use crate::support::bad_rows::legal_hold;
use crate::support::{StatsdCapture, TestDb, count, exec, insert_expired, wait_until};

/// Twelve held, eight of them expired but not yet swept when counted, and
/// two daemons: the one that sweeps reports four in that same pass, the other
/// at its next, and nobody recounted.
#[tokio::test]
async fn sweep_lowers_every_daemons_gauge() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    live(&mut conn, "live-", 4).await;
    insert_expired(&mut conn, "gone-", 8, 1_000).await;
    let mut a = Replica::new(&db).await;
    let mut b = Replica::new(&db).await;
    assert_eq!(
        locks::held_count(&mut conn, 0).await.unwrap(),
        recounted(12)
    );

    assert_eq!(a.pass().await, (8, 4, 4), "swept, held, gauge: the sweeper");
    assert_eq!(b.pass().await, (0, 4, 4), "swept, held, gauge: the other");
    assert_eq!(
        recounts(&mut conn).await,
        1,
        "no recount: the database subtracted"
    );
    assert_eq!(held_now(&mut conn).await, 4);
    assert_eq!(deltas(&mut conn).await, (1, 8), "one batch of eight");
}

#[tokio::test]
async fn failed_lines_batch_not_held() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    live(&mut conn, "live-", 4).await;
    insert_expired(&mut conn, "kept-", 8, 1_000).await;
    assert_eq!(
        locks::held_count(&mut conn, 0).await.unwrap(),
        recounted(12)
    );
    let mut broken = LockSweeper::new(
        PgLockStore::new(db.target()),
        EventLog::to_writer(Box::new(BrokenPipe)),
        Metrics::new(statsd.target()),
    );

    let err = broken
        .sweep_once(&CancellationToken::new())
        .await
        .unwrap_err();

    // The leases were released before their lines were tried: the lock
    // server may take their keys, so they are not held, and their record is
    // the hand-off, which stays until some sweeper writes the lines.
    assert!(matches!(err, StoreError::Report { .. }), "{err}");
    assert_eq!(held_now(&mut conn).await, 4);
    assert_eq!(deltas(&mut conn).await, (1, 8));
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_reap_handoff").await,
        1
    );
    let max_age = HELD_COUNT_MAX_AGE.as_millis() as i64;
    assert_eq!(
        locks::held_count(&mut conn, max_age).await.unwrap(),
        stored(4)
    );
}

#[tokio::test]
async fn recount_folds_sweeps_subtracts_once() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    live(&mut conn, "live-", 4).await;
    insert_expired(&mut conn, "gone-", 8, 1_000).await;
    assert_eq!(
        locks::held_count(&mut conn, 0).await.unwrap(),
        recounted(12)
    );
    let max_age = HELD_COUNT_MAX_AGE.as_millis() as i64;

    // A daemon's batch has deleted the eight but not committed (its stdout
    // is stuck, say): its row locks and its delta row are held open.
    let mut stuck = db.connect().await;
    let mut tx = stuck.begin().await.unwrap();
    let batch = locks::reap_batch(&mut tx, 100, None).await.unwrap();
    assert_eq!(batch.leases.len(), 8);

    // A recount and another daemon's pass meanwhile neither wait for it nor
    // see it.
    let mut other = db.connect().await;
    let recount = tokio::time::timeout(Duration::from_secs(5), locks::held_count(&mut other, 0))
        .await
        .expect("a recount waited for another daemon's open batch")
        .unwrap();
    assert_eq!(recount, recounted(12));
    let mut daemon = Replica::new(&db).await;
    let pass = tokio::time::timeout(Duration::from_secs(5), daemon.pass())
        .await
        .expect("a pass waited for another daemon's open batch");
    assert_eq!(pass, (0, 12, 12));

    // The batch commits after that recount's snapshot: the recount counted
    // its eight, and its delta row survived to be subtracted, once.
    tx.commit().await.unwrap();
    assert_eq!(deltas(&mut conn).await, (1, 8));
    assert_eq!(
        locks::held_count(&mut other, max_age).await.unwrap(),
        stored(4)
    );
    assert_eq!(daemon.pass().await, (0, 4, 4));

    // The next recount sees the deletions and folds the batch: exact, and
    // nothing left to subtract twice.
    age_the_count(&mut conn).await;
    assert_eq!(
        locks::held_count(&mut other, 0).await.unwrap(),
        recounted(4)
    );
    assert_eq!(deltas(&mut conn).await, (0, 0));
    assert_eq!(
        locks::held_count(&mut other, max_age).await.unwrap(),
        stored(4)
    );
    assert_eq!(held_now(&mut conn).await, 4);
}

/// A reading is the count the last recount took less the leases it included
/// that were swept since: never a number of leases there never were.
#[tokio::test]
async fn subtracts_only_counted_leases() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    live(&mut conn, "live-", 4).await;
    let mut a = Replica::new(&db).await;
    assert_eq!(a.pass().await, (0, 4, 4), "a fresh database: recounted");

    // Acquired after the count, expired and swept before the next one: the
    // count never included them, so the gauge stays at the four held (not
    // 4 - 3 = 1, which no moment ever had).
    insert_expired(&mut conn, "late-", 3, 1_000).await;
    assert_eq!(a.pass().await, (3, 4, 4));
    assert_eq!(held_now(&mut conn).await, 4);
    assert_eq!(deltas(&mut conn).await, (0, 0));

    // A counted lease renewed after the count is a new row version, which
    // the count's snapshot cannot vouch for: its sweep is not subtracted
    // either, and the gauge is high by one (never low) until the recount.
    let token: i64 = sqlx::query_scalar("SELECT token FROM lock_entry WHERE lock_key = 'live-1'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    exec(
        &mut conn,
        &format!("SELECT lock_renew('live-1', {token}, 1)"),
    )
    .await;
    wait_until(
        Duration::from_secs(10),
        "the renewed lease to expire",
        || async {
            let mut c = db.connect().await;
            count(
                &mut c,
                "SELECT count(*) FROM lock_entry WHERE expires_at <= now()",
            )
            .await
                == 1
        },
    )
    .await;
    assert_eq!(a.pass().await, (1, 4, 4));
    assert_eq!(held_now(&mut conn).await, 3);
    age_the_count(&mut conn).await;
    assert_eq!(a.pass().await, (0, 3, 3));
}

#[tokio::test]
async fn every_reaping_path_lowers_count() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let mut a = Replica::new(&db).await;

    // A backlog: the first batch by the expiry index, the rest by the heap
    // walk.
    let backlog = 2 * BATCH_SIZE as i64 + 10;
    live(&mut conn, "live-", 5).await;
    insert_expired(&mut conn, "bulk-", backlog, 1_000).await;
    assert_eq!(
        locks::held_count(&mut conn, 0).await.unwrap(),
        recounted(backlog + 5)
    );
    let counted = recounts(&mut conn).await;
    assert_eq!(a.pass().await, (backlog as u64, 5, 5));
    // A drain slower than the max age ends in a recount, which folds the
    // batches' rows into the count it stores (the 5 above); otherwise each
    // batch left its row.
    if recounts(&mut conn).await == counted {
        let (batches, subtracted) = deltas(&mut conn).await;
        assert_eq!(subtracted, backlog);
        assert!(batches >= 3, "{batches} batches for {backlog} leases");
    }

    // A row that cannot be deleted: the batch is redone row by row, the bad
    // row set aside, the others subtracted.
    legal_hold(&mut conn, "cursed%", &["lock_entry"]).await;
    insert_expired(&mut conn, "ordinary-", 6, 1_000).await;
    insert_expired(&mut conn, "cursed-", 1, 2_000).await;
    assert_eq!(
        locks::held_count(&mut conn, 0).await.unwrap(),
        recounted(12)
    );
    assert_eq!(a.pass().await, (6, 6, 6), "five live and the one set aside");
    assert_eq!(deltas(&mut conn).await, (1, 6));
    assert_eq!(held_now(&mut conn).await, 6);
}
