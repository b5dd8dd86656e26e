//! The files `check` and `promtool` must agree on: each shape of valid
//! file the toolkit accepts and each kind of file it refuses, with the
//! toolkit's verdict as `promtool` gave it, and the key material some of
//! them name beyond the shared PKI (other key formats, chains, an
//! encrypted key). It runs nothing but `openssl`.

use crate::web_config::support::Pki;

/// A password written where a hash belongs: refused, and never printed.
pub const PLAINTEXT: &str = "plaintext-secret-77";

/// One file of the corpus: its name, text, the toolkit's verdict (as
/// `promtool` gave it when the corpus was written; the test asks again),
/// and words one of which a refusal must say (the field, or its value).
pub struct Case {
    pub name: &'static str,
    pub text: String,
    pub valid: bool,
    pub fields: &'static [&'static str],
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
pub fn tls(extra: &str) -> String {
    format!("{TLS}{extra}")
}

/// Key material beyond the shared PKI, in its directory: the server key
/// as SEC1 (`sec1.key`) and encrypted PKCS#8 (`encrypted.key`), an RSA key
/// in PKCS#1 with a self-signed certificate (`rsa.key`, `rsa.crt`), the
/// server certificate followed by its CA (`chain.crt`) and the reverse
/// (`reversed-chain.crt`, whose first certificate is not the key's).
pub fn extra_material(pki: &Pki) {
    pki.openssl(&["ec", "-in", "server.key", "-out", "sec1.key"], false);
    pki.openssl(
        &[
            "pkcs8",
            "-topk8",
            "-in",
            "server.key",
            "-passout",
            "pass:unused-77",
            "-out",
            "encrypted.key",
        ],
        false,
    );
    pki.openssl(
        &["genrsa", "-traditional", "-out", "rsa.key", "2048"],
        false,
    );
    pki.openssl(
        &[
            "req", "-x509", "-new", "-key", "rsa.key", "-subj", "/CN=rsa", "-days", "30", "-out",
            "rsa.crt",
        ],
        false,
    );
    let (server, ca) = (pki.text("server.crt"), pki.text("ca.crt"));
    std::fs::write(pki.path("chain.crt"), format!("{server}{ca}")).unwrap();
    std::fs::write(pki.path("reversed-chain.crt"), format!("{ca}{server}")).unwrap();
    for key in ["sec1.key", "encrypted.key", "rsa.key"] {
        crate::web_config::support::readable(&pki.path(key));
    }
}

/// Keys whose text must never be printed, beyond the shared PKI's.
pub const EXTRA_KEYS: [&str; 3] = ["sec1.key", "encrypted.key", "rsa.key"];

/// The corpus, its hashes made from `hash` (a good one, cost 4).
pub fn corpus(hash: &str) -> Vec<Case> {
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
        // Edges of the key material and of YAML, each as the toolkit judges it.
        case(
            "sec1-key",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: sec1.key\n",
            true,
            &[],
        ),
        case(
            "rsa-pkcs1-key",
            "tls_server_config:\n  cert_file: rsa.crt\n  key_file: rsa.key\n",
            true,
            &[],
        ),
        case(
            "chain",
            "tls_server_config:\n  cert_file: chain.crt\n  key_file: server.key\n",
            true,
            &[],
        ),
        case(
            "reversed-chain",
            "tls_server_config:\n  cert_file: reversed-chain.crt\n  key_file: server.key\n",
            false,
            &["key_file", "cert_file"],
        ),
        case(
            "encrypted-key",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: encrypted.key\n",
            false,
            &["key_file"],
        ),
        case(
            "cert-file-a-directory",
            "tls_server_config:\n  cert_file: sub\n  key_file: server.key\n",
            false,
            &["cert_file"],
        ),
        case(
            "yaml-1-1-booleans",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  prefer_server_cipher_suites: yes\nhttp_server_config:\n  http2: on\n",
            true,
            &[],
        ),
        case("document-markers", &format!("---\n{TLS}...\n"), true, &[]),
        case("crlf-line-ends", &TLS.replace('\n', "\r\n"), true, &[]),
        case(
            "empty-users-and-headers",
            "basic_auth_users: {}\nhttp_server_config:\n  headers: {}\n",
            true,
            &[],
        ),
        case(
            "number-as-path",
            "tls_server_config:\n  cert_file: 123\n  key_file: server.key\n",
            false,
            &["cert_file"],
        ),
        case("top-level-list", "- tls_server_config\n", false, &[]),
        case(
            "key-in-other-case",
            "TLS_Server_Config:\n  cert_file: server.crt\n",
            false,
            &["TLS_Server_Config"],
        ),
        case(
            "header-value-case",
            "http_server_config:\n  headers:\n    X-Frame-Options: DENY\n",
            false,
            &["X-Frame-Options"],
        ),
        case(
            "header-without-value",
            "http_server_config:\n  headers:\n    X-Frame-Options:\n",
            false,
            &["X-Frame-Options"],
        ),
        case(
            "hash-with-leading-space",
            &format!("basic_auth_users:\n  scraper: ' {hash}'\n"),
            false,
            &["basic_auth_users", "scraper"],
        ),
        case(
            "header-value-utf-8",
            "http_server_config:\n  headers:\n    Content-Security-Policy: \"default-src 'self'; report-to café\"\n",
            true,
            &[],
        ),
    ];
    cases.sort_by_key(|c| c.name);
    cases
}
