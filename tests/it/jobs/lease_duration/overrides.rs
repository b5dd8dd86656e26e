//! A job's own lease, `metadata.lease_override_sec`, at the door: a bad
//! override is refused by a named constraint naming the job, a migration
//! over rows that break it fails naming them (and the fix works), and
//! enqueue's new metadata argument keeps every old call and grant.
//!
//! Owns none of the leases an override gives (jobs::lease_duration::claims).

use serde_json::json;

use crate::jobs::support::{claim, enqueue, given, set_kind};
use crate::support::{
    LoginRole, SUBSTRATE, TestDb, count, exec, migrate_to, run_binary, set_setting,
};

/// The last migration before lease durations per kind and per job.
const BEFORE_LEASE_DURATIONS: i64 = 20261130000400;

/// The constraint that keeps a bad override out of job_queue.
const OVERRIDE_RULE: &str = "job_queue_lease_override_sec_whole_from_1_to_86400";

#[tokio::test]
async fn bad_override_refused_naming_job() {
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
async fn migration_over_bad_overrides_names_fix() {
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
async fn enqueue_keeps_calls_and_grants() {
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
