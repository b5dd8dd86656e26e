//! The web config and the files it names, changed under a running daemon:
//! a rotated certificate is served on the next connection while Prometheus
//! scrapes every second (at most the scrape in flight fails); a changed
//! password applies to the next request; a file broken while running keeps
//! the last good configuration (still TLS, still the password, never plain
//! HTTP or no auth, even when emptied) and is reported once per distinct
//! problem, and again when it comes back after a repair; a rotation to an
//! expired certificate is served with one warning; TLS is not turned on by
//! an edit.

use std::path::Path;
use std::time::Duration;

use crate::observability::support::{Prometheus, ScrapeJob};
use crate::support::{Daemon, events, wait_until};
use crate::web_config::support::{
    PASSWORD, Pki, USER, arg, bcrypt, curl, https_url, parts, serve, served_certificate,
    stop_with_no_rejection, users, write_config,
};

/// Copies `from` over `to` the way a certificate manager does: a new file
/// renamed into place, so no reader sees half of it.
fn replace(from: &Path, to: &Path) {
    let tmp = to.with_extension("new");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

/// A web config serving TLS from `live.crt`/`live.key` in the PKI's
/// directory (copies of the first server certificate) with `auth`.
fn live_config(pki: &Pki, auth: &str) -> String {
    replace(&pki.path("server.crt"), &pki.path("live.crt"));
    replace(&pki.path("server.key"), &pki.path("live.key"));
    format!(
        "tls_server_config:\n  cert_file: {}\n  key_file: {}\n{auth}",
        pki.path("live.crt").display(),
        pki.path("live.key").display()
    )
}

/// Scrapes that failed so far for `job`, and scrapes in all.
async fn scrape_tally(prometheus: &Prometheus, job: &str) -> (f64, f64) {
    let all = format!("count_over_time(up{{job=\"{job}\"}}[1h])");
    let good = format!("sum_over_time(up{{job=\"{job}\"}}[1h])");
    let all = prometheus.value(&all).await.unwrap_or(0.0);
    let good = prometheus.value(&good).await.unwrap_or(0.0);
    (all - good, all)
}

#[tokio::test]
async fn rotated_certificate_is_served_on_the_next_connection() {
    let (db, statsd, pki) = parts().await;
    let (daemon, addr) = serve(
        &db,
        &statsd,
        &pki,
        &live_config(&pki, &users(&bcrypt(PASSWORD))),
    )
    .await;
    let job = "rotating";
    let prometheus =
        Prometheus::start_jobs(&[
            ScrapeJob::https(job, addr, &pki.path("ca.crt"), "localhost")
                .basic_auth(USER, PASSWORD),
        ])
        .await;
    let up = format!("up{{job=\"{job}\"}}");
    wait_until(
        Duration::from_secs(30),
        "three scrapes, the last up",
        || async {
            scrape_tally(&prometheus, job).await.1 >= 3.0
                && prometheus.value(&up).await == Some(1.0)
        },
    )
    .await;
    assert_eq!(
        served_certificate(addr.port()).await.as_deref(),
        Some(pki.text("server.crt").as_str()),
        "the first certificate before the rotation"
    );

    let (failed_before, _) = scrape_tally(&prometheus, job).await;
    // The key first, then the certificate: a handshake between the two may
    // fail, as it would for the toolkit.
    replace(&pki.path("server2.key"), &pki.path("live.key"));
    replace(&pki.path("server2.crt"), &pki.path("live.crt"));
    assert_eq!(
        served_certificate(addr.port()).await.as_deref(),
        Some(pki.text("server2.crt").as_str()),
        "the next connection gets the new certificate"
    );
    let (_, before) = scrape_tally(&prometheus, job).await;
    wait_until(
        Duration::from_secs(30),
        "five scrapes after the rotation",
        || async { scrape_tally(&prometheus, job).await.1 >= before + 5.0 },
    )
    .await;
    // Counted from just before the rotation: a scrape that failed earlier
    // for want of CPU on a loaded machine is none of the rotation's doing.
    let (failed, all) = scrape_tally(&prometheus, job).await;
    assert!(
        failed - failed_before <= 1.0,
        "{} of the {} scrapes since the rotation failed",
        failed - failed_before,
        all - before
    );
    assert_eq!(prometheus.value(&up).await, Some(1.0));
    stop_with_no_rejection(daemon).await;
}

#[tokio::test]
async fn changed_password_applies_to_the_next_request() {
    let (db, statsd, pki) = parts().await;
    let (mut daemon, addr) = serve(
        &db,
        &statsd,
        &pki,
        &live_config(&pki, &users(&bcrypt(PASSWORD))),
    )
    .await;
    let web = pki.path("web.yml");
    let (url, ca) = (https_url(addr), arg(pki.path("ca.crt")));
    let old = format!("{USER}:{PASSWORD}");
    let new = format!("{USER}:rotated-password-9");
    assert_eq!(
        curl(&url, &["--cacert", &ca, "--user", &old]).await.status,
        200
    );
    let loaded = events(&daemon.lines(), "web_config_loaded").len();

    let text = std::fs::read_to_string(&web).unwrap();
    let (head, _) = text.split_once("basic_auth_users:").unwrap();
    write_config(
        &pki.dir,
        "web.yml",
        &format!("{head}{}", users(&bcrypt("rotated-password-9"))),
    );
    let old_answer = curl(&url, &["--cacert", &ca, "--user", &old]).await;
    let new_answer = curl(&url, &["--cacert", &ca, "--user", &new]).await;
    assert_eq!(
        (old_answer.status, new_answer.status),
        (401, 200),
        "old: {old_answer:?}\nnew: {new_answer:?}"
    );
    daemon
        .wait_for_events("web_config_loaded", loaded + 1, Duration::from_secs(10))
        .await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    assert_eq!(
        events(&lines, "web_config_loaded").len(),
        loaded + 1,
        "one new version taken"
    );
    assert!(!lines.join("\n").contains("rotated-password-9"));
}

/// What a client gets after the file went bad: the last good configuration,
/// all of it.
async fn assert_last_good_served(what: &str, addr: std::net::SocketAddr, pki: &Pki) {
    let (url, ca) = (https_url(addr), arg(pki.path("ca.crt")));
    let good = format!("{USER}:{PASSWORD}");
    let ok = curl(&url, &["--cacert", &ca, "--user", &good]).await;
    assert_eq!((ok.exit, ok.status), (0, 200), "{what}: {ok:?}");
    let no_auth = curl(&url, &["--cacert", &ca]).await;
    assert_eq!(
        no_auth.status, 401,
        "{what}: served without the password: {no_auth:?}"
    );
    let plain = curl(&format!("http://{addr}/metrics"), &["--user", &good]).await;
    assert_eq!(plain.status, 0, "{what}: served plain HTTP: {plain:?}");
    assert_eq!(
        served_certificate(addr.port()).await.as_deref(),
        Some(pki.text("server.crt").as_str()),
        "{what}: the last good certificate"
    );
}

/// A way to break the configuration, named for the failure message.
type Break<'a> = (&'a str, Box<dyn Fn() + 'a>);

/// Rejections logged so far, each with the file it names.
fn rejections(daemon: &Daemon, web: &Path) -> usize {
    let lines = daemon.lines();
    let rejected = events(&lines, "web_config_rejected");
    for line in &rejected {
        assert_eq!(line["level"], "error", "{line:?}");
        assert_eq!(line["file"], web.display().to_string(), "{line:?}");
        assert!(!line["error"].is_empty(), "{line:?}");
    }
    rejected.len()
}

#[tokio::test]
async fn broken_file_keeps_the_last_good_config() {
    let (db, statsd, pki) = parts().await;
    let hash = bcrypt(PASSWORD);
    let good = live_config(&pki, &users(&hash));
    let (mut daemon, addr) = serve(&db, &statsd, &pki, &good).await;
    let web = pki.path("web.yml");
    assert_last_good_served("at start", addr, &pki).await;
    assert_eq!(rejections(&daemon, &web), 0);

    // Each break, then three clients on it: one rejection per problem,
    // however many connections see it.
    let mut seen = 0;
    let breaks: [Break; 7] = [
        (
            "malformed YAML",
            Box::new(|| {
                write_config(&pki.dir, "web.yml", "tls_server_config: [\n");
            }),
        ),
        (
            "an unknown key",
            Box::new(|| {
                write_config(
                    &pki.dir,
                    "web.yml",
                    &format!("{good}listen_address: 0.0.0.0\n"),
                );
            }),
        ),
        (
            "a plaintext password",
            Box::new(|| {
                write_config(
                    &pki.dir,
                    "web.yml",
                    &good.replace(&hash, "plaintext-secret-77"),
                );
            }),
        ),
        (
            "a key not matching the certificate",
            Box::new(|| {
                replace(&pki.path("server2.key"), &pki.path("live.key"));
                write_config(&pki.dir, "web.yml", &good);
            }),
        ),
        (
            "a certificate that is not PEM",
            Box::new(|| {
                replace(&pki.path("server.key"), &pki.path("live.key"));
                std::fs::write(pki.path("live.crt"), "not a certificate\n").unwrap();
            }),
        ),
        (
            "the file removed",
            Box::new(|| {
                replace(&pki.path("server.crt"), &pki.path("live.crt"));
                std::fs::remove_file(&web).unwrap();
            }),
        ),
        // Valid to the toolkit (plain HTTP, no auth), as a truncating
        // editor leaves it: never taken while TLS is on.
        (
            "the file emptied",
            Box::new(|| {
                write_config(&pki.dir, "web.yml", "");
            }),
        ),
    ];
    for (what, break_it) in &breaks {
        break_it();
        for _ in 0..3 {
            assert_last_good_served(what, addr, &pki).await;
        }
        seen += 1;
        wait_until(
            Duration::from_secs(10),
            &format!("{what} rejected"),
            || async { rejections(&daemon, &web) >= seen },
        )
        .await;
        assert_eq!(
            rejections(&daemon, &web),
            seen,
            "{what}: {:?}",
            daemon.lines()
        );
    }
    let lines = daemon.lines().join("\n");
    assert!(
        !lines.contains("plaintext-secret-77") && !lines.contains(&hash[7..]),
        "a secret in the log"
    );

    // Put back as it was: the problem is gone, so the same break again is
    // a new problem to report, not one already told.
    write_config(&pki.dir, "web.yml", &good);
    assert_last_good_served("repaired", addr, &pki).await;
    write_config(&pki.dir, "web.yml", "tls_server_config: [\n");
    assert_last_good_served("malformed YAML again", addr, &pki).await;
    wait_until(
        Duration::from_secs(10),
        "the break again rejected",
        || async { rejections(&daemon, &web) > breaks.len() },
    )
    .await;

    // A new good version (one more header) is taken, said, and served.
    let loaded = events(&daemon.lines(), "web_config_loaded").len();
    let with_header = format!("{good}http_server_config:\n  headers:\n    X-Frame-Options: deny\n");
    write_config(&pki.dir, "web.yml", &with_header);
    assert_last_good_served("a new version", addr, &pki).await;
    let (url, ca) = (https_url(addr), arg(pki.path("ca.crt")));
    let good_user = format!("{USER}:{PASSWORD}");
    let fetched = curl(&url, &["--cacert", &ca, "--user", &good_user]).await;
    assert!(
        fetched
            .head
            .to_ascii_lowercase()
            .contains("x-frame-options: deny"),
        "{fetched:?}"
    );
    daemon
        .wait_for_events("web_config_loaded", loaded + 1, Duration::from_secs(10))
        .await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    assert_eq!(
        events(&lines, "web_config_rejected").len(),
        breaks.len() + 1,
        "each break once"
    );
    assert_eq!(events(&lines, "web_config_loaded").len(), loaded + 1);
}

/// A certificate rotated to one already expired is served (as the toolkit
/// would) and said once, with when it ran out.
#[tokio::test]
async fn rotating_to_an_expired_certificate_warns_once() {
    let (db, statsd, pki) = parts().await;
    let (daemon, addr) = serve(&db, &statsd, &pki, &live_config(&pki, "")).await;
    assert!(events(&daemon.lines(), "web_config_certificate_expired").is_empty());

    replace(&pki.path("expired.key"), &pki.path("live.key"));
    replace(&pki.path("expired.crt"), &pki.path("live.crt"));
    for _ in 0..3 {
        assert_eq!(
            served_certificate(addr.port()).await.as_deref(),
            Some(pki.text("expired.crt").as_str())
        );
    }
    daemon
        .wait_for_event("web_config_certificate_expired", Duration::from_secs(10))
        .await;
    let lines = stop_with_no_rejection(daemon).await;
    let warned = events(&lines, "web_config_certificate_expired");
    assert_eq!(warned.len(), 1, "{lines:?}");
    assert!(
        warned[0]["notAfter"].starts_with(&pki.not_after("expired.crt")),
        "{:?}",
        warned[0]
    );
}

/// Started without TLS, the endpoint is not switched to TLS by an edit (it
/// takes a restart, as for the toolkit): the edit is rejected and the
/// endpoint stays as it was, password included.
#[tokio::test]
async fn tls_is_not_turned_on_while_running() {
    let (db, statsd, pki) = parts().await;
    let auth = users(&bcrypt(PASSWORD));
    let (mut daemon, addr) = serve(&db, &statsd, &pki, &auth).await;
    let plain = format!("http://{addr}/metrics");
    let good = format!("{USER}:{PASSWORD}");
    assert_eq!(curl(&plain, &["--user", &good]).await.status, 200);

    write_config(&pki.dir, "web.yml", &live_config(&pki, &auth));
    let (after, ca) = (
        curl(&plain, &["--user", &good]).await,
        arg(pki.path("ca.crt")),
    );
    assert_eq!((after.exit, after.status), (0, 200), "{after:?}");
    assert_eq!(curl(&plain, &[]).await.status, 401);
    let tls = curl(&https_url(addr), &["--cacert", &ca, "--user", &good]).await;
    assert!(tls.failed_in_tls(), "{tls:?}");
    daemon
        .wait_for_event("web_config_rejected", Duration::from_secs(10))
        .await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    let rejected = events(&lines, "web_config_rejected");
    assert_eq!(rejected.len(), 1, "{lines:?}");
    assert!(
        rejected[0]["error"].contains("tls_server_config"),
        "{:?}",
        rejected[0]
    );
}
