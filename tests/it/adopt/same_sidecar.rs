//! Wherever `migrate` starts, it ends with the same sidecar: on a new
//! database, on a lock server's own tables (its owner, its statements
//! running), on the job-queue document's queue beside them, on a database a
//! build before the first release migrated and swept, and on one already
//! migrated whose daemon is sweeping while the lock server works. On each,
//! two `migrate`s started at once both exit 0, and the sidecar's objects
//! are the same: every function it records (definition, security, pinned
//! search path, the daemon's grant), its records, its tables' columns, its
//! type, its triggers and its history.

use std::time::Duration;

use sqlx::PgConnection;

use super::phase1_queue::phase1_database;
use super::{Steady, lock_server_database};
use crate::support::{Daemon, StatsdCapture, TestDb, daemon_env, events, exec, run_binary};

/// The sidecar's objects, one line each, sorted; the schema they live in is
/// `public` in every database here.
async fn sidecar(conn: &mut PgConnection) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT format('function %s definer %s config %s grant %s text %s',
                       p.oid::regprocedure, p.prosecdef, p.proconfig,
                       (SELECT array_agg(x.privilege_type ORDER BY x.privilege_type)
                          FROM aclexplode(p.proacl) AS x
                         WHERE x.grantee = 'lease_sweeper'::regrole),
                       md5(pg_get_functiondef(p.oid)))
           FROM pg_proc AS p JOIN lease_sweeper_sql AS s ON s.name = p.proname
         UNION ALL
         SELECT format('record %s %s', s.name, s.sha256) FROM lease_sweeper_sql AS s
         UNION ALL
         SELECT format('column %s.%s %s', c.relname, a.attname, format_type(a.atttypid, a.atttypmod))
           FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
          WHERE c.relname IN ('lock_reap_handoff', 'lock_expiry_outbox', 'lock_held_count',
                              'lock_held_delta', 'job_reap_handoff', 'lease_sweeper_sql',
                              'lease_sweeper_migrations', 'lock_reaped_lease')
            AND a.attnum > 0 AND NOT a.attisdropped
         UNION ALL
         SELECT format('trigger %s on %s calls %s', t.tgname, t.tgrelid::regclass, t.tgfoid::regproc)
           FROM pg_trigger AS t
          WHERE NOT t.tgisinternal
            AND t.tgfoid IN (SELECT p.oid FROM pg_proc AS p
                               JOIN lease_sweeper_sql AS s ON s.name = p.proname)
         UNION ALL
         SELECT format('migration %s', m.version) FROM lease_sweeper_migrations AS m
         ORDER BY 1",
    )
    .fetch_all(conn)
    .await
    .unwrap()
}

/// 500 leases written by the lock server's own shape, a second past their
/// deadline, keys `prefix1`…
async fn expired(conn: &mut PgConnection, prefix: &str) {
    exec(
        conn,
        &format!(
            "INSERT INTO lock_entry (lock_key, owner_id, token, acquired_at, expires_at, lease_version)
             SELECT '{prefix}' || i, 'gone', nextval('ls_fencing_seq'), now() - interval '1 minute',
                    now() - interval '1 second', 1
               FROM generate_series(1, 500) AS i"
        ),
    )
    .await;
}

/// Two `migrate`s at once on `db`: both exit 0.
async fn two_migrates(db: &TestDb, what: &str) {
    let ((code_a, out_a), (code_b, out_b)) = tokio::join!(
        run_binary(&["migrate"], &db.url),
        run_binary(&["migrate"], &db.url)
    );
    assert_eq!(
        (code_a, code_b),
        (Some(0), Some(0)),
        "{what}:\n{out_a}\n---\n{out_b}"
    );
}

#[tokio::test]
async fn migrate_ends_with_the_same_sidecar_wherever_it_starts() {
    let new = TestDb::empty().await;
    two_migrates(&new, "a new database").await;
    let expected = sidecar(&mut new.connect().await).await;
    assert!(
        expected
            .iter()
            .any(|l| l.starts_with("function lock_reap_batch(")),
        "{expected:#?}"
    );

    // The lock server's own tables, its statements running throughout.
    let (db, owner, _conn) = lock_server_database(None).await;
    let steady = Steady::start(owner.url.clone(), Duration::from_millis(5));
    two_migrates(&db, "a lock server's own tables").await;
    let (_, failed) = steady.stop().await;
    assert_eq!(failed, 0, "no lock server call failed");
    assert_eq!(sidecar(&mut db.connect().await).await, expected);

    // The job-queue document's queue beside the lock server.
    let (db, _owner, _conn) = phase1_database("text", "").await;
    two_migrates(&db, "the job-queue document's queue").await;
    assert_eq!(sidecar(&mut db.connect().await).await, expected);

    // A build before the first release migrated and swept it: its functions
    // no longer shipped are dropped, the rest replaced.
    let db = TestDb::empty().await;
    exec(&mut db.connect().await, include_str!("earlier_build.sql")).await;
    two_migrates(&db, "an earlier build's database").await;
    assert_eq!(sidecar(&mut db.connect().await).await, expected);

    // Already migrated, its daemon sweeping and the lock server working
    // while two more migrates replace what they find stale and drop a
    // function a release before recorded and this one no longer ships.
    let (db, owner, mut conn) = lock_server_database(None).await;
    two_migrates(&db, "a lock server's own tables, first").await;
    exec(
        &mut db.connect().await,
        "UPDATE lease_sweeper_sql SET sha256 = 'stale' WHERE name IN ('lock_reap_batch', 'lock_entry_hooks');
         CREATE FUNCTION lock_reap_earlier(integer) RETURNS integer LANGUAGE sql AS $$ SELECT 1 $$;
         INSERT INTO lease_sweeper_sql (name, sha256) VALUES ('lock_reap_earlier', 'of an earlier release')",
    )
    .await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    let steady = Steady::start(owner.url.clone(), Duration::from_millis(5));
    expired(&mut conn, "before-").await;
    daemon
        .wait_for_events("lease_expired", 1, Duration::from_secs(20))
        .await;
    two_migrates(&db, "a migrated database beside its daemon").await;
    expired(&mut conn, "after-").await;
    daemon
        .wait_for_events("lease_expired", 1_000, Duration::from_secs(20))
        .await;
    let (_, failed) = steady.stop().await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(failed, 0, "no lock server call failed");
    assert_eq!(code, Some(0));
    assert_eq!(events(&lines, "lease_expired").len(), 1_000, "each once");
    assert!(events(&lines, "sweep_failed").is_empty(), "no pass failed");
    assert_eq!(sidecar(&mut db.connect().await).await, expected);
}
