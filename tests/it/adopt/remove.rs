//! `remove` gives back the database `migrate` found: beside a lock server
//! with no job queue, and beside one with a job queue, every object of the
//! database's schemas, every ACL and every table's rows are as they were
//! before `migrate`; and `remove` where nothing is installed does nothing
//! and succeeds; `remove` refuses while an expiry waits to be reported; and
//! an expiry index `migrate` built goes with it, and only that one.

use std::time::Duration;

use sqlx::PgConnection;

use super::{LockServer, lock_server_database, lock_server_state, rows_checksum};
use crate::support::{Daemon, StatsdCapture, count, daemon_env, events, exec, run_binary};

/// The stand-in job queue (the job-queue document's shape, with its audit
/// triggers), applied here as a queue's own migration would apply it.
const JOB_QUEUE: &str = include_str!("../../../sql/job_substrate.sql");

/// Everything in the database's own schemas, one line each: every relation
/// (with its privileges), column privilege, function (with its
/// privileges), type and trigger, each schema's privileges, and a checksum
/// of every table's rows. Privileges are compared as they take effect: an
/// ACL that was the owner's default (NULL) and is written out after a grant
/// and its revoke grants the same.
async fn everything(conn: &mut PgConnection) -> Vec<String> {
    let mut lines: Vec<String> = sqlx::query_scalar(
        "WITH ns AS (
             SELECT oid, nspname, nspowner, nspacl FROM pg_namespace
              WHERE nspname NOT IN ('pg_catalog', 'information_schema')
                AND nspname NOT LIKE 'pg\\_toast%' AND nspname NOT LIKE 'pg\\_temp%')
         SELECT format('schema %s acl %s', n.nspname, coalesce(n.nspacl, acldefault('n'::\"char\", n.nspowner)))
           FROM ns AS n
         UNION ALL
         SELECT format('relation %s.%s kind %s acl %s', n.nspname, c.relname, c.relkind,
                       coalesce(c.relacl, acldefault((CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END)::\"char\", c.relowner)))
           FROM pg_class AS c JOIN ns AS n ON n.oid = c.relnamespace
         UNION ALL
         SELECT format('column %s.%s.%s acl %s', n.nspname, c.relname, a.attname, a.attacl)
           FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid JOIN ns AS n ON n.oid = c.relnamespace
          WHERE a.attacl IS NOT NULL
         UNION ALL
         SELECT format('function %s.%s(%s) acl %s', n.nspname, p.proname, pg_get_function_identity_arguments(p.oid),
                       coalesce(p.proacl, acldefault('f'::\"char\", p.proowner)))
           FROM pg_proc AS p JOIN ns AS n ON n.oid = p.pronamespace
         UNION ALL
         SELECT format('type %s.%s', n.nspname, t.typname)
           FROM pg_type AS t JOIN ns AS n ON n.oid = t.typnamespace
         UNION ALL
         SELECT format('trigger %s on %s.%s enabled %s', t.tgname, n.nspname, c.relname, t.tgenabled)
           FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid JOIN ns AS n ON n.oid = c.relnamespace",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class AS c
           JOIN pg_namespace AS n ON n.oid = c.relnamespace
          WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
            AND n.nspname NOT LIKE 'pg\\_toast%'",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    for table in tables {
        let rows: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) || ' rows, md5 ' || md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))
               FROM {table} AS t"
        )))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        lines.push(format!("rows of {table}: {rows}"));
    }
    lines.sort();
    lines
}

/// What `a` has that `b` lacks, and what `b` has that `a` lacks: the
/// difference a failed comparison shows.
fn difference(a: &[String], b: &[String]) -> String {
    let only_a: Vec<&String> = a.iter().filter(|l| !b.contains(l)).collect();
    let only_b: Vec<&String> = b.iter().filter(|l| !a.contains(l)).collect();
    format!("before only: {only_a:#?}\nafter only: {only_b:#?}")
}

/// Beside a lock server that runs without a job queue, `migrate` creates no
/// queue (the reaper idles, and says so), `remove` takes out all it added,
/// and a second `remove` finds nothing installed and succeeds.
#[tokio::test]
async fn remove_beside_a_lock_server_without_a_job_queue_gives_back_the_database() {
    let (db, _owner, _ls) = lock_server_database(None).await;
    let mut admin = db.connect().await;
    let before = everything(&mut admin).await;

    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<String> = out.lines().map(str::to_owned).collect();
    assert_eq!(events(&lines, "migrated")[0]["jobQueue"], "absent", "{out}");
    assert!(
        events(&lines, "job_reaper_idle")[0]["reason"]
            .contains("no job_queue in the lock server's schema"),
        "{out}"
    );
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM pg_class WHERE relname IN ('job_queue', 'job_dead_letter', \
             'queue_setting', 'queue_setting_audit', 'job_kind_lease', 'job_kind_lease_audit')"
        )
        .await,
        0,
        "no stand-in queue beside a lock server of its own"
    );
    assert_ne!(
        everything(&mut admin).await,
        before,
        "migrate added its own"
    );

    let (code, out) = run_binary(&["remove"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let after = everything(&mut admin).await;
    assert!(after == before, "{}", difference(&before, &after));

    let (code, out) = run_binary(&["remove"], &db.url).await;
    assert_eq!(code, Some(0), "a second remove is a no-op: {out}");
    let lines: Vec<String> = out.lines().map(str::to_owned).collect();
    assert_eq!(
        events(&lines, "not_installed")[0]["note"],
        "the sidecar is not installed in this database (no lease_sweeper_sql table): nothing to remove",
        "{out}"
    );
    assert!(!out.contains("level=error"), "{out}");
    assert!(everything(&mut admin).await == before);
}

/// Beside a lock server with a job queue of its own that lacks one of the
/// reaper's gates: `migrate` inserts that gate (its audit records the
/// insert) and grants the daemon's role what it reads; `remove` deletes the
/// gate it inserted and the audit of it, keeps the queue's own gate,
/// revokes the grants, and the database is as before `migrate`.
#[tokio::test]
async fn remove_beside_a_lock_server_and_job_queue_gives_back_the_database() {
    let (db, _owner, mut ls) = lock_server_database(None).await;
    sqlx::raw_sql(JOB_QUEUE)
        .execute(&mut ls)
        .await
        .expect("the job queue's migration");
    // The queue has the dry-run gate of its own, not the other; a job.
    exec(
        &mut ls,
        "DELETE FROM queue_setting WHERE key = 'queue.lease.reaper_enabled';
         INSERT INTO job_queue (job_kind) VALUES ('mail')",
    )
    .await;
    let mut admin = db.connect().await;
    let before = everything(&mut admin).await;

    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<String> = out.lines().map(str::to_owned).collect();
    assert_eq!(
        events(&lines, "migrated")[0]["jobQueue"],
        "adopted",
        "{out}"
    );
    let gates: Vec<(String, String)> = sqlx::query_as(
        "SELECT key, updated_by FROM queue_setting WHERE key LIKE 'queue.lease.reaper%' ORDER BY key",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(
        gates,
        [
            (
                "queue.lease.reaper_dry_run_only".to_owned(),
                "migration".to_owned()
            ),
            (
                "queue.lease.reaper_enabled".to_owned(),
                "lease-sweeper migrate".to_owned()
            ),
        ],
        "migrate inserted only the gate the queue lacked"
    );
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM queue_setting_audit WHERE key = 'queue.lease.reaper_enabled' AND old_value IS NULL"
        )
        .await,
        1,
        "the queue's audit recorded migrate's insert"
    );
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM information_schema.column_privileges
              WHERE grantee = 'lease_sweeper' AND table_name = 'job_queue'"
        )
        .await,
        9,
        "the reaper's columns of job_queue granted"
    );

    let (code, out) = run_binary(&["remove"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let after = everything(&mut admin).await;
    assert!(after == before, "{}", difference(&before, &after));
}

/// `remove` refuses while a recorded expiry waits to be reported, and once
/// it is reported takes every sidecar object out: the lock server's tables
/// keep their files, ACLs, rows, triggers and history exactly.
#[tokio::test]
async fn remove_leaves_the_lock_server_as_it_was() {
    let (db, _owner, ls) = lock_server_database(None).await;
    let mut admin = db.connect().await;
    let mut server = LockServer(ls);
    for i in 0..3 {
        server
            .try_insert(&format!("live-{i}"), "holder", 600_000)
            .await
            .unwrap();
    }
    let before = lock_server_state(&mut admin).await;
    let history = rows_checksum(&mut admin, "flyway_schema_history").await;

    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    // A late release is recorded: remove must not lose it.
    let token = server.try_insert("late", "paused", 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(server.delete_if_owner("late", token).await);
    let (code, out) = run_binary(&["remove"], &db.url).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("refusing to remove the sidecar: 1 recorded expiries"),
        "{out}"
    );
    assert!(out.contains("start lease-sweeper run"), "{out}");
    assert_eq!(
        count(&mut admin, "SELECT count(*) FROM lock_expiry_outbox").await,
        1,
        "kept"
    );

    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    daemon
        .wait_for_events("lease_expired", 1, Duration::from_secs(20))
        .await;
    let (_, lines) = daemon.stop().await;
    assert_eq!(events(&lines, "lease_expired")[0]["reapedBy"], "release");

    let just_before = lock_server_state(&mut admin).await;
    let (code, out) = run_binary(&["remove"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let after = lock_server_state(&mut admin).await;
    assert_eq!(
        after, just_before,
        "remove changed nothing of the lock server's"
    );
    // Since before migrate, only the lock server's own audit grew (its
    // trigger recorded the late lease's grant).
    let unchanged = |state: &[(String, String)]| {
        state
            .iter()
            .filter(|(t, _)| t != "lock_grant_audit")
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        unchanged(&after),
        unchanged(&before),
        "files, ACLs, rows, triggers as before migrate"
    );
    assert_eq!(
        rows_checksum(&mut admin, "flyway_schema_history").await,
        history
    );
    let left = count(
        &mut admin,
        "SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = 'public' AND c.relname IN ('lock_expiry_outbox', 'lock_reap_handoff',
                        'lock_held_count', 'lock_held_delta', 'job_reap_handoff', 'lease_sweeper_sql',
                        'lease_sweeper_migrations'))
              + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                  WHERE n.nspname = 'public' AND p.proname <> 'lock_entry_audit_grant'
                        AND (p.proname LIKE 'lock\\_%' OR p.proname LIKE 'fn\\_job\\_reap%'
                        OR p.proname LIKE 'lease\\_%'))
              + (SELECT count(*) FROM pg_type WHERE typname = 'lock_reaped_lease')",
    )
    .await;
    assert_eq!(left, 0, "no sidecar object left");
    // Removed twice: said plainly, and nothing to do.
    let (code, out) = run_binary(&["remove"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("the sidecar is not installed in this database"),
        "{out}"
    );
}

/// A lock server without an index on its deadline gets one, built
/// CONCURRENTLY by `migrate` and marked as the sidecar's; `remove` drops
/// that one, and only that one.
#[tokio::test]
async fn missing_deadline_index_built_then_removed() {
    let (db, _owner, mut ls) = lock_server_database(None).await;
    exec(&mut ls, "DROP INDEX lock_entry_expiry_idx").await;

    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<String> = out.lines().map(str::to_owned).collect();
    assert_eq!(events(&lines, "migrated")[0]["indexBuilt"], "true", "{out}");
    let mut admin = db.connect().await;
    let comment: Option<String> =
        sqlx::query_scalar("SELECT obj_description('lock_entry_expiry_idx'::regclass, 'pg_class')")
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!(
        comment.as_deref(),
        Some(lease_sweeper::testing::migrate::BUILT_INDEX_COMMENT)
    );
    let valid: bool = sqlx::query_scalar(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = 'lock_entry_expiry_idx'::regclass",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(valid);

    let (code, out) = run_binary(&["remove"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM pg_class WHERE relname = 'lock_entry_expiry_idx'"
        )
        .await,
        0,
        "the index migrate built goes with the sidecar"
    );
}

/// `remove` drops every function the database records, whichever release
/// installed it: one this binary never shipped, overloaded, one overload
/// returning the sidecar's row type, goes with its record and the type,
/// and so does every function the binary ships.
#[tokio::test]
async fn remove_drops_every_recorded_function_even_one_an_earlier_release_installed() {
    let (db, _owner, _ls) = lock_server_database(None).await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let mut admin = db.connect().await;
    exec(
        &mut admin,
        "CREATE FUNCTION lock_reap_earlier(integer) RETURNS SETOF lock_reaped_lease
             LANGUAGE sql AS $$ SELECT NULL::lock_reaped_lease WHERE false $$;
         CREATE FUNCTION lock_reap_earlier(integer, integer) RETURNS integer
             LANGUAGE sql AS $$ SELECT 1 $$;
         INSERT INTO lease_sweeper_sql (name, sha256) VALUES ('lock_reap_earlier', 'of an earlier release')",
    )
    .await;
    let shipped = lease_sweeper::testing::sql::FUNCTIONS.len() as i64;
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM pg_proc AS p JOIN lease_sweeper_sql AS s ON s.name = p.proname"
        )
        .await,
        shipped + 2
    );

    let (code, out) = run_binary(&["remove"], &db.url).await;

    assert_eq!(code, Some(0), "{out}");
    let names: Vec<&str> = lease_sweeper::testing::sql::FUNCTIONS
        .iter()
        .map(|(name, _)| *name)
        .chain(["lock_reap_earlier"])
        .collect();
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM pg_proc WHERE proname = ANY ($1))
              + (SELECT count(*) FROM pg_type WHERE typname = 'lock_reaped_lease')
              + (SELECT count(*) FROM pg_class WHERE relname = 'lease_sweeper_sql')",
    )
    .bind(&names)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(left, 0, "{out}");
}
