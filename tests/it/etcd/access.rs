//! How the real binary reaches etcd, and what it says when it cannot: TLS
//! with a client certificate works and without one fails; etcd's auth with
//! a user that may only read the locks' prefix (and write its own) works,
//! `check` tells that user's permissions apart from a lock holder's, and a
//! wrong password fails without ever being printed; an endpoint nobody
//! listens on fails by name. Every failure is a `sweep_failed` ERROR naming
//! the endpoint, passes go on being retried, SIGTERM still exits 0, and
//! `check` exits 1 with a `FAIL` line. With etcd and no PostgreSQL variable
//! the daemon runs the lock sweeper alone: no job reaper, no horizon check.

use std::net::SocketAddr;

use super::cluster::{EtcdCluster, LOCKER_PASSWORD, LOCKER_USER, SWEEPER_PASSWORD, SWEEPER_USER};
use super::holders::Holder;
use super::signal::{METRICS_ON, Reported, Sidecar, WAIT, assert_reported, check, scraped};
use crate::support::{TestDb, events, free_port, insert_expired, poll};

/// Failed lock-sweep passes so far, as the scrape counts them.
const FAILED_PASSES: &str = "lease_sweeper_pass_failures_total{service=\"lock_sweeper\"}";

/// Starts a sidecar that is expected to fail: waits for its `sweep_failed`
/// line, then for a second failed pass (it retries, still running), and
/// returns it with that line's `error`.
async fn failing_sidecar(env: Vec<(String, String)>, host: &str) -> (Sidecar, String) {
    let sidecar = Sidecar::start(env, host, &[METRICS_ON]).await;
    let addr: SocketAddr = sidecar.metrics_addr().await;
    sidecar.daemon.wait_for_event("sweep_failed", WAIT).await;
    let failed = events(&sidecar.daemon.lines(), "sweep_failed")[0].clone();
    assert_eq!(failed["level"], "error", "{failed:?}");
    poll(WAIT, "a second failed pass", || async {
        match scraped(addr, FAILED_PASSES).await {
            Some(n) if n >= 2.0 => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await;
    (sidecar, failed["error"].clone())
}

/// Asserts `check`'s output holds a line that starts with `start`.
fn assert_line(out: &str, start: &str) -> String {
    out.lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting {start:?} in:\n{out}"))
        .to_owned()
}

/// The cluster's environment with the client certificate left out: only
/// the CA that signed the server.
fn ca_only(cluster: &EtcdCluster) -> Vec<(String, String)> {
    cluster
        .env()
        .into_iter()
        .filter(|(k, _)| k != "ETCDCTL_CERT" && k != "ETCDCTL_KEY")
        .collect()
}

#[tokio::test]
async fn tls_with_client_certificate_reports_a_killed_holder() {
    let cluster = EtcdCluster::one_tls().await;
    let client = cluster.client().await;
    let mut sidecar = Sidecar::ready(cluster.env(), "access-tls").await;
    let mut holder = Holder::acquire(&client, "locks/tls", 1).await;
    sidecar.wait_held(1).await;

    holder.kill();

    sidecar.wait_expired(1).await;
    sidecar.wait_held(0).await;
    let lines = sidecar.stop().await;
    assert_reported(&lines, &[Reported::holder(&holder, "expiry")]);
}

#[tokio::test]
async fn tls_without_client_certificate_fails_naming_the_endpoint_and_check_fails() {
    let cluster = EtcdCluster::one_tls().await;
    let env = ca_only(&cluster);

    let (mut sidecar, error) = failing_sidecar(env.clone(), "access-no-cert").await;

    assert!(
        error.contains(&cluster.endpoints()),
        "sweep_failed names {}: {error}",
        cluster.endpoints()
    );
    sidecar.stop().await;
    let (code, out) = check(&env).await;
    assert_eq!(code, Some(1), "{out}");
    assert_line(&out, "FAIL  etcd:");
}

#[tokio::test]
async fn auth_read_only_sweeper_reports_and_passes_check_a_locker_fails_claims() {
    let mut cluster = EtcdCluster::one().await;
    cluster.enable_auth().await;
    let locker = cluster.client_as(LOCKER_USER, LOCKER_PASSWORD).await;
    let as_sweeper = cluster.env_as(SWEEPER_USER, SWEEPER_PASSWORD);
    let mut sidecar = Sidecar::ready(as_sweeper.clone(), "access-auth").await;
    let mut holder = Holder::acquire(&locker, "locks/auth", 1).await;
    sidecar.wait_held(1).await;

    holder.kill();

    sidecar.wait_expired(1).await;
    sidecar.wait_held(0).await;
    let lines = sidecar.stop().await;
    assert_reported(&lines, &[Reported::holder(&holder, "expiry")]);

    let (code, out) = check(&as_sweeper).await;
    assert_eq!(code, Some(0), "{out}");
    let etcd = assert_line(&out, "ok    etcd: ");
    assert!(etcd.contains(&cluster.endpoints()), "{etcd}");
    assert!(etcd.contains("as user sweeper"), "{etcd}");
    let keys = assert_line(&out, "ok    etcd lock keys: ");
    assert!(keys.contains("[locks/, locks0)"), "{keys}");
    assert_line(&out, "ok    etcd claims: ");
    assert!(!out.contains(SWEEPER_PASSWORD), "{out}");

    // A lock holder's user reads the locks but may not write claims.
    let (code, out) = check(&cluster.env_as(LOCKER_USER, LOCKER_PASSWORD)).await;
    assert_eq!(code, Some(1), "{out}");
    assert_line(&out, "ok    etcd lock keys: ");
    let claims = assert_line(&out, "FAIL  etcd claims: ");
    assert!(claims.contains("lease-sweeper/"), "{claims}");
}

#[tokio::test]
async fn auth_wrong_password_fails_naming_endpoint_and_user_never_the_password() {
    const WRONG: &str = "Wr0ng-pa55word-x9";
    let mut cluster = EtcdCluster::one().await;
    cluster.enable_auth().await;
    let env = cluster.env_as(SWEEPER_USER, WRONG);

    let (mut sidecar, error) = failing_sidecar(env.clone(), "access-wrong-pw").await;

    assert!(
        error.contains(&cluster.endpoints()),
        "names the endpoint: {error}"
    );
    assert!(error.contains("as user sweeper"), "names the user: {error}");
    let lines = sidecar.stop().await;
    let all = lines.join("\n");
    assert!(!all.contains(WRONG), "the password printed:\n{all}");
    let (code, out) = check(&env).await;
    assert_eq!(code, Some(1), "{out}");
    assert_line(&out, "FAIL  etcd:");
    assert!(!out.contains(WRONG), "check printed the password:\n{out}");
}

#[tokio::test]
async fn unreachable_endpoint_fails_naming_it_and_check_fails() {
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let env = vec![("ETCDCTL_ENDPOINTS".to_string(), endpoint.clone())];

    let (mut sidecar, error) = failing_sidecar(env.clone(), "access-unreachable").await;

    assert!(error.contains(&endpoint), "names {endpoint}: {error}");
    sidecar.stop().await;
    let (code, out) = check(&env).await;
    assert_eq!(code, Some(1), "{out}");
    let line = assert_line(&out, "FAIL  etcd:");
    assert!(line.contains(&endpoint), "{line}");
}

#[tokio::test]
async fn etcd_without_postgresql_runs_the_lock_sweeper_alone() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut sidecar = Sidecar::ready(cluster.env(), "access-etcd-only").await;
    let mut holder = Holder::acquire(&client, "locks/alone", 1).await;
    sidecar.wait_held(1).await;
    holder.kill();
    sidecar.wait_expired(1).await;
    // Several passes of the lock sweeper after the line: time enough for
    // any other service to have started and run.
    sidecar.wait_sweeps(3).await;
    let lines = sidecar.stop().await;

    let starting = events(&lines, "starting");
    assert_eq!(starting.len(), 1, "{lines:?}");
    assert_eq!(starting[0]["database"], "none", "{:?}", starting[0]);
    assert_eq!(
        starting[0]["locks"],
        format!("etcd at {}", cluster.endpoints())
    );
    for line in &lines {
        let message = crate::support::fields(line)
            .remove("message")
            .unwrap_or_default();
        assert!(
            !(message.starts_with("job_")
                || message.starts_with("horizon_check")
                || message.starts_with("xmin_horizon")
                || message.starts_with("database_")),
            "a PostgreSQL service ran: {line}"
        );
    }
    assert!(events(&lines, "sweeper_started").len() == 1, "{lines:?}");
    assert_reported(&lines, &[Reported::holder(&holder, "expiry")]);
    // Nor any of their series.
    for datagram in sidecar.statsd.lines() {
        assert!(
            !(datagram.starts_with("queue.") || datagram.starts_with("pg.")),
            "{datagram}"
        );
    }
}

/// Locks in etcd and a database named beside them: the lock sweeper follows
/// etcd, the job reaper and the horizon check run on the database, and the
/// database's own `lock_entry` is left alone (one daemon, one lock backend).
#[tokio::test]
async fn etcd_beside_a_database_runs_the_job_reaper_there_and_sweeps_only_etcd() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_expired(&mut conn, "pg-lease-", 3, 5_000).await;
    let mut sidecar = Sidecar::start(
        cluster.env(),
        "access-etcd-and-pg",
        &[("LOCKDB_URL", db.url.as_str())],
    )
    .await;
    sidecar.wait_sweeps(1).await;
    let mut holder = Holder::acquire(&client, "locks/beside", 1).await;
    sidecar.wait_held(1).await;
    holder.kill();
    sidecar.wait_expired(1).await;
    sidecar
        .daemon
        .wait_for_event("horizon_check_started", WAIT)
        .await;
    sidecar.wait_sweeps(2).await;
    let lines = sidecar.stop().await;

    assert_eq!(events(&lines, "job_reaper_started").len(), 1, "{lines:?}");
    assert_eq!(events(&lines, "horizon_check_started").len(), 1);
    let starting = &events(&lines, "starting")[0];
    assert!(
        starting["database"].contains(&format!("/{}", db.name)),
        "{starting:?}"
    );
    assert_reported(&lines, &[Reported::holder(&holder, "expiry")]);
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM lock_entry WHERE lock_key LIKE 'pg-lease-%'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        left, 3,
        "the database's leases are not this daemon's to sweep"
    );
}
