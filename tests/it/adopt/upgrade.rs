//! Upgrades. While daemons run: `migrate` replaces every function and the
//! triggers under a daemon that is sweeping a steady stream of expiries
//! (and takeovers), twice at once as two hosts would; the daemon fails no
//! pass, and every expiry is reported exactly once. And from a build before
//! the first release: a database it migrated and swept upgrades in place.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::{Connection as _, PgConnection};

use super::{nothing_left_to_report, reported};

use crate::support::{Daemon, StatsdCapture, TestDb, count, daemon_env, events, exec, run_binary};

/// The lock server's work while the upgrade runs: leases of 1 ms whose
/// holders die, every `every`, and every fifth key taken over once expired.
/// Returns each expiry it caused as (lockKey, token).
fn steady_expiries(
    url: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<(String, i64)>> {
    tokio::spawn(async move {
        let mut conn = PgConnection::connect(&url).await.unwrap();
        let mut caused = Vec::new();
        let mut i = 0u64;
        while !stop.load(Ordering::SeqCst) {
            i += 1;
            let key = format!("k-{i}");
            let token: i64 = sqlx::query_scalar("SELECT lock_acquire($1, 'dying', 1)")
                .bind(&key)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            caused.push((key.clone(), token));
            if i.is_multiple_of(5) {
                // Past its deadline: the acquire takes it over.
                tokio::time::sleep(Duration::from_millis(2)).await;
                let taken: Option<i64> = sqlx::query_scalar("SELECT lock_acquire($1, 'next', 1)")
                    .bind(&key)
                    .fetch_one(&mut conn)
                    .await
                    .unwrap();
                if let Some(new) = taken {
                    // The thief's lease dies too.
                    caused.push((key, new));
                }
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        caused
    })
}

#[tokio::test]
async fn migrate_beside_running_daemons_fails_no_pass_loses_nothing() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    // As if the database had another release's text of every function and
    // of the triggers: this migrate replaces them all.
    exec(&mut admin, "UPDATE lease_sweeper_sql SET sha256 = 'other'").await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    daemon
        .wait_for_event("sweeper_started", Duration::from_secs(20))
        .await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_expiries(db.url.clone(), stop.clone());
    // Some sweeps with the load before the upgrade.
    daemon
        .wait_for_events("lease_expired", 20, Duration::from_secs(20))
        .await;
    let (a, b) = tokio::join!(
        run_binary(&["migrate"], &db.url),
        run_binary(&["migrate"], &db.url)
    );
    assert_eq!(a.0, Some(0), "{}", a.1);
    assert_eq!(b.0, Some(0), "{}", b.1);
    let functions: Vec<String> = events(
        &format!("{}\n{}", a.1, b.1)
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>(),
        "migrated",
    )
    .into_iter()
    .map(|f| f["functionsApplied"].clone())
    .collect();
    assert!(
        functions.iter().any(|n| n != "0"),
        "one of the two replaced the functions: {functions:?}"
    );
    // And some sweeps after it.
    let seen = daemon.count_lines(|l| l.contains("message=lease_expired "));
    daemon
        .wait_for_events("lease_expired", seen + 20, Duration::from_secs(20))
        .await;
    stop.store(true, Ordering::SeqCst);
    let caused = load.await.unwrap();
    nothing_left_to_report(&mut admin, Duration::from_secs(15)).await;
    daemon
        .wait_for_events("lease_expired", caused.len(), Duration::from_secs(15))
        .await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));

    let failed: Vec<&String> = lines.iter().filter(|l| l.contains("level=error")).collect();
    assert!(failed.is_empty(), "no pass failed: {failed:#?}");
    let reported: Vec<(String, i64)> = events(&lines, "lease_expired")
        .into_iter()
        .map(|f| (f["lockKey"].clone(), f["token"].parse().unwrap()))
        .collect();
    let unique: HashSet<&(String, i64)> = reported.iter().collect();
    assert_eq!(unique.len(), reported.len(), "none twice");
    let caused: HashSet<&(String, i64)> = caused.iter().collect();
    assert_eq!(unique, caused, "each expiry the lock server caused, once");
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", reported.len() as u64)
        .await;
}

/// A database an earlier build migrated and swept upgrades in place: one
/// `migrate`, then every expiry it left (unswept leases, a recorded
/// takeover, abandoned hand-offs of both row shapes that build wrote) is
/// reported once, its history table is gone, and a second `migrate` has
/// nothing to do.
#[tokio::test]
async fn earlier_build_database_upgrades_in_place_losing_nothing() {
    let db = TestDb::empty().await;
    let mut restore = db.connect().await;
    sqlx::raw_sql(include_str!("earlier_build.sql"))
        .execute(&mut restore)
        .await
        .expect("the earlier build's dump restores");
    drop(restore);

    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<String> = out.lines().map(str::to_owned).collect();
    assert_eq!(
        events(&lines, "migrated")[0]["migrationsApplied"],
        "1",
        "{out}"
    );
    let mut admin = db.connect().await;
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM pg_class WHERE relname = '_sqlx_migrations'"
        )
        .await,
        0
    );

    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    daemon
        .wait_for_events("lease_expired", 9, Duration::from_secs(20))
        .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (_, lines) = daemon.stop().await;
    let mut reported = reported(&lines);
    reported.sort();
    let mut expected: Vec<(String, String, String)> = (1..=5)
        .map(|i| {
            (
                format!("earlier-expired-{i}"),
                (100 + i).to_string(),
                "sweep".to_owned(),
            )
        })
        .chain([
            (
                "earlier-handed-1".to_owned(),
                "400".to_owned(),
                "sweep".to_owned(),
            ),
            (
                "earlier-taken".to_owned(),
                "300".to_owned(),
                "takeover".to_owned(),
            ),
            (
                "earlier-walked-1".to_owned(),
                "500".to_owned(),
                "sweep".to_owned(),
            ),
            (
                "earlier-walked-2".to_owned(),
                "501".to_owned(),
                "sweep".to_owned(),
            ),
        ])
        .collect();
    expected.sort();
    assert_eq!(reported, expected, "each once");
    let walked = events(&lines, "lease_expired")
        .into_iter()
        .find(|f| f["lockKey"] == "earlier-walked-1")
        .unwrap();
    assert_eq!(
        walked["overdueMillis"], "2500",
        "the older row shape's lateness kept"
    );
    assert_eq!(
        count(&mut admin, "SELECT count(*) FROM lock_entry").await,
        3,
        "the live leases stay"
    );

    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<String> = out.lines().map(str::to_owned).collect();
    let again = &events(&lines, "migrated")[0];
    assert_eq!(
        (
            again["migrationsApplied"].as_str(),
            again["functionsApplied"].as_str(),
            again["triggersApplied"].as_str()
        ),
        ("0", "0", "false"),
        "{out}"
    );
}
