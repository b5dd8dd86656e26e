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
use crate::web_config::support::{
    CheckLine, Pki, bcrypt, check_web_config, promtool_accepts, unprivileged_reader, write_config,
};

/// A password written where a hash belongs: refused, and never printed.
const PLAINTEXT: &str = "plaintext-secret-77";

/// One file of the corpus: its name, text, the toolkit's verdict (as
/// `promtool` gave it when the corpus was written; the test asks again),
/// and words one of which a refusal must say (the field, or its value).
struct Case {
    name: &'static str,
    text: String,
    valid: bool,
    fields: &'static [&'static str],
}

fn case(name: &'static str, text: &str, valid: bool, fields: &'static [&'static str]) -> Case {
    Case {
        name,
        text: text.to_owned(),
        valid,
        fields,
    }
}

const TLS: &str = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n";

/// TLS with the server certificate (relative paths) plus `extra` lines.
fn tls(extra: &str) -> String {
    format!("{TLS}{extra}")
}

/// The corpus, its hashes made from `hash` (a good one, cost 4).
fn corpus(hash: &str) -> Vec<Case> {
    let users = |h: &str| format!("basic_auth_users:\n  scraper: '{h}'\n");
    let with_cost = |cost: &str| hash.replacen("$04$", &format!("${cost}$"), 1);
    let auth = users(hash);
    let mut cases = vec![
        // Valid: each shape an operator may write.
        case("tls-only", TLS, true, &[]),
        case(
            "tls-no-client-cert",
            &tls("  client_auth_type: NoClientCert\n"),
            true,
            &[],
        ),
        case(
            "tls-request-client-cert",
            &tls("  client_auth_type: RequestClientCert\n  client_ca_file: ca.crt\n"),
            true,
            &[],
        ),
        case(
            "tls-require-any-client-cert",
            &tls("  client_auth_type: RequireAnyClientCert\n  client_ca_file: ca.crt\n"),
            true,
            &[],
        ),
        case(
            "tls-verify-client-cert-if-given",
            &tls("  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.crt\n"),
            true,
            &[],
        ),
        case(
            "tls-require-and-verify",
            &tls("  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"),
            true,
            &[],
        ),
        // The toolkit's older name for RequireAnyClientCert, still accepted.
        case(
            "tls-require-client-cert-alias",
            &tls("  client_auth_type: RequireClientCert\n  client_ca_file: ca.crt\n"),
            true,
            &[],
        ),
        // The toolkit in Prometheus 2.42 accepts this (its check does not
        // ask for the CA): agreement means accepting it too.
        case(
            "tls-require-and-verify-without-ca",
            &tls("  client_auth_type: RequireAndVerifyClientCert\n"),
            true,
            &[],
        ),
        case("basic-auth-over-http", &auth, true, &[]),
        case(
            "basic-auth-2a-2b-2y",
            &format!(
                "basic_auth_users:\n  a: '{}'\n  b: '{}'\n  y: '{hash}'\n",
                hash.replacen("$2y$", "$2a$", 1),
                hash.replacen("$2y$", "$2b$", 1)
            ),
            true,
            &[],
        ),
        case("tls-and-basic-auth", &format!("{TLS}{auth}"), true, &[]),
        case(
            "headers",
            "http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000\n    X-Content-Type-Options: nosniff\n    X-Frame-Options: sameorigin\n    X-XSS-Protection: \"1; mode=block\"\n    Content-Security-Policy: \"default-src 'none'\"\n",
            true,
            &[],
        ),
        case(
            "http2-off",
            "http_server_config:\n  http2: false\n",
            true,
            &[],
        ),
        case(
            "versions-12-13",
            &tls("  min_version: TLS12\n  max_version: TLS13\n"),
            true,
            &[],
        ),
        case("version-13-only", &tls("  min_version: TLS13\n"), true, &[]),
        case(
            "cipher-suites",
            &tls(
                "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]\n",
            ),
            true,
            &[],
        ),
        case(
            "curves",
            &tls("  curve_preferences: [X25519, CurveP256, CurveP384]\n"),
            true,
            &[],
        ),
        case(
            "prefer-server-cipher-suites",
            &tls("  prefer_server_cipher_suites: true\n"),
            true,
            &[],
        ),
        case("empty-tls-section", "tls_server_config: {}\n", true, &[]),
        case(
            "empty-cert-and-key",
            "tls_server_config:\n  cert_file: \"\"\n  key_file: \"\"\n",
            true,
            &[],
        ),
        case("empty-file", "", true, &[]),
        case(
            "comments-only",
            "# the endpoint stays plain HTTP\n",
            true,
            &[],
        ),
        case(
            "expired-certificate",
            "tls_server_config:\n  cert_file: expired.crt\n  key_file: expired.key\n",
            true,
            &[],
        ),
        case(
            "sub/relative-up",
            "tls_server_config:\n  cert_file: ../server.crt\n  key_file: ../server.key\n",
            true,
            &[],
        ),
        // Invalid: each kind of refusal.
        case(
            "unknown-top-level-key",
            &format!("{TLS}listen_address: 0.0.0.0\n"),
            false,
            &["listen_address"],
        ),
        case(
            "unknown-nested-key",
            &tls("  cert_chain: ca.crt\n"),
            false,
            &["cert_chain"],
        ),
        case(
            "inline-cert-and-key",
            "tls_server_config:\n  cert: x\n  key: y\n",
            false,
            &["cert", "key"],
        ),
        case(
            "client-allowed-sans",
            &tls(
                "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n  client_allowed_sans: [client]\n",
            ),
            false,
            &["client_allowed_sans"],
        ),
        case(
            "cert-without-key",
            "tls_server_config:\n  cert_file: server.crt\n",
            false,
            &["key_file"],
        ),
        case(
            "key-without-cert",
            "tls_server_config:\n  key_file: server.key\n",
            false,
            &["cert_file"],
        ),
        case(
            "client-ca-without-client-auth-type",
            &tls("  client_ca_file: ca.crt\n"),
            false,
            &["client_ca_file"],
        ),
        case(
            "client-ca-with-no-client-cert",
            &tls("  client_auth_type: NoClientCert\n  client_ca_file: ca.crt\n"),
            false,
            &["client_ca_file"],
        ),
        case(
            "ca-without-cert",
            "tls_server_config:\n  client_ca_file: ca.crt\n",
            false,
            &["cert_file"],
        ),
        case(
            "missing-cert-file",
            "tls_server_config:\n  cert_file: nowhere.crt\n  key_file: server.key\n",
            false,
            &["cert_file", "nowhere.crt"],
        ),
        case(
            "sub/relative-to-cwd",
            TLS,
            false,
            &["cert_file", "server.crt"],
        ),
        case(
            "key-not-matching-cert",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server2.key\n",
            false,
            &["key_file", "cert_file"],
        ),
        case(
            "bad-client-auth-type",
            &tls("  client_auth_type: requireandverifyclientcert\n  client_ca_file: ca.crt\n"),
            false,
            &["client_auth_type", "requireandverifyclientcert"],
        ),
        case(
            "missing-client-ca-file",
            &tls(
                "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: nowhere-ca.crt\n",
            ),
            false,
            &["client_ca_file", "nowhere-ca.crt"],
        ),
        case(
            "bad-min-version",
            &tls("  min_version: TLS14\n"),
            false,
            &["min_version", "TLS14"],
        ),
        case(
            "bad-max-version",
            &tls("  max_version: SSL30\n"),
            false,
            &["max_version", "SSL30"],
        ),
        case(
            "numeric-version",
            &tls("  min_version: 771\n"),
            false,
            &["min_version", "771"],
        ),
        case(
            "unknown-cipher-suite",
            &tls("  cipher_suites: [TLS_FOO_WITH_BAR]\n"),
            false,
            &["cipher_suites", "TLS_FOO_WITH_BAR"],
        ),
        case(
            "unknown-curve",
            &tls("  curve_preferences: [CurveP999]\n"),
            false,
            &["curve_preferences", "CurveP999"],
        ),
        case(
            "disallowed-header",
            "http_server_config:\n  headers:\n    X-Powered-By: lease-sweeper\n",
            false,
            &["X-Powered-By"],
        ),
        case(
            "header-name-case",
            "http_server_config:\n  headers:\n    x-frame-options: deny\n",
            false,
            &["x-frame-options"],
        ),
        case(
            "disallowed-header-value",
            "http_server_config:\n  headers:\n    X-Frame-Options: allowall\n",
            false,
            &["X-Frame-Options", "allowall"],
        ),
        case(
            "disallowed-nosniff-value",
            "http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n",
            false,
            &["X-Content-Type-Options"],
        ),
        case(
            "http2-not-a-bool",
            "http_server_config:\n  http2: maybe\n",
            false,
            &["http2"],
        ),
        case(
            "plaintext-password",
            &users(PLAINTEXT),
            false,
            &["basic_auth_users", "scraper"],
        ),
        case(
            "empty-hash",
            &users(""),
            false,
            &["basic_auth_users", "scraper"],
        ),
        case(
            "bcrypt-cost-32",
            &users(&with_cost("32")),
            false,
            &["basic_auth_users", "scraper"],
        ),
        case(
            "bcrypt-cost-3",
            &users(&with_cost("03")),
            false,
            &["basic_auth_users", "scraper"],
        ),
        case(
            "bcrypt-version-3",
            &users(&hash.replacen("$2y$", "$3y$", 1)),
            false,
            &["basic_auth_users", "scraper"],
        ),
        case(
            "users-not-a-map",
            "basic_auth_users: [scraper]\n",
            false,
            &["basic_auth_users"],
        ),
        case(
            "duplicate-user",
            &format!("basic_auth_users:\n  scraper: '{hash}'\n  scraper: '{hash}'\n"),
            false,
            &["scraper"],
        ),
        case("malformed-yaml", "tls_server_config: [\n", false, &[]),
        case(
            "tab-indented",
            "tls_server_config:\n\tcert_file: server.crt\n",
            false,
            &[],
        ),
    ];
    cases.sort_by_key(|c| c.name);
    cases
}

/// What must never appear in anything `check` prints: passwords, hashes,
/// private keys.
fn secrets(pki: &Pki, hash: &str) -> Vec<String> {
    let mut secrets = vec![PLAINTEXT.to_owned(), hash.to_owned()];
    // The hash's salt and digest, whatever its prefix or cost.
    secrets.push(hash[7..].to_owned());
    for key in ["server.key", "server2.key", "expired.key", "ca.key"] {
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
/// that leave no suite): `check` refuses each, naming what it cannot do,
/// rather than quietly serving something else. The only disagreements.
#[tokio::test]
async fn what_rustls_cannot_serve_is_refused_by_name() {
    let db = TestDb::new().await;
    let pki = Pki::new();
    let cases: [(&str, &[&str]); 7] = [
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
    ];
    for (extra, words) in cases {
        let file = write_config(&pki.dir, "web.yml", &tls(extra));
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
