//! `lease-sweeper check` and Debian's `promtool check web-config` (the
//! exporter toolkit's own validation) agree on every file of a corpus:
//! valid ones of each shape the toolkit accepts and invalid ones of each
//! kind it refuses. Each refusal names the file and the field and prints no
//! secret (password, hash, private key). The corpus is written next to a
//! throwaway PKI, so relative paths resolve against the file's directory.
//! The one kind of file where they differ, on purpose, is what the toolkit
//! accepts and rustls cannot serve: `check` refuses it by name.

use std::path::{Path, PathBuf};

use crate::support::TestDb;
use crate::web_config::corpus::{EXTRA_KEYS, PLAINTEXT, corpus, extra_material, tls};
use crate::web_config::support::{
    CheckLine, Pki, bcrypt, check_web_config, promtool_accepts, unprivileged_reader, write_config,
};

/// What must never appear in anything `check` prints: passwords, hashes,
/// private keys.
fn secrets(pki: &Pki, hash: &str) -> Vec<String> {
    let mut secrets = vec![PLAINTEXT.to_owned(), hash.to_owned()];
    // The hash's salt and digest, whatever its prefix or cost.
    secrets.push(hash[7..].to_owned());
    for key in ["server.key", "server2.key", "expired.key", "ca.key"]
        .into_iter()
        .chain(EXTRA_KEYS)
    {
        secrets.extend(pki.key_secrets(key));
    }
    secrets
}

/// Where a check line disagrees with the toolkit or says too little.
fn judge(
    case_valid: bool,
    file: &Path,
    line: &CheckLine,
    fields: &[&str],
    secrets: &[String],
) -> Vec<String> {
    let mut wrong = Vec::new();
    let valid = matches!(line.status.as_str(), "ok" | "warn");
    if valid != case_valid || !matches!(line.status.as_str(), "ok" | "warn" | "FAIL") {
        wrong.push(format!(
            "status {} (toolkit: {})",
            line.status,
            if case_valid { "valid" } else { "invalid" }
        ));
    }
    if line.status == "FAIL" {
        if !line.detail.contains(&file.display().to_string()) {
            wrong.push("does not name the file".into());
        }
        if !fields.is_empty() && !fields.iter().any(|f| line.detail.contains(f)) {
            wrong.push(format!("names none of {fields:?}"));
        }
    }
    if let Some(s) = secrets.iter().find(|s| line.output.contains(s.as_str())) {
        wrong.push(format!("prints a secret ({}…)", &s[..6.min(s.len())]));
    }
    wrong
}

#[tokio::test]
async fn check_agrees_with_promtool_on_every_file() {
    let db = TestDb::new().await;
    let pki = Pki::new();
    let hash = bcrypt("agreed-password");
    std::fs::create_dir_all(pki.path("sub")).unwrap();
    extra_material(&pki);
    let secrets = secrets(&pki, &hash);
    let expiry = pki.not_after("expired.crt");
    let mut files: Vec<(String, PathBuf, bool, &[&str])> = Vec::new();
    for case in corpus(&hash) {
        let path = write_config(&pki.dir, &format!("{}.yml", case.name), &case.text);
        files.push((case.name.to_owned(), path, case.valid, case.fields));
    }
    // Not files at all: a directory, and a path with nothing there.
    files.push(("a-directory".into(), pki.path("sub"), false, &[]));
    files.push(("missing-file".into(), pki.path("nowhere.yml"), false, &[]));

    let mut disagreements = Vec::new();
    for (name, path, valid, fields) in &files {
        let (promtool_valid, said) = promtool_accepts(path, None, &pki.dir);
        assert_eq!(
            promtool_valid, *valid,
            "{name}: the toolkit's verdict changed: {said}"
        );
        let line = check_web_config(&db.url, path, None, &pki.dir).await;
        for wrong in judge(*valid, path, &line, fields, &secrets) {
            disagreements.push(format!(
                "{name}: {wrong}\n    check: {} {}\n    promtool: {}",
                line.status,
                line.detail,
                said.trim()
            ));
        }
        if name == "expired-certificate" && line.status != "warn" {
            disagreements.push(format!(
                "{name}: {} instead of warn: {}",
                line.status, line.detail
            ));
        }
        if name == "expired-certificate" && !line.detail.contains(&expiry) {
            disagreements.push(format!(
                "{name}: the warning does not give the expiry {expiry}: {}",
                line.detail
            ));
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} of {} files:\n{}",
        disagreements.len(),
        files.len(),
        disagreements.join("\n")
    );
}

/// A file its reader may not open is refused by both, naming the file. As
/// root, mode 000 stops nobody, so both read it as `nobody`.
#[tokio::test]
async fn unreadable_file_is_refused_by_both() {
    use std::os::unix::fs::PermissionsExt as _;
    let db = TestDb::new().await;
    let pki = Pki::new();
    let file = write_config(&pki.dir, "web.yml", &tls(""));
    let reader = unprivileged_reader();
    // Readable, it is valid for that reader: the refusal below is the mode's.
    assert!(promtool_accepts(&file, reader, &pki.dir).0);
    let line = check_web_config(&db.url, &file, reader, &pki.dir).await;
    assert_eq!(line.status, "ok", "{}", line.output);

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o000)).unwrap();
    let (accepted, said) = promtool_accepts(&file, reader, &pki.dir);
    assert!(!accepted && said.contains("permission denied"), "{said}");
    let line = check_web_config(&db.url, &file, reader, &pki.dir).await;
    assert_eq!(line.status, "FAIL", "{}", line.output);
    assert!(
        line.detail.contains(&file.display().to_string())
            && line.detail.to_lowercase().contains("permission denied"),
        "{}",
        line.detail
    );
}

/// What the toolkit accepts and the daemon cannot serve (rustls has no
/// TLS 1.0 or 1.1, no P-521, no CBC or RSA key-exchange suites; versions
/// that leave no suite; no header carries a line break): `check` refuses
/// each, naming what it cannot do, rather than quietly serving something
/// else. The only disagreements.
#[tokio::test]
async fn what_the_daemon_cannot_serve_is_refused_by_name() {
    let db = TestDb::new().await;
    let pki = Pki::new();
    let cases: [(&str, &[&str]); 9] = [
        (
            "  cipher_suites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n",
            &["cipher_suites", "TLS_RSA_WITH_AES_128_CBC_SHA"],
        ),
        (
            "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA]\n",
            &["cipher_suites", "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA"],
        ),
        ("  min_version: TLS10\n", &["min_version", "TLS10"]),
        ("  max_version: TLS11\n", &["TLS11"]),
        (
            "  min_version: TLS13\n  max_version: TLS12\n",
            &["min_version"],
        ),
        (
            "  curve_preferences: [CurveP521]\n",
            &["curve_preferences", "CurveP521"],
        ),
        (
            "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n  max_version: TLS12\n",
            &["cipher_suites"],
        ),
        (
            "http_server_config:\n  headers:\n    Content-Security-Policy: \"a\\r\\nX-Injected: 1\"\n",
            &["http_server_config.headers.Content-Security-Policy"],
        ),
        (
            "http_server_config:\n  headers:\n    X-XSS-Protection: \"1\\0\"\n",
            &["X-XSS-Protection"],
        ),
    ];
    for (extra, words) in cases {
        // TLS lines are added to the server's TLS section; others stand alone.
        let text = if extra.starts_with("  ") {
            tls(extra)
        } else {
            extra.to_owned()
        };
        let file = write_config(&pki.dir, "web.yml", &text);
        let (accepted, said) = promtool_accepts(&file, None, &pki.dir);
        assert!(accepted, "{extra}: the toolkit's verdict changed: {said}");
        let line = check_web_config(&db.url, &file, None, &pki.dir).await;
        assert_eq!(line.status, "FAIL", "{extra}: {}", line.output);
        assert!(
            line.detail.contains(&file.display().to_string())
                && words.iter().all(|w| line.detail.contains(w)),
            "{extra}: {words:?} not all in {}",
            line.detail
        );
    }
}
