//! Lock servers whose token is not a number: a random `uuid`, and `text`
//! that may be NULL. Each is adopted as it is; its expired leases are
//! reported with the token as its text, and a takeover is told by the token
//! changing. A token with no scalar text form is refused, with the table's
//! other misfits.

use std::collections::HashSet;
use std::time::Duration;

use sqlx::PgConnection;

use super::{nothing_left_to_report, reported};
use crate::support::{
    Daemon, LoginRole, StatsdCapture, TestDb, count, daemon_env, exec, run_binary,
};

/// A lock server's schema with `token` of type `token_type`, made as its
/// owner role; tryInsert below is its acquire, stealing an expired row.
async fn lock_server(token_type: &str) -> (TestDb, LoginRole, PgConnection) {
    let db = TestDb::empty().await;
    let mut admin = db.connect().await;
    let owner = LoginRole::create(&db, &mut admin, "lockserver", "").await;
    exec(
        &mut admin,
        &format!("GRANT CREATE ON SCHEMA public TO {}", owner.role),
    )
    .await;
    let mut conn = owner.connect().await;
    exec(
        &mut conn,
        &format!(
            "CREATE TABLE lock_entry (
                 lock_key   text PRIMARY KEY,
                 owner_id   text NOT NULL,
                 token      {token_type},
                 expires_at timestamptz NOT NULL);
             CREATE INDEX lock_entry_deadline ON lock_entry (expires_at)"
        ),
    )
    .await;
    (db, owner, conn)
}

/// tryInsert with a token of the lock server's making (`$3`, its text cast
/// to the column's type `ty`): whether it now holds the key (no row while a
/// live lease holds it).
async fn try_insert(
    conn: &mut PgConnection,
    ty: &str,
    key: &str,
    token: &str,
    ttl_ms: i64,
) -> bool {
    let sql = format!(
        "INSERT INTO lock_entry AS e (lock_key, owner_id, token, expires_at)
         VALUES ($1, 'holder', $2::text::{ty}, now() + $3 * interval '1 millisecond')
         ON CONFLICT (lock_key) DO UPDATE
            SET owner_id = EXCLUDED.owner_id, token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
          WHERE e.expires_at <= now()
         RETURNING 1"
    );
    sqlx::query_scalar::<_, i32>(sqlx::AssertSqlSafe(sql))
        .bind(key)
        .bind(token)
        .bind(ttl_ms)
        .fetch_optional(conn)
        .await
        .unwrap_or_else(|e| panic!("tryInsert {key}: {e}"))
        .is_some()
}

/// Adopts the lock server, has its leases die (swept) and be taken over
/// (takeover), runs the daemon, and returns each line as (lockKey, token,
/// reapedBy).
async fn report(
    token_type: &str,
    died: &[(&str, &str)],
    taken: &[(&str, &str, &str)],
) -> HashSet<(String, String, String)> {
    let (db, _owner, mut ls) = lock_server(token_type).await;
    let ty = token_type.split(' ').next().unwrap();
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{token_type}: {out}");
    assert!(out.contains("lockServer=adopted"), "{out}");
    for (key, token) in died
        .iter()
        .copied()
        .chain(taken.iter().map(|&(k, t, _)| (k, t)))
    {
        assert!(try_insert(&mut ls, ty, key, token, 1).await, "{key}");
    }
    // Not a wait for the daemon: let the 1 ms leases pass their deadline.
    tokio::time::sleep(Duration::from_millis(20)).await;
    for (key, _, new) in taken {
        assert!(
            try_insert(&mut ls, ty, key, new, 60_000).await,
            "{key} taken over"
        );
    }
    let mut admin = db.connect().await;
    let sweeper = LoginRole::create(&db, &mut admin, "sweeper", "IN ROLE lease_sweeper").await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&sweeper.url, &port));
    let expected = died.len() + taken.len();
    daemon
        .wait_for_events("lease_expired", expected, Duration::from_secs(20))
        .await;
    nothing_left_to_report(&mut admin, Duration::from_secs(10)).await;
    let (_, lines) = daemon.stop().await;
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", expected as u64)
        .await;
    sweeper.drop(&mut admin).await;
    let reported = reported(&lines);
    assert_eq!(reported.len(), expected, "{token_type}: {reported:#?}");
    reported.into_iter().collect()
}

fn expected(
    died: &[(&str, &str)],
    taken: &[(&str, &str, &str)],
) -> HashSet<(String, String, String)> {
    died.iter()
        .map(|(k, t)| ((*k).to_owned(), (*t).to_owned(), "sweep".to_owned()))
        .chain(
            taken
                .iter()
                .map(|(k, t, _)| ((*k).to_owned(), (*t).to_owned(), "takeover".to_owned())),
        )
        .collect()
}

#[tokio::test]
async fn uuid_token_lock_server_adopted_with_takeovers() {
    let died = [
        ("died-1", "6f1c1e57-3f0a-4a55-9d3e-8f8f1b0d2c11"),
        ("died-2", "0b7a6c0e-2a47-4f9e-b1d5-5a2f3c9e7d22"),
    ];
    let taken = [
        (
            "taken-1",
            "a3d1f2c4-5b6e-4789-9abc-def012345633",
            "b4e2a3d5-6c7f-4890-8bcd-ef0123456744",
        ),
        (
            "taken-2",
            "c5f3b4e6-7d80-4901-9cde-f01234567855",
            "d6a4c5f7-8e91-4a12-8def-012345678966",
        ),
    ];
    assert_eq!(
        report("uuid NOT NULL", &died, &taken).await,
        expected(&died, &taken)
    );
}

/// A nullable text token: a lease without one is reported with an empty
/// token, and a text token that needs quoting reads back unchanged.
#[tokio::test]
async fn text_token_lock_server_adopted_with_takeovers() {
    let died = [("died-1", "holder a/1"), ("died-2", "tok\"en")];
    let taken = [("taken-1", "r-17", "r-18")];
    assert_eq!(report("text", &died, &taken).await, expected(&died, &taken));
    // NULL: its own lock server, adopted, swept, reported with token "".
    let (db, _owner, mut ls) = lock_server("text").await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    exec(
        &mut ls,
        "INSERT INTO lock_entry VALUES ('no-token', 'holder', NULL, now() - interval '1 second')",
    )
    .await;
    let mut admin = db.connect().await;
    let sweeper = LoginRole::create(&db, &mut admin, "sweeper", "IN ROLE lease_sweeper").await;
    let mut daemon = Daemon::spawn(&daemon_env(&sweeper.url, "9"));
    daemon
        .wait_for_events("lease_expired", 1, Duration::from_secs(20))
        .await;
    let (_, lines) = daemon.stop().await;
    sweeper.drop(&mut admin).await;
    let got: HashSet<(String, String, String)> = reported(&lines).into_iter().collect();
    let want: HashSet<(String, String, String)> =
        [("no-token".into(), String::new(), "sweep".into())].into();
    assert_eq!(got, want);
}

/// A lock_entry whose deadline has no time zone, whose token is a composite
/// (no text form a line can carry) and
/// whose key is not unique is refused, each problem named, nothing changed.
#[tokio::test]
async fn unfit_lock_entry_refused_nothing_changed() {
    let db = TestDb::empty().await;
    let mut admin = db.connect().await;
    exec(
        &mut admin,
        "CREATE TYPE fencing_pair AS (epoch integer, seq bigint);
         CREATE TABLE lock_entry (lock_key text, owner_id text, token fencing_pair, expires_at timestamp)",
    )
    .await;

    let (code, out) = run_binary(&["migrate"], &db.url).await;

    assert_eq!(code, Some(1), "{out}");
    for part in [
        "refusing to adopt public.lock_entry, nothing was changed",
        "column token is fencing_pair, not bigint or integer or smallint or numeric or uuid or text or character varying",
        "column expires_at is timestamp without time zone, not timestamp with time zone",
        "lock_key is not unique by itself",
    ] {
        assert!(out.contains(part), "{part:?} in {out}");
    }
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM pg_class WHERE relname IN ('lease_sweeper_sql', 'lock_expiry_outbox', 'lock_session')"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'lock_entry'::regclass"
        )
        .await,
        0
    );
}
