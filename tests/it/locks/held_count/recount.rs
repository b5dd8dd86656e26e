//! The count's own rules: one recount per interval for a whole fleet,
//! exact on the first reading after it, never waited for while another
//! daemon recounts, read only through its function, the lock server's work
//! seen once the count is older than its max age, and an idle pass that is
//! the probe alone.

use std::time::Duration;

use lease_sweeper::testing::lock_entry::{self as locks, HELD_COUNT_MAX_AGE};
use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;

use super::{
    Replica, age_the_count, age_the_count_by, held_now, live, recounted, recounts, stored,
};
use crate::locks::sweeper;
use crate::support::{
    StatsdCapture, TestDb, assert_fails_with, count, exec, insert_expired, wait_until,
};

#[tokio::test]
async fn fleet_recounts_once_per_interval() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    live(&mut conn, "live-", 40).await;
    let mut fleet: Vec<_> = (0..4).map(|_| sweeper(&db, &statsd).0).collect();
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
async fn exact_after_sweep_and_interval() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    live(&mut conn, "live-", 7).await;
    insert_expired(&mut conn, "gone-", 30, 1_000).await;
    let (mut a, _, _) = sweeper(&db, &statsd);
    let (mut b, _, _) = sweeper(&db, &statsd);
    let token = CancellationToken::new();

    // A fresh database has never been counted: the first reading recounts
    // after its sweep, so it is exact at once.
    let first = a.sweep_once(&token).await.unwrap();
    assert_eq!((first.swept, first.held), (30, Some(7)));

    // Within the interval the count may be stale by what the lock server
    // did since (documented: HELD_COUNT_MAX_AGE plus two sweep periods): the
    // 3 swept were acquired after the count, which never included them, so
    // their sweep subtracts nothing ...
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
async fn never_waits_for_the_recount() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    live(&mut conn, "live-", 3).await;
    insert_expired(&mut conn, "gone-", 1, 1_000).await;
    let count = locks::held_count(&mut conn, 60_000).await.unwrap();
    assert_eq!(count, recounted(4));
    // A sweep commits, and the lock server acquires two more.
    let swept = locks::reap_batch(&mut conn, 10, None).await.unwrap();
    assert_eq!(swept.leases.len(), 1);
    live(&mut conn, "more-", 2).await;

    // Another daemon is in the middle of a recount: it holds the row.
    let mut recounter = db.connect().await;
    sqlx::query("BEGIN").execute(&mut recounter).await.unwrap();
    sqlx::query("SELECT 1 FROM lock_held_count FOR UPDATE")
        .execute(&mut recounter)
        .await
        .unwrap();

    // A reader that finds the count stale (max age 0) gets the previous
    // count, less the sweep since, at once instead of queueing behind the
    // row lock.
    let mut reader = db.connect().await;
    let read = tokio::time::timeout(Duration::from_secs(5), locks::held_count(&mut reader, 0))
        .await
        .expect("the reader waited for the recounting daemon")
        .unwrap();
    assert_eq!(read, stored(3));

    sqlx::query("ROLLBACK")
        .execute(&mut recounter)
        .await
        .unwrap();
    assert_eq!(
        locks::held_count(&mut reader, 0).await.unwrap(),
        recounted(5)
    );
}

#[tokio::test]
async fn role_reads_only_through_function() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    live(&mut conn, "live-", 2).await;
    sqlx::query("SET ROLE lease_sweeper")
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(locks::held_count(&mut conn, 0).await.unwrap(), recounted(2));
    assert_fails_with(&mut conn, "UPDATE lock_held_count SET held = 0", "42501").await;
    assert_fails_with(&mut conn, "SELECT * FROM lock_held_delta", "42501").await;
    assert_fails_with(
        &mut conn,
        "INSERT INTO lock_held_delta (n) VALUES (1)",
        "42501",
    )
    .await;
    assert_fails_with(&mut conn, "DELETE FROM lock_held_delta", "42501").await;
    assert_fails_with(&mut conn, "SELECT * FROM lock_held_count_get(-1)", "22023").await;
}

/// The bound docs/metrics-and-logs.md states: what only a recount sees (the
/// lock server's acquisitions and releases) is in every daemon's gauge once
/// the count is older than HELD_COUNT_MAX_AGE, at its next pass.
#[tokio::test]
async fn lock_server_work_seen_after_max_age() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    live(&mut conn, "live-", 4).await;
    let mut a = Replica::new(&db).await;
    let mut b = Replica::new(&db).await;
    assert_eq!(a.pass().await, (0, 4, 4));
    assert_eq!(b.pass().await, (0, 4, 4));
    assert_eq!(recounts(&mut conn).await, 1);

    exec(
        &mut conn,
        "SELECT lock_acquire('new-' || i, 'owner', 60000) FROM generate_series(1, 3) AS i;
         SELECT lock_release('live-1', token) FROM lock_entry WHERE lock_key = 'live-1';",
    )
    .await;
    assert_eq!(held_now(&mut conn).await, 6);

    // Younger than the max age: still the count taken before.
    let max_age = HELD_COUNT_MAX_AGE.as_millis() as i64;
    age_the_count_by(&mut conn, max_age / 3).await;
    assert_eq!(a.pass().await, (0, 4, 4));
    assert_eq!(b.pass().await, (0, 4, 4));
    assert_eq!(recounts(&mut conn).await, 1);

    // Older: the first daemon to read recounts, the other reads its count.
    age_the_count_by(&mut conn, max_age - max_age / 3).await;
    assert_eq!(a.pass().await, (0, 6, 6));
    assert_eq!(b.pass().await, (0, 6, 6));
    assert_eq!(recounts(&mut conn).await, 2);
}

/// Calls of the lock sweep's functions in this database, from the function
/// statistics (`track_functions`), by name.
async fn calls(conn: &mut PgConnection) -> std::collections::BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "SELECT p.proname::text, coalesce(s.calls, 0)
           FROM pg_proc AS p
           LEFT JOIN pg_stat_user_functions AS s ON s.funcid = p.oid
          WHERE p.proname IN ('lock_sweep_probe', 'lock_held_count_get', 'lock_reap_batch',
                              'lock_drain_takeovers')",
    )
    .fetch_all(conn)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// An idle pass is the probe alone, and the probe's fresh count already has
/// another daemon's sweep subtracted: no count, no second statement.
#[tokio::test]
async fn idle_pass_is_one_probe() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    // Sessions opened from now on count their function calls.
    exec(
        &mut conn,
        &format!("ALTER DATABASE {} SET track_functions = 'pl'", db.name),
    )
    .await;
    live(&mut conn, "live-", 4).await;
    insert_expired(&mut conn, "gone-", 8, 1_000).await;
    assert_eq!(
        locks::held_count(&mut conn, 0).await.unwrap(),
        recounted(12)
    );
    let mut a = Replica::new(&db).await;
    assert_eq!(a.pass().await, (8, 4, 4));
    // A backend hands in its statistics when it exits (idle, only every
    // 10 s): each daemon is dropped before its calls are read.
    drop(a);
    let swept = |c: &std::collections::BTreeMap<String, i64>| {
        (
            c["lock_sweep_probe"],
            c["lock_reap_batch"],
            c["lock_held_count_get"],
        )
    };
    wait_until(
        Duration::from_secs(10),
        "the sweeping daemon's statistics",
        || async {
            let mut c = db.connect().await;
            swept(&calls(&mut c).await) == (1, 1, 1)
        },
    )
    .await;
    let before = calls(&mut conn).await;

    // The count as fresh as a recount just now, the sweep still to subtract.
    exec(&mut conn, "UPDATE lock_held_count SET counted_at = now()").await;
    let mut b = Replica::new(&db).await;
    for _ in 0..3 {
        assert_eq!(b.pass().await, (0, 4, 4));
    }
    drop(b);

    wait_until(
        Duration::from_secs(10),
        "the idle daemon's statistics",
        || async {
            let mut c = db.connect().await;
            calls(&mut c).await["lock_sweep_probe"] >= before["lock_sweep_probe"] + 3
        },
    )
    .await;
    let mut after = calls(&mut conn).await;
    assert_eq!(
        after.remove("lock_sweep_probe"),
        Some(before["lock_sweep_probe"] + 3)
    );
    let mut rest = before.clone();
    rest.remove("lock_sweep_probe");
    assert_eq!(
        after, rest,
        "three idle passes: three probes and nothing else"
    );
    assert_eq!(recounts(&mut conn).await, 1);
}
