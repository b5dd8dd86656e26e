//! A hostile flood on the scrape port while leases expire at 500 a second:
//! idle and trickling connections held open, garbage, oversized heads, TLS
//! handshakes, path traversal and a scrape storm. The sweep must not notice:
//! every expiry reported exactly once and on time, the daemon alive and
//! small, every connection it was sent closed by it.
//!
//! It prints one `flood:` line with the figures (overdue p50/p99/max, peak
//! RSS, requests and connections); `scripts/bench --only flood` runs it on a
//! release build and reports that line.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::observability::support::{daemon_with_endpoint, scrape, value};
use crate::support::{StatsdCapture, TestDb, count, daemon_env, events, wait_until};

/// Leases expiring during the flood, one every 2 ms: 500 a second for 10 s.
const LEASES: i64 = 5_000;
const SPACING_MS: i64 = 2;
/// The first lease expires this long after the insert, once the flood runs.
const LEAD_MS: i64 = 1_000;
/// Connections opened at the start and never sent a byte.
const IDLE: usize = 300;
/// Connections that send one byte of a request head every 500 ms.
const TRICKLING: usize = 100;
/// Tasks sending hostile requests back to back, and tasks scraping.
const HOSTILE_TASKS: usize = 12;
const SCRAPERS: usize = 12;
/// How long the hostile tasks and the scrapers keep going.
const FLOOD: Duration = Duration::from_secs(12);
/// Peak resident memory the daemon may reach under the flood.
const MAX_RSS_KIB: u64 = 32 * 1024;
/// Latest any lease may be reported: a sweep held up by the flood for more
/// than a few seconds fails here (the p99 goal is measured, not asserted).
const MAX_OVERDUE_MS: i64 = 5_000;

#[derive(Default)]
struct Tally {
    /// Requests that got an HTTP status back.
    answered: AtomicU64,
    /// Connections the endpoint closed (or reset) without a response: full,
    /// a head it refused, a timeout.
    closed: AtomicU64,
    /// Connections that could not be opened at all.
    refused: AtomicU64,
    scrapes: AtomicU64,
}

#[tokio::test]
async fn flood_never_delays_an_expiry() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let port = statsd.port.to_string();
    let (mut daemon, addr) = daemon_with_endpoint(&daemon_env(&db.url, &port)).await;
    let pid = daemon.pid();

    // Held connections first, so they are in place when the leases expire.
    let mut idle = Vec::new();
    for _ in 0..IDLE {
        idle.push(TcpStream::connect(addr).await.expect("connecting"));
    }
    let tally = Arc::new(Tally::default());
    let until = Instant::now() + FLOOD;
    let mut tasks = Vec::new();
    for i in 0..TRICKLING {
        tasks.push(tokio::spawn(trickle(addr, until, tally.clone(), i)));
    }
    for i in 0..HOSTILE_TASKS {
        tasks.push(tokio::spawn(hostile(addr, until, tally.clone(), i as u64)));
    }
    for _ in 0..SCRAPERS {
        tasks.push(tokio::spawn(storm(addr, until, tally.clone())));
    }

    sqlx::query(
        "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
         SELECT 'flood-' || i, 'owner', nextval('lock_fencing_token_seq'),
                now() + ($2 + i * $3) * interval '1 millisecond'
           FROM generate_series(1, $1) AS i",
    )
    .bind(LEASES)
    .bind(LEAD_MS)
    .bind(SPACING_MS)
    .execute(&mut conn)
    .await
    .unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    wait_until(Duration::from_secs(30), "every lease reported", || async {
        daemon.count_lines(|l| l.contains(" message=lease_expired ")) >= LEASES as usize
    })
    .await;

    // Every connection it was sent, the held ones too, it closed itself.
    let mut still_open = 0;
    for mut stream in idle {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            _ => still_open += 1,
        }
    }
    // Still serving, still alive, still small.
    let after = scrape(addr).await;
    let peak_rss_kib = peak_rss_kib(pid);
    let (code, lines) = daemon.stop().await;

    let expired = events(&lines, "lease_expired");
    let mut keys: Vec<&str> = expired.iter().map(|l| l["lockKey"].as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    let mut overdue: Vec<i64> = expired
        .iter()
        .map(|l| l["overdueMillis"].parse().unwrap())
        .collect();
    overdue.sort_unstable();
    let pct = |p: usize| overdue[(overdue.len() * p / 100).min(overdue.len() - 1)];
    eprintln!(
        "flood: {} expiries over {} s; overdue p50 {} ms, p99 {} ms, max {} ms; peak RSS {:.1} MiB; \
         {} held + {} trickling connections; {} hostile requests answered, {} connections closed \
         unanswered, {} refused; {} scrapes",
        expired.len(),
        LEASES * SPACING_MS / 1_000,
        pct(50),
        pct(99),
        overdue.last().unwrap(),
        peak_rss_kib as f64 / 1024.0,
        IDLE,
        TRICKLING,
        tally.answered.load(Ordering::Relaxed),
        tally.closed.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
        tally.scrapes.load(Ordering::Relaxed),
    );

    assert_eq!(code, Some(0));
    assert_eq!(
        (expired.len(), keys.len()),
        (LEASES as usize, LEASES as usize)
    );
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        LEASES as u64
    );
    assert_eq!(
        value(&after, "lock_lease_expired_total{backend=\"pg\"}"),
        Some(LEASES as f64)
    );
    assert!(
        *overdue.last().unwrap() <= MAX_OVERDUE_MS,
        "a sweep was held up: max overdue {} ms",
        overdue.last().unwrap()
    );
    assert_eq!(still_open, 0, "held connections the endpoint never closed");
    assert!(
        peak_rss_kib <= MAX_RSS_KIB,
        "peak RSS {peak_rss_kib} KiB over {MAX_RSS_KIB} KiB"
    );
    assert!(
        tally.scrapes.load(Ordering::Relaxed) > 0,
        "no scrape got through"
    );
    assert!(
        tally.answered.load(Ordering::Relaxed) > 0,
        "no hostile request reached it"
    );
}

/// Sends a request head one byte every 500 ms until the endpoint hangs up.
async fn trickle(addr: SocketAddr, until: Instant, tally: Arc<Tally>, i: usize) {
    let head = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow-{i}: ");
    while Instant::now() < until {
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            tally.refused.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        for byte in head.bytes().cycle() {
            if Instant::now() >= until || stream.write_all(&[byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tally.closed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Hostile requests back to back: garbage, an oversized head, a TLS
/// ClientHello, path traversal, a huge body, in turn.
async fn hostile(addr: SocketAddr, until: Instant, tally: Arc<Tally>, seed: u64) {
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut turn = 0u64;
    while Instant::now() < until {
        turn += 1;
        let payload: Vec<u8> = match turn % 5 {
            0 => (0..1_024)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng as u8
                })
                .collect(),
            1 => format!(
                "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
                "a".repeat(32 * 1024)
            )
            .into_bytes(),
            2 => {
                let mut hello = vec![
                    0x16, 0x03, 0x01, 0x00, 0xc8, 0x01, 0x00, 0x00, 0xc4, 0x03, 0x03,
                ];
                hello.extend(std::iter::repeat_n(0x42, 200));
                hello
            }
            3 => b"GET /../../../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            _ => format!(
                "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n{}",
                "b".repeat(16 * 1024)
            )
            .into_bytes(),
        };
        exchange(addr, &payload, &tally).await;
    }
}

/// Scrapes as fast as the endpoint answers.
async fn storm(addr: SocketAddr, until: Instant, tally: Arc<Tally>) {
    while Instant::now() < until {
        if exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", &tally).await == Some(200) {
            tally.scrapes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One connection: send, read to the end; the status, if one came back.
async fn exchange(addr: SocketAddr, payload: &[u8], tally: &Tally) -> Option<u16> {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        tally.refused.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(10)).await;
        return None;
    };
    let _ = stream.write_all(payload).await;
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), stream.read_to_end(&mut response)).await;
    let status = response
        .get(9..12)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse().ok());
    match status {
        Some(_) => tally.answered.fetch_add(1, Ordering::Relaxed),
        None => tally.closed.fetch_add(1, Ordering::Relaxed),
    };
    status
}

/// The process's peak resident set (VmHWM), in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}
