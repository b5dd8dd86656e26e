//! The web configuration file's text: its YAML read strictly into the
//! settings it names, as Prometheus's exporter toolkit reads it (unknown keys,
//! repeated keys, unknown enumeration names, headers outside the allowed set
//! and password hashes the toolkit would not take all refuse the file).
//!
//! Pure: bytes in, `Settings` or a `FieldError` out. It reads no other file
//! (`tls` turns the named certificate and key into a TLS configuration) and
//! decides nothing about serving.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

/// What is wrong with the file: the key it is about (dotted, as written in
/// the file) and the problem with what to do. Never carries a value that
/// could be a secret (a password hash, key material).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub problem: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// The security headers the toolkit lets a file set, each with the values
/// it allows (empty: any value). Any other header refuses the file, so the
/// endpoint cannot be made to send what no Prometheus exporter sends.
pub const ALLOWED_HEADERS: &[(&str, &[&str])] = &[
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

/// Who must show a client certificate, under the toolkit's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    NoClientCert,
    RequestClientCert,
    RequireAnyClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

impl ClientAuth {
    /// The toolkit's spelling, for messages and the summary.
    pub fn name(self) -> &'static str {
        match self {
            Self::NoClientCert => "NoClientCert",
            Self::RequestClientCert => "RequestClientCert",
            Self::RequireAnyClientCert => "RequireAnyClientCert",
            Self::VerifyClientCertIfGiven => "VerifyClientCertIfGiven",
            Self::RequireAndVerifyClientCert => "RequireAndVerifyClientCert",
        }
    }

    fn parse(name: &str) -> Result<Self, FieldError> {
        Ok(match name {
            "" | "NoClientCert" => Self::NoClientCert,
            "RequestClientCert" => Self::RequestClientCert,
            // The toolkit still takes the older name.
            "RequireAnyClientCert" | "RequireClientCert" => Self::RequireAnyClientCert,
            "VerifyClientCertIfGiven" => Self::VerifyClientCertIfGiven,
            "RequireAndVerifyClientCert" => Self::RequireAndVerifyClientCert,
            other => {
                return Err(FieldError::new(
                    "tls_server_config.client_auth_type",
                    format!(
                        "unknown value {other:?}; use one of NoClientCert, RequestClientCert, \
                         RequireAnyClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"
                    ),
                ));
            }
        })
    }
}

/// A TLS protocol version, under the toolkit's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    Tls10,
    Tls11,
    Tls12,
    Tls13,
}

impl TlsVersion {
    pub fn name(self) -> &'static str {
        match self {
            Self::Tls10 => "TLS10",
            Self::Tls11 => "TLS11",
            Self::Tls12 => "TLS12",
            Self::Tls13 => "TLS13",
        }
    }

    fn parse(field: &str, name: &str) -> Result<Self, FieldError> {
        Ok(match name {
            "TLS10" => Self::Tls10,
            "TLS11" => Self::Tls11,
            "TLS12" => Self::Tls12,
            "TLS13" => Self::Tls13,
            other => {
                return Err(FieldError::new(
                    field,
                    format!("unknown TLS version {other:?}; use TLS12 or TLS13"),
                ));
            }
        })
    }
}

/// A key-exchange curve, under the toolkit's (Go's) names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Curve {
    P256,
    P384,
    P521,
    X25519,
}

impl Curve {
    fn parse(name: &str) -> Result<Self, FieldError> {
        Ok(match name {
            "CurveP256" => Self::P256,
            "CurveP384" => Self::P384,
            "CurveP521" => Self::P521,
            "X25519" => Self::X25519,
            other => {
                return Err(FieldError::new(
                    "tls_server_config.curve_preferences",
                    format!("unknown curve {other:?}; use CurveP256, CurveP384 or X25519"),
                ));
            }
        })
    }
}

/// The cipher-suite names the toolkit takes: Go's list of secure suites.
/// Whether this endpoint can serve each is `tls`'s business.
pub const GO_CIPHER_SUITES: &[&str] = &[
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
];

/// The `tls_server_config` section, validated; paths already resolved
/// against the file's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_auth: ClientAuth,
    pub client_ca_file: Option<PathBuf>,
    /// Go names, each one of `GO_CIPHER_SUITES`; empty: the defaults.
    pub cipher_suites: Vec<String>,
    /// Empty: the defaults.
    pub curves: Vec<Curve>,
    pub min_version: TlsVersion,
    pub max_version: TlsVersion,
}

/// Everything the file says, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// None: plain HTTP.
    pub tls: Option<TlsSettings>,
    /// Accepted and ignored: the endpoint speaks HTTP/1.1 either way.
    pub http2: bool,
    /// Header name and value, each allowed by `ALLOWED_HEADERS`.
    pub headers: Vec<(String, String)>,
    /// User name to bcrypt hash; empty: no authentication.
    pub users: BTreeMap<String, String>,
}

/// Reads the file's bytes; `dir` is the file's own directory, which
/// relative paths in it are resolved against.
pub fn parse(bytes: &[u8], dir: &Path) -> Result<Settings, FieldError> {
    let raw = read_yaml(bytes)?;
    let http = raw.http_server_config.unwrap_or_default();
    let headers = validate_headers(
        http.headers
            .map(|h| h.0.into_iter().map(|(k, v)| (k, v.0)).collect())
            .unwrap_or_default(),
    )?;
    let mut users = BTreeMap::new();
    for (user, hash) in raw.basic_auth_users.map(|u| u.0).unwrap_or_default() {
        let hash = hash.map(|h| h.0).unwrap_or_default();
        bcrypt_cost(&hash).map_err(|problem| {
            FieldError::new(
                format!("basic_auth_users.{user}"),
                format!(
                    "{problem}; give a bcrypt hash such as `htpasswd -nbB USER PASSWORD` prints"
                ),
            )
        })?;
        users.insert(user, hash);
    }
    Ok(Settings {
        tls: tls_settings(raw.tls_server_config.unwrap_or_default(), dir)?,
        http2: http.http2.is_none_or(|b| b.0),
        headers,
        users,
    })
}

/// The YAML itself, strictly: the first document only (as the toolkit's
/// reader), an empty file or an empty document meaning every default.
fn read_yaml(bytes: &[u8]) -> Result<RawFile, FieldError> {
    let syntax = |e: serde_yaml_ng::Error| FieldError::new("(YAML)", yaml_problem(&e));
    let Some(document) = serde_yaml_ng::Deserializer::from_slice(bytes).next() else {
        return Ok(RawFile::default());
    };
    match Option::<RawFile>::deserialize(document) {
        Ok(raw) => Ok(raw.unwrap_or_default()),
        Err(e) => Err(syntax(e)),
    }
}

/// serde's message, which names the key path and the line, with any
/// string value it quotes left out: a hash put where a mapping belongs
/// would otherwise be printed.
fn yaml_problem(e: &serde_yaml_ng::Error) -> String {
    format!(
        "{}; fix the file (keys and layout as Prometheus's web configuration file)",
        without_quoted_strings(&e.to_string())
    )
}

/// `invalid type: string "…", expected …` becomes `invalid type: a string,
/// expected …` (serde quotes a value as `string "…"`, escaping quotes in it).
fn without_quoted_strings(message: &str) -> String {
    const QUOTED: &str = "string \"";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(QUOTED) {
        out.push_str(&rest[..at]);
        out.push_str("a string");
        let value = &rest[at + QUOTED.len()..];
        let mut escaped = false;
        let end = value
            .char_indices()
            .find(|&(_, c)| {
                let closes = c == '"' && !escaped;
                escaped = c == '\\' && !escaped;
                closes
            })
            .map_or(value.len(), |(i, _)| i + 1);
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}

fn tls_settings(raw: RawTls, dir: &Path) -> Result<Option<TlsSettings>, FieldError> {
    let field = |name: &str| format!("tls_server_config.{name}");
    let text = |s: Option<GoString>| s.map(|s| s.0).unwrap_or_default();
    let cert_file = text(raw.cert_file);
    let key_file = text(raw.key_file);
    let client_auth_type = text(raw.client_auth_type);
    let client_ca_file = text(raw.client_ca_file);
    // Names are checked whether or not TLS is on, as the toolkit reads
    // them with the YAML.
    let cipher_suites = raw.cipher_suites.unwrap_or_default();
    for name in &cipher_suites {
        if !GO_CIPHER_SUITES.contains(&name.0.as_str()) {
            return Err(FieldError::new(
                field("cipher_suites"),
                format!(
                    "unknown cipher suite {:?}; use Go's names, such as \
                     TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
                    name.0
                ),
            ));
        }
    }
    let curves = raw
        .curve_preferences
        .unwrap_or_default()
        .iter()
        .map(|c| Curve::parse(&c.0))
        .collect::<Result<Vec<_>, _>>()?;
    let version = |name: &str, v: Option<GoString>, default| match v {
        None => Ok(default),
        Some(v) => TlsVersion::parse(&field(name), &v.0),
    };
    let min_version = version("min_version", raw.min_version, TlsVersion::Tls12)?;
    let max_version = version("max_version", raw.max_version, TlsVersion::Tls13)?;
    if cert_file.is_empty()
        && key_file.is_empty()
        && client_auth_type.is_empty()
        && client_ca_file.is_empty()
    {
        return Ok(None);
    }
    if cert_file.is_empty() {
        return Err(FieldError::new(
            field("cert_file"),
            "missing: TLS needs the server certificate's file (PEM), and key_file",
        ));
    }
    if key_file.is_empty() {
        return Err(FieldError::new(
            field("key_file"),
            "missing: TLS needs the server's private key file (PEM), and cert_file",
        ));
    }
    let client_auth = ClientAuth::parse(&client_auth_type)?;
    if !client_ca_file.is_empty() && client_auth == ClientAuth::NoClientCert {
        return Err(FieldError::new(
            field("client_ca_file"),
            "set without client_auth_type: set client_auth_type (RequireAndVerifyClientCert, \
             say) or remove client_ca_file",
        ));
    }
    Ok(Some(TlsSettings {
        cert_file: join_dir(dir, &cert_file),
        key_file: join_dir(dir, &key_file),
        client_auth,
        client_ca_file: (!client_ca_file.is_empty()).then(|| join_dir(dir, &client_ca_file)),
        cipher_suites: cipher_suites.into_iter().map(|c| c.0).collect(),
        curves,
        min_version,
        max_version,
    }))
}

/// A path in the file: absolute as written, else relative to the file's
/// own directory (not to the daemon's working directory).
fn join_dir(dir: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        dir.join(path)
    }
}

/// Each header must be one of `ALLOWED_HEADERS`, spelt as there, with one
/// of its values when it lists any.
pub fn validate_headers(
    headers: Vec<(String, String)>,
) -> Result<Vec<(String, String)>, FieldError> {
    for (name, value) in &headers {
        let field = format!("http_server_config.headers.{name}");
        let Some((_, allowed)) = ALLOWED_HEADERS.iter().find(|(n, _)| n == name) else {
            let names: Vec<&str> = ALLOWED_HEADERS.iter().map(|(n, _)| *n).collect();
            return Err(FieldError::new(
                field,
                format!(
                    "this header cannot be set; the ones that can: {}",
                    names.join(", ")
                ),
            ));
        };
        if !allowed.is_empty() && !allowed.contains(&value.as_str()) {
            return Err(FieldError::new(
                field,
                format!("value {value:?} not allowed; use one of {allowed:?}"),
            ));
        }
        if hyper::header::HeaderValue::from_bytes(value.as_bytes()).is_err() {
            return Err(FieldError::new(
                field,
                "the value has characters a header cannot carry (a line break, say)",
            ));
        }
    }
    Ok(headers)
}

/// The bcrypt cost of `hash`, refusing what the toolkit's bcrypt refuses
/// when it reads a hash's cost: shorter than a bcrypt hash, not starting
/// with `$`, a version newer than 2, or a cost outside 4..=31. Like the
/// toolkit it does not decode the salt and digest: a hash that passes but
/// is damaged matches no password.
pub fn bcrypt_cost(hash: &str) -> Result<u32, String> {
    const MIN_HASH_LEN: usize = 59;
    let b = hash.as_bytes();
    if b.len() < MIN_HASH_LEN {
        return Err("too short to be a bcrypt hash".into());
    }
    if b[0] != b'$' {
        return Err("a bcrypt hash starts with `$2`".into());
    }
    if b[1] > b'2' {
        return Err("bcrypt hash version newer than 2".into());
    }
    let cost_at = if b[2] == b'$' { 3 } else { 4 };
    let digits = std::str::from_utf8(&b[cost_at..cost_at + 2]).unwrap_or("");
    let cost: i64 = digits
        .strip_prefix('+')
        .unwrap_or(digits)
        .parse()
        .map_err(|_| "the bcrypt cost is not a number".to_owned())?;
    if !(4..=31).contains(&cost) {
        return Err(format!(
            "bcrypt cost {cost} is outside the allowed range 4 to 31"
        ));
    }
    Ok(cost as u32)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename = "web configuration")]
struct RawFile {
    tls_server_config: Option<RawTls>,
    http_server_config: Option<RawHttp>,
    basic_auth_users: Option<UniqueMap<Option<GoString>>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename = "tls_server_config")]
struct RawTls {
    cert_file: Option<GoString>,
    key_file: Option<GoString>,
    client_auth_type: Option<GoString>,
    client_ca_file: Option<GoString>,
    cipher_suites: Option<Vec<GoString>>,
    curve_preferences: Option<Vec<GoString>>,
    min_version: Option<GoString>,
    max_version: Option<GoString>,
    // Read for strictness only: rustls always chooses the suite itself.
    #[allow(dead_code)]
    prefer_server_cipher_suites: Option<GoBool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename = "http_server_config")]
struct RawHttp {
    http2: Option<GoBool>,
    headers: Option<UniqueMap<GoString>>,
}

/// A string as the toolkit's YAML reader takes one: any scalar, written as
/// it stands (`cert_file: 123` names the file `123`).
struct GoString(String);

impl<'de> Deserialize<'de> for GoString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = GoString;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<GoString, E> {
                Ok(GoString(v.to_owned()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<GoString, E> {
                Ok(GoString(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<GoString, E> {
                Ok(GoString(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<GoString, E> {
                Ok(GoString(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<GoString, E> {
                Ok(GoString(v.to_string()))
            }
        }
        d.deserialize_str(V)
    }
}

/// A boolean as the toolkit's YAML reader takes one: YAML 1.1's words
/// (`yes`, `on`, ...) as well as `true` and `false`.
struct GoBool(bool);

impl<'de> Deserialize<'de> for GoBool {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = GoBool;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("true or false")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<GoBool, E> {
                Ok(GoBool(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<GoBool, E> {
                match v {
                    "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True"
                    | "TRUE" => Ok(GoBool(true)),
                    "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False"
                    | "FALSE" => Ok(GoBool(false)),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A mapping whose keys may each appear once (a repeated key refuses the
/// file, as in the toolkit's strict reading), in the file's order.
struct UniqueMap<T>(Vec<(String, T)>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for UniqueMap<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = UniqueMap<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueMap<T>, A::Error> {
                let mut entries: Vec<(String, T)> = Vec::new();
                while let Some(key) = map.next_key::<GoString>()? {
                    let value = map.next_value::<T>()?;
                    if entries.iter().any(|(k, _)| *k == key.0) {
                        return Err(de::Error::custom(format_args!(
                            "key {:?} appears twice",
                            key.0
                        )));
                    }
                    entries.push((key.0, value));
                }
                Ok(UniqueMap(entries))
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "$2y$04$abcdefghijklmnopqrstuuJm1Dm3MjfPW1l0nOmNFSMdHGhFu7q6a";

    fn parse_str(text: &str) -> Result<Settings, FieldError> {
        parse(text.as_bytes(), Path::new("/etc/web"))
    }

    fn field_of(text: &str) -> String {
        parse_str(text).expect_err("must be refused").field
    }

    fn problem_of(text: &str) -> String {
        parse_str(text).expect_err("must be refused").problem
    }

    #[test]
    fn an_empty_file_or_comment_means_plain_http_without_auth() {
        for text in [
            "",
            "# nothing\n",
            "---\n",
            "tls_server_config:\nbasic_auth_users:\n",
        ] {
            let s = parse_str(text).unwrap();
            assert_eq!(s.tls, None, "{text:?}");
            assert!(s.users.is_empty() && s.headers.is_empty(), "{text:?}");
            assert!(s.http2);
        }
    }

    #[test]
    fn relative_paths_resolve_against_the_files_directory() {
        let s = parse_str(
            "tls_server_config:\n  cert_file: c.pem\n  key_file: /abs/k.pem\n  \
             client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca/ca.pem\n",
        )
        .unwrap();
        let tls = s.tls.unwrap();
        assert_eq!(tls.cert_file, Path::new("/etc/web/c.pem"));
        assert_eq!(tls.key_file, Path::new("/abs/k.pem"));
        assert_eq!(
            tls.client_ca_file.as_deref(),
            Some(Path::new("/etc/web/ca/ca.pem"))
        );
        assert_eq!(tls.client_auth, ClientAuth::RequireAndVerifyClientCert);
        assert_eq!(
            (tls.min_version, tls.max_version),
            (TlsVersion::Tls12, TlsVersion::Tls13)
        );
    }

    #[test]
    fn empty_cert_and_key_mean_no_tls() {
        let s = parse_str("tls_server_config:\n  cert_file: ''\n  key_file: ''\n").unwrap();
        assert_eq!(s.tls, None);
    }

    #[test]
    fn unknown_keys_are_refused_at_every_level() {
        assert!(problem_of("foo: 1\n").contains("unknown field `foo`"));
        assert!(problem_of("tls_server_config:\n  bogus: 1\n").contains("unknown field `bogus`"));
        assert!(
            problem_of("http_server_config:\n  http3: true\n").contains("unknown field `http3`")
        );
        // Newer toolkits' keys the supported version does not know.
        assert!(
            problem_of("tls_server_config:\n  client_allowed_sans: [a]\n")
                .contains("client_allowed_sans")
        );
        assert!(problem_of("tls_server_config:\n  cert: x\n").contains("unknown field `cert`"));
    }

    #[test]
    fn repeated_keys_are_refused() {
        let p = problem_of("tls_server_config:\n  cert_file: a\n  cert_file: b\n  key_file: k\n");
        assert!(p.contains("duplicate field `cert_file`"), "{p}");
        let p = problem_of(&format!("basic_auth_users:\n  a: {HASH}\n  a: {HASH}\n"));
        assert!(p.contains("key \"a\" appears twice"), "{p}");
        assert!(!p.contains(HASH), "{p}");
        let p = problem_of(
            "http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Frame-Options: deny\n",
        );
        assert!(p.contains("appears twice"), "{p}");
    }

    #[test]
    fn a_file_that_is_not_a_mapping_is_refused() {
        assert_eq!(field_of("- a\n"), "(YAML)");
        assert_eq!(field_of("hello\n"), "(YAML)");
        assert_eq!(field_of("a: [\n"), "(YAML)");
        assert_eq!(field_of("tls_server_config:\n\tcert_file: x\n"), "(YAML)");
    }

    #[test]
    fn a_value_in_the_wrong_place_is_not_quoted() {
        let e = parse_str(&format!("basic_auth_users: '{HASH}'\n")).unwrap_err();
        assert!(!e.problem.contains("abcdefghij"), "{}", e.problem);
        assert!(
            e.problem.contains("invalid type: a string"),
            "{}",
            e.problem
        );
        assert_eq!(
            without_quoted_strings(r#"x: string "a\"b", expected y; string "c""#),
            "x: a string, expected y; a string"
        );
    }

    #[test]
    fn only_the_first_document_counts() {
        let s = parse_str("---\nbasic_auth_users: {}\n---\nfoo: 1\n").unwrap();
        assert!(s.users.is_empty());
    }

    #[test]
    fn scalars_read_as_strings_and_yaml_1_1_booleans_as_the_toolkit_does() {
        let s = parse_str(
            "tls_server_config:\n  cert_file: 123\n  key_file: k\n\
             http_server_config:\n  http2: no\n",
        )
        .unwrap();
        assert_eq!(s.tls.unwrap().cert_file, Path::new("/etc/web/123"));
        assert!(!s.http2);
        assert_eq!(field_of("http_server_config:\n  http2: maybe\n"), "(YAML)");
    }

    #[test]
    fn tls_needs_both_cert_and_key() {
        assert_eq!(
            field_of("tls_server_config:\n  key_file: k\n"),
            "tls_server_config.cert_file"
        );
        assert_eq!(
            field_of("tls_server_config:\n  cert_file: c\n"),
            "tls_server_config.key_file"
        );
        // A client-auth setting alone turns TLS on, so the certificate is missing.
        assert_eq!(
            field_of("tls_server_config:\n  client_auth_type: RequireAnyClientCert\n"),
            "tls_server_config.cert_file"
        );
    }

    #[test]
    fn client_auth_names_are_the_toolkits() {
        const TLS: &str = "tls_server_config:\n  cert_file: c\n  key_file: k\n";
        for (name, want) in [
            ("NoClientCert", ClientAuth::NoClientCert),
            ("RequestClientCert", ClientAuth::RequestClientCert),
            ("RequireAnyClientCert", ClientAuth::RequireAnyClientCert),
            ("RequireClientCert", ClientAuth::RequireAnyClientCert),
            (
                "VerifyClientCertIfGiven",
                ClientAuth::VerifyClientCertIfGiven,
            ),
            (
                "RequireAndVerifyClientCert",
                ClientAuth::RequireAndVerifyClientCert,
            ),
        ] {
            let s = parse_str(&format!("{TLS}  client_auth_type: {name}\n")).unwrap();
            assert_eq!(s.tls.unwrap().client_auth, want, "{name}");
        }
        let e = parse_str(&format!("{TLS}  client_auth_type: Foo\n")).unwrap_err();
        assert_eq!(e.field, "tls_server_config.client_auth_type");
        assert!(e.problem.contains("\"Foo\""));
    }

    #[test]
    fn a_client_ca_without_client_auth_is_refused() {
        let e =
            parse_str("tls_server_config:\n  cert_file: c\n  key_file: k\n  client_ca_file: ca\n")
                .unwrap_err();
        assert_eq!(e.field, "tls_server_config.client_ca_file");
    }

    #[test]
    fn enumeration_names_outside_the_toolkits_are_refused_naming_the_value() {
        const TLS: &str = "tls_server_config:\n  cert_file: c\n  key_file: k\n";
        let e = parse_str(&format!("{TLS}  min_version: TLS14\n")).unwrap_err();
        assert_eq!(e.field, "tls_server_config.min_version");
        assert!(e.problem.contains("\"TLS14\""));
        let e = parse_str(&format!("{TLS}  curve_preferences: [P256]\n")).unwrap_err();
        assert_eq!(e.field, "tls_server_config.curve_preferences");
        assert!(e.problem.contains("\"P256\""));
        // Go's insecure suites and its short aliases are not names the toolkit takes.
        for bad in [
            "TLS_RSA_WITH_RC4_128_SHA",
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        ] {
            let e = parse_str(&format!("{TLS}  cipher_suites: [{bad}]\n")).unwrap_err();
            assert_eq!(e.field, "tls_server_config.cipher_suites");
            assert!(e.problem.contains(bad));
        }
        // Checked even when TLS is off, as the toolkit reads them with the YAML.
        assert_eq!(
            field_of("tls_server_config:\n  max_version: SSL3\n"),
            "tls_server_config.max_version"
        );
    }

    #[test]
    fn headers_only_from_the_allowed_set_with_allowed_values() {
        let ok = "http_server_config:\n  headers:\n    X-Frame-Options: sameorigin\n    \
                  X-Content-Type-Options: nosniff\n    Strict-Transport-Security: max-age=31536000\n    \
                  X-XSS-Protection: '1; mode=block'\n    Content-Security-Policy: \"default-src 'self'\"\n";
        assert_eq!(parse_str(ok).unwrap().headers.len(), 5);
        assert_eq!(
            field_of("http_server_config:\n  headers:\n    Server: x\n"),
            "http_server_config.headers.Server"
        );
        // Spelt exactly as listed, values too.
        assert!(parse_str("http_server_config:\n  headers:\n    x-frame-options: deny\n").is_err());
        let p = problem_of("http_server_config:\n  headers:\n    X-Frame-Options: DENY\n");
        assert!(p.contains("\"DENY\""), "{p}");
        assert!(
            parse_str("http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n")
                .is_err()
        );
        // Any byte a header can carry, UTF-8 included; a line break cannot be.
        let csp = |v: &str| {
            format!("http_server_config:\n  headers:\n    Content-Security-Policy: {v}\n")
        };
        assert!(parse_str(&csp("\"default-src é\"")).is_ok());
        let p = problem_of(&csp("\"a\\nb\""));
        assert!(p.contains("line break"), "{p}");
    }

    #[test]
    fn users_need_a_hash_whose_cost_the_toolkit_reads() {
        let s = parse_str(&format!("basic_auth_users:\n  alice: {HASH}\n")).unwrap();
        assert_eq!(s.users["alice"], HASH);
        for (hash, problem) in [
            ("password", "too short"),
            ("", "too short"),
            ("$2y$10$abc", "too short"),
            (
                "$2y$03$abcdefghijklmnopqrstuuJm1Dm3MjfPW1l0nOmNFSMdHGhFu7q6a",
                "cost 3",
            ),
            (
                "$2y$32$abcdefghijklmnopqrstuuJm1Dm3MjfPW1l0nOmNFSMdHGhFu7q6a",
                "cost 32",
            ),
            (
                "$3a$10$abcdefghijklmnopqrstuuJm1Dm3MjfPW1l0nOmNFSMdHGhFu7q6a",
                "newer than 2",
            ),
            (
                "x2y$10$abcdefghijklmnopqrstuuJm1Dm3MjfPW1l0nOmNFSMdHGhFu7q6ab",
                "starts with",
            ),
            (
                "$2y$xx$abcdefghijklmnopqrstuuJm1Dm3MjfPW1l0nOmNFSMdHGhFu7q6a",
                "not a number",
            ),
        ] {
            let e = parse_str(&format!("basic_auth_users:\n  bob: '{hash}'\n")).unwrap_err();
            assert_eq!(e.field, "basic_auth_users.bob", "{hash}");
            assert!(e.problem.contains(problem), "{hash}: {}", e.problem);
            assert!(
                hash.is_empty() || !e.problem.contains(hash),
                "leaks the hash"
            );
        }
        assert!(parse_str("basic_auth_users:\n  bob:\n").is_err());
        // The toolkit reads only the cost: a damaged salt passes (and matches nothing).
        let junk = "$2y$10$!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!";
        assert!(parse_str(&format!("basic_auth_users:\n  bob: '{junk}'\n")).is_ok());
    }

    #[test]
    fn bcrypt_cost_reads_each_prefix() {
        for prefix in ["$2a$", "$2b$", "$2y$", "$2x$"] {
            let hash = format!("{prefix}12$abcdefghijklmnopqrstuuJm1Dm3MjfPW1l0nOmNFSMdHGhFu7q6a");
            assert_eq!(bcrypt_cost(&hash), Ok(12), "{prefix}");
        }
        assert_eq!(
            bcrypt_cost("$2$10$abcdefghijklmnopqrstuuJm1Dm3MjfPW1l0nOmNFSMdHGhFu7q6ab"),
            Ok(10)
        );
    }
}
