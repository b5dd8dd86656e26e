//! `run` with a web config file that is bad from the start: it exits
//! non-zero before listening, with an error naming the file, the field and
//! the problem, and no secret. The file without the endpoint's address is a
//! configuration error. An expired certificate is served (as the toolkit
//! does) with a warning.

use std::time::Duration;

use crate::observability::support::ADDR_VAR;
use crate::support::{Daemon, TestDb, daemon_env, events};
use crate::web_config::support::{
    PASSWORD, Pki, USER, WEB_CONFIG_VAR, arg, bcrypt, curl, https_url, parts, serve,
    served_certificate, users, write_config,
};

/// Runs `run` with `web` as the web config; returns its exit code and
/// every line it wrote.
async fn run_with(db: &TestDb, web: &std::path::Path) -> (Option<i32>, Vec<String>) {
    let web = web.to_str().unwrap();
    let mut env = daemon_env(&db.url, "9");
    env.push((ADDR_VAR, "127.0.0.1:0"));
    env.push((WEB_CONFIG_VAR, web));
    let mut daemon = Daemon::spawn(&env);
    let (code, _) = daemon.wait_exit(Duration::from_secs(20)).await;
    (code, daemon.lines())
}

#[tokio::test]
async fn bad_file_at_start_exits_naming_the_file_and_field() {
    let db = TestDb::new().await;
    let pki = Pki::new();
    let hash = bcrypt(PASSWORD);
    let tls = |cert: &str, key: &str| {
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            pki.path(cert).display(),
            pki.path(key).display()
        )
    };
    let mut secrets = vec![
        PASSWORD.to_owned(),
        "plaintext-secret-77".to_owned(),
        hash[7..].to_owned(),
    ];
    for key in ["server.key", "server2.key"] {
        secrets.extend(pki.key_secrets(key));
    }
    std::fs::create_dir_all(pki.path("a-directory")).unwrap();
    let cases: Vec<(&str, std::path::PathBuf, &[&str])> = vec![
        ("a directory", pki.path("a-directory"), &[]),
        ("a missing file", pki.path("nowhere.yml"), &[]),
        (
            "a key not matching its certificate",
            write_config(&pki.dir, "mismatch.yml", &tls("server.crt", "server2.key")),
            &["key_file", "cert_file"],
        ),
        (
            "bcrypt cost above 31",
            write_config(
                &pki.dir,
                "cost.yml",
                &users(&hash.replacen("$04$", "$32$", 1)),
            ),
            &["basic_auth_users", USER],
        ),
        (
            "a plaintext password",
            write_config(&pki.dir, "plain.yml", &users("plaintext-secret-77")),
            &["basic_auth_users", USER],
        ),
        (
            "an unknown key",
            write_config(
                &pki.dir,
                "unknown.yml",
                &format!(
                    "{}  cert_chain: ca.crt\n{}",
                    tls("server.crt", "server.key"),
                    users(&hash)
                ),
            ),
            &["cert_chain"],
        ),
        (
            "a missing certificate file",
            write_config(&pki.dir, "no-cert.yml", &tls("nowhere.crt", "server.key")),
            &["cert_file", "nowhere.crt"],
        ),
    ];
    for (what, web, fields) in cases {
        let (code, lines) = run_with(&db, &web).await;
        let all = lines.join("\n");
        assert!(
            matches!(code, Some(c) if c != 0),
            "{what}: exit {code:?}\n{all}"
        );
        assert!(
            events(&lines, "metrics_listening").is_empty(),
            "{what}: listened\n{all}"
        );
        let failed = events(&lines, "failed");
        assert_eq!(failed.len(), 1, "{what}: one `failed` line\n{all}");
        let error = &failed[0]["error"];
        assert!(
            error.contains(&web.display().to_string()),
            "{what}: file not named: {error}"
        );
        assert!(
            fields.is_empty() || fields.iter().any(|f| error.contains(f)),
            "{what}: names none of {fields:?}: {error}"
        );
        if let Some(s) = secrets.iter().find(|s| all.contains(s.as_str())) {
            panic!("{what}: a secret printed ({}…):\n{all}", &s[..6]);
        }
    }
}

#[tokio::test]
async fn web_config_without_the_address_is_a_configuration_error() {
    let db = TestDb::new().await;
    let pki = Pki::new();
    let web = write_config(&pki.dir, "web.yml", &users(&bcrypt(PASSWORD)));
    let web = web.to_str().unwrap();
    let mut env = daemon_env(&db.url, "9");
    env.push((WEB_CONFIG_VAR, web));
    let mut daemon = Daemon::spawn(&env);
    let (code, _) = daemon.wait_exit(Duration::from_secs(20)).await;
    let lines = daemon.lines();
    assert_eq!(code, Some(2), "{lines:?}");
    let error = &events(&lines, "failed")[0]["error"];
    assert!(
        error.contains(WEB_CONFIG_VAR) && error.contains(ADDR_VAR),
        "{error}"
    );

    // `check` reads the same variables and refuses them the same way.
    let mut check = Daemon::spawn_args(&["check"], &env);
    let (code, _) = check.wait_exit(Duration::from_secs(20)).await;
    let output = check.lines().join("\n");
    assert_eq!(code, Some(2), "{output}");
    assert!(
        output.contains(WEB_CONFIG_VAR) && output.contains(ADDR_VAR),
        "{output}"
    );
}

#[tokio::test]
async fn expired_certificate_is_served_with_a_warning() {
    let (db, statsd, pki) = parts().await;
    let (mut daemon, addr) = serve(
        &db,
        &statsd,
        &pki,
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n{}",
            pki.path("expired.crt").display(),
            pki.path("expired.key").display(),
            users(&bcrypt(PASSWORD))
        ),
    )
    .await;
    let web = pki.path("web.yml");
    daemon
        .wait_for_event("web_config_certificate_expired", Duration::from_secs(10))
        .await;
    assert_eq!(
        served_certificate(addr.port()).await.as_deref(),
        Some(pki.text("expired.crt").as_str())
    );
    // A client that checks dates refuses it; one told to accept it gets in.
    let good = format!("{USER}:{PASSWORD}");
    let ca = arg(pki.path("ca.crt"));
    let strict = curl(&https_url(addr), &["--cacert", &ca, "--user", &good]).await;
    assert_eq!((strict.exit, strict.status), (60, 0), "{strict:?}");
    let lenient = curl(&https_url(addr), &["--insecure", "--user", &good]).await;
    assert_eq!((lenient.exit, lenient.status), (0, 200), "{lenient:?}");
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    let warned = events(&lines, "web_config_certificate_expired");
    assert_eq!(warned.len(), 1, "{lines:?}");
    assert_eq!(warned[0]["level"], "warn", "{:?}", warned[0]);
    assert_eq!(warned[0]["file"], web.display().to_string());
    assert!(
        warned[0]["notAfter"].starts_with(&pki.not_after("expired.crt")),
        "{:?}",
        warned[0]
    );
}
