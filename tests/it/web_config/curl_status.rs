//! What `curl` gets from the endpoint behind TLS, a verified client
//! certificate and basic auth, with every credential and without each one:
//! 200 with all; 401 with `WWW-Authenticate: Basic` and the same body for a
//! missing password, a wrong one and an unknown user; a failed TLS
//! handshake without a client certificate, with one from another CA, or
//! without trusting the server's CA; no HTTP answer at all over plain HTTP;
//! as long to refuse an unknown user as a known one; a good password's
//! verdict cached; and credentials read as Go's `Request.BasicAuth` reads
//! them.

use crate::support::events;
use crate::web_config::support::{
    Fetched, PASSWORD, USER, arg, bcrypt, curl, htpasswd, https_url, parts, require_client_cert,
    serve, tls_and_password, users,
};

/// The scheme the daemon said it listens with.
fn scheme(lines: &[String]) -> String {
    events(lines, "metrics_listening")[0]["scheme"].clone()
}

/// Asserts a 401 that asks for basic auth; returns its body.
fn unauthorized(what: &str, got: &Fetched) -> String {
    assert_eq!((got.exit, got.status), (0, 401), "{what}: {got:?}");
    assert!(
        got.head.lines().any(|l| l
            .to_ascii_lowercase()
            .starts_with("www-authenticate: basic")),
        "{what}: no WWW-Authenticate: Basic in {}",
        got.head
    );
    assert!(!got.body.contains("lock_lease_expired_total"), "{what}");
    got.body.clone()
}

#[tokio::test]
async fn curl_gets_exact_answers_with_and_without_each_credential() {
    let (db, statsd, pki) = parts().await;
    let extra = require_client_cert(&pki);
    let (mut daemon, addr) = serve(&db, &statsd, &pki, &tls_and_password(&pki, &extra)).await;
    let url = https_url(addr);
    let (ca, cert, key) = (
        arg(pki.path("ca.crt")),
        arg(pki.path("client.crt")),
        arg(pki.path("client.key")),
    );
    let (rogue_cert, rogue_key) = (
        arg(pki.path("rogue-client.crt")),
        arg(pki.path("rogue-client.key")),
    );
    let good = format!("{USER}:{PASSWORD}");

    let all = curl(
        &url,
        &[
            "--cacert", &ca, "--cert", &cert, "--key", &key, "--user", &good,
        ],
    )
    .await;
    assert_eq!((all.exit, all.status), (0, 200), "{all:?}");
    assert!(
        all.body
            .contains("lock_lease_expired_total{backend=\"pg\"} 0"),
        "{}",
        all.body
    );

    let no_user = curl(&url, &["--cacert", &ca, "--cert", &cert, "--key", &key]).await;
    let wrong = format!("{USER}:not-{PASSWORD}");
    let wrong_password = curl(
        &url,
        &[
            "--cacert", &ca, "--cert", &cert, "--key", &key, "--user", &wrong,
        ],
    )
    .await;
    let stranger = format!("stranger:{PASSWORD}");
    let unknown_user = curl(
        &url,
        &[
            "--cacert", &ca, "--cert", &cert, "--key", &key, "--user", &stranger,
        ],
    )
    .await;
    let bodies = [
        unauthorized("no --user", &no_user),
        unauthorized("a wrong password", &wrong_password),
        unauthorized("an unknown user", &unknown_user),
    ];
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "the 401 tells who exists: {bodies:?}"
    );

    for (what, got) in [
        (
            "no client certificate",
            curl(&url, &["--cacert", &ca, "--user", &good]).await,
        ),
        (
            "a client certificate from another CA",
            curl(
                &url,
                &[
                    "--cacert",
                    &ca,
                    "--cert",
                    &rogue_cert,
                    "--key",
                    &rogue_key,
                    "--user",
                    &good,
                ],
            )
            .await,
        ),
        (
            "the server's CA not trusted",
            curl(&url, &["--cert", &cert, "--key", &key, "--user", &good]).await,
        ),
    ] {
        assert!(got.failed_in_tls(), "{what}: {got:?}");
        assert!(!got.body.contains("lock_lease"), "{what}");
    }
    // Plain HTTP to the TLS port: no HTTP answer, never the metrics.
    let plain = curl(&format!("http://{addr}/metrics"), &["--user", &good]).await;
    assert_eq!(plain.status, 0, "{plain:?}");
    assert_ne!(plain.exit, 0, "{plain:?}");
    assert!(!plain.body.contains("lock_lease"), "{plain:?}");

    // Still serving the one who has everything.
    let again = curl(
        &url,
        &[
            "--cacert", &ca, "--cert", &cert, "--key", &key, "--user", &good,
        ],
    )
    .await;
    assert_eq!((again.exit, again.status), (0, 200), "{again:?}");
    let (code, lines) = daemon.stop().await;
    assert_eq!(scheme(&lines), "https");
    assert_eq!(code, Some(0));
    let all_output = lines.join("\n");
    assert!(!all_output.contains(PASSWORD), "a password in the log");
}

/// TLS and basic auth without client certificates: the CA and the password
/// are all it takes, and the password is all that is missing without it.
#[tokio::test]
async fn curl_needs_only_the_password_when_no_client_cert_is_asked() {
    let (db, statsd, pki) = parts().await;
    let (mut daemon, addr) = serve(&db, &statsd, &pki, &tls_and_password(&pki, "")).await;
    let url = https_url(addr);
    let ca = arg(pki.path("ca.crt"));
    let good = format!("{USER}:{PASSWORD}");

    let ok = curl(&url, &["--cacert", &ca, "--user", &good]).await;
    assert_eq!((ok.exit, ok.status), (0, 200), "{ok:?}");
    // A client certificate nobody asked for changes nothing.
    let (cert, key) = (arg(pki.path("client.crt")), arg(pki.path("client.key")));
    let extra_cert = curl(
        &url,
        &[
            "--cacert", &ca, "--cert", &cert, "--key", &key, "--user", &good,
        ],
    )
    .await;
    assert_eq!(
        (extra_cert.exit, extra_cert.status),
        (0, 200),
        "{extra_cert:?}"
    );
    unauthorized("no --user", &curl(&url, &["--cacert", &ca]).await);
    // Basic auth is checked on HEAD too.
    let head = curl(&url, &["--cacert", &ca, "--head"]).await;
    assert_eq!(head.status, 401, "{head:?}");
    let untrusted = curl(&url, &["--user", &good]).await;
    assert_eq!((untrusted.exit, untrusted.status), (60, 0), "{untrusted:?}");
    let (code, lines) = daemon.stop().await;
    assert_eq!(scheme(&lines), "https");
    assert_eq!(code, Some(0));
}

/// Basic auth over plain HTTP (no TLS section): 200 with the password, 401
/// without; a TLS handshake to it fails.
#[tokio::test]
async fn basic_auth_alone_serves_plain_http() {
    let (db, statsd, pki) = parts().await;
    let (mut daemon, addr) = serve(&db, &statsd, &pki, &users(&bcrypt(PASSWORD))).await;
    let url = format!("http://{addr}/metrics");
    let good = format!("{USER}:{PASSWORD}");

    let ok = curl(&url, &["--user", &good]).await;
    assert_eq!((ok.exit, ok.status), (0, 200), "{ok:?}");
    unauthorized("no --user", &curl(&url, &[]).await);
    let ca = arg(pki.path("ca.crt"));
    let tls = curl(&https_url(addr), &["--cacert", &ca, "--user", &good]).await;
    assert!(tls.failed_in_tls(), "{tls:?}");
    let (code, lines) = daemon.stop().await;
    assert_eq!(scheme(&lines), "http");
    assert_eq!(code, Some(0));
}

/// An unknown user costs what a known one with a wrong password does, so
/// timing does not tell who exists: at cost 10 (a bcrypt of tens of
/// milliseconds) the medians stay within a factor of two, where skipping
/// the comparison for an unknown user would answer in a fraction of it.
#[tokio::test]
async fn unknown_user_takes_as_long_as_a_wrong_password() {
    const TRIES: usize = 7;
    let (db, statsd, pki) = parts().await;
    let hash = htpasswd(USER, PASSWORD, 10);
    let (mut daemon, addr) = serve(&db, &statsd, &pki, &users(&hash)).await;
    let url = format!("http://{addr}/metrics");

    let (mut known, mut unknown) = (Vec::new(), Vec::new());
    for i in 0..TRIES {
        // A new wrong password each time, so no cached verdict answers.
        for (user, times) in [(USER, &mut known), ("nobody-here", &mut unknown)] {
            let credentials = format!("{user}:wrong-{i}");
            let started = std::time::Instant::now();
            let got = curl(&url, &["--user", &credentials]).await;
            times.push(started.elapsed());
            assert_eq!(got.status, 401, "{user}: {got:?}");
        }
    }
    known.sort();
    unknown.sort();
    let (known, unknown) = (known[TRIES / 2], unknown[TRIES / 2]);
    let ratio = unknown.as_secs_f64() / known.as_secs_f64();
    assert!(
        (0.5..=2.0).contains(&ratio),
        "median 401 for an unknown user {unknown:?}, for a known one {known:?}"
    );
    let (code, _) = daemon.stop().await;
    assert_eq!(code, Some(0));
}

/// Credentials read as Go's `Request.BasicAuth` reads them: the scheme in
/// any case, the password after the first colon (so it may hold colons),
/// UTF-8 names and passwords; padded base64 only, one space, the first
/// header. Anything else is a 401, never a 400 or a 500.
#[tokio::test]
async fn basic_credentials_are_read_as_the_toolkit_reads_them() {
    let (db, statsd, pki) = parts().await;
    let (mut daemon, addr) = serve(
        &db,
        &statsd,
        &pki,
        &format!(
            "basic_auth_users:\n  colon: '{}'\n  'ü': '{}'\n",
            htpasswd("colon", "pa:ss", 4),
            htpasswd("ü", "pässwörd", 4)
        ),
    )
    .await;
    let url = format!("http://{addr}/metrics");
    let b64 = |s: &str| {
        let out = std::process::Command::new(crate::support::tool("base64", "coreutils"))
            .args(["-w", "0"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                std::io::Write::write_all(&mut child.stdin.take().unwrap(), s.as_bytes())?;
                child.wait_with_output()
            })
            .expect("running base64");
        String::from_utf8(out.stdout).unwrap()
    };
    let good = b64("colon:pa:ss");
    let cases = [
        ("a password with a colon", format!("Basic {good}"), 200),
        (
            "UTF-8 name and password",
            format!("Basic {}", b64("ü:pässwörd")),
            200,
        ),
        ("the scheme in lower case", format!("basic {good}"), 200),
        ("the scheme in upper case", format!("BASIC {good}"), 200),
        ("three spaces", format!("Basic   {good}"), 401),
        (
            "base64 without padding",
            format!("Basic {}", good.trim_end_matches('=')),
            401,
        ),
        ("not base64", "Basic !!!".to_owned(), 401),
        ("no colon", format!("Basic {}", b64("colonpa")), 401),
        ("another scheme", "Bearer abc".to_owned(), 401),
        ("nothing", String::new(), 401),
    ];
    let mut wrong = Vec::new();
    for (what, header, status) in &cases {
        let got = curl(&url, &["-H", &format!("Authorization: {header}")]).await;
        if got.status != *status {
            wrong.push(format!("{what}: wanted {status}, got {got:?}"));
        }
    }
    let first_wins = curl(
        &url,
        &[
            "-H",
            &format!("Authorization: Basic {}", b64("colon:wrong")),
            "-H",
            &format!("Authorization: Basic {good}"),
        ],
    )
    .await;
    if first_wins.status != 401 {
        wrong.push(format!("two headers, the first wrong: {first_wins:?}"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let (code, _) = daemon.stop().await;
    assert_eq!(code, Some(0));
}

/// The right password's verdict is cached, as the toolkit caches it: at
/// cost 12 the first request pays for a bcrypt, the next ones do not.
#[tokio::test]
async fn a_known_good_password_is_not_hashed_again() {
    let (db, statsd, pki) = parts().await;
    let (mut daemon, addr) = serve(&db, &statsd, &pki, &users(&htpasswd(USER, PASSWORD, 12))).await;
    let (url, good) = (
        format!("http://{addr}/metrics"),
        format!("{USER}:{PASSWORD}"),
    );
    let mut took = Vec::new();
    for _ in 0..4 {
        let started = std::time::Instant::now();
        assert_eq!(curl(&url, &["--user", &good]).await.status, 200);
        took.push(started.elapsed());
    }
    let slowest_again = *took[1..].iter().max().unwrap();
    assert!(
        slowest_again * 4 < took[0],
        "the first request took {:?}, the later ones up to {slowest_again:?}",
        took[0]
    );
    let (code, _) = daemon.stop().await;
    assert_eq!(code, Some(0));
}
