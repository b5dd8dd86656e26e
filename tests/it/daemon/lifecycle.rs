//! The real binary: signals, exit codes, errors and recovery.

use std::time::Duration;

use crate::support::{
    Daemon, NotifySocket, StatsdCapture, TestDb, count, daemon_env, events, insert_expired,
    wait_until,
};

async fn exits_zero_promptly_on(signal: i32) {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    daemon
        .wait_for_event("sweeper_started", Duration::from_secs(10))
        .await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "bye-", 3, 10).await;
    wait_until(Duration::from_secs(10), "the sweep", || async {
        events(&daemon.lines(), "lease_expired").len() == 3
    })
    .await;

    daemon.signal(signal);
    let (code, took) = daemon.wait_exit(Duration::from_secs(10)).await;

    assert_eq!(code, Some(0), "{}", daemon.lines().join("\n"));
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let lines = daemon.lines();
    assert_eq!(events(&lines, "shutdown_requested").len(), 1);
    assert_eq!(events(&lines, "sweeper_stopped").len(), 1);
    assert_eq!(events(&lines, "lease_expired").len(), 3);
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", 3)
        .await;
    assert_eq!(statsd.counter("lock.lease.expired", "#backend:pg"), 3);
}

#[tokio::test]
async fn sigterm_exits_0_promptly() {
    exits_zero_promptly_on(libc::SIGTERM).await;
}

#[tokio::test]
async fn sigint_exits_0_promptly() {
    exits_zero_promptly_on(libc::SIGINT).await;
}

#[tokio::test]
async fn second_signal_exits_at_once() {
    // A "database" that accepts TCP and never answers keeps a sweep in flight.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "postgres://u:pw@127.0.0.1:{}/db",
        silent.local_addr().unwrap().port()
    );
    silent.set_nonblocking(true).unwrap();
    let mut daemon = Daemon::spawn(&[("LOCKDB_URL", &url), ("STATSD_PORT", "9")]);
    daemon
        .wait_for_event("sweeper_started", Duration::from_secs(10))
        .await;
    // A pass is in flight once the daemon's connection is in: accepted and
    // kept open, it waits for a startup reply that never comes.
    let mut accepted = Vec::new();
    wait_until(Duration::from_secs(10), "the daemon to connect", || {
        if let Ok((conn, _)) = silent.accept() {
            accepted.push(conn);
        }
        let connected = !accepted.is_empty();
        async move { connected }
    })
    .await;

    daemon.signal(libc::SIGTERM);
    daemon
        .wait_for_event("shutdown_requested", Duration::from_secs(5))
        .await;
    daemon.signal(libc::SIGTERM);
    let (code, took) = daemon.wait_exit(Duration::from_secs(5)).await;

    assert_eq!(
        code,
        Some(128 + libc::SIGTERM),
        "{}",
        daemon.lines().join("\n")
    );
    assert!(took < Duration::from_millis(1_500), "took {took:?}");
    assert_eq!(events(&daemon.lines(), "shutdown_forced").len(), 1);
}

#[tokio::test]
async fn store_error_logged_once_sweeps_go_on() {
    // No schema yet: every sweep fails until the migration lands.
    let db = TestDb::empty().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    // A failing pass sends no gauge; the watchdog ping counts it.
    let notify = NotifySocket::bind();
    let mut daemon = Daemon::spawn(&notify.daemon_env(&db.url, &port));
    daemon
        .wait_for_event("sweep_failed", Duration::from_secs(30))
        .await;
    // At least two more failing sweeps after the one logged.
    notify.wait_watchdogs(3).await;

    let mut conn = db.connect().await;
    lease_sweeper::testing::migrate::migrate(&mut conn)
        .await
        .unwrap();
    insert_expired(&mut conn, "after-", 4, 10).await;
    wait_until(Duration::from_secs(30), "the recovered sweep", || async {
        events(&daemon.lines(), "lease_expired").len() == 4
    })
    .await;
    let (code, lines) = daemon.stop().await;
    let failed = events(&lines, "sweep_failed");
    assert_eq!(
        failed.len(),
        1,
        "a persistent error is logged once: {lines:#?}"
    );
    assert_eq!(failed[0]["level"], "error");
    assert!(
        // The first statement of a sweep is the probe (lock_sweep_probe).
        failed[0]["error"].contains("lock_sweep_probe"),
        "names the cause: {:?}",
        failed[0]
    );
    assert!(
        failed[0]["error"].ends_with(
            "does not exist (SQLSTATE 42883); is the schema migrated? run `lease-sweeper migrate`"
        ),
        "says what to do, with no server hint about type casts before it: {:?}",
        failed[0]
    );
    let recovered = events(&lines, "sweep_recovered");
    assert_eq!(recovered.len(), 1);
    let failed_sweeps: u64 = recovered[0]["failedSweeps"].parse().unwrap();
    assert!(
        failed_sweeps >= 3,
        "logged once over {failed_sweeps} failed sweeps: {lines:#?}"
    );
    assert_eq!(code, Some(0));
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
}

#[tokio::test]
async fn unreachable_database_retried_without_password() {
    let socket_dir = std::env::temp_dir().join(format!("ls-nodb-{}", std::process::id()));
    std::fs::create_dir_all(&socket_dir).unwrap();
    let url = format!(
        "postgres://sweeper:Sup3r-S3cret@localhost/locks?host={}",
        socket_dir.display()
    );
    let notify = NotifySocket::bind();
    let socket = notify.path.to_str().unwrap().to_owned();
    let mut daemon = Daemon::spawn(&[
        ("LOCKDB_URL", &url),
        ("STATSD_HOST", "statsd.invalid"),
        ("NOTIFY_SOCKET", &socket),
    ]);
    daemon
        .wait_for_event("sweep_failed", Duration::from_secs(10))
        .await;
    // At least one more failing sweep after the one logged.
    notify.wait_watchdogs(2).await;
    assert!(daemon.child.try_wait().unwrap().is_none(), "still running");
    let (code, lines) = daemon.stop().await;
    let all = lines.join("\n");
    assert!(!all.contains("Sup3r-S3cret"), "{all}");
    let failed = events(&lines, "sweep_failed");
    assert_eq!(failed.len(), 1, "{all}");
    assert!(failed[0]["error"].contains("cannot connect"), "{all}");
    assert!(
        failed[0]["error"].contains("No such file or directory"),
        "names the real cause: {all}"
    );
    assert_eq!(code, Some(0));
    let _ = std::fs::remove_dir_all(socket_dir);
}

#[tokio::test]
async fn bad_configuration_exits_2() {
    for (args, env, needle) in [
        (
            vec!["migrate"],
            vec![("LOCKDB_URL", "postgres://u:hunter2@host:notaport/db")],
            "LOCKDB_URL is not a valid PostgreSQL URL",
        ),
        (
            vec!["run"],
            vec![("DATABASE_URL", "postgres://u:hunter2@host:notaport/db")],
            "DATABASE_URL is not a valid PostgreSQL URL",
        ),
        (
            vec!["run"],
            vec![
                ("LOCKDB_URL", "postgres://u@h/db"),
                ("STATSD_PORT", "eighty"),
            ],
            "STATSD_PORT must be a port number",
        ),
        (
            vec!["run"],
            vec![("RUST_LOG", "lease_sweeper=loud")],
            "RUST_LOG is not a valid filter",
        ),
        (vec!["frobnicate"], vec![], "unrecognized subcommand"),
        (
            vec!["run", "--interval", "5"],
            vec![],
            "unexpected argument",
        ),
    ] {
        let mut d = Daemon::spawn_args(&args, &env);
        let (code, _) = d.wait_exit(Duration::from_secs(10)).await;
        let all = d.lines().join("\n");
        assert_eq!(code, Some(2), "{args:?}: {all}");
        assert!(all.contains(needle), "{args:?}: {all}");
        assert!(!all.contains("hunter2"), "{all}");
    }
}

#[tokio::test]
async fn migrate_idempotent_exits_1_unreachable() {
    let db = TestDb::empty().await;
    for _ in 0..2 {
        let mut d = Daemon::spawn_args(&["migrate"], &[("LOCKDB_URL", &db.url)]);
        let (code, _) = d.wait_exit(Duration::from_secs(30)).await;
        assert_eq!(code, Some(0), "{}", d.lines().join("\n"));
    }
    let mut d = Daemon::spawn_args(
        &["migrate"],
        &[("LOCKDB_URL", "postgres://u:pw@127.0.0.1:1/db")],
    );
    let (code, _) = d.wait_exit(Duration::from_secs(30)).await;
    let all = d.lines().join("\n");
    assert_eq!(code, Some(1), "{all}");
    assert!(
        all.contains("Connection refused") || all.contains("connection refused"),
        "{all}"
    );
}

#[tokio::test]
async fn debug_pass_logs_counts() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let port = statsd.port.to_string();
    let mut env = daemon_env(&db.url, &port);
    env.push(("RUST_LOG", "info,lease_sweeper=debug"));
    insert_expired(&mut conn, "counted-", 2, 100).await;
    let mut daemon = Daemon::spawn(&env);
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", 2)
        .await;
    daemon
        .wait_for_events("job_reap_done", 1, Duration::from_secs(10))
        .await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));

    let sweeps = events(&lines, "sweep_done");
    let busy = sweeps
        .iter()
        .find(|s| s["swept"] == "2")
        .unwrap_or_else(|| panic!("no sweep_done with swept=2 in {sweeps:?}"));
    for (field, value) in [
        ("takenOver", "0"),
        ("batches", "1"),
        ("held", "0"),
        ("interrupted", "false"),
    ] {
        assert_eq!(busy[field], value, "{field} in {busy:?}");
    }
    assert!(!busy.contains_key("outcome"), "{busy:?}");
    let job = &events(&lines, "job_reap_done")[0];
    assert_eq!(
        (
            job["reset"].as_str(),
            job["deadLettered"].as_str(),
            job["stale"].as_str()
        ),
        ("0", "0", "0")
    );
    assert_eq!(job["refused"], "queue.job_substrate.enabled=false");
}
