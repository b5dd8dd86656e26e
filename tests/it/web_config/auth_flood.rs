//! Wrong passwords as fast as the endpoint takes them, each one new (so no
//! cached verdict answers it) against a hash of an operator's usual cost,
//! while leases expire at 500 a second: every bcrypt is real work, and the
//! sweep must not pay for it. Every expiry reported once and within the
//! flood tests' bound, the daemon small, every wrong password a 401.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::observability::support::{
    Expiries, assert_every_lease_swept_once, assert_on_time_and_small, insert_leases, peak_rss_kib,
    wait_every_lease_reported,
};
use crate::web_config::support::{PASSWORD, USER, htpasswd, parts, serve, users};

/// Clients sending wrong passwords at once: as many as the endpoint serves
/// at a time, so every slot holds a bcrypt.
const GUESSERS: usize = 64;
const FLOOD: Duration = Duration::from_secs(12);
/// htpasswd's cost when an operator asks for more than its default.
const COST: u32 = 10;

#[derive(Default)]
struct Tally {
    refused_401: AtomicU64,
    other_status: AtomicU64,
    no_answer: AtomicU64,
}

/// `user:password` as a Basic credential.
fn basic(credentials: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in credentials.as_bytes().chunks(3) {
        let n = chunk.iter().fold(0u32, |n, b| n << 8 | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

#[tokio::test]
async fn wrong_password_flood_never_delays_an_expiry() {
    let _alone = crate::web_config::support::ONE_FLOOD_AT_A_TIME.lock().await;
    assert_eq!(
        basic("scraper:correct-horse-7"),
        "c2NyYXBlcjpjb3JyZWN0LWhvcnNlLTc="
    );
    let (db, statsd, pki) = parts().await;
    let mut conn = db.connect().await;
    let hash = htpasswd(USER, PASSWORD, COST);
    let (mut daemon, addr) = serve(&db, &statsd, &pki, &users(&hash)).await;
    let pid = daemon.pid();

    let tally = Arc::new(Tally::default());
    let until = Instant::now() + FLOOD;
    let mut tasks = Vec::new();
    for i in 0..GUESSERS {
        tasks.push(tokio::spawn(guess(addr, until, tally.clone(), i)));
    }
    insert_leases(&mut conn, "guessed-").await;
    for task in tasks {
        task.await.unwrap();
    }
    wait_every_lease_reported(&daemon).await;
    let peak = peak_rss_kib(pid);
    let (code, lines) = daemon.stop().await;

    let expiries = Expiries::from_lines(&lines);
    let max_overdue = expiries.max_overdue();
    eprintln!(
        "auth flood: {} expiries, max overdue {max_overdue} ms, peak RSS {:.1} MiB; {} wrong \
         passwords refused 401, {} other answers, {} connections unanswered",
        expiries.reported,
        peak as f64 / 1024.0,
        tally.refused_401.load(Ordering::Relaxed),
        tally.other_status.load(Ordering::Relaxed),
        tally.no_answer.load(Ordering::Relaxed),
    );
    assert_every_lease_swept_once(code, &expiries, &mut conn, &statsd).await;
    assert_on_time_and_small(max_overdue, peak);
    assert!(
        tally.refused_401.load(Ordering::Relaxed) > 0,
        "no guess answered"
    );
    assert_eq!(
        tally.other_status.load(Ordering::Relaxed),
        0,
        "a guess answered other than 401"
    );
}

/// Wrong passwords back to back, each new, over plain HTTP (the bcrypt is
/// the cost here, not TLS).
async fn guess(addr: SocketAddr, until: Instant, tally: Arc<Tally>, task: usize) {
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let credential = basic(&format!("{USER}:guess-{task}-{n}"));
        let request = format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {credential}\r\n\r\n"
        );
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            tally.no_answer.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.write_all(request.as_bytes()).await;
        let mut response = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(15), stream.read_to_end(&mut response)).await;
        match response.get(9..12) {
            Some(b"401") => tally.refused_401.fetch_add(1, Ordering::Relaxed),
            Some(_) => tally.other_status.fetch_add(1, Ordering::Relaxed),
            None => tally.no_answer.fetch_add(1, Ordering::Relaxed),
        };
    }
}
