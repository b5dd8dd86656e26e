//! The job-queue document's own queue ("Phase 1"), made by plain SQL as its
//! owner role (`phase1_queue.sql`): adopted as it is, with nothing of the
//! sidecar's own (no per-kind lease durations, no record of who reaped), its
//! state as text or as an enum; the document's refusals and apply path
//! through the real binary and the daemon, dead letters moved by the
//! queue's own `fn_job_move_to_dead_letter`; and what `migrate` refuses by
//! name, changing nothing.

use std::time::Duration;

use serde_json::Value;
use sqlx::PgConnection;

use super::{lock_server_database, rows_checksum};
use crate::support::{
    Daemon, LoginRole, StatsdCapture, TestDb, count, daemon_env, events, exec, run_binary,
    set_setting,
};

/// The queue's own migration; `STATE_TYPE` is the state column's type.
const PHASE1: &str = include_str!("phase1_queue.sql");

/// The document's five states, as an enum the queue's tool created.
const STATE_ENUM: &str = "CREATE TYPE job_state AS ENUM \
     ('queued', 'leased', 'retry_waiting', 'succeeded', 'dead_letter')";

/// A lock server's database with the document's queue beside it, made by
/// their owner role with `state` of `state_type` (after `before`, if any).
pub(super) async fn phase1_database(
    state_type: &str,
    before: &str,
) -> (TestDb, LoginRole, PgConnection) {
    let (db, owner, mut conn) = lock_server_database(None).await;
    if !before.is_empty() {
        exec(&mut conn, before).await;
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        PHASE1.replace("STATE_TYPE", state_type),
    ))
    .execute(&mut conn)
    .await
    .expect("the queue's own migration");
    (db, owner, conn)
}

/// Every file, function and history row of the queue's that `migrate`
/// must leave as it was.
async fn queue_state(conn: &mut PgConnection) -> Vec<String> {
    let mut state: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname || ' filenode ' || pg_relation_filenode(c.oid) || ' columns '
                || (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ',' ORDER BY a.attnum)
                      FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)
           FROM pg_class c
          WHERE c.oid IN ('job_queue'::regclass, 'job_dead_letter'::regclass, 'queue_setting'::regclass,
                          'queue_setting_audit'::regclass)
          ORDER BY 1",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let functions: Vec<String> = sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text || ' oid ' || p.oid || ' ' || md5(p.prosrc)
           FROM pg_proc p
          WHERE p.pronamespace = 'public'::regnamespace
            AND p.proname IN ('fn_job_move_to_dead_letter', 'fn_job_claim', 'fn_job_complete',
                              'fn_job_heartbeat', 'fn_job_enqueue', 'fn_queue_setting_set')
          ORDER BY 1",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert_eq!(functions.len(), 6, "{functions:#?}");
    state.extend(functions);
    state.push(rows_checksum(conn, "queue_schema_history").await);
    state
}

/// The one JSON line a `jobs … --json` run printed.
fn json_of(out: &str) -> Value {
    let line = out
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON in {out}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// Two stale jobs as the document's proof prepares them (attempts 0 of 5,
/// and 4 of 5), and a live one; their ids in that order.
async fn proof_jobs(conn: &mut PgConnection) -> [String; 3] {
    let ids: Vec<String> = sqlx::query_scalar(
        "INSERT INTO job_queue (job_kind, state, attempts, max_attempts, lease_owner, lease_until)
         VALUES ('phase2_proof_retryable', 'leased', 0, 5, 'worker-a', now() - interval '2 minutes'),
                ('phase2_proof_dlq_bound', 'leased', 4, 5, 'worker-b', now() - interval '1 minute'),
                ('live', 'leased', 0, 5, 'worker-c', now() + interval '1 hour')
         RETURNING job_id::text",
    )
    .fetch_all(conn)
    .await
    .unwrap();
    [ids[0].clone(), ids[1].clone(), ids[2].clone()]
}

/// What `migrate` would have added had it adopted anything: none of it.
async fn assert_nothing_added(admin: &mut PgConnection) {
    assert_eq!(
        count(
            admin,
            "SELECT (SELECT count(*) FROM pg_class
                      WHERE relname IN ('lease_sweeper_sql', 'lock_expiry_outbox', 'job_reap_handoff'))
                  + (SELECT count(*) FROM pg_proc WHERE proname LIKE 'fn\\_job\\_reap%')
                  + (SELECT count(*) FROM pg_trigger
                      WHERE tgname IN ('lock_entry_takeover', 'lock_entry_late_release'))"
        )
        .await,
        0,
        "nothing was changed"
    );
}

/// `migrate` adopts the document's queue as it is (files, columns,
/// functions and history unchanged, nothing of the sidecar's own added to
/// it); then the document's proofs hold through the real binary: the
/// refusals in gate order, the dry run without lease fields, and the apply
/// (attempts 0 of 5 reset with a 10 s backoff, 4 of 5 moved to the
/// dead-letter table by the queue's own function), a live lease untouched.
/// `check` says the queue has no per-kind lease durations; `leases` says so.
#[tokio::test]
async fn phase1_queue_adopted_as_it_is_and_its_proofs_hold() {
    let (db, _owner, mut conn) = phase1_database("text", "").await;
    let before = queue_state(&mut conn).await;

    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<String> = out.lines().map(str::to_owned).collect();
    assert_eq!(
        events(&lines, "migrated")[0]["jobQueue"],
        "adopted",
        "{out}"
    );
    assert_eq!(
        queue_state(&mut conn).await,
        before,
        "the queue's as it was"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM pg_class WHERE relname IN ('job_kind_lease', 'job_kind_lease_audit')"
        )
        .await,
        0
    );
    let [retryable, dlq_bound, live] = proof_jobs(&mut conn).await;
    let apply = ["jobs", "apply", "--actor", "phase2_proof_reaper", "--json"];

    // The refusals, in gate order; each changes nothing.
    let refusals = [
        (None, "queue.job_substrate.enabled=false"),
        (
            Some(("true", "false", "false")),
            "queue.lease.reaper_enabled=false",
        ),
        (
            Some(("true", "true", "true")),
            "queue.lease.reaper_dry_run_only=true",
        ),
    ];
    for (gates, reason) in refusals {
        if let Some((substrate, reaper, dry_only)) = gates {
            set_setting(&mut conn, "queue.job_substrate.enabled", substrate).await;
            set_setting(&mut conn, "queue.lease.reaper_enabled", reaper).await;
            set_setting(&mut conn, "queue.lease.reaper_dry_run_only", dry_only).await;
        }
        let (code, out) = run_binary(&apply, &db.url).await;
        assert_eq!(code, Some(1), "{out}");
        assert_eq!(
            json_of(&out),
            serde_json::json!({"reason": reason, "refused": true})
        );
    }
    // As the role that migrated (EXECUTE is not granted to PUBLIC).
    let mut admin = db.connect().await;
    let actor_required: String =
        sqlx::query_scalar("SELECT fn_job_reap_stale_leases_apply('', 100)::text")
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!(
        actor_required,
        r#"{"reason": "actor_required", "refused": true}"#
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM job_queue WHERE state = 'leased' AND attempts IN (0, 4)"
        )
        .await,
        3,
        "no refusal changed a job"
    );

    // The dry run says what apply would do, and no lease it cannot know.
    let (code, out) = run_binary(&["jobs", "dry-run", "--json"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let dry = json_of(&out);
    assert_eq!(dry["stale_lease_count"], 2, "{dry}");
    assert_eq!(dry["mutation"], false, "{dry}");
    let jobs = dry["jobs"].as_array().unwrap();
    let said: Vec<(&str, &str)> = jobs
        .iter()
        .map(|j| {
            (
                j["job_id"].as_str().unwrap(),
                j["would_action"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        said,
        [
            (retryable.as_str(), "reset_to_retry_waiting"),
            (dlq_bound.as_str(), "move_to_dead_letter")
        ]
    );
    for job in jobs {
        let mut keys: Vec<&str> = job
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "attempts",
                "job_id",
                "job_kind",
                "lease_owner",
                "lease_until",
                "max_attempts",
                "overdue_seconds",
                "would_action",
            ],
            "the document's fields, none of the lease's: {job}"
        );
    }
    let (code, out) = run_binary(&["jobs", "dry-run"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("JOB") && !out.contains("LEASE"),
        "no LEASE column: {out}"
    );
    assert!(
        out.contains("this queue does not record the lease each claim gave"),
        "{out}"
    );

    // The apply path.
    set_setting(&mut conn, "queue.lease.reaper_dry_run_only", "false").await;
    let (code, out) = run_binary(&apply, &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let report = json_of(&out);
    assert_eq!(
        (
            &report["actor"],
            &report["refused"],
            &report["reset_count"],
            &report["dead_letter_count"]
        ),
        (
            &Value::from("phase2_proof_reaper"),
            &Value::from(false),
            &Value::from(1),
            &Value::from(1)
        ),
        "{report}"
    );
    let reset = &report["actions"][0];
    assert_eq!(
        (
            &reset["action"],
            &reset["job_id"],
            &reset["attempts"],
            &reset["backoff_sec"]
        ),
        (
            &Value::from("reset_to_retry_waiting"),
            &Value::from(retryable.as_str()),
            &Value::from(1),
            &Value::from(10)
        ),
        "{report}"
    );
    let moved = &report["actions"][1];
    assert_eq!(
        (&moved["action"], &moved["job_id"], &moved["attempts"]),
        (
            &Value::from("moved_to_dead_letter"),
            &Value::from(dlq_bound.as_str()),
            &Value::from(5)
        ),
        "{report}"
    );
    let letter = &moved["dead_letter"];
    let (letter_id, letter_row): (String, String) = sqlx::query_as(
        "SELECT dead_letter_id::text, concat_ws('|', job_id, job_kind, attempts, final_error, moved_by)
           FROM job_dead_letter",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        letter_row,
        format!(
            "{dlq_bound}|phase2_proof_dlq_bound|5|lease_expired_reaped_at_max_attempts|phase2_proof_reaper"
        )
    );
    assert_eq!(
        (
            &letter["dead_letter_id"],
            &letter["state"],
            &letter["refused"],
            &letter["attempts"]
        ),
        (
            &Value::from(letter_id.as_str()),
            &Value::from("dead_letter"),
            &Value::from(false),
            &Value::from(5)
        ),
        "the queue's own function's JSON: {report}"
    );
    let jobs: Vec<String> = sqlx::query_scalar(
        "SELECT concat_ws('|', job_id, state, attempts, last_error, lease_owner,
                          scheduled_at BETWEEN now() + interval '8 seconds' AND now() + interval '11 seconds')
           FROM job_queue",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let mut expected = vec![
        format!("{retryable}|retry_waiting|1|lease_expired_reaped|t"),
        format!("{dlq_bound}|dead_letter|5|lease_expired_reaped_at_max_attempts|f"),
        format!("{live}|leased|0|worker-c|f"),
    ];
    let mut jobs = jobs;
    jobs.sort();
    expected.sort();
    assert_eq!(jobs, expected, "a live lease untouched");

    // check: the optional feature it lacks, as a warning; leases: plainly.
    let statsd = StatsdCapture::start().await;
    let report = lease_sweeper::testing::check::preflight(&db.target(), &statsd.target()).await;
    let feature = report
        .lines
        .iter()
        .find(|l| l.what == "job queue's optional features")
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(feature.status.word(), "warn", "{report}");
    assert!(
        feature.detail.starts_with(
            "per-kind lease durations: no (the job queue lacks job_kind_lease, fn_job_kind_lease_set, \
             and job_queue's lease_duration_sec and lease_duration_source)"
        ),
        "{report}"
    );
    let (code, out) = run_binary(&["leases"], &db.url).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("the adopted job queue has no per-kind lease durations"),
        "{out}"
    );
}

/// With `state` an enum of the document's five states, the daemon (as a
/// login role in lease_sweeper) reaps the document's two stale jobs, one
/// line each, and leaves the live one.
#[tokio::test]
async fn phase1_queue_with_an_enum_state_reaped_by_the_daemon() {
    let (db, _owner, mut conn) = phase1_database("job_state", STATE_ENUM).await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let [retryable, dlq_bound, live] = proof_jobs(&mut conn).await;
    for (key, value) in [
        ("queue.job_substrate.enabled", "true"),
        ("queue.lease.reaper_enabled", "true"),
        ("queue.lease.reaper_dry_run_only", "false"),
    ] {
        set_setting(&mut conn, key, value).await;
    }

    let mut admin = db.connect().await;
    let sweeper = LoginRole::create(&db, &mut admin, "sweeper", "IN ROLE lease_sweeper").await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&sweeper.url, &port));
    daemon
        .wait_for_events("job_lease_expired", 2, Duration::from_secs(20))
        .await;
    let (_, lines) = daemon.stop().await;

    let reaped: Vec<(String, String, String)> = events(&lines, "job_lease_expired")
        .into_iter()
        .map(|f| {
            (
                f["jobId"].clone(),
                f["action"].clone(),
                f["attempts"].clone(),
            )
        })
        .collect();
    assert_eq!(
        reaped,
        [
            (
                retryable.clone(),
                "reset_to_retry_waiting".into(),
                "1".into()
            ),
            (dlq_bound.clone(), "moved_to_dead_letter".into(), "5".into()),
        ],
        "{}",
        lines.join("\n")
    );
    let line = events(&lines, "job_lease_expired")
        .into_iter()
        .find(|f| f["jobId"] == dlq_bound)
        .unwrap();
    let letter: String = sqlx::query_scalar(
        "SELECT dead_letter_id::text FROM job_dead_letter WHERE job_id = $1::uuid",
    )
    .bind(&dlq_bound)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(line["deadLetterId"], letter);
    let states: Vec<String> = sqlx::query_scalar(
        "SELECT job_id || ' ' || state::text || ' ' || attempts FROM job_queue ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let mut expected = vec![
        format!("{retryable} retry_waiting 1"),
        format!("{dlq_bound} dead_letter 5"),
        format!("{live} leased 0"),
    ];
    expected.sort();
    assert_eq!(states, expected);
    sweeper.drop(&mut admin).await;
}

/// The document's queue without a column the reaper reads is refused, the
/// column named, nothing changed.
#[tokio::test]
async fn phase1_queue_missing_a_column_refused_by_name() {
    let (db, _owner, mut conn) = phase1_database("text", "").await;
    exec(
        &mut conn,
        "ALTER TABLE job_queue DROP CONSTRAINT job_queue_lease_consistent, DROP COLUMN lease_owner",
    )
    .await;
    let before = queue_state(&mut conn).await;

    let (code, out) = run_binary(&["migrate"], &db.url).await;

    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("refusing to adopt public.job_queue, nothing was changed: no column lease_owner (the worker holding the lease)"),
        "{out}"
    );
    assert_eq!(queue_state(&mut conn).await, before);
    assert_nothing_added(&mut conn).await;
}

/// A queue whose `fn_job_move_to_dead_letter` takes other arguments is
/// refused, naming the one found and the one the reaper calls.
#[tokio::test]
async fn phase1_dead_letter_function_of_another_signature_refused() {
    let (db, _owner, mut conn) = phase1_database("text", "").await;
    exec(
        &mut conn,
        "DROP FUNCTION fn_job_move_to_dead_letter(uuid, text, text);
         CREATE FUNCTION fn_job_move_to_dead_letter(p_job_id uuid, p_final_error text) RETURNS jsonb
         LANGUAGE sql AS $$ SELECT '{}'::jsonb $$",
    )
    .await;

    let (code, out) = run_binary(&["migrate"], &db.url).await;

    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(
            "refusing to adopt the job queue, nothing was changed: its fn_job_move_to_dead_letter is \
             fn_job_move_to_dead_letter(uuid,text) returning jsonb, and the reaper calls \
             fn_job_move_to_dead_letter(uuid, text, text) returning jsonb"
        ),
        "{out}"
    );
    assert_nothing_added(&mut conn).await;
}

/// A `state` enum without the document's `leased` is refused by name.
#[tokio::test]
async fn phase1_state_enum_without_leased_refused() {
    let db = TestDb::empty().await;
    let mut admin = db.connect().await;
    exec(
        &mut admin,
        "CREATE TYPE job_state AS ENUM ('queued', 'retry_waiting', 'succeeded', 'dead_letter');
         CREATE TABLE job_queue (
             job_id uuid PRIMARY KEY, job_kind text NOT NULL, payload jsonb NOT NULL,
             state job_state NOT NULL, attempts integer NOT NULL, max_attempts integer NOT NULL,
             scheduled_at timestamptz NOT NULL, lease_owner text, lease_until timestamptz,
             last_error text, metadata jsonb, created_at timestamptz, updated_at timestamptz)",
    )
    .await;

    let (code, out) = run_binary(&["migrate"], &db.url).await;

    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("refusing to adopt public.job_queue, nothing was changed: state's enum type job_state has no label 'leased' ("),
        "{out}"
    );
    assert_nothing_added(&mut admin).await;
}

/// A lock server's database migrated before it had a job queue: the
/// reaper idles; once the queue's own tool adds one, the next `migrate`
/// adopts it, with the gate rows and the daemon's grants.
#[tokio::test]
async fn a_job_queue_added_after_migrate_adopted_by_the_next() {
    let (db, _owner, mut conn) = lock_server_database(None).await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("jobQueue=absent"), "{out}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(PHASE1.replace("STATE_TYPE", "text")))
        .execute(&mut conn)
        .await
        .expect("the queue's own migration");

    let (code, out) = run_binary(&["migrate"], &db.url).await;

    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("jobQueue=adopted"), "{out}");
    let mut admin = db.connect().await;
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM queue_setting WHERE key IN
                 ('queue.lease.reaper_enabled', 'queue.lease.reaper_dry_run_only')"
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM (VALUES ('job_id'), ('state'), ('lease_until')) AS c (col)
              WHERE has_column_privilege('lease_sweeper', 'job_queue', c.col, 'SELECT')"
        )
        .await,
        3
    );
    exec(&mut admin, "SET ROLE lease_sweeper").await;
    let refusal: String = sqlx::query_scalar("SELECT fn_job_reaper_gate_refusal()::text")
        .fetch_one(&mut admin)
        .await
        .expect("the daemon's gate query answers");
    assert!(
        refusal.contains("queue.job_substrate.enabled=false"),
        "{refusal}"
    );
}
