//! Bad lock rows: every value the schema admits in a column the lock sweep
//! reads is either refused at the door by a constraint whose name says the
//! rule, or handled: reported with a documented encoding, or set aside with
//! one ERROR line while every other lease of the same sweep is reported; the
//! lock functions refuse a bad limit, and a migration over bad rows names
//! them and the fix. Expiries lost: none, in every test. The job queue's bad
//! rows are `jobs::bad_rows`.
//!
//! "Handled" cases need a row the constraints now refuse; the tests drop the
//! constraint by hand first, as an operator (or an older schema) might have.

use crate::support::bad_rows::{
    I64_MAX, I64_MIN, daemon_until, error_lines, keys, legal_hold, refused_with,
};
use crate::support::{TestDb, count, events, exec, insert_expired};

#[tokio::test]
async fn infinite_deadlines_refused_by_named_constraints() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    for deadline in ["-infinity", "infinity"] {
        let msg = refused_with(
            &mut conn,
            &format!("INSERT INTO lock_entry (lock_key, owner_id, token, expires_at) VALUES ('k', 'o', 1, '{deadline}')"),
            "23514",
        )
        .await;
        assert!(msg.contains("lock_entry_expires_at_finite"), "{msg}");
        let msg = refused_with(
            &mut conn,
            &format!("INSERT INTO lock_expiry_outbox (lock_key, owner_id, token, expires_at, new_token) VALUES ('k', 'o', 1, '{deadline}', 2)"),
            "23514",
        )
        .await;
        assert!(
            msg.contains("lock_expiry_outbox_expires_at_finite"),
            "{msg}"
        );
    }
    // A renewal or an acquire can never write one: their TTL is bounded.
    let msg = refused_with(
        &mut conn,
        "INSERT INTO lock_expiry_outbox (lock_key, owner_id, token, expires_at, taken_over_at, new_token) VALUES ('k', 'o', 1, now(), 'infinity', 2)",
        "23514",
    )
    .await;
    assert!(
        msg.contains("lock_expiry_outbox_taken_over_at_finite"),
        "{msg}"
    );
}

#[tokio::test]
async fn extreme_deadlines_reported_in_the_same_sweep() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "ordinary-", 20, 1_000).await;
    // A pre-1970 deadline is admitted and must be reported: it used to be
    // hidden by the resumable reap's lower bound (epoch + 0).
    exec(&mut conn, "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at) VALUES ('moon', 'eagle', 1969, '1969-07-20 20:17:00+00')").await;
    // -infinity is refused at the door now; one written before (here: with
    // the constraint dropped by hand) is still reported.
    exec(&mut conn, "ALTER TABLE lock_entry DROP CONSTRAINT lock_entry_expires_at_finite; INSERT INTO lock_entry (lock_key, owner_id, token, expires_at) VALUES ('never', 'nobody', 1, '-infinity')").await;

    let lines = daemon_until(&db, "22 lease_expired", |l| {
        events(l, "lease_expired").len() >= 22
    })
    .await;

    let reported = events(&lines, "lease_expired");
    assert_eq!(reported.len(), 22, "each exactly once");
    let moon = reported.iter().find(|f| f["lockKey"] == "moon").unwrap();
    assert_eq!(
        moon["expiredAtMillis"], "-14182980000",
        "negative before 1970"
    );
    assert!(moon["overdueMillis"].parse::<i64>().unwrap() > 1_700_000_000_000);
    let never = reported.iter().find(|f| f["lockKey"] == "never").unwrap();
    assert_eq!(never["expiredAtMillis"], I64_MIN);
    assert_eq!(never["overdueMillis"], I64_MAX);
    let ordinary = keys(&lines, "lease_expired", "lockKey")
        .into_iter()
        .filter(|k| k.starts_with("ordinary-"))
        .count();
    assert_eq!(ordinary, 20);
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
    assert!(error_lines(&lines).is_empty(), "{:#?}", error_lines(&lines));
}

#[tokio::test]
async fn minus_infinity_takeover_drained_with_others() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    exec(&mut conn, "ALTER TABLE lock_entry DROP CONSTRAINT lock_entry_expires_at_finite; ALTER TABLE lock_expiry_outbox DROP CONSTRAINT lock_expiry_outbox_expires_at_finite").await;
    exec(&mut conn, "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at) VALUES ('steal-never', 'nobody', nextval('lock_fencing_token_seq'), '-infinity')").await;
    insert_expired(&mut conn, "steal-", 5, 1_000).await;
    exec(
        &mut conn,
        "SELECT lock_acquire(lock_key, 'thief', 60000) FROM lock_entry",
    )
    .await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_expiry_outbox").await,
        6
    );

    let lines = daemon_until(&db, "6 takeovers", |l| {
        events(l, "lease_expired").len() >= 6
    })
    .await;

    let reported = events(&lines, "lease_expired");
    assert_eq!(reported.len(), 6);
    assert!(reported.iter().all(|f| f["reapedBy"] == "takeover"));
    let never = reported
        .iter()
        .find(|f| f["lockKey"] == "steal-never")
        .unwrap();
    assert_eq!(never["expiredAtMillis"], I64_MIN);
    assert_eq!(never["overdueMillis"], I64_MAX);
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_expiry_outbox").await,
        0
    );
    assert!(error_lines(&lines).is_empty(), "{:#?}", error_lines(&lines));
}

/// Anything the constraints cannot foresee: here a trigger an operator added
/// that refuses to delete one key, and one outbox row.
#[tokio::test]
async fn failing_row_set_aside_others_reported() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    legal_hold(&mut conn, "cursed%", &["lock_entry", "lock_expiry_outbox"]).await;
    insert_expired(&mut conn, "ordinary-", 30, 1_000).await;
    insert_expired(&mut conn, "cursed-lease", 1, 2_000).await;
    insert_expired(&mut conn, "cursed-steal", 1, 2_000).await;
    insert_expired(&mut conn, "steal-", 4, 1_000).await;
    exec(&mut conn, "SELECT lock_acquire(lock_key, 'thief', 60000) FROM lock_entry WHERE lock_key LIKE '%steal%'").await;

    let lines = daemon_until(&db, "34 reported and 2 set aside", |l| {
        events(l, "lease_expired").len() >= 34
            && keys(l, "lease_set_aside", "lockKey").contains(&"cursed-lease1".to_owned())
            && keys(l, "lease_set_aside", "lockKey").contains(&"cursed-steal1".to_owned())
    })
    .await;

    let reported = keys(&lines, "lease_expired", "lockKey");
    assert_eq!(reported.len(), 34, "30 swept + 4 taken over, each once");
    assert!(!reported.iter().any(|k| k.starts_with("cursed")));
    let aside = events(&lines, "lease_set_aside");
    for f in &aside {
        assert_eq!(f["level"], "error");
        assert!(
            f["cause"].contains(&format!("legal hold on {}", f["lockKey"]))
                && f["cause"].contains("SQLSTATE P0001"),
            "{f:?}"
        );
    }
    let sweep_aside = aside
        .iter()
        .find(|f| f["lockKey"] == "cursed-lease1")
        .unwrap();
    assert_eq!(sweep_aside["reapedBy"], "sweep");
    let steal_aside = aside
        .iter()
        .find(|f| f["lockKey"] == "cursed-steal1")
        .unwrap();
    assert_eq!(steal_aside["reapedBy"], "takeover");
    // Set aside means left in place, not lost: once the hold is lifted, the
    // next sweep reports both.
    let left: Vec<String> = sqlx::query_scalar(
        "SELECT lock_key FROM lock_entry WHERE expires_at <= now()
         UNION ALL SELECT 'outbox:' || lock_key FROM lock_expiry_outbox ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(left, vec!["cursed-lease1", "outbox:cursed-steal1"]);
    exec(&mut conn, "DROP FUNCTION legal_hold() CASCADE").await;
    let lines = daemon_until(&db, "the two set-aside ones", |l| {
        events(l, "lease_expired").len() >= 2
    })
    .await;
    assert_eq!(
        keys(&lines, "lease_expired", "lockKey"),
        vec!["cursed-lease1", "cursed-steal1"]
    );
    eprintln!(
        "FIGURES bad_rows_set_aside_leases: reported=34 set_aside_lines={} later_reported=2 lost=0",
        aside.len()
    );
}

#[tokio::test]
async fn bad_limits_refused_with_22023() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "k", 3, 1_000).await;
    for sql in [
        "SELECT * FROM lock_reap_batch(NULL)",
        "SELECT * FROM lock_reap_batch(0)",
        "SELECT * FROM lock_reap_batch(-1)",
        "SELECT * FROM lock_reap_batch(100001)",
        "SELECT * FROM lock_drain_takeovers(NULL)",
        "SELECT * FROM lock_drain_takeovers(-5)",
    ] {
        let msg = refused_with(&mut conn, sql, "22023").await;
        assert!(msg.contains("limit must be from 1 to 100000, got"), "{msg}");
    }
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 3);
    // 0 is an ordinary resume bound (1970), NULL is "from the oldest".
    exec(&mut conn, "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at) VALUES ('moon', 'eagle', 1969, '1969-07-20 20:17:00+00')").await;
    let from_1970: Vec<String> = sqlx::query_scalar(
        "SELECT k FROM lock_reap_batch(10, 0), unnest(lock_keys) AS k ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(from_1970, vec!["k1", "k2", "k3"]);
    let from_oldest: Vec<String> =
        sqlx::query_scalar("SELECT k FROM lock_reap_batch(10), unnest(lock_keys) AS k")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(from_oldest, vec!["moon"]);
}
