//! Bad rows: every value the schema admits in a column the sweep
//! or the job reaper reads is either refused at the door by a constraint
//! whose name says the rule, or handled: reported with a documented encoding,
//! or set aside with one ERROR line while every other row of the same sweep
//! is reported. Expiries lost: none, in every test.
//!
//! "Handled" cases need a row the constraints now refuse; the tests drop the
//! constraint by hand first, as an operator (or an older schema) might have.

use std::time::Duration;

use sqlx::PgConnection;

use crate::jobs_support::dry_run;
use crate::support::{
    Daemon, StatsdCapture, TestDb, count, events, exec, insert_expired, insert_stale_jobs,
    migrate_to, open_gates, run_binary, wait_until,
};

/// The last migration before the bad-row rules (constraints, total
/// encodings, set-aside rows) of 20261130000100 and 20261130000110.
const BEFORE_BAD_ROW_RULES: i64 = 20261129000300;

/// key, old_value, new_value, actor, changed_by_role.
type AuditRow = (String, Option<String>, Option<String>, String, String);

const I64_MIN: &str = "-9223372036854775808";
const I64_MAX: &str = "9223372036854775807";

/// Runs `sql`, which must fail with `code`; returns the error text.
async fn refused_with(conn: &mut PgConnection, sql: &str, code: &str) -> String {
    let err = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(conn)
        .await
        .expect_err(&format!("must be refused: {sql}"));
    let got = err.as_database_error().and_then(|e| e.code());
    assert_eq!(got.as_deref(), Some(code), "{sql}: {err}");
    err.to_string()
}

/// The real daemon on `db` until `done(lines)`; then SIGTERM, exit 0.
async fn daemon_until(db: &TestDb, what: &str, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    daemon_with_statsd_until(db, what, |l, _| done(l)).await.0
}

/// The same, with the StatsD capture it sent to.
async fn daemon_with_statsd_until(
    db: &TestDb,
    what: &str,
    done: impl Fn(&[String], &StatsdCapture) -> bool,
) -> (Vec<String>, StatsdCapture) {
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&[
        ("LOCKDB_URL", db.url.as_str()),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", &port),
    ]);
    wait_until(Duration::from_secs(20), what, || async {
        done(&daemon.lines(), &statsd)
    })
    .await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0), "{}", lines.join("\n"));
    (lines, statsd)
}

fn keys(lines: &[String], event: &str, field: &str) -> Vec<String> {
    let mut k: Vec<String> = events(lines, event)
        .iter()
        .map(|f| f[field].clone())
        .collect();
    k.sort();
    k
}

fn error_lines(lines: &[String]) -> Vec<&String> {
    lines.iter().filter(|l| l.contains("level=error")).collect()
}

#[tokio::test]
async fn infinite_lease_deadlines_are_refused_at_the_door_by_named_constraints() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    for deadline in ["-infinity", "infinity"] {
        let msg = refused_with(
            &mut conn,
            &format!("INSERT INTO lock_entry (lock_key, owner_id, token, expires_at) VALUES ('k', 'o', 1, '{deadline}')"),
            "23514",
        )
        .await;
        assert!(msg.contains("lock_entry_expires_at_finite"), "{msg}");
        let msg = refused_with(
            &mut conn,
            &format!("INSERT INTO lock_expiry_outbox (lock_key, owner_id, token, expires_at, new_token) VALUES ('k', 'o', 1, '{deadline}', 2)"),
            "23514",
        )
        .await;
        assert!(
            msg.contains("lock_expiry_outbox_expires_at_finite"),
            "{msg}"
        );
    }
    // A renewal or an acquire can never write one: their TTL is bounded.
    let msg = refused_with(
        &mut conn,
        "INSERT INTO lock_expiry_outbox (lock_key, owner_id, token, expires_at, taken_over_at, new_token) VALUES ('k', 'o', 1, now(), 'infinity', 2)",
        "23514",
    )
    .await;
    assert!(
        msg.contains("lock_expiry_outbox_taken_over_at_finite"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_pre_1970_or_minus_infinity_deadline_is_reported_in_the_same_sweep_as_the_ordinary_ones()
{
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "ordinary-", 20, 1_000).await;
    // A pre-1970 deadline is admitted and must be reported: it used to be
    // hidden by the resumable reap's lower bound (epoch + 0).
    exec(&mut conn, "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at) VALUES ('moon', 'eagle', 1969, '1969-07-20 20:17:00+00')").await;
    // -infinity is refused at the door now; one written before (here: with
    // the constraint dropped by hand) is still reported.
    exec(&mut conn, "ALTER TABLE lock_entry DROP CONSTRAINT lock_entry_expires_at_finite; INSERT INTO lock_entry (lock_key, owner_id, token, expires_at) VALUES ('never', 'nobody', 1, '-infinity')").await;

    let lines = daemon_until(&db, "22 lease_expired", |l| {
        events(l, "lease_expired").len() >= 22
    })
    .await;

    let reported = events(&lines, "lease_expired");
    assert_eq!(reported.len(), 22, "each exactly once");
    let moon = reported.iter().find(|f| f["lockKey"] == "moon").unwrap();
    assert_eq!(
        moon["expiredAtMillis"], "-14182980000",
        "negative before 1970"
    );
    assert!(moon["overdueMillis"].parse::<i64>().unwrap() > 1_700_000_000_000);
    let never = reported.iter().find(|f| f["lockKey"] == "never").unwrap();
    assert_eq!(never["expiredAtMillis"], I64_MIN);
    assert_eq!(never["overdueMillis"], I64_MAX);
    let ordinary = keys(&lines, "lease_expired", "lockKey")
        .into_iter()
        .filter(|k| k.starts_with("ordinary-"))
        .count();
    assert_eq!(ordinary, 20);
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
    assert!(error_lines(&lines).is_empty(), "{:#?}", error_lines(&lines));
}

#[tokio::test]
async fn a_takeover_of_a_minus_infinity_lease_is_drained_with_every_other_takeover() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    exec(&mut conn, "ALTER TABLE lock_entry DROP CONSTRAINT lock_entry_expires_at_finite; ALTER TABLE lock_expiry_outbox DROP CONSTRAINT lock_expiry_outbox_expires_at_finite").await;
    exec(&mut conn, "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at) VALUES ('steal-never', 'nobody', nextval('lock_fencing_token_seq'), '-infinity')").await;
    insert_expired(&mut conn, "steal-", 5, 1_000).await;
    exec(
        &mut conn,
        "SELECT lock_acquire(lock_key, 'thief', 60000) FROM lock_entry",
    )
    .await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_expiry_outbox").await,
        6
    );

    let lines = daemon_until(&db, "6 takeovers", |l| {
        events(l, "lease_expired").len() >= 6
    })
    .await;

    let reported = events(&lines, "lease_expired");
    assert_eq!(reported.len(), 6);
    assert!(reported.iter().all(|f| f["reapedBy"] == "takeover"));
    let never = reported
        .iter()
        .find(|f| f["lockKey"] == "steal-never")
        .unwrap();
    assert_eq!(never["expiredAtMillis"], I64_MIN);
    assert_eq!(never["overdueMillis"], I64_MAX);
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_expiry_outbox").await,
        0
    );
    assert!(error_lines(&lines).is_empty(), "{:#?}", error_lines(&lines));
}

/// Anything the constraints cannot foresee: here a trigger an operator added
/// that refuses to delete one key, and one outbox row.
#[tokio::test]
async fn a_lease_or_takeover_that_fails_inside_the_function_is_set_aside_with_one_error_and_the_others_are_reported()
 {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    exec(
        &mut conn,
        "CREATE FUNCTION refuse_cursed() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF OLD.lock_key LIKE 'cursed%' THEN RAISE EXCEPTION 'legal hold on %', OLD.lock_key; END IF;
             RETURN OLD;
         END $$;
         CREATE TRIGGER refuse_cursed BEFORE DELETE ON lock_entry FOR EACH ROW EXECUTE FUNCTION refuse_cursed();
         CREATE TRIGGER refuse_cursed BEFORE DELETE ON lock_expiry_outbox FOR EACH ROW EXECUTE FUNCTION refuse_cursed();",
    )
    .await;
    insert_expired(&mut conn, "ordinary-", 30, 1_000).await;
    insert_expired(&mut conn, "cursed-lease", 1, 2_000).await;
    insert_expired(&mut conn, "cursed-steal", 1, 2_000).await;
    insert_expired(&mut conn, "steal-", 4, 1_000).await;
    exec(&mut conn, "SELECT lock_acquire(lock_key, 'thief', 60000) FROM lock_entry WHERE lock_key LIKE '%steal%'").await;

    let lines = daemon_until(&db, "34 reported and 2 set aside", |l| {
        events(l, "lease_expired").len() >= 34
            && keys(l, "lease_set_aside", "lockKey").contains(&"cursed-lease1".to_owned())
            && keys(l, "lease_set_aside", "lockKey").contains(&"cursed-steal1".to_owned())
    })
    .await;

    let reported = keys(&lines, "lease_expired", "lockKey");
    assert_eq!(reported.len(), 34, "30 swept + 4 taken over, each once");
    assert!(!reported.iter().any(|k| k.starts_with("cursed")));
    let aside = events(&lines, "lease_set_aside");
    for f in &aside {
        assert_eq!(f["level"], "error");
        assert!(
            f["cause"].contains(&format!("legal hold on {}", f["lockKey"]))
                && f["cause"].contains("SQLSTATE P0001"),
            "{f:?}"
        );
    }
    let sweep_aside = aside
        .iter()
        .find(|f| f["lockKey"] == "cursed-lease1")
        .unwrap();
    assert_eq!(sweep_aside["reapedBy"], "sweep");
    let steal_aside = aside
        .iter()
        .find(|f| f["lockKey"] == "cursed-steal1")
        .unwrap();
    assert_eq!(steal_aside["reapedBy"], "takeover");
    // Set aside means left in place, not lost: once the hold is lifted, the
    // next sweep reports both.
    let left: Vec<String> = sqlx::query_scalar(
        "SELECT lock_key FROM lock_entry WHERE expires_at <= now()
         UNION ALL SELECT 'outbox:' || lock_key FROM lock_expiry_outbox ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(left, vec!["cursed-lease1", "outbox:cursed-steal1"]);
    exec(&mut conn, "DROP FUNCTION refuse_cursed() CASCADE").await;
    let lines = daemon_until(&db, "the two set-aside ones", |l| {
        events(l, "lease_expired").len() >= 2
    })
    .await;
    assert_eq!(
        keys(&lines, "lease_expired", "lockKey"),
        vec!["cursed-lease1", "cursed-steal1"]
    );
    eprintln!(
        "FIGURES bad_rows_set_aside_leases: reported=34 set_aside_lines={} later_reported=2 lost=0",
        aside.len()
    );
}

#[tokio::test]
async fn the_lock_functions_refuse_null_zero_negative_and_oversized_limits_with_22023() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "k", 3, 1_000).await;
    for sql in [
        "SELECT * FROM lock_reap_expired(NULL)",
        "SELECT * FROM lock_reap_expired(0)",
        "SELECT * FROM lock_reap_expired(-1)",
        "SELECT * FROM lock_reap_expired(100001)",
        "SELECT * FROM lock_drain_takeovers(NULL)",
        "SELECT * FROM lock_drain_takeovers(-5)",
    ] {
        let msg = refused_with(&mut conn, sql, "22023").await;
        assert!(msg.contains("limit must be from 1 to 100000, got"), "{msg}");
    }
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 3);
    // 0 is an ordinary resume bound (1970), NULL is "from the oldest".
    exec(&mut conn, "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at) VALUES ('moon', 'eagle', 1969, '1969-07-20 20:17:00+00')").await;
    let from_1970: Vec<String> =
        sqlx::query_scalar("SELECT lock_key FROM lock_reap_expired(10, 0) ORDER BY 1")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(from_1970, vec!["k1", "k2", "k3"]);
    let from_oldest: Vec<String> = sqlx::query_scalar("SELECT lock_key FROM lock_reap_expired(10)")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(from_oldest, vec!["moon"]);
}

#[tokio::test]
async fn migrating_a_database_holding_infinite_lease_deadlines_fails_naming_the_rows_and_the_fix() {
    let db = TestDb::empty().await;
    let mut conn = db.connect().await;
    migrate_to(&mut conn, BEFORE_BAD_ROW_RULES).await;
    exec(&mut conn, "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
                     SELECT 'inf-' || i, 'o', i, CASE WHEN i % 2 = 0 THEN '-infinity' ELSE 'infinity' END::timestamptz
                       FROM generate_series(1, 7) AS i").await;
    insert_expired(&mut conn, "ordinary-", 3, 1_000).await;

    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("lock_entry holds 7 lease(s) with an infinite expires_at"),
        "{out}"
    );
    assert!(
        out.contains("'inf-1' (token 1, expires_at infinity)"),
        "{out}"
    );
    assert!(
        out.contains("UPDATE lock_entry SET expires_at = now() WHERE NOT isfinite(expires_at)"),
        "names the fix: {out}"
    );
    // The fix as given, then migrate: the seven are reported as expired.
    exec(
        &mut conn,
        "UPDATE lock_entry SET expires_at = now() WHERE NOT isfinite(expires_at)",
    )
    .await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let lines = daemon_until(&db, "10 lease_expired", |l| {
        events(l, "lease_expired").len() >= 10
    })
    .await;
    assert_eq!(events(&lines, "lease_expired").len(), 10);
}

#[tokio::test]
async fn job_and_setting_values_the_reaper_cannot_handle_are_refused_at_the_door_by_named_constraints()
 {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let ids = insert_stale_jobs(&mut conn, "k", 1, 0, 5, 1_000).await;
    for (sql, constraint) in [
        (
            format!(
                "UPDATE job_queue SET attempts = 2147483647 WHERE job_id = '{}'",
                ids[0]
            ),
            "job_queue_attempts_at_most_1000000",
        ),
        (
            format!(
                "UPDATE job_queue SET lease_until = '-infinity' WHERE job_id = '{}'",
                ids[0]
            ),
            "job_queue_lease_until_finite",
        ),
        (
            format!(
                "UPDATE job_queue SET lease_until = 'infinity' WHERE job_id = '{}'",
                ids[0]
            ),
            "job_queue_lease_until_finite",
        ),
        (
            "UPDATE queue_setting SET value = 'ten' WHERE key = 'queue.retry.backoff_base_sec'"
                .to_owned(),
            "queue_setting_seconds_from_1_to_86400",
        ),
        (
            "UPDATE queue_setting SET value = '0' WHERE key = 'queue.lease.duration_sec'"
                .to_owned(),
            "queue_setting_seconds_from_1_to_86400",
        ),
        (
            "UPDATE queue_setting SET value = '99999999999' WHERE key = 'queue.lease.duration_sec'"
                .to_owned(),
            "queue_setting_seconds_from_1_to_86400",
        ),
        (
            "UPDATE queue_setting SET value = 'yes' WHERE key = 'queue.lease.reaper_enabled'"
                .to_owned(),
            "queue_setting_boolean_is_true_or_false",
        ),
    ] {
        let msg = refused_with(&mut conn, &sql, "23514").await;
        assert!(msg.contains(constraint), "{sql}: {msg}");
    }
}

#[tokio::test]
async fn stale_jobs_beside_an_overflowing_or_minus_infinity_one_are_all_reaped_in_the_same_sweep() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    open_gates(&mut conn).await;
    let ordinary = insert_stale_jobs(&mut conn, "ordinary", 5, 0, 5, 60_000).await;
    // Rows the constraints refuse now, as a database might hold them from
    // before (constraint dropped by hand here).
    exec(&mut conn, "ALTER TABLE job_queue DROP CONSTRAINT job_queue_attempts_at_most_1000000, DROP CONSTRAINT job_queue_lease_until_finite").await;
    let overflow = insert_stale_jobs(&mut conn, "overflow", 1, i32::MAX, 5, 120_000).await;
    let never: String = sqlx::query_scalar(
        "INSERT INTO job_queue (job_kind, state, attempts, max_attempts, lease_owner, lease_until)
         VALUES ('never', 'leased', 0, 5, 'w', '-infinity') RETURNING job_id::text",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    // The dry run and the gauge it feeds see all seven.
    let (code, out) = run_binary(&["jobs", "dry-run", "--json"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("\"stale_lease_count\": 7") || out.contains("\"stale_lease_count\":7"),
        "{out}"
    );

    let (lines, statsd) =
        daemon_with_statsd_until(&db, "6 reaped, 1 set aside, gauge 1", |l, s| {
            events(l, "job_lease_expired").len() >= 6
                && !events(l, "job_set_aside").is_empty()
                && s.gauge("queue.lease.stale.current", "#backend:pg") == Some(1)
        })
        .await;

    let mut reaped = keys(&lines, "job_lease_expired", "jobId");
    reaped.dedup();
    let mut expected: Vec<String> = ordinary.clone();
    expected.push(never.clone());
    expected.sort();
    assert_eq!(
        reaped, expected,
        "the five ordinary ones and the -infinity one"
    );
    let never_line = events(&lines, "job_lease_expired")
        .into_iter()
        .find(|f| f["jobId"] == never)
        .unwrap();
    assert_eq!(never_line["overdueMillis"], I64_MAX);
    let aside = events(&lines, "job_set_aside");
    assert!(
        aside.iter().all(|f| f["jobId"] == overflow[0]
            && f["level"] == "error"
            && f["cause"] == "integer out of range (SQLSTATE 22003)"),
        "{aside:?}"
    );
    let state: String = sqlx::query_scalar("SELECT state FROM job_queue WHERE job_id = $1::uuid")
        .bind(&overflow[0])
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        state, "leased",
        "set aside: left as it was, still counted stale"
    );
    assert_eq!(
        statsd.gauge("queue.lease.stale.current", "#backend:pg"),
        Some(1)
    );
    eprintln!(
        "FIGURES bad_rows_jobs: reaped=6 (5 ordinary + -infinity) set_aside_lines={} stale_gauge=1 lost=0",
        aside.len()
    );
}

/// Anything the constraints cannot foresee: a trigger refusing to touch one
/// job. Its neighbours are reaped; it is set aside and named.
#[tokio::test]
async fn a_stale_job_that_fails_inside_apply_is_set_aside_and_every_other_one_is_reaped() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    open_gates(&mut conn).await;
    exec(
        &mut conn,
        "CREATE FUNCTION refuse_cursed_job() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF OLD.job_kind = 'cursed' THEN RAISE EXCEPTION 'job % is under legal hold', OLD.job_id; END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_cursed_job BEFORE UPDATE ON job_queue FOR EACH ROW EXECUTE FUNCTION refuse_cursed_job();",
    )
    .await;
    let cursed = insert_stale_jobs(&mut conn, "cursed", 1, 0, 5, 120_000).await;
    let reset = insert_stale_jobs(&mut conn, "ordinary", 40, 0, 5, 60_000).await;
    let dead = insert_stale_jobs(&mut conn, "last-try", 3, 4, 5, 60_000).await;

    let lines = daemon_until(&db, "43 reaped and 1 set aside", |l| {
        events(l, "job_lease_expired").len() >= 43 && !events(l, "job_set_aside").is_empty()
    })
    .await;

    let reported = events(&lines, "job_lease_expired");
    assert_eq!(reported.len(), 43);
    assert_eq!(
        reported
            .iter()
            .filter(|f| f["action"] == "reset_to_retry_waiting")
            .count(),
        reset.len()
    );
    assert_eq!(
        reported
            .iter()
            .filter(|f| f["action"] == "moved_to_dead_letter")
            .count(),
        dead.len()
    );
    let aside = &events(&lines, "job_set_aside")[0];
    assert_eq!(aside["jobId"], cursed[0]);
    assert_eq!(aside["jobKind"], "cursed");
    assert!(
        aside["cause"].contains("is under legal hold (SQLSTATE P0001)"),
        "{aside:?}"
    );
    // Lifted: the next sweep reaps it.
    exec(&mut conn, "DROP FUNCTION refuse_cursed_job() CASCADE").await;
    let lines = daemon_until(&db, "the set-aside job", |l| {
        !events(l, "job_lease_expired").is_empty()
    })
    .await;
    assert_eq!(keys(&lines, "job_lease_expired", "jobId"), cursed);
}

#[tokio::test]
async fn migrating_a_database_holding_bad_job_rows_or_settings_fails_naming_them_and_the_fix() {
    let db = TestDb::empty().await;
    let mut conn = db.connect().await;
    migrate_to(&mut conn, BEFORE_BAD_ROW_RULES).await;
    let ids = insert_stale_jobs(&mut conn, "k", 3, 0, 5, 1_000).await;
    exec(
        &mut conn,
        &format!(
            "UPDATE job_queue SET attempts = 2147483647 WHERE job_id = '{}'",
            ids[0]
        ),
    )
    .await;
    exec(
        &mut conn,
        &format!(
            "UPDATE job_queue SET lease_until = '-infinity' WHERE job_id = '{}'",
            ids[1]
        ),
    )
    .await;
    exec(
        &mut conn,
        "UPDATE queue_setting SET value = 'ten' WHERE key = 'queue.retry.backoff_base_sec'",
    )
    .await;

    // Each refusal names the rows and the statement that fixes them; once
    // that has run, the next migration names the next problem.
    for (names, fix, run) in [
        (
            format!(
                "job_queue holds 1 job(s) with an infinite lease_until, which the reaper cannot report (first 5 by job_id: {} (lease_until -infinity))",
                ids[1]
            ),
            "UPDATE job_queue SET lease_until = now() WHERE NOT isfinite(lease_until)",
            "UPDATE job_queue SET lease_until = now() WHERE NOT isfinite(lease_until)",
        ),
        (
            format!(
                "job_queue holds 1 job(s) with attempts above 1000000 (first 5 by job_id: {} (attempts 2147483647))",
                ids[0]
            ),
            "UPDATE job_queue SET attempts = max_attempts WHERE attempts > 1000000",
            "UPDATE job_queue SET attempts = max_attempts WHERE attempts > 1000000",
        ),
        (
            "queue_setting holds 1 ill-typed value(s): queue.retry.backoff_base_sec = 'ten'"
                .to_owned(),
            "fn_queue_setting_set('queue.retry.backoff_base_sec', '10'",
            "SELECT fn_queue_setting_set('queue.retry.backoff_base_sec', '10', 'test')",
        ),
    ] {
        let (code, out) = run_binary(&["migrate"], &db.url).await;
        assert_eq!(code, Some(1), "{out}");
        assert!(out.contains(&names), "{out}");
        assert!(out.contains(fix), "{out}");
        exec(&mut conn, run).await;
    }

    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
}

#[tokio::test]
async fn every_change_of_a_queue_setting_is_audited_whoever_makes_it_and_apply_records_its_actor() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    // One statement (one transaction) each: the setter, a direct update, an
    // insert and a delete.
    for sql in [
        "SELECT fn_queue_setting_set('queue.lease.duration_sec', '60', 'alice')",
        "UPDATE queue_setting SET value = '120' WHERE key = 'queue.lease.duration_sec'",
        "INSERT INTO queue_setting (key, value, updated_by) VALUES ('custom.note', 'x', 'bob')",
        "DELETE FROM queue_setting WHERE key = 'custom.note'",
    ] {
        exec(&mut conn, sql).await;
    }
    // The setter's actor never leaks onto a later direct write of the same transaction.
    exec(&mut conn, "BEGIN; SELECT fn_queue_setting_set('queue.lease.duration_sec', '90', 'carol'); UPDATE queue_setting SET value = '100' WHERE key = 'queue.lease.duration_sec'; COMMIT;").await;
    let who: String = sqlx::query_scalar("SELECT session_user::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let audit: Vec<AuditRow> = sqlx::query_as(
        "SELECT key, old_value, new_value, actor, changed_by_role FROM queue_setting_audit ORDER BY audit_id",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(
        audit,
        vec![
            (
                "queue.lease.duration_sec".into(),
                s("300"),
                s("60"),
                "alice".into(),
                who.clone()
            ),
            (
                "queue.lease.duration_sec".into(),
                s("60"),
                s("120"),
                format!("direct update by {who}"),
                who.clone()
            ),
            (
                "custom.note".into(),
                None,
                s("x"),
                format!("direct insert by {who}"),
                who.clone()
            ),
            (
                "custom.note".into(),
                s("x"),
                None,
                format!("direct delete by {who}"),
                who.clone()
            ),
            (
                "queue.lease.duration_sec".into(),
                s("120"),
                s("90"),
                "carol".into(),
                who.clone()
            ),
            (
                "queue.lease.duration_sec".into(),
                s("90"),
                s("100"),
                format!("direct update by {who}"),
                who.clone()
            ),
        ]
    );
    open_gates(&mut conn).await;
    let ids = insert_stale_jobs(&mut conn, "k", 2, 0, 5, 1_000).await;
    exec(
        &mut conn,
        "SELECT fn_job_reap_stale_leases_apply('reaper@host-a', 10)",
    )
    .await;
    let reaped: Vec<(String, String)> = sqlx::query_as(
        "SELECT reaped_by, reaped_by_role FROM job_queue WHERE job_id = ANY($1::uuid[])",
    )
    .bind(&ids)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(reaped, vec![("reaper@host-a".to_owned(), who.clone()); 2]);
}

/// The dry run's expressions are total for every row the schema admits; to
/// prove its set-aside path anyway, the test makes one job's object fail
/// (replacing the per-job builder for this database only).
#[tokio::test]
async fn a_job_that_fails_inside_the_dry_run_is_set_aside_and_the_gauge_still_counts_every_stale_job()
 {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    exec(
        &mut conn,
        "CREATE OR REPLACE FUNCTION fn_job_dry_run_object(p_job_id uuid, p_job_kind text, p_lease_owner text,
             p_lease_until timestamptz, p_attempts integer, p_max_attempts integer,
             p_lease_duration_sec integer, p_lease_duration_source text)
         RETURNS jsonb LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
         BEGIN
             IF p_job_kind = 'cursed' THEN RAISE EXCEPTION 'cannot describe %', p_job_id; END IF;
             RETURN pg_catalog.jsonb_build_object('job_id', p_job_id, 'job_kind', p_job_kind);
         END $$;",
    )
    .await;
    let cursed = insert_stale_jobs(&mut conn, "cursed", 1, 0, 5, 120_000).await;
    insert_stale_jobs(&mut conn, "ordinary", 6, 0, 5, 60_000).await;

    let out = dry_run(&mut conn, Some(100)).await;
    assert_eq!(out["stale_lease_count"], 7, "{out}");
    assert_eq!(out["jobs"].as_array().unwrap().len(), 6, "{out}");
    assert_eq!(out["set_aside"][0]["job_id"], cursed[0].as_str(), "{out}");
    assert!(
        out["set_aside"][0]["error"]
            .as_str()
            .unwrap()
            .contains("cannot describe"),
        "{out}"
    );

    // The gauge asks for one job: the cursed one, the oldest. It still reads 7.
    let (lines, _) = daemon_with_statsd_until(&db, "the stale gauge", |_, s| {
        s.gauge("queue.lease.stale.current", "#backend:pg") == Some(7)
    })
    .await;
    assert!(error_lines(&lines).is_empty(), "{:#?}", error_lines(&lines));
}
