//! `migrate` is one unit: a failure at its function step leaves the
//! functions the daemons call, two hosts migrating at once both succeed, a
//! function no longer shipped is dropped, `check` names a function whose
//! text is stale, and beside a lock server without a job queue the reaper
//! idles, saying so once.

use std::time::Duration;

use sqlx::PgConnection;

use super::lock_server_database;
use crate::support::bad_rows::daemon_until;
use crate::support::{
    Daemon, StatsdCapture, TestDb, count, daemon_env, events, exec, run_binary, wait_job_passes,
};

fn lines(out: &str) -> Vec<String> {
    out.lines().map(str::to_owned).collect()
}

/// The `migrated` line's field `key`.
fn migrated(out: &str, key: &str) -> String {
    events(&lines(out), "migrated")[0][key].clone()
}

/// How many of the binary's functions the database has, by name.
async fn functions_there(conn: &mut PgConnection) -> usize {
    let names: Vec<String> = lease_sweeper::testing::sql::FUNCTIONS
        .iter()
        .map(|(name, _)| (*name).to_owned())
        .collect();
    let there: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT proname) FROM pg_proc
          WHERE pronamespace = 'public'::regnamespace AND proname = ANY ($1)",
    )
    .bind(&names)
    .fetch_one(conn)
    .await
    .unwrap();
    usize::try_from(there).unwrap()
}

/// A `migrate` whose versioned migration runs again (its history row
/// forgotten: it drops functions the daemon calls, to create them again)
/// and one of whose functions cannot be created (a same-named function
/// with another return type, which CREATE OR REPLACE cannot change) fails
/// with that function named, and changes nothing: every function is still
/// there and a daemon sweeps. Once the obstacle is gone it succeeds.
#[tokio::test]
async fn migrate_failing_at_its_function_step_leaves_the_functions_the_daemons_call() {
    let db = TestDb::empty().await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let mut admin = db.connect().await;
    exec(
        &mut admin,
        "DELETE FROM lease_sweeper_migrations;
         UPDATE lease_sweeper_sql SET sha256 = 'stale';
         DROP FUNCTION fn_job_reaper_limit_refusal(integer);
         CREATE FUNCTION fn_job_reaper_limit_refusal(p_limit integer) RETURNS text
             LANGUAGE sql AS $$ SELECT 'planted' $$;",
    )
    .await;
    let total = lease_sweeper::testing::sql::FUNCTIONS.len();

    let (code, out) = run_binary(&["migrate"], &db.url).await;

    assert_eq!(code, Some(1), "{out}");
    for part in [
        "applying sql/functions/fn_job_reaper_limit_refusal.sql failed",
        "cannot change return type of existing function",
        "this run's stand-ins, versioned migrations and functions were rolled back together",
        "run lease-sweeper migrate again",
    ] {
        assert!(out.contains(part), "{part:?} in {out}");
    }
    assert_eq!(
        count(&mut admin, "SELECT count(*) FROM lease_sweeper_migrations").await,
        0,
        "the migration rolled back with the functions"
    );
    assert_eq!(
        functions_there(&mut admin).await,
        total,
        "every function kept"
    );
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM lease_sweeper_sql WHERE sha256 <> 'stale'"
        )
        .await,
        0,
        "no record changed"
    );
    exec(
        &mut admin,
        "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
         VALUES ('after-failed-migrate', 'dead-holder', 7, now() - interval '1 second')",
    )
    .await;
    assert_eq!(
        count(&mut admin, "SELECT count(*) FROM lock_sweep_probe(60000)").await,
        1,
        "the daemon's probe answers"
    );
    let swept = daemon_until(&db, "the lease swept", |l| {
        !events(l, "lease_expired").is_empty()
    })
    .await;
    assert_eq!(
        events(&swept, "lease_expired")[0]["lockKey"],
        "after-failed-migrate"
    );

    exec(
        &mut admin,
        "DROP FUNCTION fn_job_reaper_limit_refusal(integer)",
    )
    .await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(migrated(&out, "migrationsApplied"), "1", "{out}");
    assert_eq!(
        migrated(&out, "functionsApplied"),
        total.to_string(),
        "{out}"
    );
}

/// Two `migrate`s started at once from two hosts: on a fresh database, and
/// on a migrated one with a stale function text and no expiry index. Both
/// exit 0, and the work is done once (one applies, the other finds it
/// done).
#[tokio::test]
async fn two_migrates_at_once_both_succeed_and_do_the_work_once() {
    let db = TestDb::empty().await;
    let ((code_a, out_a), (code_b, out_b)) = tokio::join!(
        run_binary(&["migrate"], &db.url),
        run_binary(&["migrate"], &db.url)
    );
    assert_eq!(
        (code_a, code_b),
        (Some(0), Some(0)),
        "{out_a}\n---\n{out_b}"
    );
    let created: Vec<String> = [&out_a, &out_b]
        .iter()
        .map(|out| migrated(out, "lockServer"))
        .collect();
    assert!(
        created.contains(&"created".to_owned()) && created.contains(&"adopted".to_owned()),
        "one created the stand-in, the other adopted it: {out_a}\n---\n{out_b}"
    );

    let mut admin = db.connect().await;
    exec(
        &mut admin,
        "UPDATE lease_sweeper_sql SET sha256 = 'stale' WHERE name = 'lock_sweep_probe';
         DROP INDEX lock_entry_expiry_idx",
    )
    .await;
    let ((code_a, out_a), (code_b, out_b)) = tokio::join!(
        run_binary(&["migrate"], &db.url),
        run_binary(&["migrate"], &db.url)
    );
    assert_eq!(
        (code_a, code_b),
        (Some(0), Some(0)),
        "{out_a}\n---\n{out_b}"
    );
    let mut applied: Vec<(String, String)> = [&out_a, &out_b]
        .iter()
        .map(|out| {
            (
                migrated(out, "functionsApplied"),
                migrated(out, "indexBuilt"),
            )
        })
        .collect();
    applied.sort();
    assert_eq!(
        applied,
        [
            ("0".to_owned(), "false".to_owned()),
            ("1".to_owned(), "true".to_owned())
        ],
        "{out_a}\n---\n{out_b}"
    );
}

/// A function the database records that the binary no longer ships is
/// dropped by `migrate`, every overload of it, with its record.
#[tokio::test]
async fn migrate_drops_a_function_no_longer_shipped() {
    let db = TestDb::empty().await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let mut admin = db.connect().await;
    exec(
        &mut admin,
        "CREATE FUNCTION lock_reap_expired_fast(integer, timestamptz) RETURNS integer
             LANGUAGE sql AS $$ SELECT 1 $$;
         CREATE FUNCTION lock_reap_expired_fast(integer) RETURNS integer
             LANGUAGE sql AS $$ SELECT 1 $$;
         INSERT INTO lease_sweeper_sql (name, sha256) VALUES ('lock_reap_expired_fast', 'of an earlier build')",
    )
    .await;

    let (code, out) = run_binary(&["migrate"], &db.url).await;

    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        migrated(&out, "functionsDropped"),
        "lock_reap_expired_fast",
        "{out}"
    );
    assert_eq!(
        count(
            &mut admin,
            "SELECT (SELECT count(*) FROM pg_proc WHERE proname = 'lock_reap_expired_fast')
                  + (SELECT count(*) FROM lease_sweeper_sql WHERE name = 'lock_reap_expired_fast')"
        )
        .await,
        0
    );
}

/// `check` on a database whose migrations are all applied but one of whose
/// functions has other text than the binary's fails, naming it and saying
/// to run `migrate`; after `migrate` it passes that line.
#[tokio::test]
async fn check_fails_naming_a_function_whose_text_is_stale() {
    let db = TestDb::empty().await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let mut admin = db.connect().await;
    exec(
        &mut admin,
        "UPDATE lease_sweeper_sql SET sha256 = 'stale' WHERE name = 'lock_reap_batch';
         DELETE FROM lease_sweeper_sql WHERE name = 'lock_held_count_get';
         DROP FUNCTION lock_handoff_claim(bigint)",
    )
    .await;
    let statsd = StatsdCapture::start().await;
    let line = |report: &lease_sweeper::testing::check::Report, what: &str| {
        report
            .lines
            .iter()
            .find(|l| l.what == what)
            .unwrap_or_else(|| panic!("no {what} line in {report}"))
            .clone()
    };

    let report = lease_sweeper::testing::check::preflight(&db.target(), &statsd.target()).await;

    let migrations = line(&report, "migrations");
    assert!(!migrations.failed(), "{report}");
    assert!(
        migrations
            .detail
            .starts_with("1 of 1 versioned migrations applied"),
        "{report}"
    );
    let functions = line(&report, "functions");
    assert!(functions.failed(), "{report}");
    assert_eq!(
        functions.detail,
        "lock_handoff_claim missing from the database (a daemon's call of it fails); \
         lock_reap_batch installed with other text than this binary's (a daemon runs SQL its \
         binary was not built with); lock_held_count_get installed but not recorded in \
         lease_sweeper_sql, so its text is unknown; run `lease-sweeper migrate` with this binary"
    );

    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(migrated(&out, "functionsApplied"), "3", "{out}");
    let report = lease_sweeper::testing::check::preflight(&db.target(), &statsd.target()).await;
    assert!(!line(&report, "functions").failed(), "{report}");
}

/// Beside a lock server without a job queue the daemon's reaper idles: one
/// line says why, once, and no pass fails; `check` says the reaper is idle
/// and why, and fails no queue line.
#[tokio::test]
async fn without_a_job_queue_the_reaper_idles_saying_why_once() {
    let (db, _owner, _ls) = lock_server_database(None).await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    daemon
        .wait_for_event("job_reaper_gated", Duration::from_secs(20))
        .await;
    // More passes of the reaper, each idle.
    wait_job_passes(&statsd, 3).await;
    let (_, daemon_lines) = daemon.stop().await;
    let gated = events(&daemon_lines, "job_reaper_gated");
    assert_eq!(gated.len(), 1, "said once: {daemon_lines:#?}");
    assert!(
        gated[0]["reason"].starts_with("no job_queue in the lock server's schema"),
        "{daemon_lines:#?}"
    );
    assert!(
        !daemon_lines.iter().any(|l| l.contains("level=error")),
        "no failed pass: {daemon_lines:#?}"
    );

    let report = lease_sweeper::testing::check::preflight(&db.target(), &statsd.target()).await;
    let reaper = report
        .lines
        .iter()
        .find(|l| l.what == "job reaper")
        .unwrap_or_else(|| panic!("{report}"));
    assert!(!reaper.failed(), "{report}");
    assert!(
        reaper.detail.starts_with("idle: there is no job_queue"),
        "{report}"
    );
    assert!(
        !report
            .lines
            .iter()
            .any(|l| l.failed() && l.what.contains("job_queue")),
        "{report}"
    );
}
