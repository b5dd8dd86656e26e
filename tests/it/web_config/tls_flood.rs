//! The flood with TLS and basic auth on, while leases expire at 500 a
//! second: hundreds of connections that open and send nothing, or half a
//! ClientHello, or a ClientHello a byte at a time, plus a stream of
//! requests with a wrong password and scrapes with the right one. The sweep
//! must not notice: every expiry reported exactly once and on time, the
//! daemon small, every held connection closed by it, every wrong password
//! answered 401 and never 200. Sessions idle after their handshake are
//! closed by the daemon too.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::observability::support::{
    Expiries, LEASES, assert_every_lease_swept_once, assert_on_time_and_small, insert_leases,
    peak_rss_kib, wait_every_lease_reported,
};
use crate::web_config::support::{
    PASSWORD, USER, arg, curl, https_url, parts, serve, tls_and_password,
};

/// Connections opened at the start that never send a byte.
const SILENT: usize = 200;
/// Connections opened at the start that send half a ClientHello and stop.
const HALF_HELLO: usize = 150;
/// Connections sending a ClientHello one byte every 500 ms.
const TRICKLING: usize = 50;
/// curl loops with a wrong password, and with the right one.
const WRONG_PASSWORD_LOOPS: usize = 3;
const SCRAPE_LOOPS: usize = 1;
const FLOOD: Duration = Duration::from_secs(12);

/// The start of a TLS 1.2/1.3 ClientHello record claiming 512 bytes of
/// handshake: a server must wait for the rest, or give up.
fn client_hello_start() -> Vec<u8> {
    let mut hello = vec![
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    hello.extend(std::iter::repeat_n(0x5a, 32));
    hello
}

#[derive(Default)]
struct Tally {
    wrong_password_401: AtomicU64,
    wrong_password_other: AtomicU64,
    scrapes: AtomicU64,
    trickles_closed: AtomicU64,
}

#[tokio::test]
async fn tls_flood_never_delays_an_expiry() {
    let _alone = crate::web_config::support::ONE_FLOOD_AT_A_TIME.lock().await;
    let (db, statsd, pki) = parts().await;
    let mut conn = db.connect().await;
    let (mut daemon, addr) = serve(&db, &statsd, &pki, &tls_and_password(&pki, "")).await;
    let pid = daemon.pid();

    let mut held = Vec::new();
    for _ in 0..SILENT {
        held.push(TcpStream::connect(addr).await.expect("connecting"));
    }
    for _ in 0..HALF_HELLO {
        let mut stream = TcpStream::connect(addr).await.expect("connecting");
        stream
            .write_all(&client_hello_start())
            .await
            .expect("half a ClientHello");
        held.push(stream);
    }
    let tally = Arc::new(Tally::default());
    let until = Instant::now() + FLOOD;
    let mut tasks = Vec::new();
    for _ in 0..TRICKLING {
        tasks.push(tokio::spawn(trickle(addr, until, tally.clone())));
    }
    let ca = arg(pki.path("ca.crt"));
    for _ in 0..WRONG_PASSWORD_LOOPS {
        tasks.push(tokio::spawn(wrong_passwords(
            addr,
            ca.clone(),
            until,
            tally.clone(),
        )));
    }
    for _ in 0..SCRAPE_LOOPS {
        tasks.push(tokio::spawn(scrapes(
            addr,
            ca.clone(),
            until,
            tally.clone(),
        )));
    }

    insert_leases(&mut conn, "tls-flood-").await;
    for task in tasks {
        task.await.unwrap();
    }
    wait_every_lease_reported(&daemon).await;

    // Every held connection, silent or half a hello, the daemon closed.
    let mut still_open = 0;
    for mut stream in held {
        let mut rest = Vec::new();
        if tokio::time::timeout(Duration::from_secs(1), stream.read_to_end(&mut rest))
            .await
            .is_err()
        {
            still_open += 1;
        }
    }
    let good = format!("{USER}:{PASSWORD}");
    let after = curl(&https_url(addr), &["--cacert", &ca, "--user", &good]).await;
    let peak = peak_rss_kib(pid);
    let (code, lines) = daemon.stop().await;

    let expiries = Expiries::from_lines(&lines);
    let max_overdue = expiries.max_overdue();
    eprintln!(
        "tls flood: {} expiries, max overdue {max_overdue} ms, peak RSS {:.1} MiB; {SILENT} silent + \
         {HALF_HELLO} half-hello + {TRICKLING} trickling connections ({} trickles closed); \
         {} wrong passwords answered 401, {} otherwise; {} scrapes",
        expiries.reported,
        peak as f64 / 1024.0,
        tally.trickles_closed.load(Ordering::Relaxed),
        tally.wrong_password_401.load(Ordering::Relaxed),
        tally.wrong_password_other.load(Ordering::Relaxed),
        tally.scrapes.load(Ordering::Relaxed),
    );

    assert_every_lease_swept_once(code, &expiries, &mut conn, &statsd).await;
    assert_eq!((after.exit, after.status), (0, 200), "{after:?}");
    assert!(
        after.body.contains(&format!(
            "lock_lease_expired_total{{backend=\"pg\"}} {LEASES}"
        )),
        "{}",
        after.body
    );
    assert_eq!(still_open, 0, "held connections the endpoint never closed");
    assert_on_time_and_small(max_overdue, peak);
    assert!(
        tally.wrong_password_401.load(Ordering::Relaxed) > 0,
        "no wrong password answered"
    );
    assert_eq!(
        tally.wrong_password_other.load(Ordering::Relaxed),
        0,
        "a wrong password answered other than 401"
    );
    assert!(
        tally.scrapes.load(Ordering::Relaxed) > 0,
        "no scrape got through"
    );
}

/// Sends a ClientHello one byte every 500 ms until the endpoint hangs up,
/// then starts over.
async fn trickle(addr: SocketAddr, until: Instant, tally: Arc<Tally>) {
    let hello = client_hello_start();
    while Instant::now() < until {
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        for byte in hello.iter().cycle() {
            if Instant::now() >= until || stream.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tally.trickles_closed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Requests with a wrong password, back to back, each a fresh TLS client.
async fn wrong_passwords(addr: SocketAddr, ca: String, until: Instant, tally: Arc<Tally>) {
    let wrong = format!("{USER}:guess-{PASSWORD}");
    while Instant::now() < until {
        let got = curl(&https_url(addr), &["--cacert", &ca, "--user", &wrong]).await;
        if got.status == 401 {
            tally.wrong_password_401.fetch_add(1, Ordering::Relaxed);
        } else if got.status != 0 {
            // A refused or timed-out connection is the flood's doing; any
            // HTTP answer but 401 is the endpoint's.
            tally.wrong_password_other.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Scrapes with the right password, back to back.
async fn scrapes(addr: SocketAddr, ca: String, until: Instant, tally: Arc<Tally>) {
    let good = format!("{USER}:{PASSWORD}");
    while Instant::now() < until {
        if curl(&https_url(addr), &["--cacert", &ca, "--user", &good])
            .await
            .status
            == 200
        {
            tally.scrapes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// TLS sessions that finish the handshake and then send nothing, or half a
/// request head: the daemon closes each itself, within the flood tests'
/// fifteen seconds, and serves a scrape meanwhile.
#[tokio::test]
async fn idle_tls_sessions_are_closed_by_the_daemon() {
    const SESSIONS: usize = 20;
    let (db, statsd, pki) = parts().await;
    let (mut daemon, addr) = serve(&db, &statsd, &pki, &tls_and_password(&pki, "")).await;
    let ca = arg(pki.path("ca.crt"));
    let started = Instant::now();
    let mut sessions = Vec::new();
    for i in 0..SESSIONS {
        let mut child = tokio::process::Command::new(crate::support::tool("openssl", "openssl"))
            .args([
                "s_client",
                "-quiet",
                "-connect",
                &addr.to_string(),
                "-CAfile",
                &ca,
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("running openssl s_client");
        let mut stdin = child.stdin.take().unwrap();
        if i % 2 == 1 {
            // Half a head, then nothing more; stdin stays open either way.
            let _ = stdin
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                .await;
        }
        sessions.push((child, stdin));
    }
    let good = format!("{USER}:{PASSWORD}");
    let scrape = curl(&https_url(addr), &["--cacert", &ca, "--user", &good]).await;
    assert_eq!((scrape.exit, scrape.status), (0, 200), "{scrape:?}");
    let mut still_open = 0;
    for (mut child, _stdin) in sessions {
        let left = Duration::from_secs(15).saturating_sub(started.elapsed());
        if tokio::time::timeout(left, child.wait()).await.is_err() {
            still_open += 1;
        }
    }
    assert_eq!(still_open, 0, "TLS sessions the daemon never closed");
    let (code, _) = daemon.stop().await;
    assert_eq!(code, Some(0));
}
