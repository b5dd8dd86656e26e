//! StatsD behind a DNS server that never answers: the sweep never waits on
//! the lookup, and the counts held meanwhile reach StatsD, exactly, once the
//! name resolves.
//!
//! The real daemon runs in a mount namespace of its own whose
//! `/etc/resolv.conf` names a loopback UDP socket the test owns: silent at
//! first, then a minimal responder. That takes root (`unshare --mount`, a
//! bind mount, port 53); CI runs as root, and anyone else gets a failure
//! saying so. It prints one `FIGURES` line (`--nocapture`).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::UdpSocket;

use crate::faults::support::error_lines;
use crate::support::{Daemon, StatsdCapture, TempDir, TestDb, binary, events, poll, tool};

/// The StatsD host: not in /etc/hosts, so only DNS can answer for it.
const STATSD_NAME: &str = "statsd.lease-sweeper.test";
/// Leases acquired per tick, and ticks: 10 every 50 ms is 200 a second for
/// 10 s.
const PER_TICK: i64 = 10;
const TICKS: i64 = 200;
const TICK: Duration = Duration::from_millis(50);
/// Each lease's TTL: it expires while the next ones are acquired.
const TTL_MS: i64 = 250;
/// The lateness goal: one sweep delay plus the rest of a pass and a busy
/// 2-core machine's scheduling. A sweep held up by a lookup (a 2 s timeout
/// every 5 s before the sender had a thread of its own) exceeds it.
const OVERDUE_P99_MS: i64 = 1_100;

#[tokio::test]
async fn silent_dns_never_delays_a_sweep() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "faults_dns needs root: it runs the daemon in a mount namespace of its own \
         (unshare --mount, mount --bind over /etc/resolv.conf) and binds a DNS socket on \
         port 53; run it as root, as CI does"
    );
    let unshare = tool("unshare", "util-linux");
    let mount = tool("mount", "mount");
    let dns = Dns::start().await;
    let dir = TempDir::new("dns");
    let resolv = dir.join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {}\n", dns.addr.ip())).unwrap();

    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let script = r#""$1" --bind "$2" /etc/resolv.conf && exec "$3" run"#;
    let mut daemon = Daemon::spawn_program(
        &unshare,
        &[
            "--mount",
            "--",
            "sh",
            "-c",
            script,
            "sh",
            mount.to_str().unwrap(),
            resolv.to_str().unwrap(),
            binary().to_str().unwrap(),
        ],
        &[
            ("LOCKDB_URL", db.url.as_str()),
            ("STATSD_HOST", STATSD_NAME),
            ("STATSD_PORT", &port),
        ],
    );
    // unshare or mount failing (no CAP_SYS_ADMIN in a container) ends the
    // process at once: say so with its output rather than time out.
    poll(Duration::from_secs(30), "the daemon to start", async || {
        if let Some(status) = daemon.child.try_wait().unwrap() {
            panic!(
                "the daemon in its own mount namespace exited ({status}); unshare --mount \
                 and mount --bind need root with CAP_SYS_ADMIN:\n{}",
                daemon.lines().join("\n")
            );
        }
        if events(&daemon.lines(), "sweeper_started").is_empty() {
            Err(String::new())
        } else {
            Ok(())
        }
    })
    .await;

    // Steady expiries while every lookup goes unanswered.
    let mut ticks = tokio::time::interval(TICK);
    for tick in 0..TICKS {
        ticks.tick().await;
        sqlx::query(
            "SELECT count(lock_acquire('dns-' || i, 'owner', $3))
               FROM generate_series($1, $2) AS i",
        )
        .bind(tick * PER_TICK)
        .bind(tick * PER_TICK + PER_TICK - 1)
        .bind(TTL_MS)
        .execute(&mut conn)
        .await
        .unwrap();
    }
    let leases = (TICKS * PER_TICK) as usize;
    poll(
        Duration::from_secs(20),
        "every lease reported",
        async || {
            let n = daemon.count_lines(|l| l.contains(" message=lease_expired "));
            if n >= leases {
                Ok(())
            } else {
                Err(format!("{n} of {leases} lines"))
            }
        },
    )
    .await;
    let queries_unanswered = dns.queries();
    assert!(
        queries_unanswered > 0,
        "the daemon never asked the test's DNS server: the mount namespace did not take"
    );
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        0,
        "nothing can have been sent before the name resolved"
    );

    // A lookup gives up after the C library's timeouts (5 s, twice).
    daemon
        .wait_for_event("statsd_unavailable", Duration::from_secs(30))
        .await;

    // The name resolves now: what was held is delivered.
    dns.answer();
    poll(
        Duration::from_secs(30),
        "the held counts to reach StatsD",
        async || {
            let n = statsd.counter("lock.lease.expired", "#backend:pg");
            if n >= leases as u64 {
                Ok(())
            } else {
                Err(format!("{n} of {leases} counted"))
            }
        },
    )
    .await;
    let (code, lines) = daemon.stop().await;

    assert_eq!(code, Some(0));
    let expired = events(&lines, "lease_expired");
    let mut per_key: HashMap<&str, usize> = HashMap::new();
    for line in &expired {
        *per_key.entry(line["lockKey"].as_str()).or_default() += 1;
    }
    assert_eq!(per_key.len(), leases, "every lease reported");
    assert!(per_key.values().all(|&n| n == 1), "a lease reported twice");
    let mut overdue: Vec<i64> = expired
        .iter()
        .map(|l| l["overdueMillis"].parse().unwrap())
        .collect();
    overdue.sort_unstable();
    let pct = |p: usize| overdue[(overdue.len() * p / 100).min(overdue.len() - 1)];
    eprintln!(
        "FIGURES dns_silent: leases={leases} overdue_p50_ms={} overdue_p99_ms={} \
         overdue_max_ms={} queries_unanswered={queries_unanswered} statsd_unavailable={}",
        pct(50),
        pct(99),
        overdue.last().unwrap(),
        events(&lines, "statsd_unavailable").len()
    );
    assert!(
        pct(99) <= OVERDUE_P99_MS,
        "overdueMillis p99 {} ms over {OVERDUE_P99_MS} ms: the lookup held up the sweep",
        pct(99)
    );
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        leases as u64,
        "exactly the counts of all expiries, none lost, none twice"
    );
    assert_eq!(
        events(&lines, "statsd_recovered").len(),
        1,
        "the first answer ends the outage"
    );
    assert!(error_lines(&lines).is_empty(), "{lines:#?}");
}

/// A DNS server on a loopback address of its own, port 53: it reads every
/// query and answers none until `answer`; then it answers A queries with
/// 127.0.0.1 and any other type with NOERROR and no record.
struct Dns {
    addr: SocketAddr,
    answering: Arc<AtomicBool>,
    queries: Arc<AtomicUsize>,
}

impl Dns {
    async fn start() -> Self {
        // An address no other test run on this machine picks (all of
        // 127/8 is loopback on Linux).
        let pid = std::process::id();
        let ip = Ipv4Addr::new(127, 53, (pid >> 8) as u8, (pid % 250) as u8 + 1);
        let socket = UdpSocket::bind((ip, 53))
            .await
            .unwrap_or_else(|e| panic!("binding the test's DNS server on {ip}:53: {e}"));
        let addr = socket.local_addr().unwrap();
        let answering = Arc::new(AtomicBool::new(false));
        let queries = Arc::new(AtomicUsize::new(0));
        let (on, seen) = (answering.clone(), queries.clone());
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                seen.fetch_add(1, Ordering::SeqCst);
                if on.load(Ordering::SeqCst)
                    && let Some(reply) = dns_reply(&buf[..n])
                {
                    let _ = socket.send_to(&reply, from).await;
                }
            }
        });
        Self {
            addr,
            answering,
            queries,
        }
    }

    fn answer(&self) {
        self.answering.store(true, Ordering::SeqCst);
    }

    fn queries(&self) -> usize {
        self.queries.load(Ordering::SeqCst)
    }
}

/// The reply to one query: its id and question echoed, one A record of
/// 127.0.0.1 for an A query, no record for anything else (NOERROR).
fn dns_reply(query: &[u8]) -> Option<Vec<u8>> {
    const TYPE_A: u16 = 1;
    // The question: a name of length-prefixed labels ending in a zero byte,
    // then QTYPE and QCLASS.
    let mut end = 12;
    while *query.get(end)? != 0 {
        end += 1 + *query.get(end)? as usize;
    }
    let question = query.get(12..end + 5)?;
    let qtype = u16::from_be_bytes([question[question.len() - 4], question[question.len() - 3]]);
    let answers: u16 = (qtype == TYPE_A).into();
    let mut reply = Vec::with_capacity(64);
    reply.extend_from_slice(&query[..2]); // id
    reply.push(0x84 | (query[2] & 0x01)); // QR, AA, RD as asked
    reply.push(0x80); // RA, NOERROR
    reply.extend_from_slice(&1u16.to_be_bytes()); // QDCOUNT
    reply.extend_from_slice(&answers.to_be_bytes()); // ANCOUNT
    reply.extend_from_slice(&[0, 0, 0, 0]); // NSCOUNT, ARCOUNT
    reply.extend_from_slice(question);
    if answers == 1 {
        reply.extend_from_slice(&[0xc0, 12]); // the name, by pointer
        reply.extend_from_slice(&TYPE_A.to_be_bytes());
        reply.extend_from_slice(&1u16.to_be_bytes()); // IN
        reply.extend_from_slice(&60u32.to_be_bytes()); // TTL
        reply.extend_from_slice(&4u16.to_be_bytes());
        reply.extend_from_slice(&[127, 0, 0, 1]);
    }
    Some(reply)
}
