//! Each `client_auth_type` as the toolkit (Go's TLS server) means it, seen
//! by curl with no client certificate, one from the configured CA, and one
//! from an unrelated CA; the client CA file re-read for the next connection
//! like the server's own files; and the file's headers on every response.

use std::time::Duration;

use crate::support::events;
use crate::web_config::support::{
    Fetched, PASSWORD, Pki, Session, USER, arg, bcrypt, curl, daemon_with_web_config, https_url,
    parts, s_client_get, serve, stop_with_no_rejection, tls_config, users, write_config,
};

/// What each kind of client gets: `true` for a 200, `false` for a failed
/// handshake.
struct Expect {
    no_cert: bool,
    ca_cert: bool,
    rogue_cert: bool,
}

/// The three clients against `url`, in the order of `Expect`.
async fn three_clients(pki: &Pki, url: &str) -> [Fetched; 3] {
    let ca = arg(pki.path("ca.crt"));
    let (cert, key) = (arg(pki.path("client.crt")), arg(pki.path("client.key")));
    let (rogue, rogue_key) = (
        arg(pki.path("rogue-client.crt")),
        arg(pki.path("rogue-client.key")),
    );
    [
        curl(url, &["--cacert", &ca]).await,
        curl(url, &["--cacert", &ca, "--cert", &cert, "--key", &key]).await,
        curl(
            url,
            &["--cacert", &ca, "--cert", &rogue, "--key", &rogue_key],
        )
        .await,
    ]
}

fn judge(what: &str, got: &[Fetched; 3], expect: &Expect) -> Vec<String> {
    let wanted = [expect.no_cert, expect.ca_cert, expect.rogue_cert];
    let clients = ["no certificate", "the CA's certificate", "another CA's"];
    let mut wrong = Vec::new();
    for ((fetched, ok), client) in got.iter().zip(wanted).zip(clients) {
        let right = if ok {
            (fetched.exit, fetched.status) == (0, 200)
        } else {
            fetched.failed_in_tls()
        };
        if !right {
            wrong.push(format!(
                "{what}, {client}: wanted {}, got {fetched:?}",
                if ok { "200" } else { "a failed handshake" }
            ));
        }
    }
    wrong
}

#[tokio::test]
async fn each_client_auth_type_admits_whom_the_toolkit_does() {
    let (db, statsd, pki) = parts().await;
    let ca_file = pki.path("ca.crt").display().to_string();
    let yes = true;
    let no = false;
    let matrix = [
        (
            "NoClientCert",
            Expect {
                no_cert: yes,
                ca_cert: yes,
                rogue_cert: yes,
            },
        ),
        (
            "RequestClientCert",
            Expect {
                no_cert: yes,
                ca_cert: yes,
                rogue_cert: yes,
            },
        ),
        (
            "RequireAnyClientCert",
            Expect {
                no_cert: no,
                ca_cert: yes,
                rogue_cert: yes,
            },
        ),
        (
            "VerifyClientCertIfGiven",
            Expect {
                no_cert: yes,
                ca_cert: yes,
                rogue_cert: no,
            },
        ),
        (
            "RequireAndVerifyClientCert",
            Expect {
                no_cert: no,
                ca_cert: yes,
                rogue_cert: no,
            },
        ),
    ];
    let mut wrong = Vec::new();
    for (kind, expect) in &matrix {
        // The toolkit refuses a client CA with NoClientCert.
        let extra = match *kind {
            "NoClientCert" => format!("  client_auth_type: {kind}\n"),
            _ => format!("  client_auth_type: {kind}\n  client_ca_file: {ca_file}\n"),
        };
        let web = write_config(
            &pki.dir,
            &format!("{kind}.yml"),
            &tls_config(&pki, &extra, ""),
        );
        let (mut daemon, addr) =
            daemon_with_web_config(&db.url, &statsd.port.to_string(), &web).await;
        let got = three_clients(&pki, &https_url(addr)).await;
        wrong.extend(judge(kind, &got, expect));
        let (code, _) = daemon.stop().await;
        assert_eq!(code, Some(0), "{kind}");
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The client CA file replaced while running: the next connection is
/// verified against the new CA, as the server certificate is re-read, and
/// a TLS session the old CA let in is not resumed past the change.
#[tokio::test]
async fn replaced_client_ca_applies_to_the_next_connection() {
    let (db, statsd, pki) = parts().await;
    std::fs::copy(pki.path("ca.crt"), pki.path("clients.crt")).unwrap();
    let extra = format!(
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n",
        pki.path("clients.crt").display()
    );
    let (daemon, addr) = serve(&db, &statsd, &pki, &tls_config(&pki, &extra, "")).await;
    let before = Expect {
        no_cert: false,
        ca_cert: true,
        rogue_cert: false,
    };
    let got = three_clients(&pki, &https_url(addr)).await;
    let wrong = judge("the first client CA", &got, &before);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // A session made with the first CA resumes, with no certificate shown.
    let (ca, sessions) = (pki.path("ca.crt"), pki.path("session.pem"));
    let (cert, key, session) = (
        arg(pki.path("client.crt")),
        arg(pki.path("client.key")),
        arg(sessions.clone()),
    );
    let first = s_client_get(
        addr.port(),
        &ca,
        &["-cert", &cert, "-key", &key, "-sess_out", &session],
    )
    .await;
    let resumed = s_client_get(
        addr.port(),
        &ca,
        &["-sess_in", &session, "-sess_out", &session],
    )
    .await;
    assert_eq!(
        (first.ok, resumed),
        (
            true,
            Session {
                resumed: true,
                ok: true
            }
        )
    );

    let loaded = events(&daemon.lines(), "web_config_loaded").len();
    let tmp = pki.path("clients.crt.new");
    std::fs::copy(pki.path("rogue-ca.crt"), &tmp).unwrap();
    std::fs::rename(&tmp, pki.path("clients.crt")).unwrap();
    let after = Expect {
        no_cert: false,
        ca_cert: false,
        rogue_cert: true,
    };
    let got = three_clients(&pki, &https_url(addr)).await;
    let wrong = judge("the replaced client CA", &got, &after);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Nor does a session the old CA let in outlive it.
    let stale = s_client_get(addr.port(), &ca, &["-sess_in", &session]).await;
    assert!(
        !stale.ok,
        "a session from before the CA change got in: {stale:?}"
    );
    daemon
        .wait_for_events("web_config_loaded", loaded + 1, Duration::from_secs(10))
        .await;
    stop_with_no_rejection(daemon).await;
}

/// The file's headers on every answer: a scrape, a 401, a 404, as the
/// toolkit sets them.
#[tokio::test]
async fn configured_headers_are_on_every_response() {
    let (db, statsd, pki) = parts().await;
    let hash = bcrypt(PASSWORD);
    let headers = "http_server_config:\n  headers:\n    X-Frame-Options: deny\n    \
                   X-Content-Type-Options: nosniff\n    Strict-Transport-Security: max-age=31536000\n";
    let (mut daemon, addr) = serve(
        &db,
        &statsd,
        &pki,
        &tls_config(&pki, "", &format!("{headers}{}", users(&hash))),
    )
    .await;
    let ca = arg(pki.path("ca.crt"));
    let good = format!("{USER}:{PASSWORD}");
    let answers = [
        (
            200,
            curl(&https_url(addr), &["--cacert", &ca, "--user", &good]).await,
        ),
        (401, curl(&https_url(addr), &["--cacert", &ca]).await),
        (
            404,
            curl(
                &format!("https://{addr}/other"),
                &["--cacert", &ca, "--user", &good],
            )
            .await,
        ),
    ];
    for (status, got) in &answers {
        assert_eq!(got.status, *status, "{got:?}");
        let head = got.head.to_ascii_lowercase();
        for header in [
            "x-frame-options: deny",
            "x-content-type-options: nosniff",
            "strict-transport-security: max-age=31536000",
        ] {
            assert!(
                head.contains(header),
                "{status}: no {header} in {}",
                got.head
            );
        }
    }
    let (code, _) = daemon.stop().await;
    assert_eq!(code, Some(0));
}
