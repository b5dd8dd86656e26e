//! Lease durations per job kind and per job: a claim or a heartbeat leases
//! each job for its `metadata.lease_override_sec`, else its kind's duration
//! (`fn_job_kind_lease_set`), else `queue.lease.duration_sec`. Proved on a
//! real PostgreSQL: mixed kinds in one claim, the order of the three,
//! clearing, heartbeats, every refusal changing nothing, the audit, the
//! door for bad overrides (and a migration over rows that break it),
//! enqueue's new argument keeping old calls and grants, who may set a
//! duration, the real daemon reaping only the short-leased kind, the dry
//! run's report and the `leases` command.
//!
//! Owns none of the reaper's own behaviour (jobs_sql, jobs_daemon).

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use lease_sweeper::cli::{LeasesArgs, LeasesCommand, OutputArgs};
use lease_sweeper::testing::jobs::{Format, run_leases_as};
use serde_json::{Value, json};
use sqlx::PgConnection;

use crate::jobs_support::dry_run;
use crate::support::{
    Daemon, LoginRole, SUBSTRATE, StatsdCapture, TestDb, count, daemon_env, events, exec,
    insert_stale_jobs, migrate_to, open_gates, run_binary, set_setting, wait_job_passes,
    wait_until,
};

/// The last migration before lease durations per kind and per job.
const BEFORE_LEASE_DURATIONS: i64 = 20261130000400;

/// The constraint that keeps a bad override out of job_queue.
const OVERRIDE_RULE: &str = "job_queue_lease_override_sec_whole_from_1_to_86400";

/// `fn_job_kind_lease_set(kind, seconds, actor)`'s JSON; panics on a refusal.
async fn set_kind(conn: &mut PgConnection, kind: &str, seconds: Option<i32>, actor: &str) -> Value {
    let text: String = sqlx::query_scalar("SELECT fn_job_kind_lease_set($1, $2, $3)::text")
        .bind(kind)
        .bind(seconds)
        .bind(actor)
        .fetch_one(conn)
        .await
        .unwrap_or_else(|e| panic!("setting {kind}={seconds:?}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// Enqueues one job of `kind` with `metadata`; returns its id.
async fn enqueue(conn: &mut PgConnection, kind: &str, metadata: Value) -> String {
    sqlx::query_scalar("SELECT fn_job_enqueue($1, p_metadata => $2::text::jsonb)::text")
        .bind(kind)
        .bind(metadata.to_string())
        .fetch_one(conn)
        .await
        .unwrap_or_else(|e| panic!("enqueueing {kind} with {metadata}: {e}"))
}

/// One claim of up to 100 jobs as `worker`: job id → (seconds from now() to
/// lease_until, recorded duration, recorded source). now() is the claim's
/// own, so the seconds are exact.
async fn claim(conn: &mut PgConnection, worker: &str) -> HashMap<String, (f64, i32, String)> {
    sqlx::query_as::<_, (String, f64, i32, String)>(
        "SELECT job_id::text, extract(epoch FROM lease_until - now())::float8,
                lease_duration_sec, lease_duration_source
           FROM fn_job_claim($1, NULL, 100)",
    )
    .bind(worker)
    .fetch_all(conn)
    .await
    .expect("claim runs")
    .into_iter()
    .map(|(id, secs, given, source)| (id, (secs, given, source)))
    .collect()
}

/// fn_job_heartbeat's new lease in seconds from now(), with what it
/// recorded; None when the worker has lost the job.
async fn heartbeat(conn: &mut PgConnection, id: &str, worker: &str) -> Option<(f64, i32, String)> {
    let secs: Option<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM fn_job_heartbeat($1::uuid, $2) - now())::float8",
    )
    .bind(id)
    .bind(worker)
    .fetch_one(&mut *conn)
    .await
    .expect("heartbeat runs");
    let (given, source): (i32, String) = sqlx::query_as(
        "SELECT lease_duration_sec, lease_duration_source FROM job_queue WHERE job_id = $1::uuid",
    )
    .bind(id)
    .fetch_one(conn)
    .await
    .unwrap();
    secs.map(|s| (s, given, source))
}

fn given(secs: i32, source: &str) -> (f64, i32, String) {
    (f64::from(secs), secs, source.to_owned())
}

/// job_kind_lease and its audit, byte for byte.
async fn kind_snapshot(conn: &mut PgConnection) -> String {
    sqlx::query_scalar(
        "SELECT coalesce((SELECT string_agg(k::text, ',' ORDER BY k.job_kind) FROM job_kind_lease AS k), '')
             || '|' || (SELECT count(*) FROM job_kind_lease_audit)::text",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

/// kind, old, new, actor, role: the audit in order.
type AuditRow = (String, Option<i32>, Option<i32>, String, String);

async fn audit(conn: &mut PgConnection) -> Vec<AuditRow> {
    sqlx::query_as(
        "SELECT job_kind, old_lease_sec, new_lease_sec, actor, changed_by_role
           FROM job_kind_lease_audit ORDER BY audit_id",
    )
    .fetch_all(conn)
    .await
    .unwrap()
}

async fn session_user(conn: &mut PgConnection) -> String {
    sqlx::query_scalar("SELECT session_user::text")
        .fetch_one(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn one_claim_of_mixed_kinds_leases_each_job_for_its_override_else_its_kind_else_the_default()
{
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    set_setting(&mut conn, SUBSTRATE, "true").await;
    set_setting(&mut conn, "queue.lease.duration_sec", "120").await;
    set_kind(&mut conn, "email", Some(60), "alice").await;
    set_kind(&mut conn, "report", Some(3600), "alice").await;
    let email = enqueue(&mut conn, "email", json!({})).await;
    let email_override = enqueue(&mut conn, "email", json!({"lease_override_sec": 45})).await;
    let report = enqueue(&mut conn, "report", json!({"trace": "t-1"})).await;
    let report_override =
        enqueue(&mut conn, "report", json!({"lease_override_sec": 86400.0})).await;
    let plain = enqueue(&mut conn, "sms", json!({})).await;
    let plain_override = enqueue(&mut conn, "sms", json!({"lease_override_sec": 1})).await;

    let leased = claim(&mut conn, "worker-1").await;

    let want: HashMap<String, (f64, i32, String)> = [
        (email, given(60, "kind")),
        (email_override, given(45, "override")),
        (report, given(3600, "kind")),
        (report_override, given(86400, "override")),
        (plain, given(120, "default")),
        (plain_override, given(1, "override")),
    ]
    .into_iter()
    .collect();
    assert_eq!(leased, want, "one claim, each job its own lease");
    // The reaper's question is unchanged: nothing here is stale yet except
    // what a second lets go (the 1 s override), and only once it has passed.
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM job_queue WHERE state = 'leased' AND lease_until < now()"
        )
        .await,
        0
    );
}

#[tokio::test]
async fn clearing_a_kinds_duration_returns_its_next_leases_to_the_default() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    set_setting(&mut conn, SUBSTRATE, "true").await;
    set_kind(&mut conn, "email", Some(60), "alice").await;
    let first = enqueue(&mut conn, "email", json!({})).await;
    assert_eq!(claim(&mut conn, "w").await[&first], given(60, "kind"));

    let cleared = set_kind(&mut conn, "email", None, "bob").await;
    let second = enqueue(&mut conn, "email", json!({})).await;

    assert_eq!(
        (
            cleared["job_kind"].clone(),
            cleared["old_lease_sec"].clone(),
            cleared["lease_sec"].clone(),
            cleared["default_sec"].clone(),
            cleared["updated_by"].clone()
        ),
        (
            json!("email"),
            json!(60),
            Value::Null,
            json!(300),
            json!("bob")
        )
    );
    assert_eq!(claim(&mut conn, "w").await[&second], given(300, "default"));
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM job_kind_lease").await,
        0
    );
    // The lease in flight keeps what it was given.
    let kept: (i32, String) = sqlx::query_as(
        "SELECT lease_duration_sec, lease_duration_source FROM job_queue WHERE job_id = $1::uuid",
    )
    .bind(&first)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(kept, (60, "kind".to_owned()));
}

#[tokio::test]
async fn heartbeats_extend_each_job_by_its_own_duration_and_follow_a_changed_kind_duration() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    set_setting(&mut conn, SUBSTRATE, "true").await;
    set_kind(&mut conn, "email", Some(600), "alice").await;
    let kind = enqueue(&mut conn, "email", json!({})).await;
    let over = enqueue(&mut conn, "email", json!({"lease_override_sec": 45})).await;
    let plain = enqueue(&mut conn, "sms", json!({})).await;
    claim(&mut conn, "w").await;

    assert_eq!(
        heartbeat(&mut conn, &kind, "w").await,
        Some(given(600, "kind"))
    );
    assert_eq!(
        heartbeat(&mut conn, &over, "w").await,
        Some(given(45, "override"))
    );
    assert_eq!(
        heartbeat(&mut conn, &plain, "w").await,
        Some(given(300, "default"))
    );
    assert_eq!(
        heartbeat(&mut conn, &kind, "someone-else").await,
        None,
        "not the holder"
    );

    // A kind's new duration applies from its jobs' next heartbeat; an
    // override still wins over it.
    set_kind(&mut conn, "email", Some(90), "alice").await;
    assert_eq!(
        heartbeat(&mut conn, &kind, "w").await,
        Some(given(90, "kind"))
    );
    assert_eq!(
        heartbeat(&mut conn, &over, "w").await,
        Some(given(45, "override"))
    );
    set_kind(&mut conn, "email", None, "alice").await;
    set_setting(&mut conn, "queue.lease.duration_sec", "30").await;
    assert_eq!(
        heartbeat(&mut conn, &kind, "w").await,
        Some(given(30, "default"))
    );
}

#[tokio::test]
async fn every_bad_kind_duration_is_refused_with_22023_naming_the_bad_part_and_changes_nothing() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    set_kind(&mut conn, "email", Some(60), "alice").await;
    let before = kind_snapshot(&mut conn).await;

    // kind, seconds, actor, what the message says.
    type Refused<'a> = (Option<&'a str>, Option<i32>, Option<&'a str>, &'a str);
    let refused: [Refused; 10] = [
        (
            Some("email"),
            Some(0),
            Some("alice"),
            "the lease duration of kind 'email' is a whole number of seconds from 1 to 86400 (NULL clears it), got 0",
        ),
        (Some("email"), Some(-1), Some("alice"), "got -1"),
        (Some("email"), Some(86401), Some("alice"), "got 86401"),
        (
            Some("email"),
            Some(i32::MAX),
            Some("alice"),
            "got 2147483647",
        ),
        (
            Some(""),
            Some(60),
            Some("alice"),
            "job kind must be a non-empty string, got ''",
        ),
        (
            None,
            Some(60),
            Some("alice"),
            "job kind must be a non-empty string, got NULL",
        ),
        (
            Some("email"),
            Some(60),
            Some(""),
            "actor is required (who is changing the lease duration of kind 'email'?)",
        ),
        (Some("email"), Some(60), Some("  "), "actor is required"),
        (Some("email"), None, None, "actor is required"),
        (Some("sms"), Some(0), Some(""), "actor is required"),
    ];
    for (kind, seconds, actor, message) in refused {
        let err = sqlx::query("SELECT fn_job_kind_lease_set($1, $2, $3)")
            .bind(kind)
            .bind(seconds)
            .bind(actor)
            .execute(&mut conn)
            .await
            .expect_err(&format!(
                "{kind:?}={seconds:?} by {actor:?} must be refused"
            ));
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(db_err.code().as_deref(), Some("22023"), "{db_err}");
        assert!(
            db_err.message().starts_with("fn_job_kind_lease_set: ")
                && db_err.message().contains(message),
            "{kind:?}={seconds:?} by {actor:?}: {}",
            db_err.message()
        );
    }

    assert_eq!(
        kind_snapshot(&mut conn).await,
        before,
        "a refusal changed something"
    );
    // The bounds themselves are accepted.
    assert_eq!(
        set_kind(&mut conn, "email", Some(1), "alice").await["lease_sec"],
        1
    );
    assert_eq!(
        set_kind(&mut conn, "email", Some(86400), "alice").await["lease_sec"],
        86400
    );
}

#[tokio::test]
async fn every_change_of_a_kind_duration_is_audited_whoever_makes_it() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let who = session_user(&mut conn).await;

    set_kind(&mut conn, "email", Some(60), "alice").await;
    set_kind(&mut conn, "email", Some(90), "bob").await;
    set_kind(&mut conn, "email", None, "carol").await;
    // Clearing a kind without a duration changes nothing: nothing to audit.
    set_kind(&mut conn, "never-set", None, "dave").await;
    for sql in [
        "INSERT INTO job_kind_lease (job_kind, lease_sec, updated_by) VALUES ('sms', 10, 'x')",
        "UPDATE job_kind_lease SET lease_sec = 20 WHERE job_kind = 'sms'",
        "DELETE FROM job_kind_lease WHERE job_kind = 'sms'",
        // The setter's actor never leaks onto a later direct write.
        "BEGIN; SELECT fn_job_kind_lease_set('push', 5, 'erin'); UPDATE job_kind_lease SET lease_sec = 6; COMMIT;",
    ] {
        exec(&mut conn, sql).await;
    }

    let direct = |op: &str| format!("direct {op} by {who}");
    let row = |kind: &str, old: Option<i32>, new: Option<i32>, actor: &str| -> AuditRow {
        (kind.into(), old, new, actor.into(), who.clone())
    };
    assert_eq!(
        audit(&mut conn).await,
        vec![
            row("email", None, Some(60), "alice"),
            row("email", Some(60), Some(90), "bob"),
            row("email", Some(90), None, "carol"),
            row("sms", None, Some(10), &direct("insert")),
            row("sms", Some(10), Some(20), &direct("update")),
            row("sms", Some(20), None, &direct("delete")),
            row("push", None, Some(5), "erin"),
            row("push", Some(5), Some(6), &direct("update")),
        ]
    );
    let stamped: (String, bool) = sqlx::query_as(
        "SELECT updated_by, updated_at IS NOT NULL FROM job_kind_lease WHERE job_kind = 'push'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(stamped, ("erin".to_owned(), true));
}

#[tokio::test]
async fn a_bad_lease_override_is_refused_at_the_door_by_a_named_constraint_naming_the_job() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let id = enqueue(&mut conn, "email", json!({})).await;

    for bad in [
        json!("300"),
        json!(0),
        json!(-5),
        json!(86401),
        json!(1.5),
        json!(1e10),
        json!(null),
        json!(true),
        json!({"sec": 5}),
        json!([5]),
    ] {
        let metadata = json!({ "lease_override_sec": bad }).to_string();
        // Through the producer's function…
        let err = sqlx::query("SELECT fn_job_enqueue('email', '{}', 5, $1::text::jsonb)")
            .bind(&metadata)
            .execute(&mut conn)
            .await
            .expect_err(&format!("enqueue with {metadata} must be refused"));
        let db_err = err.as_database_error().unwrap();
        assert_eq!(
            db_err.code().as_deref(),
            Some("23514"),
            "{metadata}: {db_err}"
        );
        assert_eq!(db_err.constraint(), Some(OVERRIDE_RULE), "{metadata}");
        assert!(
            db_err.message().contains(OVERRIDE_RULE),
            "{}",
            db_err.message()
        );
        // …and by a direct write, whose failing row starts with the job's id.
        let err =
            sqlx::query("UPDATE job_queue SET metadata = $1::text::jsonb WHERE job_id = $2::uuid")
                .bind(&metadata)
                .bind(&id)
                .execute(&mut conn)
                .await
                .expect_err(&format!("update to {metadata} must be refused"));
        let pg = err
            .as_database_error()
            .unwrap()
            .downcast_ref::<sqlx::postgres::PgDatabaseError>();
        assert_eq!(pg.constraint(), Some(OVERRIDE_RULE), "{metadata}");
        assert!(
            pg.detail()
                .is_some_and(|d| d.starts_with(&format!("Failing row contains ({id}, "))),
            "names the job: {:?}",
            pg.detail()
        );
    }
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM job_queue").await,
        1,
        "nothing was enqueued"
    );
    let metadata: String = sqlx::query_scalar("SELECT metadata::text FROM job_queue")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(metadata, "{}", "nothing was changed");
    // Whole numbers at the bounds, written either way, and metadata that is
    // not an object, are admitted.
    for good in [
        json!({"lease_override_sec": 1}),
        json!({"lease_override_sec": 86400}),
        json!({"lease_override_sec": 300.0}),
        json!(["lease_override_sec"]),
        json!({"other": "x"}),
    ] {
        enqueue(&mut conn, "email", good).await;
    }
}

#[tokio::test]
async fn migrating_a_database_holding_bad_overrides_fails_naming_them_and_the_fix_works() {
    let db = TestDb::empty().await;
    let mut conn = db.connect().await;
    migrate_to(&mut conn, BEFORE_LEASE_DURATIONS).await;
    let mut bad: Vec<String> = sqlx::query_scalar(
        r#"INSERT INTO job_queue (job_kind, metadata)
           VALUES ('k', '{"lease_override_sec": "300"}'), ('k', '{"lease_override_sec": 0}'),
                  ('k', '{"lease_override_sec": 1.5}')
           RETURNING job_id::text"#,
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    bad.sort();
    let good: String = sqlx::query_scalar(
        r#"INSERT INTO job_queue (job_kind, metadata) VALUES ('k', '{"lease_override_sec": 300, "trace": "t"}')
           RETURNING job_id::text"#,
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();

    let (code, out) = run_binary(&["migrate"], &db.url).await;

    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "job_queue holds 3 job(s) whose metadata.lease_override_sec is not a whole number of seconds from 1 to 86400 (first 5 by job_id: {} (lease_override_sec ",
            bad[0]
        )),
        "{out}"
    );
    for id in &bad {
        assert!(out.contains(id.as_str()), "names {id}: {out}");
    }
    assert!(!out.contains(&good), "{out}");
    const FIX: &str = "UPDATE job_queue SET metadata = metadata - 'lease_override_sec' WHERE metadata -> 'lease_override_sec' IS NOT NULL AND NOT CASE WHEN jsonb_typeof(metadata -> 'lease_override_sec') = 'number' THEN (metadata -> 'lease_override_sec')::numeric BETWEEN 1 AND 86400 AND (metadata -> 'lease_override_sec')::numeric % 1 = 0 ELSE false END";
    assert!(out.contains(FIX), "names the fix: {out}");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM pg_class WHERE relname = 'job_kind_lease'"
        )
        .await,
        0,
        "nothing of the migration stayed"
    );

    exec(&mut conn, FIX).await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let kept: String = sqlx::query_scalar(
        "SELECT metadata ->> 'lease_override_sec' FROM job_queue WHERE job_id = $1::uuid",
    )
    .bind(&good)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(kept, "300", "the valid override is kept");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM job_queue WHERE metadata ? 'lease_override_sec'"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn enqueue_takes_metadata_and_keeps_every_call_and_every_grant_it_had_and_claimers_keep_claiming()
 {
    let db = TestDb::empty().await;
    let mut admin = db.connect().await;
    migrate_to(&mut admin, BEFORE_LEASE_DURATIONS).await;
    // Before the upgrade: a producer allowed to enqueue where PUBLIC is not,
    // and a worker with the privileges claiming needed.
    let producer = LoginRole::create(&db, &mut admin, "producer", "").await;
    let worker = LoginRole::create(&db, &mut admin, "worker", "").await;
    let bystander = LoginRole::create(&db, &mut admin, "bystander", "").await;
    exec(
        &mut admin,
        &format!(
            "REVOKE ALL ON FUNCTION fn_job_enqueue(text, jsonb, integer) FROM PUBLIC;
             GRANT EXECUTE ON FUNCTION fn_job_enqueue(text, jsonb, integer) TO {p};
             GRANT INSERT, SELECT (job_id) ON job_queue TO {p};
             GRANT SELECT, UPDATE ON job_queue TO {w};
             GRANT SELECT ON queue_setting TO {w};",
            p = producer.role,
            w = worker.role
        ),
    )
    .await;

    lease_sweeper::testing::migrate::migrate(&mut admin)
        .await
        .expect("the rest migrates");

    let may = |role: &str, what: &str, on: &str| {
        format!("SELECT has_{what}_privilege('{role}', '{on}', 'EXECUTE')")
    };
    let new_enqueue = "fn_job_enqueue(text, jsonb, integer, jsonb)";
    for (role, allowed) in [(&producer.role, true), (&bystander.role, false)] {
        let granted: bool =
            sqlx::query_scalar(sqlx::AssertSqlSafe(may(role, "function", new_enqueue)))
                .fetch_one(&mut admin)
                .await
                .unwrap();
        assert_eq!(granted, allowed, "{role} on {new_enqueue}");
    }
    let reads_kinds =
        |role: &str| format!("SELECT has_table_privilege('{role}', 'job_kind_lease', 'SELECT')");
    for (role, allowed) in [
        (worker.role.as_str(), true),
        ("lease_sweeper", false),
        (bystander.role.as_str(), false),
    ] {
        let granted: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(reads_kinds(role)))
            .fetch_one(&mut admin)
            .await
            .unwrap();
        assert_eq!(granted, allowed, "{role} on job_kind_lease");
    }

    set_setting(&mut admin, SUBSTRATE, "true").await;
    set_kind(&mut admin, "email", Some(60), "alice").await;
    let mut as_producer = producer.connect().await;
    for call in [
        "SELECT fn_job_enqueue('email')::text",
        "SELECT fn_job_enqueue('email', '{\"to\": \"a@b\"}')::text",
        "SELECT fn_job_enqueue('email', '{}', 3)::text",
        "SELECT fn_job_enqueue('email', '{}', 3, '{\"lease_override_sec\": 45}')::text",
        "SELECT fn_job_enqueue('email', p_metadata => '{\"lease_override_sec\": 46}')::text",
    ] {
        sqlx::query_scalar::<_, String>(call)
            .fetch_one(&mut as_producer)
            .await
            .unwrap_or_else(|e| panic!("{call}: {e}"));
    }
    let mut as_worker = worker.connect().await;
    let mut leases: Vec<(f64, i32, String)> =
        claim(&mut as_worker, "w").await.into_values().collect();
    leases.sort_by_key(|l| l.1);
    assert_eq!(
        leases,
        vec![
            given(45, "override"),
            given(46, "override"),
            given(60, "kind"),
            given(60, "kind"),
            given(60, "kind"),
        ]
    );
    let attempts: Vec<i32> =
        sqlx::query_scalar("SELECT max_attempts FROM job_queue ORDER BY max_attempts")
            .fetch_all(&mut admin)
            .await
            .unwrap();
    assert_eq!(
        attempts,
        [3, 3, 5, 5, 5],
        "the old arguments mean what they meant"
    );
    drop((as_producer, as_worker));
    for role in [producer, worker, bystander] {
        role.drop(&mut admin).await;
    }
}

/// Runs `sql` as `conn`'s role, which must be refused with 42501.
async fn assert_denied(conn: &mut PgConnection, sql: &str) {
    let err = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut *conn)
        .await
        .expect_err(&format!("must be denied: {sql}"));
    let code = err.as_database_error().and_then(|e| e.code());
    assert_eq!(code.as_deref(), Some("42501"), "{sql}: {err}");
}

#[tokio::test]
async fn only_a_role_granted_the_setter_may_set_a_kind_duration_and_only_through_it() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    set_kind(&mut admin, "email", Some(60), "alice").await;
    let sweeper = LoginRole::create(&db, &mut admin, "sweeper", "IN ROLE lease_sweeper").await;
    let nobody = LoginRole::create(&db, &mut admin, "nobody", "").await;
    let operator = LoginRole::create(&db, &mut admin, "operator", "").await;
    exec(
        &mut admin,
        &format!(
            "GRANT EXECUTE ON FUNCTION fn_job_kind_lease_set(text, integer, text) TO {}",
            operator.role
        ),
    )
    .await;
    let before = kind_snapshot(&mut admin).await;

    for role in [&sweeper, &nobody, &operator] {
        let mut low = role.connect().await;
        if role.role != operator.role {
            // The sweeper role and PUBLIC may not call the setter.
            assert_denied(
                &mut low,
                "SELECT fn_job_kind_lease_set('email', 1, 'mallory')",
            )
            .await;
            assert_denied(
                &mut low,
                "SELECT fn_job_kind_lease_set('email', NULL, 'mallory')",
            )
            .await;
        }
        // Nobody but the owner writes the table or its audit directly.
        for sql in [
            "UPDATE job_kind_lease SET lease_sec = 1",
            "INSERT INTO job_kind_lease (job_kind, lease_sec, updated_by) VALUES ('x', 1, 'm')",
            "DELETE FROM job_kind_lease",
            "INSERT INTO job_kind_lease_audit (job_kind, new_lease_sec, actor) VALUES ('x', 1, 'm')",
            "DELETE FROM job_kind_lease_audit",
        ] {
            assert_denied(&mut low, sql).await;
        }
        sqlx::Connection::close(low).await.unwrap();
    }
    assert_eq!(kind_snapshot(&mut admin).await, before, "nothing changed");
    // The command says what the role lacks and what to do.
    for args in [
        &["leases"][..],
        &["leases", "set", "email", "1", "--actor", "mallory"][..],
    ] {
        let (code, out) = run_binary(args, &sweeper.url).await;
        assert_eq!(code, Some(1), "{args:?}: {out}");
        assert!(
            out.contains("(SQLSTATE 42501); `leases` needs SELECT on job_kind_lease")
                && out.contains("run it as an operator's role"),
            "{args:?}: {out}"
        );
    }

    // The operator's role, granted the setter, changes it, audited as itself.
    let mut op = operator.connect().await;
    set_kind(&mut op, "email", Some(120), "op@host").await;
    assert_eq!(
        audit(&mut admin).await.last().unwrap(),
        &(
            "email".to_owned(),
            Some(60),
            Some(120),
            "op@host".to_owned(),
            operator.role.clone()
        )
    );
    sqlx::Connection::close(op).await.unwrap();
    for role in [sweeper, nobody, operator] {
        role.drop(&mut admin).await;
    }
}

#[tokio::test]
async fn the_daemon_reaps_a_short_leased_kinds_stale_jobs_while_a_long_leased_kinds_jobs_claimed_with_them_stay_leased()
 {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut conn = db.connect().await;
    open_gates(&mut conn).await;
    set_kind(&mut conn, "short", Some(1), "alice").await;
    set_kind(&mut conn, "long", Some(3600), "alice").await;
    let mut short = Vec::new();
    let mut long = Vec::new();
    for _ in 0..5 {
        short.push(enqueue(&mut conn, "short", json!({})).await);
        long.push(enqueue(&mut conn, "long", json!({})).await);
    }
    // A long-kind job whose own override is short goes with the short ones.
    let overridden = enqueue(&mut conn, "long", json!({"lease_override_sec": 1})).await;
    short.push(overridden.clone());
    let leased = claim(&mut conn, "worker-1").await;
    assert_eq!(leased.len(), 11, "one claim took them all");
    assert_eq!(leased[&overridden], given(1, "override"));

    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    daemon
        .wait_for_events("job_lease_expired", short.len(), Duration::from_secs(20))
        .await;
    // A few more passes: the long leases are still not stale.
    wait_job_passes(&statsd, 3).await;
    let (code, lines) = daemon.stop().await;

    assert_eq!(code, Some(0), "{}", lines.join("\n"));
    let mut reaped: Vec<String> = events(&lines, "job_lease_expired")
        .iter()
        .map(|e| e["jobId"].clone())
        .collect();
    reaped.sort();
    short.sort();
    assert_eq!(reaped, short, "exactly the short-leased jobs, once each");
    let states: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT job_id::text, state, lease_owner FROM job_queue ORDER BY job_id")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    for (id, state, owner) in states {
        if short.contains(&id) {
            assert_eq!((state.as_str(), owner), ("retry_waiting", None), "{id}");
        } else {
            assert!(long.contains(&id));
            assert_eq!(
                (state.as_str(), owner.as_deref()),
                ("leased", Some("worker-1")),
                "{id}"
            );
        }
    }
    assert_eq!(
        statsd.gauge("queue.lease.stale.current", "#backend:pg"),
        Some(0)
    );
}

#[tokio::test]
async fn the_dry_run_reports_what_each_stale_job_was_given_and_where_it_came_from() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    set_setting(&mut conn, SUBSTRATE, "true").await;
    set_setting(&mut conn, "queue.lease.duration_sec", "1").await;
    set_kind(&mut conn, "short", Some(1), "alice").await;
    let by_kind = enqueue(&mut conn, "short", json!({})).await;
    let by_override = enqueue(&mut conn, "other", json!({"lease_override_sec": 1})).await;
    let by_default = enqueue(&mut conn, "other", json!({})).await;
    claim(&mut conn, "w").await;
    // Leased without a claim (by hand, or before lease durations existed).
    let unknown = insert_stale_jobs(&mut conn, "by-hand", 1, 0, 5, 60_000).await;
    wait_until(Duration::from_secs(10), "four stale leases", || async {
        let mut c = db.connect().await;
        dry_run(&mut c, Some(10)).await["stale_lease_count"] == 4
    })
    .await;

    let out = dry_run(&mut conn, Some(10)).await;

    let reported: HashMap<String, (Value, Value)> = out["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["job_id"].as_str().unwrap().to_owned(),
                (
                    j["lease_duration_sec"].clone(),
                    j["lease_duration_source"].clone(),
                ),
            )
        })
        .collect();
    let want: HashMap<String, (Value, Value)> = [
        (by_kind, (json!(1), json!("kind"))),
        (by_override, (json!(1), json!("override"))),
        (by_default, (json!(1), json!("default"))),
        (unknown[0].clone(), (Value::Null, Value::Null)),
    ]
    .into_iter()
    .collect();
    assert_eq!(reported, want);

    // The table's LEASE column says the same.
    let mut text = Vec::new();
    let cmd = lease_sweeper::cli::JobsCommand::DryRun(lease_sweeper::cli::LimitArg { limit: 10 });
    lease_sweeper::testing::jobs::run_jobs_as(&db.target(), cmd, &mut text, Format::Table)
        .await
        .unwrap();
    let table = String::from_utf8(text).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "JOB",
            "KIND",
            "OWNER",
            "ATTEMPTS",
            "LEASE",
            "OVERDUE_S",
            "WOULD"
        ]
    );
    let lease_of = |id: &str| -> Vec<&str> {
        let row = lines.iter().find(|l| l.starts_with(id)).unwrap();
        row.split_whitespace().collect::<Vec<_>>()[4..6].to_vec()
    };
    for (id, (_, source)) in &want {
        match source.as_str() {
            Some(source) => assert_eq!(lease_of(id), ["1s", source], "{table}"),
            None => assert_eq!(lease_of(id)[0], "-", "{table}"),
        }
    }
}

/// `leases …` in process: exit code and what was printed.
async fn leases(db: &TestDb, command: Option<LeasesCommand>, format: Format) -> (ExitCode, String) {
    let mut out = Vec::new();
    let args = LeasesArgs {
        command,
        output: OutputArgs::default(),
    };
    let code = run_leases_as(&db.target(), args, &mut out, format)
        .await
        .expect("the command runs");
    (code, String::from_utf8(out).unwrap())
}

fn set(kind: &str, seconds: i32) -> Option<LeasesCommand> {
    Some(LeasesCommand::Set {
        kind: kind.into(),
        seconds,
        actor: "cli-operator".into(),
    })
}

#[tokio::test]
async fn leases_shows_each_kinds_duration_and_who_set_it_as_a_table_and_as_json_and_sets_and_clears()
 {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;

    let (code, out) = leases(&db, set("report.render", 3600), Format::Table).await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["KIND", "OLD_S", "NEW_S", "BY"]
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["report.render", "-", "3600", "cli-operator"]
    );
    assert_eq!(
        *lines.last().unwrap(),
        "new claims and heartbeats of report.render lease for 3600 s; a lease in flight keeps its deadline until its next heartbeat"
    );
    leases(&db, set("email", 60), Format::Json).await;

    let (code, out) = leases(&db, None, Format::Table).await;
    assert_eq!(code, ExitCode::SUCCESS);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["KIND", "LEASE_S", "CHANGED", "BY"]
    );
    let rows: Vec<Vec<&str>> = lines[1..3]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows.iter().map(|r| (r[0], r[1], r[4])).collect::<Vec<_>>(),
        [
            ("email", "60", "cli-operator"),
            ("report.render", "3600", "cli-operator")
        ],
        "{out}"
    );
    assert_eq!(lines[3], "");
    assert!(
        lines[4].starts_with("every other kind: 300 s (queue.lease.duration_sec, changed ")
            && lines[4]
                .ends_with(" by migration); a job's metadata.lease_override_sec wins over both"),
        "{out}"
    );
    assert_eq!(lines.len(), 5, "{out}");

    let (code, out) = leases(&db, None, Format::Json).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(out.lines().count(), 1, "one line for a pipe: {out}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    let kinds: Vec<(Value, Value, Value)> = shown["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["job_kind"].clone(),
                k["lease_sec"].clone(),
                k["updated_by"].clone(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (json!("email"), json!(60), json!("cli-operator")),
            (json!("report.render"), json!(3600), json!("cli-operator"))
        ]
    );
    assert_eq!(
        (
            shown["default"]["setting"].clone(),
            shown["default"]["lease_sec"].clone(),
            shown["default"]["updated_by"].clone()
        ),
        (
            json!("queue.lease.duration_sec"),
            json!(300),
            json!("migration")
        )
    );

    // Clear: back to the default, said so.
    let clear = Some(LeasesCommand::Clear {
        kind: "email".into(),
        actor: "cli-operator".into(),
    });
    let (code, out) = leases(&db, clear, Format::Table).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(
        out.lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["email", "60", "-", "cli-operator"]
    );
    assert_eq!(
        out.lines().last().unwrap(),
        "email leases for the default: 300 s (queue.lease.duration_sec)"
    );

    // A rejected change: exit 1, `refused: …` (JSON with --json), nothing changed.
    let before = kind_snapshot(&mut conn).await;
    let (code, out) = leases(&db, set("email", 0), Format::Table).await;
    assert_eq!(code, ExitCode::from(1));
    assert_eq!(
        out,
        "refused: fn_job_kind_lease_set: the lease duration of kind 'email' is a whole number of seconds from 1 to 86400 (NULL clears it), got 0\n"
    );
    let (code, out) = leases(&db, set("", 60), Format::Json).await;
    assert_eq!(code, ExitCode::from(1));
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        json!({
            "job_kind": "",
            "reason": "fn_job_kind_lease_set: job kind must be a non-empty string, got ''",
            "refused": true
        })
    );
    assert_eq!(kind_snapshot(&mut conn).await, before);
}

#[tokio::test]
async fn the_leases_binary_exits_0_1_or_2_and_prints_refusals_and_json_for_scripts() {
    let db = TestDb::new().await;
    let json =
        |s: &str| -> Value { serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s:?}")) };
    let run = |args: &'static [&'static str]| {
        let url = db.url.clone();
        async move {
            let out = tokio::process::Command::new(crate::support::binary())
                .args(args)
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("LOCKDB_URL", url)
                .output()
                .await
                .expect("running lease-sweeper");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };

    let (code, out, err) = run(&["leases", "set", "email", "60", "--actor", "ops", "--json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let set = json(&out);
    assert_eq!(
        (
            set["job_kind"].clone(),
            set["lease_sec"].clone(),
            set["old_lease_sec"].clone()
        ),
        (json!("email"), json!(60), Value::Null)
    );
    let (code, out, _) = run(&["leases", "--json"]).await;
    assert_eq!(
        (code, json(&out)["kinds"][0]["lease_sec"].clone()),
        (Some(0), json!(60))
    );

    let (code, out, err) = run(&["leases", "set", "email", "-5", "--actor", "ops"]).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(out.starts_with("refused: fn_job_kind_lease_set: "), "{out}");
    assert!(
        err.contains("message=kind_lease_rejected jobKind=email"),
        "{err}"
    );
    let (code, out, _) = run(&["leases", "clear", "email", "--actor", "", "--json"]).await;
    assert_eq!(
        (code, json(&out)["refused"].clone()),
        (Some(1), json!(true))
    );

    // Usage errors are clap's: exit 2, nothing sent.
    for args in [
        &["leases", "set", "email", "sixty", "--actor", "ops"][..],
        &["leases", "set", "email", "60"][..],
        &["leases", "clear", "email"][..],
        &["leases", "set", "email", "99999999999", "--actor", "ops"][..],
    ] {
        let out = std::process::Command::new(crate::support::binary())
            .args(args)
            .env("LOCKDB_URL", &db.url)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
    let (code, out, _) = run(&["leases", "--json"]).await;
    assert_eq!(
        (code, json(&out)["kinds"][0]["lease_sec"].clone()),
        (Some(0), json!(60))
    );
    let (code, out) = run_binary(&["leases", "clear", "email", "--actor", "ops"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
}
