//! A daemon holds two connections, never more: at the documented count (a
//! login role's `CONNECTION LIMIT 2`, a session pool of two) a backlog is
//! reported once and no service fails a pass for want of a connection.

use std::time::{Duration, Instant};

use crate::support::{
    Daemon, LoginRole, StatsdCapture, TestDb, count, daemon_env, events, insert_expired,
};
use crate::topology::support::{Bouncer, assert_each_once, lease_keys, server_of};

/// The backlog: many full batches.
const BACKLOG: i64 = 20_000;

/// Runs a daemon on `url` until it reported the backlog; its lines and how
/// long the last one took from its start.
async fn drain(url: &str) -> (Vec<String>, Duration) {
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let started = Instant::now();
    let mut daemon = Daemon::spawn(&daemon_env(url, &port));
    daemon
        .wait_for_events("lease_expired", BACKLOG as usize, Duration::from_secs(60))
        .await;
    let took = started.elapsed();
    // Two more passes of every service, so a failure for want of a
    // connection would show.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    (lines, took)
}

fn assert_reported_once_without_failures(lines: &[String], prefix: &str) {
    for bad in ["sweep_failed", "job_reap_failed", "horizon_check_failed"] {
        assert_eq!(events(lines, bad), Vec::new(), "no {bad}");
    }
    assert_each_once(&lease_keys(lines), BACKLOG as usize, prefix);
}

#[tokio::test]
async fn at_a_role_connection_limit_of_two_a_backlog_is_reported_once() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let role = LoginRole::create(
        &db,
        &mut admin,
        "two",
        "IN ROLE lease_sweeper CONNECTION LIMIT 2",
    )
    .await;
    insert_expired(&mut admin, "limited-", BACKLOG, 1_000).await;

    let (lines, took) = drain(&role.url).await;

    assert_reported_once_without_failures(&lines, "limited-");
    assert_eq!(
        count(&mut admin, "SELECT count(*) FROM lock_entry").await,
        0
    );
    eprintln!(
        "FIGURES connection_limit_two: leases={BACKLOG} last_line_after_ms={}",
        took.as_millis()
    );
    role.drop(&mut admin).await;
}

#[tokio::test]
async fn through_a_session_pool_of_two_a_backlog_is_reported_once() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let (server, server_port, user) = server_of(&db.url);
    let bouncer = Bouncer::start(&server, server_port, &db.name, &user, "session", 2).await;
    let url = format!("postgres://{user}@127.0.0.1:{}/{}", bouncer.port, db.name);
    insert_expired(&mut admin, "pooled-", BACKLOG, 1_000).await;

    let (lines, took) = drain(&url).await;

    assert_reported_once_without_failures(&lines, "pooled-");
    assert_eq!(
        count(&mut admin, "SELECT count(*) FROM lock_entry").await,
        0
    );
    eprintln!(
        "FIGURES session_pool_of_two: leases={BACKLOG} last_line_after_ms={}",
        took.as_millis()
    );
}
