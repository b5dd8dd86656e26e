//! Debian's Prometheus scraping the endpoint behind a web config file with
//! its own `scrape_config` options (`scheme: https`, `tls_config`,
//! `basic_auth`): with the right credentials the target is up and reads
//! exactly the expiries the daemon wrote; with a wrong password, no client
//! certificate, one from another CA, or plain HTTP, the target is down and
//! the daemon's own signal (lines, StatsD) is untouched.

use std::net::SocketAddr;
use std::time::Duration;

use crate::observability::support::{Prometheus, ScrapeJob};
use crate::support::{Daemon, StatsdCapture, TestDb, events, insert_expired, wait_until};
use crate::web_config::support::{
    PASSWORD, USER, parts, require_client_cert, serve, tls_and_password, tls_config,
};

/// Leases made to expire in each test.
const N: i64 = 17;

/// Waits until Prometheus has scraped `job` at least `n` times (up or not).
async fn wait_scrapes(prometheus: &Prometheus, job: &str, n: u32) {
    let expr = format!("count_over_time(up{{job=\"{job}\"}}[1h])");
    wait_until(
        Duration::from_secs(30),
        &format!("{n} scrapes of {job}"),
        || async { prometheus.value(&expr).await.unwrap_or(0.0) >= f64::from(n) },
    )
    .await;
}

/// Waits until `job` is up and has scraped `N` expiries; fails with what
/// Prometheus said about the target when it never gets there.
async fn wait_scraped_all(prometheus: &Prometheus, job: &str) {
    let counter = format!("lock_lease_expired_total{{job=\"{job}\",backend=\"pg\"}}");
    let up = format!("up{{job=\"{job}\"}}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if prometheus.value(&up).await == Some(1.0)
            && prometheus.value(&counter).await == Some(N as f64)
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{job} never scraped {N} expiries: up {:?}, counter {:?}, last error {:?}",
            prometheus.value(&up).await,
            prometheus.value(&counter).await,
            prometheus.scrape_error(job).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Makes `N` leases expire and waits until the daemon has written them.
async fn expire_leases(db: &TestDb, daemon: &Daemon, prefix: &str) {
    let mut conn = db.connect().await;
    insert_expired(&mut conn, prefix, N, 100).await;
    daemon
        .wait_for_events("lease_expired", N as usize, Duration::from_secs(20))
        .await;
}

/// Makes `N` leases expire while a Prometheus scrapes `job` (its name and
/// its settings), waits until Prometheus has seen every one, and stops the
/// daemon: it exited 0 having reported each lease once, in its log and to
/// statsd.
async fn expire_while_scraped(
    db: &TestDb,
    statsd: &StatsdCapture,
    mut daemon: Daemon,
    job: (&str, ScrapeJob),
    prefix: &str,
) {
    let prometheus = Prometheus::start_jobs(&[job.1]).await;
    expire_leases(db, &daemon, prefix).await;
    wait_scraped_all(&prometheus, job.0).await;

    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    assert_eq!(events(&lines, "lease_expired").len(), N as usize);
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        N as u64
    );
}

#[tokio::test]
async fn prometheus_scrapes_over_tls_with_basic_auth() {
    let (db, statsd, pki) = parts().await;
    let (daemon, addr) = serve(&db, &statsd, &pki, &tls_and_password(&pki, "")).await;
    let job = ScrapeJob::https("tls-basic-auth", addr, &pki.path("ca.crt"), "localhost")
        .basic_auth(USER, PASSWORD);
    expire_while_scraped(&db, &statsd, daemon, ("tls-basic-auth", job), "tls-auth-").await;
}

#[tokio::test]
async fn prometheus_scrapes_with_a_verified_client_certificate() {
    let (db, statsd, pki) = parts().await;
    let extra = require_client_cert(&pki);
    let (daemon, addr) = serve(&db, &statsd, &pki, &tls_config(&pki, &extra, "")).await;
    let job = ScrapeJob::https("tls-client-cert", addr, &pki.path("ca.crt"), "localhost")
        .client_cert(&pki.path("client.crt"), &pki.path("client.key"));
    expire_while_scraped(
        &db,
        &statsd,
        daemon,
        ("tls-client-cert", job),
        "tls-client-",
    )
    .await;
}

/// One endpoint asking for both a verified client certificate and a
/// password, scraped by five jobs: only the one with both gets in.
#[tokio::test]
async fn refused_scrapes_are_down_and_leave_the_signal_alone() {
    let (db, statsd, pki) = parts().await;
    let extra = require_client_cert(&pki);
    let (mut daemon, addr) = serve(&db, &statsd, &pki, &tls_and_password(&pki, &extra)).await;
    let https =
        |job: &str, addr: SocketAddr| ScrapeJob::https(job, addr, &pki.path("ca.crt"), "localhost");
    let client = |job: ScrapeJob| job.client_cert(&pki.path("client.crt"), &pki.path("client.key"));
    let refused = [
        "wrong-password",
        "no-client-cert",
        "rogue-client-cert",
        "plain-http",
    ];
    let prometheus = Prometheus::start_jobs(&[
        client(https("both", addr)).basic_auth(USER, PASSWORD),
        client(https("wrong-password", addr)).basic_auth(USER, "not-the-password"),
        https("no-client-cert", addr).basic_auth(USER, PASSWORD),
        https("rogue-client-cert", addr)
            .client_cert(&pki.path("rogue-client.crt"), &pki.path("rogue-client.key"))
            .basic_auth(USER, PASSWORD),
        ScrapeJob::plain("plain-http", addr).basic_auth(USER, PASSWORD),
    ])
    .await;

    expire_leases(&db, &daemon, "refused-").await;
    wait_scraped_all(&prometheus, "both").await;
    for job in refused {
        wait_scrapes(&prometheus, job, 3).await;
    }
    for job in refused {
        // Never once up, over every scrape so far.
        let ever_up = format!("max_over_time(up{{job=\"{job}\"}}[1h])");
        assert_eq!(
            prometheus.value(&ever_up).await,
            Some(0.0),
            "{job} got in: {}",
            prometheus.scrape_error(job).await
        );
        let seen = format!("lock_lease_expired_total{{job=\"{job}\"}}");
        assert_eq!(
            prometheus.value(&seen).await,
            None,
            "{job} read the counter"
        );
        assert!(
            !prometheus.scrape_error(job).await.is_empty(),
            "{job}: down without a reason"
        );
    }
    // The refusals cost the signal nothing: every expiry once, here and in
    // StatsD, and the one good job read exactly that.
    wait_scraped_all(&prometheus, "both").await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    assert_eq!(events(&lines, "lease_expired").len(), N as usize);
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        N as u64
    );
}
