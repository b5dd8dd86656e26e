//! The job-queue stale-lease reaper's SQL API (docs/sql-api.md):
//! the functions' exact JSON, the refusal table in gate order, the apply
//! proof, backoff and dead-lettering, the setter and its audit, privileges,
//! `search_path` and overload hijacks, and concurrent appliers.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::PgConnection;

use crate::jobs_support::{dry_run, job_snapshot, refusal};
use crate::support::{
    LoginRole, REAPER, SUBSTRATE, TestDb, apply_stale_leases, count, insert_stale_jobs, open_gates,
    set_gates, set_setting,
};

async fn job_row(
    conn: &mut PgConnection,
    id: &str,
) -> (String, i32, Option<String>, Option<String>) {
    sqlx::query_as(
        "SELECT state, attempts, last_error, lease_owner FROM job_queue WHERE job_id = $1::uuid",
    )
    .bind(id)
    .fetch_one(conn)
    .await
    .unwrap()
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort_unstable();
    k
}

/// Runs a statement returning one JSON value (as text) and parses it.
async fn json_of(conn: &mut PgConnection, sql: &'static str) -> Value {
    let text: String = sqlx::query_scalar(sql).fetch_one(conn).await.unwrap();
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn apply_refusals_reproduce_the_source_table_in_gate_order_and_change_nothing() {
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
async fn apply_path_proof_resets_0_of_5_with_10s_backoff_and_dead_letters_4_of_5_with_attempts_5() {
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
async fn backoff_doubles_per_attempt_with_the_multiplier_capped_at_2_pow_10() {
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
async fn dry_run_changes_no_row_says_mutation_false_and_predicts_what_apply_does() {
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

    // PostgreSQL itself holds the dry run to read-only; the apply is the definer.
    let props: Vec<(String, String, bool, Vec<String>)> = sqlx::query_as(
        "SELECT proname::text, provolatile::text, prosecdef, coalesce(proconfig, '{}')
           FROM pg_proc WHERE proname LIKE 'fn_job_reap_stale_leases_%' ORDER BY proname",
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
async fn three_concurrent_appliers_reap_each_of_3000_stale_jobs_exactly_once() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let mut all = HashSet::new();
    for attempts in 0..5 {
        all.extend(insert_stale_jobs(&mut conn, "bulk", 600, attempts, 5, 2_000).await);
    }
    open_gates(&mut conn).await;
    let started = Instant::now();

    let mut tasks = Vec::new();
    for r in 0..3 {
        let mut c = db.connect().await;
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                let out = apply_stale_leases(&mut c, &format!("reaper-{r}"), Some(250)).await;
                let actions = out["actions"].as_array().unwrap().clone();
                if actions.is_empty() {
                    return seen;
                }
                seen.extend(actions.into_iter().map(|a| {
                    (
                        a["job_id"].as_str().unwrap().to_owned(),
                        a["action"].as_str().unwrap().to_owned(),
                    )
                }));
            }
        }));
    }
    let mut handled = Vec::new();
    for t in tasks {
        handled.extend(t.await.unwrap());
    }
    eprintln!(
        "3 appliers reaped 3000 stale jobs in {:?}",
        started.elapsed()
    );

    assert_eq!(handled.len(), 3_000, "every stale job once");
    let ids: HashSet<&String> = handled.iter().map(|(id, _)| id).collect();
    assert_eq!(ids.len(), 3_000, "no job twice");
    assert_eq!(ids.into_iter().cloned().collect::<HashSet<_>>(), all);
    assert_eq!(
        handled
            .iter()
            .filter(|(_, a)| a == "moved_to_dead_letter")
            .count(),
        600
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM job_dead_letter").await,
        600
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(DISTINCT job_id) FROM job_dead_letter"
        )
        .await,
        600
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM job_queue WHERE state = 'retry_waiting'"
        )
        .await,
        2_400
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM job_queue WHERE state = 'leased'"
        )
        .await,
        0
    );
}

#[tokio::test]
async fn a_job_completed_between_dry_run_and_apply_is_left_alone() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let id = insert_stale_jobs(&mut conn, "slow", 1, 0, 5, 2_000)
        .await
        .remove(0);
    open_gates(&mut conn).await;
    let seen = dry_run(&mut conn, Some(10)).await;
    assert_eq!(seen["jobs"][0]["job_id"], id.as_str());

    // The worker was only late: it finishes before the reaper acts.
    let completed: bool = sqlx::query_scalar("SELECT fn_job_complete($1::uuid, 'worker-1')")
        .bind(&id)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(completed);
    let out = apply_stale_leases(&mut conn, "op", Some(10)).await;

    assert_eq!(
        (out["reset_count"].clone(), out["dead_letter_count"].clone()),
        (json!(0), json!(0))
    );
    assert_eq!(
        job_row(&mut conn, &id).await,
        ("succeeded".into(), 0, None, None)
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM job_dead_letter").await,
        0
    );
}

#[tokio::test]
async fn a_job_re_leased_between_dry_run_and_apply_is_left_alone() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let id = insert_stale_jobs(&mut conn, "flaky", 1, 0, 5, 2_000)
        .await
        .remove(0);
    open_gates(&mut conn).await;
    let seen = dry_run(&mut conn, Some(10)).await;
    assert_eq!(seen["stale_lease_count"], 1);

    // Meanwhile another reaper resets it and a worker claims it again.
    let mut other = db.connect().await;
    assert_eq!(
        apply_stale_leases(&mut other, "other-reaper", Some(10)).await["reset_count"],
        1
    );
    sqlx::query("UPDATE job_queue SET scheduled_at = now() WHERE job_id = $1::uuid")
        .bind(&id)
        .execute(&mut conn)
        .await
        .unwrap();
    let claimed: Vec<String> =
        sqlx::query_scalar("SELECT job_id::text FROM fn_job_claim('worker-2')")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(claimed, vec![id.clone()]);

    let out = apply_stale_leases(&mut conn, "first-reaper", Some(10)).await;

    assert_eq!(out["actions"], json!([]));
    assert_eq!(
        job_row(&mut conn, &id).await,
        (
            "leased".into(),
            1,
            Some("lease_expired_reaped".into()),
            Some("worker-2".into())
        )
    );
}

#[tokio::test]
async fn a_stale_job_a_worker_holds_locked_is_skipped_without_waiting_and_not_reaped_after_it_completes()
 {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let held = insert_stale_jobs(&mut conn, "held", 1, 0, 5, 3_000)
        .await
        .remove(0);
    let free = insert_stale_jobs(&mut conn, "free", 1, 0, 5, 2_000)
        .await
        .remove(0);
    open_gates(&mut conn).await;

    // A worker is completing `held` in an open transaction.
    let mut worker = db.connect().await;
    sqlx::query("BEGIN").execute(&mut worker).await.unwrap();
    let done: bool = sqlx::query_scalar("SELECT fn_job_complete($1::uuid, 'worker-1')")
        .bind(&held)
        .fetch_one(&mut worker)
        .await
        .unwrap();
    assert!(done);

    let out = tokio::time::timeout(
        Duration::from_secs(10),
        apply_stale_leases(&mut conn, "op", Some(10)),
    )
    .await
    .expect("apply skips a locked row instead of waiting on it");
    assert_eq!(out["reset_count"], 1);
    assert_eq!(out["actions"][0]["job_id"], free.as_str());

    sqlx::query("COMMIT").execute(&mut worker).await.unwrap();
    let out = apply_stale_leases(&mut conn, "op", Some(10)).await;
    assert_eq!(out["actions"], json!([]));
    assert_eq!(job_row(&mut conn, &held).await.0, "succeeded");
}

#[tokio::test]
async fn live_leases_and_jobs_in_other_states_are_never_reaped() {
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

#[tokio::test]
async fn limits_outside_1_to_10000_are_refused_by_dry_run_and_apply() {
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
async fn the_setter_rejects_unknown_keys_ill_typed_values_and_empty_actors_and_audits_each_change()
{
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

#[tokio::test]
async fn an_unprivileged_role_can_call_apply_but_cannot_mutate_redefine_or_reroute_it() {
    let db = TestDb::new().await;
    let mut owner = db.connect().await;
    let login = LoginRole::with_password(&db, &mut owner, "reaper", "reaper-pw", "").await;
    let role = login.role.clone();
    let id = insert_stale_jobs(&mut owner, "guarded", 1, 4, 5, 1_000)
        .await
        .remove(0);
    open_gates(&mut owner).await;
    let mut low = login.connect().await;
    let denied = |r: Result<sqlx::postgres::PgQueryResult, sqlx::Error>, what: &str| {
        let err = r.expect_err(&format!("{what} must be denied"));
        let code = err
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("42501"), "{what}: {err}");
    };

    // Not executable by PUBLIC: the owner grants it to the reaper's role.
    denied(
        sqlx::query("SELECT fn_job_reap_stale_leases_apply('mallory', 10)")
            .execute(&mut low)
            .await,
        "apply before the grant",
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "GRANT EXECUTE ON FUNCTION fn_job_reap_stale_leases_apply(text, integer) TO {role}"
    )))
    .execute(&mut owner)
    .await
    .unwrap();

    // It cannot change the data, the gates, or the function.
    denied(
        sqlx::query("UPDATE job_queue SET state = 'queued'")
            .execute(&mut low)
            .await,
        "UPDATE job_queue",
    );
    denied(
        sqlx::query("DELETE FROM job_dead_letter")
            .execute(&mut low)
            .await,
        "DELETE job_dead_letter",
    );
    denied(
        sqlx::query(
            "UPDATE queue_setting SET value = 'false' WHERE key = 'queue.lease.reaper_enabled'",
        )
        .execute(&mut low)
        .await,
        "UPDATE queue_setting",
    );
    denied(
        sqlx::query(
            "SELECT fn_queue_setting_set('queue.lease.reaper_enabled', 'false', 'mallory')",
        )
        .execute(&mut low)
        .await,
        "the setter",
    );
    denied(
        sqlx::query(
            "CREATE OR REPLACE FUNCTION fn_job_reap_stale_leases_apply(p_actor text, p_limit integer)
             RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$",
        )
        .execute(&mut low)
        .await,
        "replacing apply",
    );
    denied(
        sqlx::query("ALTER FUNCTION fn_job_reap_stale_leases_apply(text, integer) SET search_path = pg_temp")
            .execute(&mut low)
            .await,
        "re-pinning apply's search_path",
    );
    // Objects of its own that shadow the real ones are not used.
    sqlx::raw_sql(
        "CREATE TEMP TABLE job_queue (job_id uuid);
         CREATE TEMP TABLE job_dead_letter (job_id uuid);
         SET search_path = pg_temp, public",
    )
    .execute(&mut low)
    .await
    .unwrap();

    let out = apply_stale_leases(&mut low, "mallory", Some(10)).await;

    assert_eq!(out["dead_letter_count"], 1, "{out}");
    assert_eq!(job_row(&mut owner, &id).await.0, "dead_letter");
    let moved: (String, String) =
        sqlx::query_as("SELECT moved_by, moved_by_role FROM job_dead_letter")
            .fetch_one(&mut owner)
            .await
            .unwrap();
    assert_eq!(
        moved,
        ("mallory".to_owned(), role.clone()),
        "the role behind the actor name is recorded"
    );
    sqlx::Connection::close(low).await.unwrap();
    login.drop(&mut owner).await;
}

#[tokio::test]
async fn a_role_that_may_create_in_public_cannot_run_its_overloads_inside_the_definer_functions() {
    let db = TestDb::new().await;
    let mut owner = db.connect().await;
    let login = LoginRole::with_password(&db, &mut owner, "creator", "creator-pw", "").await;
    let role = &login.role;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "GRANT CREATE ON SCHEMA public TO {role};
         GRANT EXECUTE ON FUNCTION fn_job_reap_stale_leases_apply(text, integer) TO {role};
         GRANT EXECUTE ON FUNCTION fn_queue_setting_set(text, text, text) TO {role};"
    )))
    .execute(&mut owner)
    .await
    .unwrap();
    insert_stale_jobs(&mut owner, "retry", 2, 0, 5, 1_000).await;
    insert_stale_jobs(&mut owner, "bury", 1, 0, 1, 1_000).await;
    open_gates(&mut owner).await;
    let mut low = login.connect().await;
    // Better-matching overloads than pg_catalog's variadic, polymorphic or
    // coercing ones, each recording who it ran as.
    sqlx::raw_sql(
        r#"CREATE TABLE public.hits (what text, as_user text);
           GRANT INSERT ON public.hits TO PUBLIC;
           CREATE FUNCTION public.hit(w text) RETURNS void LANGUAGE sql
               AS $$ INSERT INTO public.hits VALUES (w, current_user) $$;
           CREATE FUNCTION public.jsonb_build_object(text, text, text, boolean, text, bigint, text, bigint, text, jsonb)
               RETURNS jsonb LANGUAGE sql AS $$ SELECT public.hit('report'); SELECT '{}'::jsonb $$;
           CREATE FUNCTION public.jsonb_build_object(text, text, text, boolean, text, integer, text, integer, text, integer)
               RETURNS jsonb LANGUAGE sql AS $$ SELECT public.hit('limit'); SELECT '{}'::jsonb $$;
           CREATE FUNCTION public.jsonb_build_object(text, text, text, text, text, text, text, text, text, timestamptz)
               RETURNS jsonb LANGUAGE sql AS $$ SELECT public.hit('setter'); SELECT '{}'::jsonb $$;
           CREATE FUNCTION public.agg_step(jsonb, jsonb) RETURNS jsonb LANGUAGE sql
               AS $$ SELECT public.hit('jsonb_agg'); SELECT '[]'::jsonb $$;
           CREATE AGGREGATE public.jsonb_agg(jsonb) (sfunc = public.agg_step, stype = jsonb);
           CREATE FUNCTION public.mul_bi(bigint, interval) RETURNS interval LANGUAGE sql
               AS $$ SELECT public.hit('bigint*interval'); SELECT interval '0' $$;
           CREATE OPERATOR public.* (leftarg = bigint, rightarg = interval, function = public.mul_bi);
           CREATE FUNCTION public.mul_ni(numeric, integer) RETURNS numeric LANGUAGE sql
               AS $$ SELECT public.hit('numeric*integer'); SELECT 0::numeric $$;
           CREATE OPERATOR public.* (leftarg = numeric, rightarg = integer, function = public.mul_ni);"#,
    )
    .execute(&mut low)
    .await
    .unwrap();
    let limit: Value = json_of(
        &mut low,
        "SELECT fn_job_reap_stale_leases_apply('creator', 0)::text",
    )
    .await;
    let applied: Value = json_of(
        &mut low,
        "SELECT fn_job_reap_stale_leases_apply('creator', 10)::text",
    )
    .await;
    let setting: Value = json_of(
        &mut low,
        "SELECT fn_queue_setting_set('queue.lease.duration_sec', '60', 'creator')::text",
    )
    .await;

    let hits: Vec<(String, String)> = sqlx::query_as("SELECT what, as_user FROM public.hits")
        .fetch_all(&mut owner)
        .await
        .unwrap();
    assert!(
        hits.is_empty(),
        "attacker code ran inside a definer: {hits:?}"
    );
    assert_eq!(limit["reason"], "limit_out_of_range", "{limit}");
    assert_eq!(
        (
            applied["reset_count"].clone(),
            applied["dead_letter_count"].clone()
        ),
        (json!(2), json!(1))
    );
    let backoffs: Vec<&Value> = applied["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.get("backoff_sec"))
        .collect();
    assert_eq!(backoffs, [&json!(10), &json!(10)]);
    assert!(applied["actions"][0]["overdue_millis"].as_i64().unwrap() >= 1_000);
    let waits: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM scheduled_at - updated_at)::float8 FROM job_queue WHERE state = 'retry_waiting'",
    )
    .fetch_all(&mut owner)
    .await
    .unwrap();
    assert_eq!(waits, [10.0, 10.0]);
    assert_eq!(setting["value"], "60");
    // And no unqualified variadic/polymorphic JSON builder is left anywhere.
    let unqualified: Vec<String> = sqlx::query_scalar(
        r"SELECT proname::text FROM pg_proc
           WHERE proname ~ '^fn_(job|queue)_'
             AND prosrc ~ '(^|[^.a-z_])jsonb_(build_object|agg)\('",
    )
    .fetch_all(&mut owner)
    .await
    .unwrap();
    assert!(unqualified.is_empty(), "{unqualified:?}");
    sqlx::Connection::close(low).await.unwrap();
    login.drop(&mut owner).await;
}

#[tokio::test]
async fn claim_refuses_while_the_substrate_is_off_and_leases_for_the_configured_duration() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let id: String =
        sqlx::query_scalar("SELECT fn_job_enqueue('email', '{\"to\": \"a@b\"}', 3)::text")
            .fetch_one(&mut conn)
            .await
            .unwrap();

    let err = sqlx::query("SELECT * FROM fn_job_claim('worker-1')")
        .execute(&mut conn)
        .await
        .unwrap_err();
    let db_err = err.as_database_error().unwrap();
    assert_eq!(db_err.code().as_deref(), Some("55000"));
    assert!(
        db_err
            .message()
            .contains("queue.job_substrate.enabled=false"),
        "{}",
        db_err.message()
    );

    set_setting(&mut conn, SUBSTRATE, "true").await;
    set_setting(&mut conn, "queue.lease.duration_sec", "120").await;
    let other_kind: Vec<String> =
        sqlx::query_scalar("SELECT job_id::text FROM fn_job_claim('worker-1', ARRAY['sms'])")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert!(other_kind.is_empty());
    let claimed: Vec<(String, String, String, f64, i32)> = sqlx::query_as(
        "SELECT job_id::text, state, lease_owner, extract(epoch FROM lease_until - now())::float8, attempts
           FROM fn_job_claim('worker-1', ARRAY['email'])",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        claimed,
        vec![(id.clone(), "leased".into(), "worker-1".into(), 120.0, 0)]
    );
    let again: Vec<String> =
        sqlx::query_scalar("SELECT job_id::text FROM fn_job_claim('worker-2')")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert!(again.is_empty(), "a leased job is not claimable");

    let beat = "SELECT fn_job_heartbeat($1::uuid, $2) IS NOT NULL";
    let by = |w: &'static str| sqlx::query_scalar::<_, bool>(beat).bind(id.clone()).bind(w);
    assert!(
        !by("worker-2").fetch_one(&mut conn).await.unwrap(),
        "not the holder"
    );
    assert!(by("worker-1").fetch_one(&mut conn).await.unwrap());
    let complete = "SELECT fn_job_complete($1::uuid, 'worker-1')";
    assert!(
        sqlx::query_scalar::<_, bool>(complete)
            .bind(&id)
            .fetch_one(&mut conn)
            .await
            .unwrap()
    );
    assert!(
        !sqlx::query_scalar::<_, bool>(complete)
            .bind(&id)
            .fetch_one(&mut conn)
            .await
            .unwrap()
    );
    assert_eq!(
        job_row(&mut conn, &id).await,
        ("succeeded".into(), 0, None, None)
    );
    assert!(
        !by("worker-1").fetch_one(&mut conn).await.unwrap(),
        "a finished job has no lease"
    );
}

#[tokio::test]
async fn move_to_dead_letter_returns_the_same_dead_letter_object_as_apply_and_refuses_finished_jobs()
 {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let id: String = sqlx::query_scalar("SELECT fn_job_enqueue('poison', '{}', 5)::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let call = "SELECT fn_job_move_to_dead_letter($1::uuid, $2, $3)::text";
    let mv = |actor: &'static str| {
        sqlx::query_scalar::<_, String>(call)
            .bind(id.clone())
            .bind("unparseable payload")
            .bind(actor)
    };

    let refused: Value = serde_json::from_str(&mv("").fetch_one(&mut conn).await.unwrap()).unwrap();
    assert_eq!(refused, refusal("actor_required"));
    let out: Value = serde_json::from_str(&mv("ops").fetch_one(&mut conn).await.unwrap()).unwrap();
    assert_eq!(
        keys(&out),
        [
            "attempts",
            "dead_letter_id",
            "final_error",
            "job_id",
            "moved_at",
            "moved_by",
            "refused",
            "state"
        ]
    );
    assert_eq!(
        (
            out["state"].clone(),
            out["refused"].clone(),
            out["attempts"].clone(),
            out["final_error"].clone()
        ),
        (
            json!("dead_letter"),
            json!(false),
            json!(0),
            json!("unparseable payload")
        )
    );
    assert_eq!(job_row(&mut conn, &id).await.0, "dead_letter");
    let twice: Value =
        serde_json::from_str(&mv("ops").fetch_one(&mut conn).await.unwrap()).unwrap();
    assert_eq!(twice["reason"], "job_not_movable");
    assert_eq!(twice["state"], "dead_letter");

    // Apply's dead_letter object has exactly the same keys.
    insert_stale_jobs(&mut conn, "last", 1, 0, 1, 1_000).await;
    open_gates(&mut conn).await;
    let applied = apply_stale_leases(&mut conn, "op", Some(10)).await;
    assert_eq!(keys(&applied["actions"][0]["dead_letter"]), keys(&out));
}
