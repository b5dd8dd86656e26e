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

use crate::support::{StatsdCapture, TestDb, assert_fails_with, count, events, exec};

#[tokio::test]
async fn walk_reports_database_millis() {
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
async fn walk_refuses_bad_limit_or_page() {
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

/// Fills the first `empty_pages` pages of `lock_entry` with rows, writes
/// `expired` expired leases after them, then deletes the filler and vacuums:
/// the expired rows sit behind pages that hold nothing (a table whose first
/// half was released while no sweeper ran).
async fn expired_behind_empty_pages(conn: &mut sqlx::PgConnection, empty_pages: i64, expired: i64) {
    exec(
        conn,
        "ALTER TABLE lock_entry SET (autovacuum_enabled = off);
         INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
         SELECT 'filler-' || i, 'o', nextval('lock_fencing_token_seq'), now() + interval '1 hour'
           FROM generate_series(1, 2000) AS i",
    )
    .await;
    // Grow the filler until it covers the pages asked for.
    while count(
        conn,
        "SELECT pg_relation_size('lock_entry') / current_setting('block_size')::bigint",
    )
    .await
        < empty_pages
    {
        exec(
            conn,
            "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
             SELECT 'filler-' || i || '-' || nextval('lock_fencing_token_seq'), 'o',
                    nextval('lock_fencing_token_seq'), now() + interval '1 hour'
               FROM generate_series(1, 20000) AS i",
        )
        .await;
    }
    sqlx::query(
        "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
         SELECT 'k-' || i, 'o', nextval('lock_fencing_token_seq'), now() - interval '1 minute'
           FROM generate_series(1, $1) AS i",
    )
    .bind(expired)
    .execute(&mut *conn)
    .await
    .unwrap();
    exec(
        conn,
        "DELETE FROM lock_entry WHERE lock_key LIKE 'filler-%'",
    )
    .await;
    exec(conn, "VACUUM lock_entry").await;
}

#[tokio::test]
async fn walk_crosses_empty_pages_stops_at_sparse() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    // A limit of 100 walks 50 pages a range: 200 empty pages are four ranges.
    expired_behind_empty_pages(&mut conn, 200, 300).await;
    let (rows, next): (i64, i64) = sqlx::query_as(
        "SELECT count(lock_key), max(next_page) FROM lock_reap_expired_walk(100, 0)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(rows, 100, "a full batch from behind the empty pages");
    assert!(
        next >= 200,
        "it resumes where the batch stopped, not at page 50: {next}"
    );

    // Live rows with one expired lease in a hundred: the range ends the walk.
    exec(
        &mut conn,
        "DELETE FROM lock_entry;
         INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
         SELECT 'live-' || i, 'o', nextval('lock_fencing_token_seq'),
                CASE WHEN i % 100 = 0 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END
           FROM generate_series(1, 20000) AS i",
    )
    .await;
    let (rows, next): (i64, i64) = sqlx::query_as(
        "SELECT count(lock_key), max(next_page) FROM lock_reap_expired_walk(100, 0)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(rows < 100, "a short batch from one sparse range: {rows}");
    assert_eq!(next, 50, "the first page after the sparse range");
}

#[tokio::test]
async fn backlog_behind_empty_pages_reported_once() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    // More empty pages than one walk range (BATCH_SIZE / 2 pages), and two
    // and a half batches behind them.
    let expired = BATCH_SIZE as i64 * 5 / 2;
    expired_behind_empty_pages(&mut conn, BATCH_SIZE as i64 / 2 + 500, expired).await;

    let (log, lines) = EventLog::in_memory();
    let mut sweeper = LockSweeper::new(
        PgLockStore::new(db.target()),
        log,
        Metrics::new(statsd.target()),
    );
    let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

    assert_eq!(outcome.swept as i64, expired);
    let reported = events(&lines.lines(), "lease_expired");
    assert_eq!(reported.len() as i64, expired);
    let keys: std::collections::HashSet<_> =
        reported.iter().map(|f| f["lockKey"].clone()).collect();
    assert_eq!(keys.len() as i64, expired, "no lease reported twice");
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
}
