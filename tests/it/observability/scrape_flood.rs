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

use crate::observability::support::{
    Expiries, LEASES, MAX_OVERDUE_MS, MAX_RSS_KIB, SPACING_MS, assert_every_lease_swept_once,
    daemon_with_endpoint, insert_leases, peak_rss_kib, scrape, value, wait_every_lease_reported,
};
use crate::support::{StatsdCapture, TestDb, daemon_env};

/// Connections opened at the start and never sent a byte.
const IDLE: usize = 300;
/// Connections that send one byte of a request head every 500 ms.
const TRICKLING: usize = 100;
/// Tasks sending hostile requests back to back, and tasks scraping.
const HOSTILE_TASKS: usize = 12;
const SCRAPERS: usize = 12;
/// How long the hostile tasks and the scrapers keep going.
const FLOOD: Duration = Duration::from_secs(12);

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

    insert_leases(&mut conn, "flood-").await;
    for task in tasks {
        task.await.unwrap();
    }
    wait_every_lease_reported(&daemon).await;

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

    let expiries = Expiries::from_lines(&lines);
    let overdue = &expiries.overdue;
    let pct = |p: usize| overdue[(overdue.len() * p / 100).min(overdue.len() - 1)];
    eprintln!(
        "flood: {} expiries over {} s; overdue p50 {} ms, p99 {} ms, max {} ms; peak RSS {:.1} MiB; \
         {} held + {} trickling connections; {} hostile requests answered, {} connections closed \
         unanswered, {} refused; {} scrapes",
        expiries.reported,
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

    assert_every_lease_swept_once(code, &expiries, &mut conn, &statsd).await;
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
