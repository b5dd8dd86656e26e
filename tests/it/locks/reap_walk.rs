//! The backlog walk (`lock_reap_walk`): a backlog drained by walking the
//! heap reports exactly the fields the database computes for each lease
//! (integer milliseconds, deadlines before 1970 included), passes over live
//! leases and empty pages, splits the heap between walkers without either
//! waiting (a batch around a range another walker holds leaves it out, a
//! careful one locks none of its rows, a sweeper's two walkers take
//! alternate ranges), gives up at once on a row someone holds, and refuses
//! bad arguments.

use std::collections::HashMap;

use lease_sweeper::testing::events::EventLog;
use lease_sweeper::testing::lock_store::PgLockStore;
use lease_sweeper::testing::lock_sweeper::{BATCH_SIZE, LockSweeper};
use lease_sweeper::testing::metrics::Metrics;
use tokio_util::sync::CancellationToken;

use crate::support::{
    BusyNeighbour, StatsdCapture, TestDb, assert_fails_with, count, events, exec, insert_expired,
};

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
        "SELECT * FROM lock_reap_walk(NULL, 0, false)",
        "SELECT * FROM lock_reap_walk(-5, 0, false)",
        "SELECT * FROM lock_reap_walk(10, NULL, false)",
        "SELECT * FROM lock_reap_walk(10, 0, NULL)",
        "SELECT * FROM lock_reap_walk(10, 0, false, 0, 0)",
        "SELECT * FROM lock_reap_walk(10, 0, false, NULL, 0)",
        "SELECT * FROM lock_reap_walk(10, 0, false, 2, 2)",
        "SELECT * FROM lock_reap_walk(10, 0, false, 2, -1)",
        "SELECT * FROM lock_reap_walk(10, 0, false, 2, NULL)",
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
    let range = count(&mut conn, "SELECT lock_walk_range_pages()").await;
    // Empty pages over more than three ranges, then the backlog.
    expired_behind_empty_pages(&mut conn, 3 * range + 8, 300).await;
    let (rows, next): (i64, i64) = sqlx::query_as(
        "SELECT cardinality(lock_keys)::bigint, next_page FROM lock_reap_walk(100, 0, false)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(rows, 100, "a full batch from behind the empty pages");
    assert!(
        next >= 3 * range,
        "it resumes where the batch stopped, past the empty pages: {next}"
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
        "SELECT coalesce(cardinality(lock_keys), 0)::bigint, next_page FROM lock_reap_walk(100, 0, false)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(rows < 100, "a short batch from one sparse range: {rows}");
    assert_eq!(next, range, "the first page after the sparse range");
}

/// Fills lock_entry (autovacuum off, so pages stay as written) with expired
/// leases over at least three of the walk's ranges; returns the range's
/// size in pages and how many leases there are.
async fn expired_over_three_ranges(conn: &mut sqlx::PgConnection) -> (i64, i64) {
    let range = count(conn, "SELECT lock_walk_range_pages()").await;
    exec(
        conn,
        "ALTER TABLE lock_entry SET (autovacuum_enabled = off)",
    )
    .await;
    while count(
        conn,
        "SELECT pg_relation_size('lock_entry') / current_setting('block_size')::bigint",
    )
    .await
        < 3 * range
    {
        let n = count(conn, "SELECT count(*) FROM lock_entry").await;
        insert_expired(conn, &format!("k{n}-"), 5_000, 1_000).await;
    }
    (range, count(conn, "SELECT count(*) FROM lock_entry").await)
}

/// Two walkers from the same page: the second skips the range the first
/// holds instead of waiting for it, and no lease is taken by both.
#[tokio::test]
async fn walkers_split_ranges_without_waiting() {
    use sqlx::Connection as _;
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let (_, total) = expired_over_three_ranges(&mut conn).await;

    let mut first = db.connect().await;
    let mut first_tx = first.begin().await.unwrap();
    let taken_first: Vec<String> =
        sqlx::query_scalar("SELECT unnest(lock_keys) FROM lock_reap_walk(100, 0, false)")
            .fetch_all(&mut *first_tx)
            .await
            .unwrap();
    assert_eq!(taken_first.len(), 100);

    // The second walker would wait for the first's deleted rows if it met
    // them; its own lock_timeout would then fail it. It must not.
    let mut second = db.connect().await;
    let started = std::time::Instant::now();
    let taken_second: Option<Vec<String>> =
        sqlx::query_scalar("SELECT lock_keys FROM lock_reap_walk(100, 0, false)")
            .fetch_one(&mut second)
            .await
            .expect("the second walker skips the held range instead of waiting on its rows");
    let taken_second = taken_second.unwrap_or_default();
    assert!(
        started.elapsed() < std::time::Duration::from_millis(45),
        "the second walker did not wait: {:?}",
        started.elapsed()
    );
    assert_eq!(
        taken_second.len(),
        100,
        "a full batch from a range of its own"
    );
    let both: std::collections::HashSet<_> = taken_first.iter().chain(&taken_second).collect();
    assert_eq!(both.len(), 200, "no lease taken by both walkers");

    first_tx.commit().await.unwrap();
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_entry").await,
        total - 200
    );
}

/// One sweeper's two walkers, in alternate ranges (stride 2, phases 0 and
/// 1): while the first holds a full batch uncommitted, the second drains all
/// of its own ranges without meeting a row of the first's (it would wait on
/// it and fail after lock_timeout); each takes only rows of its own ranges,
/// and together they take every expired lease once.
#[tokio::test]
async fn alternate_range_walkers_split_the_heap() {
    use sqlx::Connection as _;
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let (_, total) = expired_over_three_ranges(&mut conn).await;
    let range_of: HashMap<String, i64> = sqlx::query_as(
        "SELECT lock_key, (ctid::text::point)[0]::bigint / lock_walk_range_pages() FROM lock_entry",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert!(range_of.values().any(|&r| r >= 2), "three ranges at least");

    /// Walks `phase`'s ranges to the end of the table in batches of 1,000,
    /// each committed before the next; the keys taken.
    async fn walk_to_the_end(conn: &mut sqlx::PgConnection, phase: i32, from: i64) -> Vec<String> {
        let mut keys = Vec::new();
        let mut page = from;
        while page >= 0 {
            let (batch, next): (Option<Vec<String>>, i64) = sqlx::query_as(
                "SELECT lock_keys, next_page FROM lock_reap_walk(1000, $1, false, 2, $2)",
            )
            .bind(page)
            .bind(phase)
            .fetch_one(&mut *conn)
            .await
            .expect("a walker never meets the other's rows");
            keys.extend(batch.unwrap_or_default());
            page = next;
        }
        keys
    }

    // The first walker's first batch, held open.
    let mut first = db.connect().await;
    let mut first_tx = first.begin().await.unwrap();
    let (held, next): (Vec<String>, i64) =
        sqlx::query_as("SELECT lock_keys, next_page FROM lock_reap_walk(1000, 0, false, 2, 0)")
            .fetch_one(&mut *first_tx)
            .await
            .unwrap();
    assert_eq!(held.len(), 1000);
    let mut second = db.connect().await;
    let taken_second = walk_to_the_end(&mut second, 1, 0).await;
    first_tx.commit().await.unwrap();
    let taken_first: Vec<String> = held
        .into_iter()
        .chain(walk_to_the_end(&mut first, 0, next).await)
        .collect();

    for (phase, keys) in [&taken_first, &taken_second].into_iter().enumerate() {
        assert!(!keys.is_empty());
        let strays: Vec<_> = keys
            .iter()
            .filter(|k| range_of[k.as_str()] % 2 != phase as i64)
            .collect();
        assert!(
            strays.is_empty(),
            "walker {phase} took rows of the other's ranges: {strays:?}"
        );
    }
    let both: std::collections::HashSet<_> = taken_first.iter().chain(&taken_second).collect();
    assert_eq!(
        (
            both.len() as i64,
            (taken_first.len() + taken_second.len()) as i64
        ),
        (total, total),
        "every lease taken once"
    );
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
}

/// How many rows pages `from`..`to` of lock_entry hold.
async fn rows_in_range(conn: &mut sqlx::PgConnection, from: i64, to: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM lock_entry
          WHERE ctid >= format('(%s,0)', $1::bigint)::tid AND ctid < format('(%s,0)', $2::bigint)::tid",
    )
    .bind(from)
    .bind(to)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// A batch that spans a range another walker holds leaves that range's rows
/// out of its one range DELETE: it takes the ranges on either side, never
/// meets the other walker's rows (which would fail it after lock_timeout),
/// and no lease is taken by both.
#[tokio::test]
async fn batch_around_a_held_range_leaves_it_out() {
    use sqlx::Connection as _;
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let (range, total) = expired_over_three_ranges(&mut conn).await;
    let first_range = rows_in_range(&mut conn, 0, range).await;
    let middle_range = rows_in_range(&mut conn, range, 2 * range).await;
    assert!(first_range > 0 && middle_range > 100);

    // The other walker holds the middle range, 100 of its rows deleted.
    let mut other = db.connect().await;
    let mut other_tx = other.begin().await.unwrap();
    let taken_other: Vec<String> =
        sqlx::query_scalar("SELECT unnest(lock_keys) FROM lock_reap_walk(100, $1, false)")
            .bind(range)
            .fetch_all(&mut *other_tx)
            .await
            .unwrap();
    assert_eq!(taken_other.len(), 100);

    // This batch has room for the first range and 10 rows of the third.
    let mut walker = db.connect().await;
    let (keys, next_page): (Option<Vec<String>>, i64) =
        sqlx::query_as("SELECT lock_keys, next_page FROM lock_reap_walk($1, 0, false)")
            .bind(i32::try_from(first_range + 10).unwrap())
            .fetch_one(&mut walker)
            .await
            .expect("the batch leaves the held range out instead of waiting on its rows");
    let keys = keys.unwrap_or_default();
    assert_eq!(
        keys.len() as i64,
        first_range + 10,
        "the first range and 10 rows of the third"
    );
    assert_eq!(next_page, 2 * range, "it stopped in the third range");
    let both: std::collections::HashSet<_> = taken_other.iter().chain(&keys).collect();
    assert_eq!(
        both.len() as i64,
        100 + first_range + 10,
        "no lease taken by both walkers"
    );

    other_tx.commit().await.unwrap();
    assert_eq!(
        rows_in_range(&mut conn, range, 2 * range).await,
        middle_range - 100,
        "the held range lost only the other walker's rows"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_entry").await,
        total - 100 - first_range - 10
    );
}

/// A careful walker (rows locked first, beside a workload) that meets a
/// range another walker holds locks none of its rows: row locks kept there
/// until its commit would make callers of those keys wait for nothing.
#[tokio::test]
async fn careful_walker_locks_no_row_of_a_held_range() {
    use sqlx::Connection as _;
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let (range, _) = expired_over_three_ranges(&mut conn).await;
    let first_range = rows_in_range(&mut conn, 0, range).await;

    let mut other = db.connect().await;
    let mut other_tx = other.begin().await.unwrap();
    let taken_other: Vec<String> =
        sqlx::query_scalar("SELECT unnest(lock_keys) FROM lock_reap_walk(100, 0, false)")
            .fetch_all(&mut *other_tx)
            .await
            .unwrap();
    assert_eq!(taken_other.len(), 100);

    let mut careful = db.connect().await;
    let mut careful_tx = careful.begin().await.unwrap();
    let taken: Vec<String> =
        sqlx::query_scalar("SELECT unnest(lock_keys) FROM lock_reap_walk(500, 0, true)")
            .fetch_all(&mut *careful_tx)
            .await
            .unwrap();
    assert_eq!(taken.len(), 500, "a full batch from the next range");
    let both: std::collections::HashSet<_> = taken_other.iter().chain(&taken).collect();
    assert_eq!(both.len(), 600, "no lease taken by both walkers");

    // Every row of the held range that the other walker did not delete is
    // still free while both batches are open.
    let free: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM lock_entry
          WHERE ctid >= '(0,0)'::tid AND ctid < format('(%s,0)', $1::bigint)::tid
            FOR UPDATE SKIP LOCKED) AS free",
    )
    .bind(range)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        free,
        first_range - 100,
        "the careful walker locked rows of the held range"
    );
    careful_tx.commit().await.unwrap();
    other_tx.commit().await.unwrap();
}

/// A walk that meets a row another session holds gives up after its
/// lock_timeout instead of waiting for that session, and takes nothing; the
/// careful walk (rows locked first) skips that row and takes the rest.
#[tokio::test]
async fn held_row_fails_fast_walk_careful_skips() {
    use sqlx::Connection as _;
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "held-", 500, 1_000).await;
    let mut holder = db.connect().await;
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM lock_entry WHERE lock_key = 'held-250' FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();

    let started = std::time::Instant::now();
    assert_fails_with(
        &mut conn,
        "SELECT * FROM lock_reap_walk(1000, 0, false)",
        "55P03",
    )
    .await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "it gave up after its lock_timeout: {:?}",
        started.elapsed()
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_entry").await,
        500
    );

    let taken: Vec<String> =
        sqlx::query_scalar("SELECT unnest(lock_keys) FROM lock_reap_walk(1000, 0, true)")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(taken.len(), 499);
    assert!(!taken.contains(&"held-250".to_owned()));
    tx.rollback().await.unwrap();
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 1);
}

/// `busy` counts the other sessions of the database running a statement
/// (the workload a backlog's drain then yields to), not idle ones and not
/// the sweepers' own.
#[tokio::test]
async fn walk_counts_busy_neighbours() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    exec(&mut conn, "SET application_name = 'lease-sweeper'").await;
    insert_expired(&mut conn, "busy-", 10, 1_000).await;
    let mut idle = db.connect().await;
    exec(&mut idle, "SELECT 1").await;
    let walk_busy = async |conn: &mut sqlx::PgConnection| -> i32 {
        sqlx::query_scalar("SELECT busy FROM lock_reap_walk(1, 0, false)")
            .fetch_one(conn)
            .await
            .unwrap()
    };
    assert_eq!(walk_busy(&mut conn).await, 0, "an idle session is not busy");

    let mut sleepers = Vec::new();
    for name in ["lease-sweeper", "the-lock-server"] {
        sleepers.push(BusyNeighbour::named(&db, Some(name)).await);
    }
    assert_eq!(
        walk_busy(&mut conn).await,
        1,
        "the lock server's statement counts; another sweeper's does not"
    );

    for sleeper in sleepers {
        sleeper.stop(&mut conn).await;
    }
}
