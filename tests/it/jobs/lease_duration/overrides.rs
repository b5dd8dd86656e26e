//! A job's own lease, `metadata.lease_override_sec`, at the door: a bad
//! override is refused by a named constraint naming the job, a migration
//! over rows that break it fails naming them (and the fix works), and
//! enqueue's new metadata argument keeps every old call and grant.
//!
//! Owns none of the leases an override gives (jobs::lease_duration::claims).

use serde_json::json;

use crate::jobs::support::enqueue;
use crate::support::{TestDb, count};

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
