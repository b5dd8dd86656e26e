//! The idle probes sent alone with the simple query protocol, outside any
//! explicit transaction (`conn::probe_row`): their answers decode from text,
//! a gated job pass reads its refusal and its gauge in one statement, and the
//! client-side bound ends a probe stuck behind a table lock, the bound the
//! guards every other transaction sets for itself alone. Through PgBouncer:
//! `topology::pgbouncer`.

use std::time::{Duration, Instant};

use lease_sweeper::testing::conn::{self, PROBE_TIMEOUT};
use lease_sweeper::testing::job_queue::{
    GATES_THEN_STALE, Gates, JobQueue, PgJobQueue, STALE_COUNT,
};
use lease_sweeper::testing::lock_entry::{self as locks, SWEEP_PROBE};
use lease_sweeper::testing::store::Probe;

use crate::jobs::support::dry_run;
use crate::support::{TestDb, exec, insert_expired, insert_stale_jobs};

#[tokio::test]
async fn sweep_probe_decodes_from_text() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    assert_eq!(
        locks::sweep_probe(&mut conn).await.unwrap(),
        Probe {
            expired: false,
            recorded: false,
            held: Some(0),
            missed: 0,
        }
    );
    insert_expired(&mut conn, "probe-", 3, 1_000).await;
    // Something expired: no count (the sweep reads it after deleting), and
    // whether others are busy: an idle test database has nobody.
    assert_eq!(
        locks::sweep_probe(&mut conn).await.unwrap(),
        Probe {
            expired: true,
            recorded: false,
            held: None,
            missed: 0,
        }
    );
}

#[tokio::test]
async fn gated_pass_is_one_statement() {
    let db = TestDb::new().await;
    let mut queue = PgJobQueue::new(db.target());
    // A fresh schema's gates refuse (the substrate is off by default).
    match queue.gates().await.unwrap().gates {
        Gates::Refuse { reason, stale } => {
            assert_eq!(reason, "queue.job_substrate.enabled=false");
            assert_eq!(stale, 0);
        }
        Gates::Allow => panic!("a fresh schema's gates allowed reaping"),
    }
    assert_eq!(queue.stale_count().await.unwrap(), 0);

    // The gauge counts what the dry run counts: stale leases only, not a
    // live lease (overdue -1 minute) nor a job in another state.
    let mut conn = db.connect().await;
    insert_stale_jobs(&mut conn, "gauge", 5, 0, 3, 1_000).await;
    insert_stale_jobs(&mut conn, "live", 2, 0, 3, -60_000).await;
    exec(
        &mut conn,
        "UPDATE job_queue SET state = 'retry_waiting', lease_owner = NULL, lease_until = NULL
          WHERE job_id = (SELECT job_id FROM job_queue WHERE job_kind = 'gauge' LIMIT 1)",
    )
    .await;
    assert_eq!(dry_run(&mut conn, Some(1)).await["stale_lease_count"], 4);
    match queue.gates().await.unwrap().gates {
        Gates::Refuse { stale, .. } => assert_eq!(stale, 4),
        Gates::Allow => panic!("the gates were not opened"),
    }
    assert_eq!(queue.stale_count().await.unwrap(), 4);
}

#[tokio::test]
async fn probe_behind_lock_fails_at_bound() {
    assert_eq!(PROBE_TIMEOUT, Duration::from_secs(30));
    let db = TestDb::new().await;
    let mut blocker = db.connect().await;
    sqlx::raw_sql("BEGIN; LOCK TABLE lock_entry, job_queue IN ACCESS EXCLUSIVE MODE")
        .execute(&mut blocker)
        .await
        .unwrap();
    for probe in [SWEEP_PROBE, GATES_THEN_STALE, STALE_COUNT] {
        let mut conn = db.connect().await;
        let started = Instant::now();
        let err = conn::probe_row_within(&mut conn, probe, Duration::from_millis(300))
            .await
            .expect_err(probe);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(5),
            "{probe}: {took:?}"
        );
        let text = conn::describe(&err);
        assert!(text.contains("no answer within 300 ms"), "{text}");
    }
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut blocker)
        .await
        .unwrap();
    // Unblocked, a new connection answers at once.
    let mut conn = db.connect().await;
    assert!(locks::sweep_probe(&mut conn).await.is_ok());
}

/// What the probes go without: every other transaction sets the guards for
/// itself alone (`SET LOCAL`: behind PgBouncer a session setting would stay
/// on whichever server connection it reached), the statement guard the
/// probes' client-side bound.
#[tokio::test]
async fn guards_hold_and_end_with_transaction() {
    const GUARDS: &str = "SELECT (SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout'), \
                                 (SELECT setting::bigint FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout')";
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let guards = async |c: &mut sqlx::PgConnection| {
        sqlx::query_as::<_, (i64, i64)>(GUARDS).fetch_one(c).await
    };
    let before = guards(&mut conn).await.unwrap();

    let (statement, idle) = conn::in_tx(&mut conn, guards).await.unwrap();

    assert_eq!(statement, PROBE_TIMEOUT.as_millis() as i64);
    assert!(idle > 0, "a transaction left idle is ended: {idle}");
    assert_ne!((statement, idle), before);
    assert_eq!(
        guards(&mut conn).await.unwrap(),
        before,
        "gone with the transaction"
    );
}
