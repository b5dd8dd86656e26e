//! The job-queue stale-lease reaper's apply against a queue that moves under
//! it (docs/sql-api.md): three concurrent appliers reap each stale job
//! exactly once, a job completed or re-leased between dry run and apply is
//! left alone, and a job a worker holds locked is skipped without waiting.
//!
//! Owns none of apply's results on a still queue (jobs::apply).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::jobs::support::{dry_run, job_row};
use crate::support::{TestDb, apply_stale_leases, count, insert_stale_jobs, open_gates};

#[tokio::test]
async fn concurrent_appliers_reap_each_once() {
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
async fn completed_before_apply_left_alone() {
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
async fn re_leased_before_apply_left_alone() {
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
async fn locked_job_skipped_without_waiting() {
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
