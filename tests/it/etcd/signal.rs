//! One sidecar following real etcd without auth, as the real binary: what
//! it reports and what it does not. Holders that die (their lease runs out)
//! come out as `reapedBy=expiry` and holders whose lease is revoked while
//! they hold as `reapedBy=revoke`, each exactly once, with the key, its
//! create revision as the token and the lease as the owner; released
//! holders, queued waiters and keys that only look like locks give no line;
//! a waiter that comes to hold is reported when it dies in turn; one lease
//! holding two locks gives a line per lock with the lease's one verdict;
//! unlocking and then closing the session (revoking its lease, as Go's
//! `concurrency` package does) is a release; `etcdctl lock` killed with
//! SIGKILL is an expiry; binary and huge keys come out escaped and
//! bounded; and StatsD and Prometheus count exactly the lines.
//!
//! The helpers here (`Sidecar`, `Reported`, `assert_reported`, `check`)
//! serve `access` too.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use etcd_client::{Client, LockOptions};

use super::cluster::EtcdCluster;
use super::holders::{EtcdctlLock, Holder, Waiter, gone_after, lease_ttl, lock_keys};
use crate::observability::support::{scrape, value};
use crate::support::{Daemon, StatsdCapture, events, poll, wait_sweeps, wait_until};

/// Generous bound on any wait for the daemon or etcd: every lease here is
/// 1-2 s (10 s for the revoked ones, revoked long before), and a line
/// follows etcd's deletion within a pass or two.
pub(super) const WAIT: Duration = Duration::from_secs(20);

/// The scrape endpoint on a port the kernel picks (`Sidecar::metrics_addr`).
pub(super) const METRICS_ON: (&str, &str) = ("LEASE_SWEEPER_METRICS_ADDR", "127.0.0.1:0");

/// The tags of every etcd series in StatsD.
pub(super) const TAGS: &str = "#backend:etcd";

/// The real daemon following etcd, with its StatsD capture.
pub(super) struct Sidecar {
    pub daemon: Daemon,
    pub statsd: StatsdCapture,
}

impl Sidecar {
    /// Starts `lease-sweeper run` with `etcd_env` (the cluster's `ETCDCTL_*`),
    /// `HOSTNAME=host`, StatsD to a capture of its own, and `extra`; no
    /// PostgreSQL variable.
    pub async fn start(
        etcd_env: Vec<(String, String)>,
        host: &str,
        extra: &[(&str, &str)],
    ) -> Self {
        let statsd = StatsdCapture::start().await;
        let mut env = etcd_env;
        env.push(("HOSTNAME".into(), host.into()));
        env.push(("STATSD_HOST".into(), "127.0.0.1".into()));
        env.push(("STATSD_PORT".into(), statsd.port.to_string()));
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let daemon = Daemon::spawn(&as_refs(&env));
        Self { daemon, statsd }
    }

    /// `start`, then waits for its first finished lock sweep: connected,
    /// following etcd from the revision it started at.
    pub async fn ready(etcd_env: Vec<(String, String)>, host: &str) -> Self {
        let sidecar = Self::start(etcd_env, host, &[]).await;
        sidecar.wait_sweeps(1).await;
        sidecar
    }

    /// Waits until `n` more lock sweeps have finished (each sends the held
    /// gauge).
    pub async fn wait_sweeps(&self, n: usize) {
        wait_sweeps(&self.statsd, n).await;
    }

    /// Its `lease_expired` lines so far.
    pub fn expired(&self) -> Vec<HashMap<String, String>> {
        events(&self.daemon.lines(), "lease_expired")
    }

    /// Waits until it has written `n` `lease_expired` lines.
    pub async fn wait_expired(&self, n: usize) {
        self.daemon.wait_for_events("lease_expired", n, WAIT).await;
    }

    /// The scrape endpoint's address, once it logged `metrics_listening`
    /// (started with `LEASE_SWEEPER_METRICS_ADDR=127.0.0.1:0`: a free port
    /// the kernel picks).
    pub async fn metrics_addr(&self) -> SocketAddr {
        self.daemon.wait_for_event("metrics_listening", WAIT).await;
        events(&self.daemon.lines(), "metrics_listening")[0]["addr"]
            .parse()
            .expect("metrics_listening carries the bound address")
    }

    /// Waits until the last held gauge it sent (`lock.held.current`,
    /// backend etcd) is `n`.
    pub async fn wait_held(&self, n: u64) {
        wait_until(
            WAIT,
            &format!("lock.held.current {TAGS} at {n}"),
            || async { self.statsd.gauge("lock.held.current", TAGS) == Some(n) },
        )
        .await;
    }

    /// SIGTERM; asserts exit code 0 and returns every line it wrote.
    pub async fn stop(&mut self) -> Vec<String> {
        let (code, lines) = self.daemon.stop().await;
        assert_eq!(code, Some(0), "exit code; output:\n{}", lines.join("\n"));
        lines
    }
}

/// `(k, v)` pairs as `Daemon::spawn` takes them.
pub(super) fn as_refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Runs `lease-sweeper check` with exactly `env` (plus PATH); returns its
/// exit code and everything it wrote.
pub(super) async fn check(env: &[(String, String)]) -> (Option<i32>, String) {
    let mut run = Daemon::spawn_args(&["check"], &as_refs(env));
    let (code, _) = run.wait_exit(Duration::from_secs(60)).await;
    (code, run.lines().join("\n"))
}

/// One `lease_expired` line a test expects.
#[derive(Debug, Clone)]
pub(super) struct Reported {
    /// `lockKey` as decoded from the line.
    pub key: String,
    pub lease: i64,
    pub token: i64,
    pub by: &'static str,
}

impl Reported {
    pub fn holder(h: &Holder, by: &'static str) -> Self {
        Self {
            key: h.key.clone(),
            lease: h.lease,
            token: h.create_revision,
            by,
        }
    }
}

/// Asserts that `lines` hold exactly one `lease_expired` line per
/// `expected` entry and no other, each with its key, token (the key's
/// create revision), owner (the lease in hex), `backend=etcd` and
/// `reapedBy`, at WARN.
pub(super) fn assert_reported(lines: &[String], expected: &[Reported]) {
    let got = events(lines, "lease_expired");
    let all = || lines.join("\n");
    assert_eq!(got.len(), expected.len(), "lease_expired lines:\n{}", all());
    for want in expected {
        let same: Vec<_> = got.iter().filter(|f| f["lockKey"] == want.key).collect();
        assert_eq!(same.len(), 1, "lines for {:?}:\n{}", want.key, all());
        let f = same[0];
        let token = want.token.to_string();
        let owner = format!("{:x}", want.lease);
        assert_eq!(
            (
                f["level"].as_str(),
                f["backend"].as_str(),
                f["reapedBy"].as_str(),
                f["token"].as_str(),
                f["ownerId"].as_str()
            ),
            ("warn", "etcd", want.by, token.as_str(), owner.as_str()),
            "{f:?}"
        );
        let overdue: i64 = f["overdueMillis"].parse().expect("overdueMillis");
        assert!(overdue >= 0, "{f:?}");
        if want.by == "revoke" {
            assert_eq!(overdue, 0, "{f:?}");
        }
        let at: i64 = f["expiredAtMillis"].parse().expect("expiredAtMillis");
        assert!(at > 1_600_000_000_000, "{f:?}");
    }
}

/// A lease of `ttl_secs` nobody renews: its holder dies the moment it has
/// locked.
async fn unrenewed_lease(client: &Client, ttl_secs: i64) -> i64 {
    client
        .clone()
        .lease_grant(ttl_secs, None)
        .await
        .expect("granting a lease")
        .id()
}

/// Takes lock `name` (any bytes) with the Lock RPC on an unrenewed lease of
/// `ttl_secs`; returns the key, its lease and its create revision.
async fn lock_unrenewed(client: &Client, name: &[u8], ttl_secs: i64) -> (Vec<u8>, i64, i64) {
    let lease = unrenewed_lease(client, ttl_secs).await;
    lock_with(client, name, lease).await
}

/// Takes lock `name` (any bytes) with the Lock RPC on `lease`; returns the
/// key, the lease and the key's create revision.
async fn lock_with(client: &Client, name: &[u8], lease: i64) -> (Vec<u8>, i64, i64) {
    let locked = client
        .clone()
        .lock(name.to_vec(), Some(LockOptions::new().with_lease(lease)))
        .await
        .unwrap_or_else(|e| panic!("locking a {}-byte name: {e}", name.len()));
    let key = locked.key().to_vec();
    let mut expected = name.to_vec();
    expected.extend(format!("/{lease:x}").into_bytes());
    assert_eq!(key, expected, "the Lock RPC's key is <name>/<lease hex>");
    let got = client.clone().get(key.clone(), None).await.unwrap();
    let created = got.kvs()[0].create_revision();
    (key, lease, created)
}

#[tokio::test]
async fn killed_and_revoked_holders_reported_once_released_holders_and_waiters_never() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut sidecar = Sidecar::ready(cluster.env(), "signal-mixed").await;
    let group = async |what: &str, ttl: i64| {
        let mut out = Vec::new();
        for i in 0..5 {
            out.push(Holder::acquire(&client, &format!("locks/{what}-{i}"), ttl).await);
        }
        out
    };
    let mut killed = group("killed", 1).await;
    // A live 1 s lease reads TTL 0 when asked: still alive, so released.
    let mut released = group("released", 1).await;
    // Revoked long before a 10 s lease could run out.
    let mut revoked = group("revoked", 10).await;
    let _held = [
        Holder::acquire(&client, "locks/held-0", 2).await,
        Holder::acquire(&client, "locks/held-1", 2).await,
    ];
    // Waiters that come to hold when their holder goes: W_a is killed once
    // it holds, the others hold to the end.
    let mut w_a = Waiter::queue(&client, "locks/killed-0", 1).await;
    let mut w_b = Waiter::queue(&client, "locks/killed-1", 2).await;
    let mut w_r = Waiter::queue(&client, "locks/released-0", 2).await;
    let mut w_c = Waiter::queue(&client, "locks/revoked-0", 2).await;
    // Waiters dropped while they wait: behind a holder that dies, and
    // behind holders that live on.
    let dropped = [
        Waiter::queue(&client, "locks/killed-2", 2).await,
        Waiter::queue(&client, "locks/held-0", 2).await,
        Waiter::queue(&client, "locks/held-1", 2).await,
    ];
    // 17 locks, none counted twice for its waiters; reached only once the
    // sidecar has asked every holder's deadline (it learns them before it
    // hands the count over).
    sidecar.wait_held(17).await;
    // Pacing, not proof: a pass later the sidecar has asked each new
    // holder's deadline (at once, and every 250 ms while unknown), which a
    // revoke must come after to be told from an expiry.
    sidecar.wait_sweeps(1).await;

    drop(dropped);
    for h in &mut killed {
        h.kill();
    }
    for h in &mut released {
        h.release().await;
    }
    for h in &mut revoked {
        h.revoke().await;
    }

    assert_eq!(w_r.acquired(WAIT).await, w_r.key);
    assert_eq!(w_c.acquired(WAIT).await, w_c.key);
    assert_eq!(w_a.acquired(WAIT).await, w_a.key);
    assert_eq!(w_b.acquired(WAIT).await, w_b.key);
    sidecar.wait_expired(10).await;
    // The waiter that took over killed-0 dies while holding it: its lease
    // runs out after every release and dropped waiter above, so its line
    // comes after any line those could have caused.
    w_a.kill();
    sidecar.wait_expired(11).await;
    // killed-1, released-0 and revoked-0 (their waiters), held-0, held-1.
    sidecar.wait_held(5).await;
    sidecar
        .statsd
        .wait_counter("lock.lease.expired", TAGS, 11)
        .await;
    let lines = sidecar.stop().await;

    let mut expected: Vec<Reported> = killed
        .iter()
        .map(|h| Reported::holder(h, "expiry"))
        .chain(revoked.iter().map(|h| Reported::holder(h, "revoke")))
        .collect();
    expected.push(Reported {
        key: w_a.key.clone(),
        lease: w_a.lease,
        token: w_a.create_revision,
        by: "expiry",
    });
    assert_reported(&lines, &expected);
    assert_eq!(sidecar.statsd.counter("lock.lease.expired", TAGS), 11);
    assert_eq!(sidecar.statsd.gauge("lock.held.current", TAGS), Some(5));
}

/// Takes lock `name` with the Lock RPC on `lease` (which may hold others);
/// returns its key and create revision.
async fn lock_on(client: &Client, name: &str, lease: i64) -> (String, i64) {
    let (key, _, created) = lock_with(client, name.as_bytes(), lease).await;
    (String::from_utf8(key).unwrap(), created)
}

#[tokio::test]
async fn one_lease_holding_two_locks_gives_a_line_per_lock_with_the_same_verdict() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut sidecar = Sidecar::ready(cluster.env(), "signal-session").await;
    // One session, one lease, two mutexes, as etcd's concurrency package
    // holds them: one revoked, one left to run out.
    let revoked = unrenewed_lease(&client, 10).await;
    let expires = unrenewed_lease(&client, 2).await;
    let mut expected = Vec::new();
    for (lease, by) in [(revoked, "revoke"), (expires, "expiry")] {
        for i in 0..2 {
            let (key, token) = lock_on(&client, &format!("locks/s-{by}-{i}"), lease).await;
            expected.push(Reported {
                key,
                lease,
                token,
                by,
            });
        }
    }
    sidecar.wait_held(4).await;
    // Pacing, as above: both deadlines asked.
    sidecar.wait_sweeps(1).await;

    client.clone().lease_revoke(revoked).await.unwrap();

    sidecar.wait_expired(4).await;
    sidecar.wait_held(0).await;
    let lines = sidecar.stop().await;
    assert_reported(&lines, &expected);
    // Both locks of the lease that ran out died at its one deadline.
    let at: Vec<String> = events(&lines, "lease_expired")
        .into_iter()
        .filter(|f| f["reapedBy"] == "expiry")
        .map(|f| f["expiredAtMillis"].clone())
        .collect();
    assert_eq!(at[0], at[1], "{}", lines.join("\n"));
}

#[tokio::test]
async fn etcdctl_lock_killed_with_sigkill_reported_once_as_expiry() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut sidecar = Sidecar::ready(cluster.env(), "signal-etcdctl").await;
    let mut cli = EtcdctlLock::spawn(&cluster, "locks/cli", 1).await;
    cli.wait_holding(&client).await;
    sidecar.wait_held(1).await;

    cli.kill();

    sidecar.wait_expired(1).await;
    sidecar.wait_held(0).await;
    // Passes go on after the line; none repeats it.
    sidecar.wait_sweeps(3).await;
    let lines = sidecar.stop().await;
    assert_reported(
        &lines,
        &[Reported {
            key: cli.key.clone(),
            lease: cli.lease,
            token: cli.create_revision,
            by: "expiry",
        }],
    );
    assert_eq!(sidecar.statsd.counter("lock.lease.expired", TAGS), 1);
}

#[tokio::test]
async fn keys_that_only_look_like_locks_never_reported_nor_counted_held() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut sidecar = Sidecar::ready(cluster.env(), "signal-lookalike").await;
    let mut c = client.clone();
    // Named for lease A, attached to lease B, which runs out.
    let a = unrenewed_lease(&client, 10).await;
    let b = unrenewed_lease(&client, 3).await;
    let wrong_lease = format!("locks/x/{a:x}");
    c.put(
        wrong_lease.as_str(),
        "",
        Some(etcd_client::PutOptions::new().with_lease(b)),
    )
    .await
    .unwrap();
    // Ends in hex, on no lease; deleted by hand.
    let no_lease = format!("locks/plain/{a:x}");
    c.put(no_lease.as_str(), "", None).await.unwrap();
    // An election candidate (etcd's Campaign RPC): `elect/<its lease
    // hex>` with its proposal as the value, on a lease that runs out.
    let candidate = unrenewed_lease(&client, 3).await;
    let campaign = c.campaign("elect", "candidate-1", candidate).await.unwrap();
    let elected = String::from_utf8(campaign.leader().unwrap().key().to_vec()).unwrap();
    assert_eq!(elected, format!("elect/{candidate:x}"));
    // A real holder, written after them all.
    let mut real = Holder::acquire(&client, "locks/real", 1).await;

    // Counted alone, while every look-alike is still there: the gauge
    // that says 1 was taken after the sidecar read them.
    sidecar.wait_held(1).await;
    for key in [&wrong_lease, &no_lease, &elected] {
        let there = c.get(key.as_str(), None).await.unwrap();
        assert_eq!(there.kvs().len(), 1, "{key} already gone");
    }
    c.delete(no_lease.as_str(), None).await.unwrap();
    let since = std::time::Instant::now();
    gone_after(&client, &wrong_lease, since, WAIT).await;
    gone_after(&client, &elected, since, WAIT).await;
    assert_eq!(lease_ttl(&client, b).await, -1);
    assert_eq!(lease_ttl(&client, candidate).await, -1);
    // The real holder dies after them all: its line comes after any they
    // could have caused.
    real.kill();

    sidecar.wait_expired(1).await;
    sidecar.wait_held(0).await;
    let lines = sidecar.stop().await;
    assert_reported(&lines, &[Reported::holder(&real, "expiry")]);
    assert_eq!(sidecar.statsd.counter("lock.lease.expired", TAGS), 1);
}

#[tokio::test]
async fn binary_key_escaped_and_huge_key_cut_at_4096_bytes_with_its_length() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut sidecar = Sidecar::ready(cluster.env(), "signal-bytes").await;
    let binary_name = b"locks/bin\xff\nname".to_vec();
    let mut huge_name = b"locks/".to_vec();
    huge_name.resize(10_000, b'h');

    // Both holders die as they lock: nobody renews their leases.
    let (_, binary_lease, binary_token) = lock_unrenewed(&client, &binary_name, 2).await;
    let (huge, huge_lease, huge_token) = lock_unrenewed(&client, &huge_name, 2).await;
    assert!(huge.len() > 10_000, "etcd took a {}-byte key", huge.len());

    sidecar.wait_expired(2).await;
    sidecar.wait_held(0).await;
    sidecar.wait_sweeps(2).await;
    let lines = sidecar.stop().await;
    let binary_text = format!("locks/bin\\xff\nname/{binary_lease:x}");
    let mut huge_text = String::from_utf8(huge[..4096].to_vec()).unwrap();
    huge_text.push_str(&format!("…({} bytes)", huge.len()));
    assert_reported(
        &lines,
        &[
            Reported {
                key: binary_text,
                lease: binary_lease,
                token: binary_token,
                by: "expiry",
            },
            Reported {
                key: huge_text,
                lease: huge_lease,
                token: huge_token,
                by: "expiry",
            },
        ],
    );
    // As written: one line, the non-UTF-8 byte as `\xff` (its backslash
    // escaped by logfmt) and the newline as `\n`.
    let raw: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("message=lease_expired"))
        .collect();
    let binary_raw = format!("lockKey=\"locks/bin\\\\xff\\nname/{binary_lease:x}\" ");
    assert_eq!(
        raw.iter().filter(|l| l.contains(&binary_raw)).count(),
        1,
        "{raw:?}"
    );
    let huge_raw = raw
        .iter()
        .find(|l| l.contains(&format!("ownerId={huge_lease:x}")))
        .unwrap();
    assert!(huge_raw.len() < 4096 + 400, "{} bytes", huge_raw.len());
    assert_eq!(lock_keys(&client, "locks/").await, vec![]);
}

/// The value of the series `series` in the daemon's scrape at `addr`.
pub(super) async fn scraped(addr: SocketAddr, series: &str) -> Option<f64> {
    value(&scrape(addr).await, series)
}

#[tokio::test]
async fn prometheus_counts_each_expiry_and_no_missed_events() {
    const EXPIRED: &str = "lock_lease_expired_total{backend=\"etcd\"}";
    const MISSED: &str = "lock_events_missed_total{backend=\"etcd\"}";
    const HELD: &str = "lock_held_current{backend=\"etcd\"}";
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut sidecar = Sidecar::start(cluster.env(), "signal-prometheus", &[METRICS_ON]).await;
    let addr = sidecar.metrics_addr().await;
    sidecar.wait_sweeps(1).await;
    // Registered at zero before anything happened.
    assert_eq!(scraped(addr, EXPIRED).await, Some(0.0));
    assert_eq!(scraped(addr, MISSED).await, Some(0.0));
    let mut dying = Vec::new();
    for i in 0..3 {
        dying.push(Holder::acquire(&client, &format!("locks/p-{i}"), 1).await);
    }
    let stays = Holder::acquire(&client, "locks/p-stays", 2).await;
    sidecar.wait_held(4).await;

    for h in &mut dying {
        h.kill();
    }

    sidecar.wait_expired(3).await;
    poll(WAIT, "3 expiries and 1 held in the scrape", || async {
        let body = scrape(addr).await;
        match (value(&body, EXPIRED), value(&body, HELD)) {
            (Some(3.0), Some(1.0)) => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await;
    assert_eq!(scraped(addr, MISSED).await, Some(0.0));
    let lines = sidecar.stop().await;
    let expected: Vec<Reported> = dying
        .iter()
        .map(|h| Reported::holder(h, "expiry"))
        .collect();
    assert_reported(&lines, &expected);
    assert_eq!(lock_keys(&client, "locks/p-stays/").await[0].key, stays.key);
}

/// Go's `m.Unlock(); s.Close()` races the sidecar's lease question: won, no
/// line; lost, a revoke (docs/etcd.md). Never an expiry, never twice.
#[tokio::test]
async fn unlock_then_session_close_is_never_an_expiry_nor_reported_twice() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut sidecar = Sidecar::ready(cluster.env(), "signal-unlock-close").await;
    let mut sessions = Vec::new();
    for i in 0..30 {
        let lease = unrenewed_lease(&client, 10).await;
        let (key, _) = lock_on(&client, &format!("locks/clean-{i}"), lease).await;
        sessions.push((key, lease));
    }
    sidecar.wait_held(30).await;
    // Pacing, as above: every deadline asked.
    sidecar.wait_sweeps(1).await;

    let mut c = client.clone();
    for (key, lease) in &sessions {
        c.unlock(key.as_str()).await.unwrap();
        c.lease_revoke(*lease).await.unwrap();
    }
    // A holder dies after them all: its line comes after any they caused.
    let mut real = Holder::acquire(&client, "locks/after", 1).await;
    sidecar.wait_held(1).await;
    real.kill();

    sidecar.wait_expired(1).await;
    sidecar.wait_held(0).await;
    let lines = sidecar.stop().await;
    let got = events(&lines, "lease_expired");
    let clean: Vec<_> = got
        .iter()
        .filter(|l| l["lockKey"].starts_with("locks/clean-"))
        .collect();
    assert!(
        clean.iter().all(|l| l["reapedBy"] == "revoke"),
        "an unlock before the revoke is never an expiry:\n{}",
        lines.join("\n")
    );
    let mut keys: Vec<&str> = clean.iter().map(|l| l["lockKey"].as_str()).collect();
    keys.sort_unstable();
    let n = keys.len();
    keys.dedup();
    assert_eq!(keys.len(), n, "each at most once");
    let after: Vec<_> = got.iter().filter(|l| l["lockKey"] == real.key).collect();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0]["reapedBy"], "expiry");
    assert_eq!(
        sidecar.statsd.counter("lock.lease.expired", TAGS),
        got.len() as u64,
        "one count per line"
    );
}
