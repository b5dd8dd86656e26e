//! The gates in front of the job-queue stale-lease reaper's SQL API
//! (docs/sql-api.md): apply's refusals reproduce the refusal table in gate
//! order and change nothing, limits outside 1 to 10000 are refused by dry run
//! and apply, and the setter that changes a gate rejects unknown keys,
//! ill-typed values and empty actors and audits each change.
//!
//! Owns none of what apply does once the gates are open (jobs::apply,
//! jobs::races).

use serde_json::{Value, json};

use crate::jobs::support::{dry_run, job_snapshot, refusal};
use crate::support::{
    REAPER, TestDb, apply_stale_leases, count, insert_stale_jobs, open_gates, set_gates,
    set_setting,
};

#[tokio::test]
async fn refusals_in_gate_order_change_nothing() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_stale_jobs(&mut conn, "refusal_probe", 1, 0, 5, 5_000).await;
    let before = job_snapshot(&mut conn).await;

    // (substrate, reaper_enabled, dry_run_only, actor) → the source's answer.
    let table = [
        (
            true,
            true,
            true,
            "op",
            refusal("queue.lease.reaper_dry_run_only=true"),
        ),
        (
            true,
            false,
            false,
            "op",
            refusal("queue.lease.reaper_enabled=false"),
        ),
        (
            false,
            true,
            false,
            "op",
            refusal("queue.job_substrate.enabled=false"),
        ),
        (true, true, false, "", refusal("actor_required")),
        // Order: actor before every gate, then substrate, reaper, dry run.
        (false, false, true, "", refusal("actor_required")),
        (
            false,
            false,
            true,
            "op",
            refusal("queue.job_substrate.enabled=false"),
        ),
        (
            true,
            false,
            true,
            "op",
            refusal("queue.lease.reaper_enabled=false"),
        ),
        (true, true, false, "   ", refusal("actor_required")),
    ];
    for (substrate, reaper, dry_only, actor, expected) in table {
        set_gates(&mut conn, substrate, reaper, dry_only).await;
        let got = apply_stale_leases(&mut conn, actor, Some(100)).await;
        assert_eq!(
            got, expected,
            "substrate={substrate} reaper_enabled={reaper} dry_run_only={dry_only} actor={actor:?}"
        );
        assert_eq!(
            job_snapshot(&mut conn).await,
            before,
            "a refusal mutated a job"
        );
    }
    // A NULL actor is an empty actor.
    let text: String = sqlx::query_scalar("SELECT fn_job_reap_stale_leases_apply(NULL, 100)::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        refusal("actor_required")
    );
    // The defaults as migrated refuse at the first gate.
    let fresh = TestDb::new().await;
    let mut fresh_conn = fresh.connect().await;
    assert_eq!(
        apply_stale_leases(&mut fresh_conn, "op", Some(100)).await,
        refusal("queue.job_substrate.enabled=false")
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM job_dead_letter").await,
        0
    );
}

#[tokio::test]
async fn limits_outside_range_refused() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_stale_jobs(&mut conn, "limit", 2, 0, 5, 1_000).await;
    open_gates(&mut conn).await;
    let before = job_snapshot(&mut conn).await;

    for limit in [Some(0), Some(10_001), Some(-1), None] {
        let expected = json!({"reason": "limit_out_of_range", "refused": true,
                              "limit": limit, "limit_min": 1, "limit_max": 10000});
        assert_eq!(
            dry_run(&mut conn, limit).await,
            expected,
            "dry run, limit {limit:?}"
        );
        assert_eq!(
            apply_stale_leases(&mut conn, "op", limit).await,
            expected,
            "apply, limit {limit:?}"
        );
    }
    assert_eq!(job_snapshot(&mut conn).await, before);
    // The bounds themselves are accepted.
    assert_eq!(dry_run(&mut conn, Some(10_000)).await["limit"], 10_000);
    assert_eq!(
        apply_stale_leases(&mut conn, "op", Some(1)).await["reset_count"],
        1
    );
    assert_eq!(
        apply_stale_leases(&mut conn, "op", Some(10_000)).await["reset_count"],
        1
    );
}

#[tokio::test]
async fn setter_rejects_bad_input_audits_changes() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let settings = "SELECT string_agg(s::text, ',' ORDER BY key) FROM queue_setting s";
    let before: String = sqlx::query_scalar(settings)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let defaults: Vec<(String, String)> =
        sqlx::query_as("SELECT key, value FROM queue_setting ORDER BY key")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        defaults,
        [
            ("queue.job_substrate.enabled", "false"),
            ("queue.lease.duration_sec", "300"),
            ("queue.lease.reaper_dry_run_only", "true"),
            ("queue.lease.reaper_enabled", "false"),
            ("queue.retry.backoff_base_sec", "10"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
    );

    let rejected = [
        (
            "queue.lease.reaper_enabeld",
            "true",
            "test-operator",
            "unknown setting key \"queue.lease.reaper_enabeld\"",
        ),
        (
            "queue.lease.reaper_enabled",
            "yes",
            "test-operator",
            "must be true or false",
        ),
        (
            "queue.lease.reaper_enabled",
            "TRUE",
            "test-operator",
            "must be true or false",
        ),
        (
            "queue.lease.reaper_dry_run_only",
            "",
            "test-operator",
            "must be true or false",
        ),
        (
            "queue.retry.backoff_base_sec",
            "ten",
            "test-operator",
            "whole number of seconds from 1 to 86400",
        ),
        (
            "queue.retry.backoff_base_sec",
            "0",
            "test-operator",
            "whole number of seconds from 1 to 86400",
        ),
        (
            "queue.lease.duration_sec",
            "-5",
            "test-operator",
            "whole number of seconds from 1 to 86400",
        ),
        (
            "queue.lease.duration_sec",
            "86401",
            "test-operator",
            "whole number of seconds from 1 to 86400",
        ),
        (
            "queue.lease.duration_sec",
            "99999999999",
            "test-operator",
            "whole number of seconds from 1 to 86400",
        ),
        (
            "queue.lease.duration_sec",
            "1.5",
            "test-operator",
            "whole number of seconds from 1 to 86400",
        ),
        (
            "queue.lease.reaper_enabled",
            "true",
            "",
            "actor is required",
        ),
        (
            "queue.lease.reaper_enabled",
            "true",
            "  ",
            "actor is required",
        ),
    ];
    for (key, value, actor, message) in rejected {
        let err = sqlx::query("SELECT fn_queue_setting_set($1, $2, $3)")
            .bind(key)
            .bind(value)
            .bind(actor)
            .execute(&mut conn)
            .await
            .expect_err(&format!("{key}={value:?} by {actor:?} must be rejected"));
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(db_err.code().as_deref(), Some("22023"), "{db_err}");
        assert!(
            db_err.message().contains(message),
            "{key}={value:?}: {}",
            db_err.message()
        );
    }
    let after: String = sqlx::query_scalar(settings)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(after, before, "a rejected change changed a setting");
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM queue_setting_audit").await,
        0
    );

    let out = set_setting(&mut conn, "queue.retry.backoff_base_sec", " 007 ").await;
    assert_eq!(out["key"], "queue.retry.backoff_base_sec");
    assert_eq!(out["old_value"], "10");
    assert_eq!(out["value"], "7", "stored in canonical form");
    assert_eq!(out["updated_by"], "test-operator");
    set_setting(&mut conn, REAPER, "true").await;
    let audit: Vec<(String, Option<String>, String, String, String)> = sqlx::query_as(
        "SELECT key, old_value, new_value, actor, changed_by_role FROM queue_setting_audit ORDER BY audit_id",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let role: String = sqlx::query_scalar("SELECT session_user::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        audit,
        vec![
            (
                "queue.retry.backoff_base_sec".into(),
                Some("10".into()),
                "7".into(),
                "test-operator".into(),
                role.clone()
            ),
            (
                REAPER.into(),
                Some("false".into()),
                "true".into(),
                "test-operator".into(),
                role
            ),
        ]
    );
}
