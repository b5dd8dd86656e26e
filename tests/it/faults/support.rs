//! Plumbing for the fault tests: reading the `lease_expired` reports back out
//! of a daemon's output, the leases left in the table, holding a batch's
//! COMMIT open on an advisory lock (the crash window), and waiting on SQL or
//! on output.
//!
//! The accounting invariant every fault test checks lives in
//! `check_reports`: each report names an expired lease with its own token,
//! and one process never reports a lease twice. It owns no tests; the
//! modules beside it do.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::PgConnection;

use crate::support::{Daemon, TestDb};

/// `(lockKey, token)` of every `lease_expired` line, in output order.
///
/// Every line must decode, except that a process killed with SIGKILL may have
/// left its very last line half-written (`allow_torn_tail`); that line's
/// batch was never committed, so the next sweeper reports it again.
pub fn reported(lines: &[String], allow_torn_tail: bool) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(pairs) = lease_sweeper::testing::logfmt::decode_line(line) else {
            assert!(
                allow_torn_tail && i + 1 == lines.len(),
                "line {i} of {} does not decode: {line:?}",
                lines.len()
            );
            eprintln!("torn last line after SIGKILL ({} bytes)", line.len());
            continue;
        };
        let f: HashMap<String, String> = pairs.into_iter().collect();
        if f.get("message").map(String::as_str) == Some("lease_expired") {
            assert_eq!(f["level"], "warn", "{line}");
            out.push((f["lockKey"].clone(), f["token"].parse().expect("token")));
        }
    }
    out
}

/// Cheap count of signal lines, for polling while 100,000s of lines arrive.
pub fn lease_lines(daemon: &Daemon) -> usize {
    daemon.count_lines(|l| l.contains(" message=lease_expired "))
}

/// Every lease whose last durable record remains, key → token: its row in
/// `lock_entry`, or its place in a batch handed off (deleted from the table)
/// whose lines were not yet written and committed.
pub async fn leases(conn: &mut PgConnection) -> HashMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "SELECT lock_key, token FROM lock_entry
         UNION ALL
         SELECT u.k, u.t::bigint FROM lock_reap_handoff AS h, unnest(h.lock_keys, h.tokens) AS u (k, t)",
    )
    .fetch_all(conn)
    .await
    .expect("reading lock_entry")
    .into_iter()
    .collect()
}

/// Asserts that each report names an inserted lease with its own token, and
/// that one process never reports the same lease twice. Returns the keys.
pub fn check_reports(
    who: &str,
    reports: &[(String, i64)],
    inserted: &HashMap<String, i64>,
) -> HashSet<String> {
    let mut keys = HashSet::with_capacity(reports.len());
    for (key, token) in reports {
        assert_eq!(
            inserted.get(key),
            Some(token),
            "{who} reported {key:?}/{token}, which was never an expired lease"
        );
        assert!(keys.insert(key.clone()), "{who} reported {key:?} twice");
    }
    keys
}

/// Holds the COMMIT of the batch that reports `key` until the test releases
/// advisory lock 4242: a deferred constraint trigger on the deletion of the
/// batch's hand-off runs at commit time, after the daemon has written and
/// flushed that batch's lines (the leases themselves were deleted and
/// committed before). Killing the daemon then is the crash window, hit
/// deterministically rather than by luck.
/// `client_connection_check_interval` lets the server notice the dead client
/// while it waits and roll the batch back, as it would after a host crash.
pub async fn hold_commit_of_batch_deleting(conn: &mut PgConnection, db: &TestDb, key: &str) {
    sqlx::raw_sql(
        "CREATE FUNCTION test_hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE CONSTRAINT TRIGGER test_crash_window AFTER DELETE ON lock_reap_handoff
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
           WHEN (OLD.lock_keys @> ARRAY['{key}']) EXECUTE FUNCTION test_hold_commit();
         ALTER DATABASE {} SET client_connection_check_interval = '100ms';
         SELECT pg_advisory_lock(4242);",
        db.name
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
}

pub async fn release_held_commit(conn: &mut PgConnection) {
    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(conn)
        .await
        .unwrap();
}

/// Polls a one-number query (bound to `db`'s name as `$1`) every 20 ms
/// until `ok` accepts its value.
pub async fn wait_sql(
    conn: &mut PgConnection,
    db: &TestDb,
    sql: &'static str,
    what: &str,
    ok: impl Fn(i64) -> bool,
) {
    crate::support::poll(Duration::from_secs(20), what, async || {
        let v: i64 = sqlx::query_scalar(sql)
            .bind(&db.name)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        if ok(v) {
            Ok(())
        } else {
            Err(format!("last {v}"))
        }
    })
    .await
}

/// The daemon's connections (its `application_name`) to the test database.
pub const SWEEPER_BACKENDS: &str = "SELECT count(*) FROM pg_stat_activity
  WHERE datname = $1 AND application_name = 'lease-sweeper'";

/// Those of them waiting on a lock.
pub const SWEEPER_BACKENDS_WAITING: &str = "SELECT count(*) FROM pg_stat_activity
  WHERE datname = $1 AND application_name = 'lease-sweeper' AND wait_event_type = 'Lock'";

/// Every diagnostic line at ERROR, as (event, error text).
pub fn error_lines(lines: &[String]) -> Vec<(String, String)> {
    lines
        .iter()
        .map(|l| crate::support::fields(l))
        .filter(|f| f.get("level").map(String::as_str) == Some("error"))
        .map(|f| {
            (
                f.get("message").cloned().unwrap_or_default(),
                f.get("error").cloned().unwrap_or_default(),
            )
        })
        .collect()
}

/// Reports of leases whose key starts with `prefix`.
pub fn reported_with_prefix(lines: &[String], prefix: &str) -> Vec<(String, i64)> {
    reported(lines, false)
        .into_iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .collect()
}

/// Waits until `ok` holds for the daemon's output; on timeout, fails with
/// that output so the cause is visible.
pub async fn wait_output(
    daemon: &Daemon,
    timeout: Duration,
    what: &str,
    ok: impl Fn(&[String]) -> bool,
) {
    crate::support::poll(timeout, what, || async {
        let lines = daemon.lines();
        if ok(&lines) {
            Ok(())
        } else {
            Err(format!("daemon output:\n{}", lines.join("\n")))
        }
    })
    .await
}
