//! The backlog walk (`lock_reap_expired_walk`): a backlog drained by walking
//! the heap reports exactly the fields the database computes for each lease
//! (integer milliseconds, deadlines before 1970 included), passes over live
//! leases, and refuses bad arguments.

use std::collections::HashMap;

use lease_sweeper::testing::events::EventLog;
use lease_sweeper::testing::lock_store::PgLockStore;
use lease_sweeper::testing::lock_sweeper::{BATCH_SIZE, LockSweeper};
use lease_sweeper::testing::metrics::Metrics;
use tokio_util::sync::CancellationToken;

use crate::support::{StatsdCapture, TestDb, assert_fails_with, count, events};

#[tokio::test]
async fn a_backlog_walk_reports_the_same_millis_as_the_database_for_every_lease() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    // Two and a half batches with deadlines at every millisecond phase over
    // the last hour, a few before 1970, and live ones mixed in between (the
    // walk must pass over them).
    let n = BATCH_SIZE as i64 * 5 / 2;
    sqlx::query(
        "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
         SELECT 'k-' || i, 'o', nextval('lock_fencing_token_seq'),
                CASE WHEN i % 997 = 0 THEN timestamptz '1969-12-31 23:59:59.9995+00' - i * interval '1 day'
                     WHEN i % 3 = 0 THEN now() + interval '1 hour'
                     ELSE now() - interval '1 second' - i * interval '0.7301 second' END
           FROM generate_series(1, $1) AS i",
    )
    .bind(n)
    .execute(&mut conn)
    .await
    .unwrap();
    // What the database itself says each expired lease's fields are, with the
    // lateness taken when the sweep runs (bounded below).
    let want: HashMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT lock_key, floor(extract(epoch FROM expires_at) * 1000)::bigint
           FROM lock_entry WHERE expires_at <= now() AND isfinite(expires_at)",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let live = count(
        &mut conn,
        "SELECT count(*) FROM lock_entry WHERE expires_at > now()",
    )
    .await;

    let (log, lines) = EventLog::in_memory();
    let mut sweeper = LockSweeper::new(
        PgLockStore::new(db.target()),
        log,
        Metrics::new(statsd.target()),
    );
    let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

    assert_eq!(outcome.swept as usize, want.len());
    let reported = events(&lines.lines(), "lease_expired");
    assert_eq!(reported.len(), want.len());
    let mut seen = HashMap::new();
    for f in &reported {
        let key = f["lockKey"].clone();
        let expired: i64 = f["expiredAtMillis"].parse().unwrap();
        let overdue: i64 = f["overdueMillis"].parse().unwrap();
        assert_eq!(Some(&expired), want.get(&key), "{f:?}");
        assert!(overdue >= 1_000, "{f:?}");
        assert!(seen.insert(key, ()).is_none(), "reported twice: {f:?}");
    }
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_entry").await,
        live,
        "every expired lease gone, every live one kept"
    );
}

#[tokio::test]
async fn the_walk_refuses_a_null_or_negative_limit_or_a_null_page() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    for sql in [
        "SELECT * FROM lock_reap_expired_walk(NULL, 0)",
        "SELECT * FROM lock_reap_expired_walk(-5, 0)",
        "SELECT * FROM lock_reap_expired_walk(10, NULL)",
    ] {
        assert_fails_with(&mut conn, sql, "22023").await;
    }
}
