//! The worker's side of the job-queue SQL API (docs/sql-api.md): claim
//! refuses while the substrate is off and leases for the configured
//! duration, heartbeat and complete answer only the holder, and moving a job
//! to the dead letter returns the same object apply does and refuses
//! finished jobs.
//!
//! Owns none of the reaper (jobs::apply) or lease durations per kind and
//! per job (jobs::lease_duration::claims).

use serde_json::{Value, json};

use crate::jobs::support::{job_row, keys, refusal};
use crate::support::{
    SUBSTRATE, TestDb, apply_stale_leases, insert_stale_jobs, open_gates, set_setting,
};

#[tokio::test]
async fn claim_refused_while_off_leases_configured() {
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
async fn dead_letter_matches_apply() {
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
