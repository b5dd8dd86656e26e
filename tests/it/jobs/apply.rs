//! What the job-queue stale-lease reaper's apply and dry run do to stale
//! jobs (docs/sql-api.md): the apply proof (resets with backoff,
//! dead-lettering at the last attempt, the exact JSON), the backoff
//! multiplier's cap, the dry run changing no row while predicting what apply
//! does, and the rows apply never reaps.
//!
//! Owns none of the refusals (jobs::gates), appliers racing the queue
//! (jobs::races), privileges (privilege::jobs_api) or the worker's
//! functions (jobs::worker).

use serde_json::json;

use crate::jobs::support::{dry_run, job_row, job_snapshot, keys};
use crate::support::{
    TestDb, apply_stale_leases, count, insert_stale_jobs, open_gates, set_setting,
};

#[tokio::test]
async fn proof_resets_and_dead_letters() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let retryable = insert_stale_jobs(&mut conn, "phase2_proof_retryable", 1, 0, 5, 5_000).await;
    let dlq_bound = insert_stale_jobs(&mut conn, "phase2_proof_dlq_bound", 1, 4, 5, 3_000).await;
    open_gates(&mut conn).await;

    let out = apply_stale_leases(&mut conn, "phase2_proof_reaper", Some(100)).await;

    assert_eq!(out["actor"], "phase2_proof_reaper");
    assert_eq!(out["refused"], false);
    assert_eq!(out["reset_count"], 1);
    assert_eq!(out["dead_letter_count"], 1);
    assert_eq!(
        keys(&out),
        [
            "actions",
            "actor",
            "dead_letter_count",
            "refused",
            "reset_count"
        ]
    );
    let actions = out["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 2, "{out:#}");

    let reset = &actions[0];
    assert_eq!(reset["action"], "reset_to_retry_waiting");
    assert_eq!(reset["job_id"], retryable[0].as_str());
    assert_eq!(reset["attempts"], 1);
    assert_eq!(reset["backoff_sec"], 10);
    assert!(reset["scheduled_at"].is_string());
    assert_eq!(reset["job_kind"], "phase2_proof_retryable");
    assert_eq!(reset["lease_owner"], "worker-1");
    assert_eq!(reset["max_attempts"], 5);
    assert!(reset["overdue_millis"].as_i64().unwrap() >= 5_000);
    assert!(reset.get("dead_letter").is_none());
    let (state, attempts, last_error, owner) = job_row(&mut conn, &retryable[0]).await;
    assert_eq!(
        (state.as_str(), attempts, last_error.as_deref(), owner),
        ("retry_waiting", 1, Some("lease_expired_reaped"), None)
    );
    let (backoff, lease_until): (f64, Option<String>) = sqlx::query_as(
        "SELECT extract(epoch FROM scheduled_at - updated_at)::float8, lease_until::text
           FROM job_queue WHERE job_id = $1::uuid",
    )
    .bind(&retryable[0])
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        (backoff, lease_until),
        (10.0, None),
        "scheduled 10 s after the reap, lease cleared"
    );

    let moved = &actions[1];
    assert_eq!(moved["action"], "moved_to_dead_letter");
    assert_eq!(moved["job_id"], dlq_bound[0].as_str());
    assert_eq!(moved["attempts"], 5);
    assert!(moved.get("backoff_sec").is_none());
    let dead = &moved["dead_letter"];
    assert_eq!(dead["state"], "dead_letter");
    assert_eq!(dead["refused"], false);
    assert_eq!(dead["attempts"], 5);
    assert_eq!(dead["job_id"], dlq_bound[0].as_str());
    assert_eq!(dead["final_error"], "lease_expired_reaped_at_max_attempts");
    assert_eq!(dead["moved_by"], "phase2_proof_reaper");
    let (state, attempts, last_error, owner) = job_row(&mut conn, &dlq_bound[0]).await;
    assert_eq!(
        (state.as_str(), attempts, last_error.as_deref(), owner),
        (
            "dead_letter",
            5,
            Some("lease_expired_reaped_at_max_attempts"),
            None
        )
    );
    let dlq: Vec<(String, String, String, i32, String, String, String)> = sqlx::query_as(
        "SELECT dead_letter_id::text, job_id::text, job_kind, attempts, final_error, moved_by, payload::text
           FROM job_dead_letter",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        dlq,
        vec![(
            dead["dead_letter_id"].as_str().unwrap().to_owned(),
            dlq_bound[0].clone(),
            "phase2_proof_dlq_bound".to_owned(),
            5,
            "lease_expired_reaped_at_max_attempts".to_owned(),
            "phase2_proof_reaper".to_owned(),
            r#"{"n": 1}"#.to_owned(),
        )]
    );

    // Nothing is stale any more: a second apply has nothing to do.
    let again = apply_stale_leases(&mut conn, "phase2_proof_reaper", Some(100)).await;
    assert_eq!(
        again,
        json!({"actor": "phase2_proof_reaper", "refused": false, "reset_count": 0,
               "dead_letter_count": 0, "actions": []})
    );
}

#[tokio::test]
async fn backoff_doubles_capped() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let mut expected = Vec::new();
    for attempts in 0..=13 {
        let id = insert_stale_jobs(&mut conn, "backoff", 1, attempts, 100, 1_000).await;
        // Bumped attempts a = attempts + 1; multiplier 2^min(a-1, 10).
        expected.push((id[0].clone(), 10_i64 << attempts.min(10)));
    }
    open_gates(&mut conn).await;

    let out = apply_stale_leases(&mut conn, "op", Some(100)).await;

    assert_eq!(out["reset_count"], 14);
    for (id, backoff) in &expected {
        let action = out["actions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["job_id"] == id.as_str())
            .unwrap();
        assert_eq!(action["backoff_sec"], *backoff, "{action}");
        let in_db: f64 = sqlx::query_scalar(
            "SELECT extract(epoch FROM scheduled_at - updated_at)::float8 FROM job_queue WHERE job_id = $1::uuid",
        )
        .bind(id)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(in_db, *backoff as f64);
    }
    assert_eq!(expected[10].1, 10_240, "2^10 × 10 s");
    assert_eq!(expected[13].1, 10_240, "capped");

    // The base comes from queue.retry.backoff_base_sec.
    set_setting(&mut conn, "queue.retry.backoff_base_sec", "3").await;
    insert_stale_jobs(&mut conn, "backoff", 1, 2, 100, 1_000).await;
    let out = apply_stale_leases(&mut conn, "op", Some(100)).await;
    assert_eq!(out["actions"][0]["backoff_sec"], 12);
}

#[tokio::test]
async fn dry_run_changes_nothing_predicts_apply() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let retryable = insert_stale_jobs(&mut conn, "retryable", 3, 1, 5, 9_000).await;
    let last = insert_stale_jobs(&mut conn, "last_attempt", 2, 2, 3, 4_000).await;
    sqlx::raw_sql(
        "INSERT INTO job_queue (job_kind, state, lease_owner, lease_until)
              VALUES ('live', 'leased', 'alive', now() + interval '1 minute');
         INSERT INTO job_queue (job_kind, state) VALUES ('q', 'queued'), ('r', 'retry_waiting'), ('s', 'succeeded')",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    open_gates(&mut conn).await; // armed: the dry run must still not touch anything
    let before = job_snapshot(&mut conn).await;
    let settings_before: String =
        sqlx::query_scalar("SELECT string_agg(s::text, ',' ORDER BY key) FROM queue_setting s")
            .fetch_one(&mut conn)
            .await
            .unwrap();

    let limited = dry_run(&mut conn, Some(2)).await;
    let full = dry_run(&mut conn, Some(100)).await;

    assert_eq!(
        keys(&limited),
        [
            "evaluated_at",
            "jobs",
            "limit",
            "mutation",
            "stale_lease_count"
        ]
    );
    assert_eq!(limited["mutation"], false);
    assert_eq!(limited["limit"], 2);
    assert_eq!(limited["stale_lease_count"], 5, "counts every stale lease");
    assert_eq!(
        limited["jobs"].as_array().unwrap().len(),
        2,
        "lists at most limit"
    );
    assert_eq!(full["stale_lease_count"], 5);
    let jobs = full["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 5);
    for job in jobs {
        assert_eq!(
            keys(job),
            [
                "attempts",
                "job_id",
                "job_kind",
                "lease_duration_sec",
                "lease_duration_source",
                "lease_owner",
                "lease_until",
                "max_attempts",
                "overdue_seconds",
                "would_action"
            ]
        );
        let id = job["job_id"].as_str().unwrap().to_owned();
        if retryable.contains(&id) {
            assert_eq!(job["would_action"], "reset_to_retry_waiting");
            assert!(job["overdue_seconds"].as_i64().unwrap() >= 9);
        } else {
            assert!(last.contains(&id));
            assert_eq!(job["would_action"], "move_to_dead_letter");
            assert!(job["overdue_seconds"].as_i64().unwrap() >= 4);
        }
    }
    assert_eq!(
        job_snapshot(&mut conn).await,
        before,
        "a dry run changed a row"
    );
    let settings_after: String =
        sqlx::query_scalar("SELECT string_agg(s::text, ',' ORDER BY key) FROM queue_setting s")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(settings_after, settings_before);
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM job_dead_letter").await,
        0
    );

    // PostgreSQL itself holds the dry run to read-only; the apply is the
    // definer (the daemon's call around it, which also records the report,
    // is the other one).
    let props: Vec<(String, String, bool, Vec<String>)> = sqlx::query_as(
        "SELECT proname::text, provolatile::text, prosecdef, coalesce(proconfig, '{}')
           FROM pg_proc WHERE proname IN ('fn_job_reap_stale_leases_apply', 'fn_job_reap_stale_leases_dry_run')
          ORDER BY proname",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let pinned = vec!["search_path=pg_catalog, public, pg_temp".to_owned()];
    assert_eq!(
        props,
        vec![
            (
                "fn_job_reap_stale_leases_apply".into(),
                "v".into(),
                true,
                pinned.clone()
            ),
            (
                "fn_job_reap_stale_leases_dry_run".into(),
                "s".into(),
                false,
                pinned
            ),
        ]
    );

    // What the dry run predicted is what apply does.
    let applied = apply_stale_leases(&mut conn, "op", Some(100)).await;
    let mut predicted: Vec<(String, String)> = jobs
        .iter()
        .map(|j| {
            let act = match j["would_action"].as_str().unwrap() {
                "move_to_dead_letter" => "moved_to_dead_letter",
                other => other,
            };
            (j["job_id"].as_str().unwrap().to_owned(), act.to_owned())
        })
        .collect();
    let mut done: Vec<(String, String)> = applied["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["job_id"].as_str().unwrap().to_owned(),
                a["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    predicted.sort();
    done.sort();
    assert_eq!(done, predicted);
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM job_queue WHERE state = 'leased'"
        )
        .await,
        1,
        "the live lease stays"
    );
}

#[tokio::test]
async fn live_and_other_states_never_reaped() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    sqlx::raw_sql(
        "INSERT INTO job_queue (job_kind, state, lease_owner, lease_until)
              VALUES ('live', 'leased', 'alive', now() + interval '2 seconds');
         INSERT INTO job_queue (job_kind, state, scheduled_at)
              VALUES ('q', 'queued', now() - interval '1 hour'), ('r', 'retry_waiting', now() - interval '1 hour'),
                     ('s', 'succeeded', now() - interval '1 hour'), ('d', 'dead_letter', now() - interval '1 hour')",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    open_gates(&mut conn).await;
    let before = job_snapshot(&mut conn).await;

    let out = apply_stale_leases(&mut conn, "op", Some(10_000)).await;

    assert_eq!(out["actions"], json!([]));
    assert_eq!(dry_run(&mut conn, Some(10)).await["stale_lease_count"], 0);
    assert_eq!(job_snapshot(&mut conn).await, before);
}
