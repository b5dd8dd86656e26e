//! Liveness for containers: the heartbeat file follows every service loop's
//! progress, and `lease-sweeper alive` turns it into an exec probe's verdict.
//! A wedged job loop makes the probe fail; a database outage would not.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use crate::support::{
    Daemon, JobQueueBlock, StatsdCapture, TempDir, TestDb, binary, daemon_env, events,
    insert_expired, wait_sweeps, wait_until,
};

/// Strict enough to notice a wedge quickly, loose enough for two loops that
/// each finish a pass about once a second.
const MAX_AGE_SECS: &str = "3";

fn alive(heartbeat: &Path) -> Output {
    std::process::Command::new(binary())
        .args(["alive", "--max-age", MAX_AGE_SECS])
        .env("LEASE_SWEEPER_HEARTBEAT_FILE", heartbeat)
        .output()
        .expect("running lease-sweeper alive")
}

#[tokio::test]
async fn probe_fails_while_job_loop_wedged() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let dir = TempDir::new("alive");
    let heartbeat = dir.0.join("heartbeat");
    let port = statsd.port.to_string();
    let mut env = daemon_env(&db.url, &port);
    let file = heartbeat.to_str().unwrap().to_owned();
    env.push(("LEASE_SWEEPER_HEARTBEAT_FILE", &file));

    let before = alive(&heartbeat);
    assert_eq!(
        before.status.code(),
        Some(1),
        "no heartbeat before the daemon ran"
    );
    let mut daemon = Daemon::spawn(&env);
    wait_until(Duration::from_secs(15), "alive exits 0", || async {
        alive(&heartbeat).status.success()
    })
    .await;

    let block = JobQueueBlock::hold(&db).await;
    wait_until(Duration::from_secs(15), "alive exits 1", || async {
        alive(&heartbeat).status.code() == Some(1)
    })
    .await;
    let stale = alive(&heartbeat);
    let said = String::from_utf8_lossy(&stale.stdout);
    assert!(
        said.starts_with("not alive: no pass of every service loop for "),
        "{said}"
    );
    // The lock loop still sweeps all along: only the wedge fails the probe.
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "during-wedge-", 5, 10).await;
    wait_sweeps(&statsd, 2).await;
    wait_until(Duration::from_secs(10), "5 lease_expired lines", || async {
        events(&daemon.lines(), "lease_expired").len() == 5
    })
    .await;
    assert_eq!(alive(&heartbeat).status.code(), Some(1));

    block.release().await;
    wait_until(Duration::from_secs(15), "alive exits 0 again", || async {
        alive(&heartbeat).status.success()
    })
    .await;
    assert_eq!(daemon.stop().await.0, Some(0));
}

#[test]
fn probe_without_heartbeat_file_exits_2() {
    let out = std::process::Command::new(binary())
        .arg("alive")
        .env_remove("LEASE_SWEEPER_HEARTBEAT_FILE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("LEASE_SWEEPER_HEARTBEAT_FILE is not set"),
        "{err}"
    );
}
