//! The shared held-lease count behind `lock.held.current`: one recount per
//! interval for a whole fleet, read by every daemon with one probe; lowered
//! by every sweep at once (on the sweeping daemon in the same pass, on every
//! other at its next reading), by exactly the leases the count included,
//! never by a batch that rolled back, never twice; the lock server's work
//! shown once the count is older than its max age; and never a wait on
//! another daemon, recounting or stuck in its batch.

use std::time::Duration;

use lease_sweeper::testing::events::EventLog;
use lease_sweeper::testing::lock_entry::{self as locks, HELD_COUNT_MAX_AGE, HeldCount};
use lease_sweeper::testing::lock_store::PgLockStore;
use lease_sweeper::testing::lock_sweeper::{BATCH_SIZE, LockSweeper};
use lease_sweeper::testing::metrics::Metrics;
use lease_sweeper::testing::store::StoreError;
use sqlx::{Connection as _, PgConnection};
use tokio_util::sync::CancellationToken;

use crate::support::{
    StatsdCapture, TestDb, assert_fails_with, count, exec, insert_expired, wait_until,
};

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
    age_the_count_by(conn, HELD_COUNT_MAX_AGE.as_millis() as i64 + 1_000).await;
}

async fn age_the_count_by(conn: &mut PgConnection, ms: i64) {
    sqlx::query(
        "UPDATE lock_held_count SET counted_at = counted_at - $1 * interval '1 millisecond'",
    )
    .bind(ms)
    .execute(conn)
    .await
    .unwrap();
}

/// Batches recorded since the last recount, and the leases they subtract.
async fn deltas(conn: &mut PgConnection) -> (i64, i64) {
    sqlx::query_as("SELECT count(*), coalesce(sum(n), 0)::bigint FROM lock_held_delta")
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn held_now(conn: &mut PgConnection) -> i64 {
    count(conn, "SELECT count(*) FROM lock_entry").await
}

/// `held_count`'s answer when that call recounted.
fn recounted(held: i64) -> HeldCount {
    HeldCount {
        held,
        recounted: true,
    }
}

/// `held_count`'s answer when that call read the stored count.
fn stored(held: i64) -> HeldCount {
    HeldCount {
        held,
        recounted: false,
    }
}

/// One daemon's lock sweep with its own StatsD listener, so each daemon's
/// gauge can be read on its own.
struct Replica {
    sweeper: LockSweeper<PgLockStore>,
    metrics: Metrics,
    statsd: StatsdCapture,
}

impl Replica {
    async fn new(db: &TestDb) -> Self {
        let statsd = StatsdCapture::start().await;
        let metrics = Metrics::new(statsd.target());
        let (log, _) = EventLog::in_memory();
        Self {
            sweeper: LockSweeper::new(PgLockStore::new(db.target()), log, metrics.clone()),
            metrics,
            statsd,
        }
    }

    /// One pass, its gauge flushed as the daemon's loop does: (swept, held,
    /// the gauge StatsD received).
    async fn pass(&mut self) -> (u64, i64, u64) {
        let outcome = self
            .sweeper
            .sweep_once(&CancellationToken::new())
            .await
            .unwrap();
        let held = outcome.held.expect("a finished pass reports the gauge");
        let before = self.statsd.lines().len();
        self.metrics.flush();
        wait_until(Duration::from_secs(10), "the gauge datagram", || async {
            self.statsd.lines()[before..]
                .iter()
                .any(|l| l.starts_with("lock.held.current:"))
        })
        .await;
        let gauge = self
            .statsd
            .gauge("lock.held.current", "#backend:pg")
            .unwrap();
        (outcome.swept, held, gauge)
    }
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
async fn fleet_recounts_once_per_interval() {
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
async fn exact_after_sweep_and_interval() {
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

struct BrokenPipe;
impl std::io::Write for BrokenPipe {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
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
    exec(
        &mut conn,
        "CREATE FUNCTION refuse_cursed() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF OLD.lock_key LIKE 'cursed%' THEN RAISE EXCEPTION 'legal hold on %', OLD.lock_key; END IF;
             RETURN OLD;
         END $$;
         CREATE TRIGGER refuse_cursed BEFORE DELETE ON lock_entry FOR EACH ROW EXECUTE FUNCTION refuse_cursed();",
    )
    .await;
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
