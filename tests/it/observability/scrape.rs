//! The Prometheus scrape endpoint, through the real binary: the same numbers
//! as the lines and StatsD, on one daemon and across replicas; only
//! `GET /metrics` served; output `promtool` accepts; a bad address or a port
//! in use refused at start; nothing listening when it is not asked for.

use std::collections::HashSet;
use std::time::Duration;

use crate::observability::support::{ADDR_VAR, daemon_with_endpoint, get, request, scrape, value};
use crate::support::{
    Daemon, StatsdCapture, TestDb, count, daemon_env, events, insert_expired, insert_stale_jobs,
    open_gates, wait_until,
};

const EXPIRED: &str = "lock_lease_expired_total{backend=\"pg\"}";
const RESET: &str = "queue_lease_reaped_total{backend=\"pg\",action=\"reset_to_retry_waiting\"}";
const DEAD: &str = "queue_lease_reaped_total{backend=\"pg\",action=\"moved_to_dead_letter\"}";

#[tokio::test]
async fn counts_match_lines_and_statsd() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let port = statsd.port.to_string();
    let (mut daemon, addr) = daemon_with_endpoint(&daemon_env(&db.url, &port)).await;

    // Before anything expires, the counters are there at zero and the
    // daemon's own series are up.
    wait_until(Duration::from_secs(10), "the first passes", || async {
        let text = scrape(addr).await;
        text.contains("lease_sweeper_last_success_timestamp_seconds{service=\"job_reaper\"}")
            && text
                .contains("lease_sweeper_last_success_timestamp_seconds{service=\"lock_sweeper\"}")
    })
    .await;
    let first = scrape(addr).await;
    for series in [EXPIRED, RESET, DEAD] {
        assert_eq!(value(&first, series), Some(0.0), "{series} in:\n{first}");
    }

    insert_expired(&mut conn, "scraped-", 25, 500).await;
    open_gates(&mut conn).await;
    insert_stale_jobs(&mut conn, "mail", 7, 0, 5, 1_000).await;
    insert_stale_jobs(&mut conn, "mail", 3, 4, 5, 1_000).await;
    wait_until(
        Duration::from_secs(20),
        "every lease and job reaped",
        || async {
            let text = scrape(addr).await;
            value(&text, EXPIRED) == Some(25.0)
                && value(&text, RESET) == Some(7.0)
                && value(&text, DEAD) == Some(3.0)
        },
    )
    .await;

    let text = scrape(addr).await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    assert_eq!(events(&lines, "lease_expired").len(), 25);
    let jobs = events(&lines, "job_lease_expired");
    let by_action = |a: &str| jobs.iter().filter(|j| j["action"] == a).count();
    assert_eq!(
        (
            by_action("reset_to_retry_waiting"),
            by_action("moved_to_dead_letter")
        ),
        (7, 3)
    );
    assert_eq!(statsd.counter("lock.lease.expired", "#backend:pg"), 25);
    assert_eq!(
        statsd.counter(
            "queue.lease.reaped",
            "#backend:pg,action:reset_to_retry_waiting"
        ),
        7
    );
    assert_eq!(
        statsd.counter(
            "queue.lease.reaped",
            "#backend:pg,action:moved_to_dead_letter"
        ),
        3
    );
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
    assert_eq!(
        value(&text, "queue_lease_stale_current{backend=\"pg\"}"),
        Some(0.0)
    );
    assert_eq!(
        value(
            &text,
            concat!(
                "lease_sweeper_build_info{version=\"",
                env!("CARGO_PKG_VERSION"),
                "\"}"
            )
        ),
        Some(1.0)
    );
    for service in ["lock_sweeper", "job_reaper"] {
        let failures = format!("lease_sweeper_pass_failures_total{{service=\"{service}\"}}");
        assert_eq!(value(&text, &failures), Some(0.0), "{text}");
        let passes = format!("lease_sweeper_pass_duration_seconds_count{{service=\"{service}\"}}");
        assert!(value(&text, &passes).unwrap_or(0.0) >= 1.0, "{text}");
    }
}

#[tokio::test]
async fn replicas_sum_to_expiries() {
    const N: i64 = 3_000;
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let port = statsd.port.to_string();
    let mut fleet = Vec::new();
    for _ in 0..3 {
        fleet.push(daemon_with_endpoint(&daemon_env(&db.url, &port)).await);
    }
    insert_expired(&mut conn, "fleet-", N, 100).await;
    wait_until(
        Duration::from_secs(30),
        "every replica's scrape summing to N",
        || async {
            let mut sum = 0.0;
            for (_, addr) in &fleet {
                sum += value(&scrape(*addr).await, EXPIRED).unwrap_or(0.0);
            }
            sum == N as f64
        },
    )
    .await;

    let mut keys = HashSet::new();
    let mut total = 0;
    for (daemon, addr) in &mut fleet {
        let scraped = value(&scrape(*addr).await, EXPIRED).unwrap();
        let (code, lines) = daemon.stop().await;
        assert_eq!(code, Some(0));
        let own = events(&lines, "lease_expired");
        assert_eq!(
            scraped,
            own.len() as f64,
            "a replica's scrape is its own lines"
        );
        total += own.len();
        keys.extend(own.iter().map(|l| l["lockKey"].clone()));
    }
    assert_eq!(
        (total, keys.len()),
        (N as usize, N as usize),
        "each expiry once"
    );
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
}

#[tokio::test]
async fn serves_only_get_and_head_of_metrics() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let (mut daemon, addr) = daemon_with_endpoint(&daemon_env(&db.url, &port)).await;

    assert_eq!(get(addr, "/metrics?debug=1").await.0, 200);
    for path in [
        "/",
        "/metricsx",
        "/metrics/",
        "/metrics/../../etc/passwd",
        "/../../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/prometheus",
    ] {
        let (status, body) = get(addr, path).await;
        assert_eq!(status, 404, "{path}");
        assert!(!body.contains("root:"), "{path} served a file");
    }
    let (status, _) = request(
        addr,
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nabcd",
    )
    .await;
    assert_eq!(status, 405);
    let (status, body) = request(addr, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!((status, body.as_str()), (200, ""));
    // A head over the bound is refused, not buffered.
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    assert_eq!(request(addr, huge.as_bytes()).await.0, 431);
    let (code, _) = daemon.stop().await;
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn promtool_accepts_exposition() {
    let promtool = crate::support::tool("promtool", "prometheus");
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let port = statsd.port.to_string();
    let (mut daemon, addr) = daemon_with_endpoint(&daemon_env(&db.url, &port)).await;
    insert_expired(&mut conn, "linted-", 2, 100).await;
    wait_until(Duration::from_secs(10), "two expiries scraped", || async {
        value(&scrape(addr).await, EXPIRED) == Some(2.0)
    })
    .await;
    let text = scrape(addr).await;
    daemon.stop().await;

    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running promtool");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool: {said}\n{text}"
    );
}

#[tokio::test]
async fn malformed_address_exits_2() {
    for bad in ["9464", "localhost:9464", "127.0.0.1:99999", "127.0.0.1"] {
        let mut daemon = Daemon::spawn(&[
            ("LOCKDB_URL", "postgres://nobody@127.0.0.1:1/none"),
            (ADDR_VAR, bad),
        ]);
        let (code, _) = daemon.wait_exit(Duration::from_secs(10)).await;
        let lines = daemon.lines();
        assert_eq!(code, Some(2), "{bad}: {lines:?}");
        let failed = &events(&lines, "failed")[0]["error"];
        assert!(
            failed.contains(ADDR_VAR) && failed.contains("127.0.0.1:9464") && failed.contains(bad),
            "{failed}"
        );
    }
}

#[tokio::test]
async fn port_in_use_fails_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut daemon = Daemon::spawn(&[
        ("LOCKDB_URL", "postgres://nobody@127.0.0.1:1/none"),
        (ADDR_VAR, &addr),
    ]);
    let (code, _) = daemon.wait_exit(Duration::from_secs(10)).await;
    let lines = daemon.lines();
    assert_eq!(code, Some(1), "{lines:?}");
    let failed = &events(&lines, "failed")[0]["error"];
    assert!(
        failed.contains(&format!("cannot listen on {addr}")) && failed.contains("in use"),
        "{failed}"
    );
    assert!(
        events(&lines, "sweeper_started").is_empty(),
        "nothing swept"
    );
}

#[tokio::test]
async fn unset_variable_listens_nowhere() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    crate::support::wait_sweeps(&statsd, 2).await;
    let listening = listening_sockets_of(daemon.pid());
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    assert!(events(&lines, "metrics_listening").is_empty());
    assert_eq!(listening, 0, "no listening TCP socket");
}

/// How many of `pid`'s sockets are listening TCP sockets (IPv4 or IPv6).
fn listening_sockets_of(pid: i32) -> usize {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy().into_owned();
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        })
        // Column 3 is the state (0A: LISTEN), column 9 the inode.
        .filter(|cols| cols.get(3).map(String::as_str) == Some("0A"))
        .filter(|cols| cols.get(9).is_some_and(|inode| inodes.contains(inode)))
        .count()
}

/// The lock server's own verification, with the endpoint in place of its
/// actuator: a 1 s lease left to expire gives one `lease_expired` line with
/// overdueMillis under 1,500, the counter reads 1 with `backend="pg"`, the
/// table is empty; two more give 3 and three distinct lines.
#[tokio::test]
async fn verification_step_reads_one_then_three() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let port = statsd.port.to_string();
    let (mut daemon, addr) = daemon_with_endpoint(&daemon_env(&db.url, &port)).await;

    acquire_payout(&mut conn).await;
    daemon
        .wait_for_events("lease_expired", 1, Duration::from_secs(10))
        .await;
    let text = scrape(addr).await;
    let grep: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("lock_lease_expired_total") && !l.starts_with('#'))
        .collect();
    assert_eq!(grep, ["lock_lease_expired_total{backend=\"pg\"} 1"]);
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);

    for _ in 0..2 {
        acquire_payout(&mut conn).await;
        let seen = events(&daemon.lines(), "lease_expired").len();
        daemon
            .wait_for_events("lease_expired", seen + 1, Duration::from_secs(10))
            .await;
    }
    assert_eq!(value(&scrape(addr).await, EXPIRED), Some(3.0));
    let (_, lines) = daemon.stop().await;
    let expired = events(&lines, "lease_expired");
    let tokens: HashSet<&str> = expired.iter().map(|l| l["token"].as_str()).collect();
    assert_eq!(
        (expired.len(), tokens.len()),
        (3, 3),
        "three distinct lines"
    );
    for line in &expired {
        let overdue: i64 = line["overdueMillis"].parse().unwrap();
        assert!(overdue < 1_500, "overdueMillis {overdue}");
        assert_eq!(line["backend"], "pg");
    }
}

/// The lock server's acquire of `payout:acct-1` for 1 s, which must succeed.
async fn acquire_payout(conn: &mut sqlx::PgConnection) {
    let token: Option<i64> =
        sqlx::query_scalar("SELECT lock_acquire('payout:acct-1', 'worker-1', 1000)")
            .fetch_one(conn)
            .await
            .unwrap();
    token.expect("the key was free");
}
