//! Bad job-queue rows and settings: every value the schema admits in a
//! column the job reaper reads is either refused at the door by a constraint
//! whose name says the rule, or handled: a stale job the apply or the dry
//! run cannot handle is set aside with one ERROR line while every other one
//! is reaped and counted; a migration over bad rows or settings names them
//! and the fix; every change of a queue setting is audited. Jobs lost: none,
//! in every test. The lock sweep's bad rows are `locks::bad_rows`.
//!
//! "Handled" cases need a row the constraints now refuse; the tests drop the
//! constraint by hand first, as an operator (or an older schema) might have.

use crate::jobs::support::dry_run;
use crate::support::bad_rows::{
    I64_MAX, daemon_until, daemon_with_statsd_until, error_lines, keys, refused_with,
};
use crate::support::{TestDb, events, exec, insert_stale_jobs, open_gates, run_binary};

/// key, old_value, new_value, actor, changed_by_role.
type AuditRow = (String, Option<String>, Option<String>, String, String);

#[tokio::test]
async fn unhandled_values_refused_by_named_constraints() {
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
async fn extreme_deadlines_reaped_in_the_same_sweep() {
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
async fn failing_job_set_aside_others_reaped() {
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
async fn setting_changes_and_apply_actor_audited() {
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
async fn dry_run_failure_set_aside_gauge_counts_all() {
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
