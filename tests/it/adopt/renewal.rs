//! A holder that renews after its deadline, with the lock server's own
//! extend that does not check the deadline, while the daemon sweeps: every
//! lease that passed its deadline is reported exactly once, swept
//! (`reapedBy=sweep`) or renewed late (`reapedBy=renewal`, the lease still
//! held), and a lease renewed in time never is. A late renewal to infinity
//! is an expiry; a live lease moved into the past is not, until the sweep
//! finds its new deadline passed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sqlx::PgConnection;

use super::{LockServer, lock_server_database, nothing_left_to_report};
use crate::support::{
    Daemon, LoginRole, StatsdCapture, count, daemon_env, events, exec, run_binary,
};

/// extend, as a lock server without a deadline check sends it: the holder's
/// token finds its row whether or not the deadline has passed.
const EXTEND_UNCHECKED: &str = "
    UPDATE lock_entry SET expires_at = now() + $3 * interval '1 millisecond',
                          lease_version = lease_version + 1
     WHERE lock_key = $1 AND token = $2";

async fn extend_unchecked(conn: &mut PgConnection, key: &str, token: i64, ttl_ms: i64) -> bool {
    sqlx::query(EXTEND_UNCHECKED)
        .bind(key)
        .bind(token)
        .bind(ttl_ms)
        .execute(conn)
        .await
        .unwrap_or_else(|e| panic!("extend {key}: {e}"))
        .rows_affected()
        == 1
}

/// The deadline of `key`'s lease in epoch ms, by the database.
async fn deadline_millis(conn: &mut PgConnection, key: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT floor(extract(epoch FROM expires_at) * 1000)::int8 FROM lock_entry WHERE lock_key = $1",
    )
    .bind(key)
    .fetch_one(conn)
    .await
    .unwrap()
}

#[tokio::test]
async fn late_renewals_reported_once_and_timely_ones_never() {
    let (db, _owner, ls) = lock_server_database(None).await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let mut admin = db.connect().await;
    let sweeper = LoginRole::create(&db, &mut admin, "sweeper", "IN ROLE lease_sweeper").await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&sweeper.url, &port));
    daemon
        .wait_for_event("sweeper_started", Duration::from_secs(20))
        .await;
    let mut server = LockServer(ls);

    // Holders that pause past their 300 ms deadline by 30 ms to 1.5 s, then
    // renew as if nothing happened; the daemon sweeps every second meanwhile,
    // so some are swept before their holder wakes.
    const LATE: usize = 40;
    let mut late = Vec::new();
    for i in 0..LATE {
        let key = format!("late-{i}");
        let token = server.try_insert(&key, "paused", 300).await.unwrap();
        let deadline = deadline_millis(&mut server.0, &key).await;
        late.push((key, token, deadline));
    }
    let acquired = Instant::now();
    // Holders that renew in time, over and over.
    let mut timely = Vec::new();
    for i in 0..10 {
        let key = format!("timely-{i}");
        timely.push((
            key.clone(),
            server.try_insert(&key, "awake", 400).await.unwrap(),
        ));
    }
    let mut renewed_late = HashMap::new();
    for (i, (key, token, deadline)) in late.iter().enumerate() {
        let wake = Duration::from_millis(330 + (i as u64 * 1_170) / LATE as u64);
        if let Some(left) = wake.checked_sub(acquired.elapsed()) {
            // The holder's pause, not a wait for the daemon.
            tokio::time::sleep(left).await;
        }
        for (key, token) in &timely {
            assert!(
                server.extend(key, *token, 400).await,
                "{key} renewed in time"
            );
        }
        let renewed = extend_unchecked(&mut server.0, key, *token, 60_000).await;
        renewed_late.insert(key.clone(), (renewed, *token, *deadline));
    }
    for (key, token) in &timely {
        assert!(
            server.delete_if_owner(key, *token).await,
            "{key} released in time"
        );
    }
    // A late renewal to infinity, and a live lease moved into the past.
    let forever = server.try_insert("forever", "paused", 1).await.unwrap();
    let forever_deadline = deadline_millis(&mut server.0, "forever").await;
    let moved = server.try_insert("moved", "awake", 60_000).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let renewed: u64 = sqlx::query(
        "UPDATE lock_entry SET expires_at = 'infinity' WHERE lock_key = 'forever' AND token = $1",
    )
    .bind(forever)
    .execute(&mut server.0)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(renewed, 1);
    exec(
        &mut server.0,
        &format!(
            "UPDATE lock_entry SET expires_at = now() - interval '1 second' WHERE lock_key = 'moved' AND token = {moved}"
        ),
    )
    .await;

    let expected = LATE + 2;
    daemon
        .wait_for_events("lease_expired", expected, Duration::from_secs(20))
        .await;
    nothing_left_to_report(&mut admin, Duration::from_secs(10)).await;
    // Not a wait for an event: one more sweep, which must add nothing.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (_, lines) = daemon.stop().await;

    let lines = events(&lines, "lease_expired");
    assert_eq!(lines.len(), expected, "one line each: {lines:#?}");
    let by_key: HashMap<&str, &HashMap<String, String>> =
        lines.iter().map(|f| (f["lockKey"].as_str(), f)).collect();
    assert_eq!(by_key.len(), expected, "no key twice");
    let mut swept = 0;
    for (key, (renewed, token, deadline)) in &renewed_late {
        let f = by_key[key.as_str()];
        assert_eq!(f["token"], token.to_string(), "{key}");
        assert_eq!(f["ownerId"], "paused", "{key}");
        assert_eq!(f["expiredAtMillis"], deadline.to_string(), "{key}");
        let overdue: i64 = f["overdueMillis"].parse().unwrap();
        if *renewed {
            assert_eq!(f["reapedBy"], "renewal", "{key}");
            assert!((30..5_000).contains(&overdue), "{key}: {overdue} ms late");
        } else {
            assert_eq!(f["reapedBy"], "sweep", "{key} was swept first");
            swept += 1;
        }
    }
    eprintln!(
        "late renewals: {} renewed, {swept} swept first",
        LATE - swept
    );
    let f = by_key["forever"];
    assert_eq!(f["reapedBy"], "renewal");
    assert_eq!(f["expiredAtMillis"], forever_deadline.to_string());
    assert_eq!(by_key["moved"]["reapedBy"], "sweep");
    assert_eq!(by_key["moved"]["token"], moved.to_string());
    assert!(
        timely.iter().all(|(k, _)| !by_key.contains_key(k.as_str())),
        "no lease renewed in time is reported"
    );
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", expected as u64)
        .await;
    // The renewed leases are the lock server's still, with their new deadline.
    let held = count(
        &mut admin,
        "SELECT count(*) FROM lock_entry WHERE lock_key LIKE 'late-%' AND expires_at > now()",
    )
    .await;
    assert_eq!(held as usize, LATE - swept);
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM lock_entry WHERE lock_key = 'forever' AND expires_at = 'infinity'"
        )
        .await,
        1
    );
    sweeper.drop(&mut admin).await;
}
