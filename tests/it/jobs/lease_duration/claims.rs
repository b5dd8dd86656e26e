//! Which lease a claim or a heartbeat gives each job, proved on a real
//! PostgreSQL: its `metadata.lease_override_sec`, else its kind's duration
//! (`fn_job_kind_lease_set`), else `queue.lease.duration_sec`; mixed kinds in
//! one claim, clearing a kind's duration, and heartbeats that follow a
//! changed duration.
//!
//! Owns none of setting a duration (jobs::lease_duration::setter), bad
//! overrides (jobs::lease_duration::overrides), the reaper's use of what each
//! job was given (jobs::lease_duration::reaper) or the `leases` command
//! (jobs::lease_duration::cli).

use std::collections::HashMap;

use serde_json::{Value, json};
use sqlx::PgConnection;

use crate::jobs::support::{claim, enqueue, given, set_kind};
use crate::support::{SUBSTRATE, TestDb, count, set_setting};

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

#[tokio::test]
async fn override_else_kind_else_default() {
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
async fn cleared_kind_returns_to_default() {
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
async fn heartbeats_extend_by_own_duration() {
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
