//! The systemd unit as systemd reads it, and the notify protocol as systemd
//! speaks it: a real `NOTIFY_SOCKET` datagram socket and the real binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{
    Daemon, NotifySocket, StatsdCapture, TempDir, TestDb, binary, events, wait_until,
};

/// The unit as shipped.
const UNIT: &str = include_str!("../../../systemd/lease-sweeper.service");
/// Where the shipped unit expects the binary.
const INSTALLED_BINARY: &str = "/usr/bin/lease-sweeper";
/// The highest `systemd-analyze security` exposure the unit may have.
const MAX_EXPOSURE: f64 = 1.5;

/// A copy of the unit whose ExecStart/ExecStartPre point at the binary cargo
/// built, because `verify` checks that the executable exists.
fn unit_copy(dir: &Path) -> PathBuf {
    assert!(
        UNIT.contains(INSTALLED_BINARY),
        "the unit runs {INSTALLED_BINARY}"
    );
    let path = dir.join("lease-sweeper.service");
    let unit = UNIT.replace(INSTALLED_BINARY, binary().to_str().expect("UTF-8 path"));
    std::fs::write(&path, unit).expect("writing the unit copy");
    path
}

/// `KEY=VALUE` of the unit's first non-comment line for `key`.
fn directive<'a>(key: &str) -> &'a str {
    UNIT.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("the unit sets {key}="))
}

fn seconds(value: &str) -> u64 {
    value
        .strip_suffix('s')
        .unwrap_or(value)
        .parse()
        .unwrap_or_else(|_| panic!("{value:?} is whole seconds"))
}

#[test]
fn unit_verifies_exposure_at_most_1_5() {
    let dir = TempDir::new("unit");
    let unit = unit_copy(&dir.0);

    // --man=no: the unit's Documentation= names the package's man pages,
    // which exist once the package is installed, not on a build host.
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg("--man=no")
        .arg(&unit)
        .output()
        .expect("running systemd-analyze verify (install systemd)");
    let said = String::from_utf8_lossy(&verify.stderr).into_owned()
        + &String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "verify failed: {said}");
    // Warnings about other units on the host are not ours; ours must be clean.
    assert!(!said.contains("lease-sweeper"), "verify warned: {said}");

    let security = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&unit)
        .output()
        .expect("running systemd-analyze security");
    let table = String::from_utf8_lossy(&security.stdout);
    assert!(
        security.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&security.stderr)
    );
    let score: f64 = table
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for lease-sweeper.service:"))
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no exposure score in:\n{table}"));
    println!("systemd-analyze security --offline=yes: exposure {score}");
    assert!(
        score <= MAX_EXPOSURE,
        "exposure {score} > {MAX_EXPOSURE}:\n{table}"
    );
}

#[test]
fn timeouts_match_daemon_bounds() {
    use lease_sweeper::testing::sweep::{DRAIN_GRACE, SWEEP_DELAY};

    assert_eq!(directive("Type"), "notify");
    assert_eq!(directive("Restart"), "on-failure");
    assert_eq!(
        directive("RestartPreventExitStatus"),
        "2",
        "exit 2 = configuration error"
    );
    assert_eq!(directive("EnvironmentFile"), "-/etc/lease-sweeper/env");
    // After SIGTERM: DRAIN_GRACE for the batch in flight, then up to 1 s for
    // the StatsD sender to deliver what is left. Stopping must be allowed to
    // take that, with room, before systemd resorts to SIGKILL.
    let stop = Duration::from_secs(seconds(directive("TimeoutStopSec")));
    let drain_bound = DRAIN_GRACE + Duration::from_secs(4);
    assert!(
        stop > drain_bound,
        "TimeoutStopSec {stop:?} <= drain bound {drain_bound:?}"
    );
    assert!(
        stop <= Duration::from_secs(30),
        "a stop should not hang a host's shutdown"
    );
    // The watchdog is fed once per sweep; it must outlast a long backlog drain.
    let watchdog = Duration::from_secs(seconds(directive("WatchdogSec")));
    assert!(
        watchdog >= 60 * SWEEP_DELAY,
        "WatchdogSec {watchdog:?} too tight"
    );

    // The Kubernetes sidecar gets at least the same stop budget.
    let manifest = include_str!("../../../deploy/kubernetes/lock-server-with-sweeper.yaml");
    let grace: u64 = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("terminationGracePeriodSeconds:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("the manifest sets terminationGracePeriodSeconds");
    assert!(
        Duration::from_secs(grace) >= stop,
        "terminationGracePeriodSeconds {grace} < the sweeper's stop budget {stop:?}"
    );
}

#[tokio::test]
async fn speaks_notify_protocol() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut notify = NotifySocket::bind();
    let mut env = notify.daemon_env(&db.url, &port);
    env.push(("WATCHDOG_USEC", "10000000"));
    let mut daemon = Daemon::spawn(&env);

    wait_until(Duration::from_secs(10), "READY=1", || async {
        !notify.arrivals("READY=1").is_empty()
    })
    .await;
    wait_until(Duration::from_secs(10), "two more WATCHDOG=1", || async {
        notify.arrivals("WATCHDOG=1").len() >= 3
    })
    .await;
    let signalled = Instant::now();
    daemon.signal(libc::SIGTERM);
    let (code, took) = daemon.wait_exit(Duration::from_secs(10)).await;
    // The daemon has exited, so every datagram it sent is in the socket.
    notify.finish().await;

    let all = daemon.lines().join("\n");
    assert_eq!(code, Some(0), "{all}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let messages = notify.messages();
    let ready = notify.arrivals("READY=1");
    let watchdog = notify.arrivals("WATCHDOG=1");
    let stopping = notify.arrivals("STOPPING=1");
    assert_eq!(ready.len(), 1, "READY=1 exactly once: {messages:?}");
    assert!(watchdog.len() >= 3, "{messages:?}");
    assert!(
        watchdog.iter().all(|t| *t >= ready[0]),
        "pings start at READY: {messages:?}"
    );
    assert_eq!(stopping.len(), 1, "STOPPING=1 exactly once: {messages:?}");
    assert!(
        stopping[0] >= signalled,
        "STOPPING=1 follows the signal: {messages:?}"
    );
    assert!(
        messages
            .last()
            .is_some_and(|(_, m)| m.contains("STOPPING=1")),
        "nothing after STOPPING=1: {messages:?}"
    );
    let enabled = events(&daemon.lines(), "systemd_notify_enabled");
    assert_eq!(enabled.len(), 1, "{all}");
    assert_eq!(enabled[0]["watchdogMillis"], "10000");
    assert!(
        events(&daemon.lines(), "systemd_notify_failed").is_empty(),
        "{all}"
    );
}

#[tokio::test]
async fn missing_notify_socket_reported_once() {
    let db = TestDb::new().await;
    let dir = TempDir::new("nosock");
    let socket = dir.0.join("absent.sock");
    let mut daemon = Daemon::spawn(&[
        ("LOCKDB_URL", &db.url),
        ("STATSD_PORT", "9"),
        ("NOTIFY_SOCKET", socket.to_str().unwrap()),
    ]);
    daemon
        .wait_for_event("systemd_notify_failed", Duration::from_secs(10))
        .await;
    let mut conn = db.connect().await;
    crate::support::insert_expired(&mut conn, "still-", 2, 10).await;
    wait_until(Duration::from_secs(10), "the sweep", || async {
        events(&daemon.lines(), "lease_expired").len() == 2
    })
    .await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0), "{}", lines.join("\n"));
    let failed = events(&lines, "systemd_notify_failed");
    assert_eq!(failed.len(), 1, "reported once: {}", lines.join("\n"));
    assert_eq!(failed[0]["level"], "warn");
}

#[tokio::test]
async fn watchdog_stops_while_job_loop_wedged() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let notify = NotifySocket::bind();
    let mut env = notify.daemon_env(&db.url, &port);
    env.push(("WATCHDOG_USEC", "10000000"));
    let mut daemon = Daemon::spawn(&env);
    wait_until(Duration::from_secs(10), "two WATCHDOG=1", || async {
        notify.arrivals("WATCHDOG=1").len() >= 2
    })
    .await;

    let block = crate::support::JobQueueBlock::hold(&db).await;
    // A pass of the job loop may have been in flight: let it end, then count.
    crate::support::wait_sweeps(&statsd, 2).await;
    let wedged_at = notify.arrivals("WATCHDOG=1").len();
    crate::support::wait_sweeps(&statsd, 4).await;
    assert_eq!(
        notify.arrivals("WATCHDOG=1").len(),
        wedged_at,
        "WATCHDOG=1 was sent while the job loop made no progress"
    );

    block.release().await;
    wait_until(Duration::from_secs(10), "WATCHDOG=1 again", || async {
        notify.arrivals("WATCHDOG=1").len() > wedged_at
    })
    .await;
    assert_eq!(daemon.stop().await.0, Some(0));
}

/// Lines a second the unit's journald limit must allow: over twenty times
/// the 33,000-47,000 a second journald stored from a 100,000-lease drain.
const MIN_JOURNAL_LINES_PER_SECOND: u64 = 1_000_000;
/// The largest factor journald's free-space scaling multiplies the burst by
/// before dividing by 4 (log2 of a 64-bit byte count, minus 16), in 32-bit
/// arithmetic.
const JOURNALD_BURST_FACTOR_MAX: u64 = 63 - 16;

#[test]
fn journald_rate_limit_out_of_drains_reach() {
    // 0 (or nothing) means "not set" for a unit: journald's default, 10,000
    // lines in 30 s, applies and drops most of a large drain's lines.
    let interval = seconds(directive("LogRateLimitIntervalSec"));
    let burst: u64 = directive("LogRateLimitBurst")
        .parse()
        .expect("LogRateLimitBurst is a number");
    assert!(
        interval > 0 && burst > 0,
        "0 does not switch journald's limit off: it restores the default"
    );
    assert!(
        burst / interval >= MIN_JOURNAL_LINES_PER_SECOND,
        "{burst} lines in {interval} s: a drain could reach it"
    );
    assert!(
        burst * JOURNALD_BURST_FACTOR_MAX <= u64::from(u32::MAX),
        "LogRateLimitBurst={burst} can wrap around in journald's free-space scaling"
    );
}
