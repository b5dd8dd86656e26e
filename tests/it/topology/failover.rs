//! A primary with a streaming hot standby: a multi-host URL follows the
//! promoted standby without a restart and loses no expiry, and a standby
//! alone deletes nothing and says why once.
//!
//! It does not cover TLS or how the target is read (`topology::tls`,
//! `topology::libpq`). The test prints its `FIGURES` line (`--nocapture`) for
//! docs/topologies.md.

use std::time::{Duration, Instant};

use lease_sweeper::testing::throwaway::{StopMode, ThrowawayPg};
use sqlx::{Connection as _, PgConnection};

use crate::support::free_port;
use crate::support::{
    Daemon, StatsdCapture, acquire, blocking, count, daemon_env, events, insert_expired, wait_until,
};
use crate::topology::support::{assert_each_once, lease_keys};

/// How many `lease_expired` lines `daemon` wrote so far for keys `{prefix}…`.
fn reported_with_prefix(daemon: &Daemon, prefix: &str) -> usize {
    lease_keys(&daemon.lines())
        .iter()
        .filter(|k| k.starts_with(prefix))
        .count()
}

async fn wait_count(conn: &mut PgConnection, sql: &'static str, want: i64, what: &str) {
    crate::support::poll(Duration::from_secs(20), what, async || {
        let n = count(&mut *conn, sql).await;
        if n == want {
            Ok(())
        } else {
            Err(format!("{n}, want {want}"))
        }
    })
    .await
}

#[tokio::test]
async fn follows_promoted_standby_standby_deletes_nothing() {
    let (p1, p2) = (free_port(), free_port());
    let primary = blocking(move || {
        ThrowawayPg::start_tcp(
            p1,
            &[
                ("synchronous_commit", "on"),
                ("log_connections", "on"),
                // The standby inherits it: a standby whose primary is gone
                // retries WAL every 5 s by default, and notices a promotion
                // only then.
                ("wal_retrieve_retry_interval", "200ms"),
            ],
        )
    })
    .await
    .expect("primary");
    let mut conn = PgConnection::connect(&primary.url("postgres"))
        .await
        .unwrap();
    lease_sweeper::testing::migrate::migrate(&mut conn)
        .await
        .unwrap();
    let (mut primary, standby) = blocking(move || {
        let standby = ThrowawayPg::standby_of(&primary, p2);
        (primary, standby)
    })
    .await;
    let standby = standby.expect("standby");
    let mut on_standby = PgConnection::connect(&standby.url("postgres"))
        .await
        .unwrap();
    insert_expired(&mut conn, "early-", 10, 10).await;
    wait_count(
        &mut on_standby,
        "SELECT count(*) FROM lock_entry WHERE lock_key LIKE 'early-%'",
        10,
        "replayed on the standby",
    )
    .await;

    // The standby alone: by default (read-write) the walk passes it over;
    // with target_session_attrs=any the DELETE fails with 25006. Either way
    // nothing is deleted and the hot-standby words are logged once.
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let standby_url = format!("postgres://postgres@127.0.0.1:{p2}/postgres");
    let standby_any = format!("{standby_url}?target_session_attrs=any");
    let mut alone = Daemon::spawn(&daemon_env(&standby_url, &port));
    let mut alone_any = Daemon::spawn(&daemon_env(&standby_any, &port));
    for d in [&alone, &alone_any] {
        d.wait_for_event("sweep_failed", Duration::from_secs(10))
            .await;
    }
    // Several sweeps each: every failed sweep reconnects (the standby logs
    // each connection).
    wait_until(
        Duration::from_secs(20),
        "six sweeps' connections",
        || async {
            standby
                .log_text()
                .matches("application_name=lease-sweeper")
                .count()
                >= 12
        },
    )
    .await;
    for d in [&mut alone, &mut alone_any] {
        assert_eq!(d.stop().await.0, Some(0));
    }
    for (d, extra) in [(&alone, ""), (&alone_any, "SQLSTATE 25006")] {
        let lines = d.lines();
        let failed = events(&lines, "sweep_failed");
        assert_eq!(failed.len(), 1, "once: {failed:#?}");
        assert!(
            failed[0]["error"].contains(lease_sweeper::testing::conn::HOT_STANDBY)
                && failed[0]["error"].contains(extra),
            "{:?}",
            failed[0]["error"]
        );
        assert!(lease_keys(&lines).is_empty());
    }
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_entry").await,
        10,
        "nothing deleted"
    );

    // Both hosts: the primary first.
    let url =
        format!("postgres://postgres@127.0.0.1:{p1},127.0.0.1:{p2}/postgres?connect_timeout=2");
    let mut daemon = Daemon::spawn(&daemon_env(&url, &port));
    let pid = daemon.pid();
    wait_until(Duration::from_secs(10), "the early leases", || async {
        lease_keys(&daemon.lines()).len() == 10
    })
    .await;
    let meanwhile = acquire(&mut conn, "meanwhile-", 20, 1_500).await;
    wait_count(
        &mut on_standby,
        "SELECT count(*) FROM lock_entry WHERE lock_key LIKE 'meanwhile-%'",
        20,
        "replayed on the standby",
    )
    .await;
    drop(conn);
    let stopped = Instant::now();
    // Kept until the end: dropping it would remove its directory.
    let _stopped_primary = blocking(move || {
        primary.stop(StopMode::Fast);
        primary
    })
    .await;
    let promoted: bool = sqlx::query_scalar("SELECT pg_promote()")
        .fetch_one(&mut on_standby)
        .await
        .unwrap();
    assert!(promoted);
    let promote_took = stopped.elapsed();
    wait_until(
        Duration::from_secs(30),
        "the first sweep on the new primary",
        || async { !events(&daemon.lines(), "sweep_recovered").is_empty() },
    )
    .await;
    let gap = stopped.elapsed();
    wait_until(
        Duration::from_secs(20),
        "the leases that expired meanwhile",
        || async { reported_with_prefix(&daemon, "meanwhile-") >= meanwhile.len() },
    )
    .await;
    insert_expired(&mut on_standby, "after-", 5, 10).await;
    wait_until(
        Duration::from_secs(10),
        "leases on the new primary",
        || async { reported_with_prefix(&daemon, "after-") == 5 },
    )
    .await;
    assert!(daemon.child.try_wait().unwrap().is_none(), "no restart");
    assert_eq!(daemon.pid(), pid);
    assert_eq!(daemon.stop().await.0, Some(0));

    let lines = daemon.lines();
    let keys = lease_keys(&lines);
    assert_each_once(&keys, 10, "early-");
    assert_each_once(&keys, 20, "meanwhile-");
    assert_each_once(&keys, 5, "after-");
    let left = count(&mut on_standby, "SELECT count(*) FROM lock_entry").await;
    assert_eq!(left, 0, "no expiry lost");
    // Once per connection the daemon holds (lock sweep, job reaper).
    let changed = events(&lines, "database_host_changed");
    assert_eq!(changed.len(), 2, "{changed:#?}");
    assert!(
        changed
            .iter()
            .all(|c| c["to"] == format!("127.0.0.1:{p2}") && c["from"] == format!("127.0.0.1:{p1}"))
    );
    let failed: Vec<String> = events(&lines, "sweep_failed")
        .into_iter()
        .map(|f| f["error"].clone())
        .collect();
    eprintln!(
        "FIGURES failover: leases_expired_meanwhile={} reported={} lost={left} restarts=0 \
         failover_gap={:.2}s (stop to first successful sweep on the promoted standby; \
         pg_promote took {:.2}s of it) sweep_failed_lines={}",
        meanwhile.len(),
        keys.iter().filter(|k| k.starts_with("meanwhile-")).count(),
        gap.as_secs_f64(),
        promote_took.as_secs_f64(),
        failed.len()
    );
    for f in failed {
        eprintln!("  sweep_failed: {f}");
    }
    for f in events(&lines, "database_host_changed") {
        eprintln!("  database_host_changed: {} -> {}", f["from"], f["to"]);
    }
}
