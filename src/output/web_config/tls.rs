//! The `tls_server_config` section made into a rustls server configuration:
//! the certificate chain and key (which must match), the client-certificate
//! policy, the protocol versions, cipher suites and curves, each toolkit
//! name mapped to what rustls (ring) implements, or the file refused naming
//! the option and the value it cannot honour.
//!
//! Pure: the named files' bytes come in (`Material`), read by the caller.
//! It does not decide when to rebuild or what to serve.

use std::sync::Arc;

use rustls::crypto::{CryptoProvider, SupportedKxGroup, ring};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CipherSuite, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme, SupportedCipherSuite, SupportedProtocolVersion,
};

use super::file::{ClientAuth, Curve, FieldError, TlsSettings, TlsVersion};

/// The bytes of the files `tls_server_config` names.
pub struct Material {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub client_ca: Option<Vec<u8>>,
    /// This system's CA store, loaded only for a verifying
    /// `client_auth_type` without `client_ca_file` (the toolkit's fallback).
    pub system_roots: Vec<CertificateDer<'static>>,
}

/// A built TLS configuration and what the operator should hear about it.
pub struct Built {
    pub config: Arc<ServerConfig>,
    /// The server certificate's notAfter, as RFC 3339.
    pub not_after: String,
    /// Whether that moment has passed (served all the same, as the toolkit does).
    pub expired: bool,
    /// What the toolkit accepts but an operator should hear about.
    pub warnings: Vec<String>,
}

fn field(name: &str) -> String {
    format!("tls_server_config.{name}")
}

/// Builds the server configuration `settings` describe from `material`.
pub fn build(settings: &TlsSettings, material: &Material) -> Result<Built, FieldError> {
    let provider = Arc::new(provider(settings)?);
    let versions = versions(settings.min_version, settings.max_version)?;
    let chain = certificates(&material.cert).map_err(|problem| {
        FieldError::new(
            field("cert_file"),
            format!("{}: {problem}", settings.cert_file.display()),
        )
    })?;
    let (not_after, expired) = validity(&chain[0]).map_err(|problem| {
        FieldError::new(
            field("cert_file"),
            format!("{}: {problem}", settings.cert_file.display()),
        )
    })?;
    // The key's own parse error could quote key material: only say what to do.
    let key = PrivateKeyDer::from_pem_slice(&material.key).map_err(|_| {
        FieldError::new(
            field("key_file"),
            format!(
                "{}: no unencrypted private key in PEM (PKCS#8, PKCS#1 or SEC1) found; \
                 give the server certificate's key",
                settings.key_file.display()
            ),
        )
    })?;
    let mut warnings = Vec::new();
    let verifier = client_verifier(settings, material, &provider, &mut warnings)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| {
            FieldError::new(
                field("cipher_suites"),
                format!("no cipher suite left for the TLS versions allowed ({e}); widen one or the other"),
            )
        })?;
    let config = builder
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| {
            FieldError::new(
                field("key_file"),
                format!(
                    "{} does not go with {}: {}; give the key of the server certificate",
                    settings.key_file.display(),
                    settings.cert_file.display(),
                    key_problem(&e)
                ),
            )
        })?;
    Ok(Built {
        config: Arc::new(config),
        not_after,
        expired,
        warnings,
    })
}

/// rustls's words for a key that cannot be used, with nothing of the key.
fn key_problem(e: &rustls::Error) -> &'static str {
    match e {
        rustls::Error::InconsistentKeys(_) => "the private key does not match the certificate",
        _ => "the key cannot be used (an unsupported type, say)",
    }
}

/// The certificates in a PEM file, leaf first; at least one.
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate file ({e})"))?;
    if chain.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    Ok(chain)
}

/// The leaf's notAfter (RFC 3339) and whether it has passed.
fn validity(leaf: &CertificateDer<'_>) -> Result<(String, bool), String> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| format!("the first certificate cannot be parsed ({e})"))?;
    let not_after = cert.validity().not_after;
    let text = not_after
        .to_datetime()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| not_after.to_string());
    let expired = not_after.timestamp() < time::OffsetDateTime::now_utc().unix_timestamp();
    Ok((text, expired))
}

/// rustls serves TLS 1.2 and 1.3 only: an older version asked for is
/// refused rather than silently not served.
fn versions(
    min: TlsVersion,
    max: TlsVersion,
) -> Result<Vec<&'static SupportedProtocolVersion>, FieldError> {
    for (name, v) in [("min_version", min), ("max_version", max)] {
        if v < TlsVersion::Tls12 {
            return Err(FieldError::new(
                field(name),
                format!(
                    "{} is not supported (this endpoint serves TLS 1.2 and 1.3 only); use TLS12 or TLS13",
                    v.name()
                ),
            ));
        }
    }
    if min > max {
        return Err(FieldError::new(
            field("min_version"),
            format!(
                "{} is above max_version {}: no version left; lower min_version or raise max_version",
                min.name(),
                max.name()
            ),
        ));
    }
    Ok([
        (TlsVersion::Tls12, &rustls::version::TLS12),
        (TlsVersion::Tls13, &rustls::version::TLS13),
    ]
    .into_iter()
    .filter(|(v, _)| (min..=max).contains(v))
    .map(|(_, p)| p)
    .collect())
}

/// Go's name of each TLS 1.2 suite rustls (ring) implements. Go ignores
/// TLS 1.3 suites in this list (all three are always on), and so does this
/// endpoint.
const TLS12_SUITES: &[(&str, CipherSuite)] = &[
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

const TLS13_SUITE_NAMES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// ring's provider narrowed to the suites and curves the file lists.
fn provider(settings: &TlsSettings) -> Result<CryptoProvider, FieldError> {
    let mut provider = ring::default_provider();
    if !settings.cipher_suites.is_empty() {
        let mut wanted: Vec<CipherSuite> = Vec::new();
        for name in &settings.cipher_suites {
            if TLS13_SUITE_NAMES.contains(&name.as_str()) {
                continue;
            }
            let Some((_, suite)) = TLS12_SUITES.iter().find(|(n, _)| n == name) else {
                let supported: Vec<&str> = TLS12_SUITES.iter().map(|(n, _)| *n).collect();
                return Err(FieldError::new(
                    field("cipher_suites"),
                    format!(
                        "{name} is not supported here (no CBC or RSA key-exchange suites); \
                         use some of {}",
                        supported.join(", ")
                    ),
                ));
            };
            wanted.push(*suite);
        }
        // In the file's order; the TLS 1.3 suites stay, as in Go.
        let all = provider.cipher_suites.clone();
        let tls13 = all
            .iter()
            .filter(|s| matches!(s, SupportedCipherSuite::Tls13(_)));
        let tls12 = wanted
            .iter()
            .filter_map(|w| all.iter().find(|s| s.suite() == *w));
        provider.cipher_suites = tls13.chain(tls12).copied().collect();
    }
    if !settings.curves.is_empty() {
        let mut groups: Vec<&'static dyn SupportedKxGroup> = Vec::new();
        for curve in &settings.curves {
            groups.push(match curve {
                Curve::X25519 => ring::kx_group::X25519,
                Curve::P256 => ring::kx_group::SECP256R1,
                Curve::P384 => ring::kx_group::SECP384R1,
                Curve::P521 => {
                    return Err(FieldError::new(
                        field("curve_preferences"),
                        "CurveP521 is not supported here; use CurveP256, CurveP384 or X25519",
                    ));
                }
            });
        }
        provider.kx_groups = groups;
    }
    Ok(provider)
}

fn client_verifier(
    settings: &TlsSettings,
    material: &Material,
    provider: &Arc<CryptoProvider>,
    warnings: &mut Vec<String>,
) -> Result<Arc<dyn ClientCertVerifier>, FieldError> {
    let auth = settings.client_auth;
    let anyone = |mandatory| -> Arc<dyn ClientCertVerifier> {
        Arc::new(AnyClientCert {
            mandatory,
            provider: provider.clone(),
            reject: false,
        })
    };
    let mandatory = match auth {
        ClientAuth::NoClientCert => return Ok(WebPkiClientVerifier::no_client_auth()),
        // The toolkit does not verify these either.
        ClientAuth::RequestClientCert => return Ok(anyone(false)),
        ClientAuth::RequireAnyClientCert => return Ok(anyone(true)),
        ClientAuth::VerifyClientCertIfGiven => false,
        ClientAuth::RequireAndVerifyClientCert => true,
    };
    // As Go's certificate pool: PEM blocks that are not certificates, or
    // that do not parse, are skipped.
    let mut roots = RootCertStore::empty();
    let (source, certs) = match (&settings.client_ca_file, &material.client_ca) {
        (Some(path), Some(pem)) => (
            path.display().to_string(),
            CertificateDer::pem_slice_iter(pem)
                .filter_map(Result::ok)
                .collect::<Vec<_>>(),
        ),
        _ => {
            warnings.push(format!(
                "client_auth_type {} without client_ca_file: client certificates are verified \
                 against this system's CA store ({} CAs), so one from any public CA passes; \
                 set client_ca_file to the CA that signs your clients' certificates",
                auth.name(),
                material.system_roots.len()
            ));
            (
                "this system's CA store".to_owned(),
                material.system_roots.clone(),
            )
        }
    };
    roots.add_parsable_certificates(certs);
    if roots.is_empty() {
        warnings.push(format!(
            "{source} holds no usable CA certificate: no client certificate can be verified{}",
            if mandatory {
                ", so no client can connect"
            } else {
                ", so only clients without one can connect"
            }
        ));
        return Ok(Arc::new(AnyClientCert {
            mandatory,
            provider: provider.clone(),
            reject: true,
        }));
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let builder = if mandatory {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    builder.build().map_err(|e| {
        FieldError::new(
            field("client_ca_file"),
            format!("{source}: cannot verify clients with it ({e})"),
        )
    })
}

/// `RequestClientCert` / `RequireAnyClientCert`: any certificate is taken
/// (the toolkit does not verify it either), but the client must still prove
/// it holds the certificate's key. With `reject`, a verifying type whose CA
/// pool is empty: every certificate is refused, as Go's empty pool does.
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    provider: Arc<CryptoProvider>,
    reject: bool,
}

impl ClientCertVerifier for AnyClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if self.reject {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            ));
        }
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn settings() -> TlsSettings {
        TlsSettings {
            cert_file: PathBuf::from("/w/cert.pem"),
            key_file: PathBuf::from("/w/key.pem"),
            client_auth: ClientAuth::NoClientCert,
            client_ca_file: None,
            cipher_suites: vec![],
            curves: vec![],
            min_version: TlsVersion::Tls12,
            max_version: TlsVersion::Tls13,
        }
    }

    #[test]
    fn versions_map_to_rustls_or_are_refused_naming_the_value() {
        assert_eq!(
            versions(TlsVersion::Tls12, TlsVersion::Tls13)
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            versions(TlsVersion::Tls13, TlsVersion::Tls13)
                .unwrap()
                .len(),
            1
        );
        let e = versions(TlsVersion::Tls10, TlsVersion::Tls13).unwrap_err();
        assert_eq!(e.field, "tls_server_config.min_version");
        assert!(e.problem.contains("TLS10"));
        let e = versions(TlsVersion::Tls12, TlsVersion::Tls11).unwrap_err();
        assert_eq!(e.field, "tls_server_config.max_version");
        let e = versions(TlsVersion::Tls13, TlsVersion::Tls12).unwrap_err();
        assert!(e.problem.contains("above max_version"));
    }

    #[test]
    fn cipher_suites_rustls_lacks_are_refused_naming_the_value() {
        let mut s = settings();
        s.cipher_suites = vec!["TLS_RSA_WITH_AES_128_GCM_SHA256".into()];
        let e = provider(&s).unwrap_err();
        assert_eq!(e.field, "tls_server_config.cipher_suites");
        assert!(e.problem.contains("TLS_RSA_WITH_AES_128_GCM_SHA256"));
    }

    #[test]
    fn listed_tls12_suites_narrow_the_list_and_tls13_suites_stay() {
        let mut s = settings();
        s.cipher_suites = vec![
            "TLS_AES_128_GCM_SHA256".into(),
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".into(),
        ];
        let p = provider(&s).unwrap();
        let suites: Vec<CipherSuite> = p.cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(suites.len(), 4, "{suites:?}");
        assert!(suites.contains(&CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256));
        assert!(!suites.contains(&CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256));
    }

    #[test]
    fn each_go_name_rustls_has_is_mapped() {
        for (name, suite) in TLS12_SUITES {
            assert!(
                super::super::file::GO_CIPHER_SUITES.contains(name),
                "{name}"
            );
            assert!(
                ring::default_provider()
                    .cipher_suites
                    .iter()
                    .any(|s| s.suite() == *suite),
                "{name}"
            );
        }
    }

    #[test]
    fn curves_map_to_rustls_groups_and_p521_is_refused() {
        let mut s = settings();
        s.curves = vec![Curve::X25519, Curve::P384];
        assert_eq!(provider(&s).unwrap().kx_groups.len(), 2);
        s.curves = vec![Curve::P521];
        let e = provider(&s).unwrap_err();
        assert_eq!(e.field, "tls_server_config.curve_preferences");
        assert!(e.problem.contains("CurveP521"));
    }

    fn verify_with(
        s: &TlsSettings,
        m: &Material,
        warnings: &mut Vec<String>,
    ) -> Arc<dyn ClientCertVerifier> {
        let provider = Arc::new(provider(s).unwrap());
        client_verifier(s, m, &provider, warnings).expect("builds")
    }

    const CERT: &[u8] = include_bytes!("testdata/server.crt");
    const KEY: &[u8] = include_bytes!("testdata/server.key");

    fn material(cert: &[u8], key: &[u8]) -> Material {
        Material {
            cert: cert.to_vec(),
            key: key.to_vec(),
            client_ca: None,
            system_roots: vec![],
        }
    }

    #[test]
    fn a_matching_pair_builds_and_reports_its_expiry() {
        let built = build(&settings(), &material(CERT, KEY)).expect("builds");
        assert!(!built.expired);
        assert!(built.not_after.starts_with("2126-"), "{}", built.not_after);
        assert!(built.warnings.is_empty());
    }

    #[test]
    fn an_expired_certificate_is_built_and_flagged() {
        let built = build(
            &settings(),
            &material(
                include_bytes!("testdata/expired.crt"),
                include_bytes!("testdata/expired.key"),
            ),
        )
        .expect("an expired certificate is served");
        assert!(built.expired);
        assert!(built.not_after.starts_with("2020-"), "{}", built.not_after);
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_without_quoting_it() {
        let other = include_bytes!("testdata/other.key");
        let e = build(&settings(), &material(CERT, other))
            .err()
            .expect("refused");
        assert_eq!(e.field, "tls_server_config.key_file");
        assert!(e.problem.contains("does not match"), "{}", e.problem);
        let key_body = std::str::from_utf8(other).unwrap().lines().nth(1).unwrap();
        assert!(!e.problem.contains(&key_body[..16]));
    }

    #[test]
    fn swapped_files_are_refused_naming_the_field() {
        let e = build(&settings(), &material(KEY, CERT))
            .err()
            .expect("refused");
        assert_eq!(e.field, "tls_server_config.cert_file");
    }

    #[test]
    fn each_client_auth_type_builds_its_verifier() {
        for auth in [
            ClientAuth::NoClientCert,
            ClientAuth::RequestClientCert,
            ClientAuth::RequireAnyClientCert,
            ClientAuth::VerifyClientCertIfGiven,
            ClientAuth::RequireAndVerifyClientCert,
        ] {
            let mut s = settings();
            s.client_auth = auth;
            s.client_ca_file = Some(PathBuf::from("/w/ca.pem"));
            let mut m = material(CERT, KEY);
            m.client_ca = Some(CERT.to_vec());
            assert!(build(&s, &m).is_ok(), "{auth:?}");
            let mut warnings = Vec::new();
            let verifier = verify_with(&s, &m, &mut warnings);
            assert!(warnings.is_empty(), "{auth:?}: {warnings:?}");
            assert_eq!(
                verifier.offer_client_auth(),
                auth != ClientAuth::NoClientCert
            );
            if auth != ClientAuth::NoClientCert {
                assert_eq!(
                    verifier.client_auth_mandatory(),
                    matches!(
                        auth,
                        ClientAuth::RequireAnyClientCert | ClientAuth::RequireAndVerifyClientCert
                    ),
                    "{auth:?}"
                );
            }
        }
    }

    #[test]
    fn a_verifying_type_without_usable_cas_warns_and_refuses_every_certificate() {
        let mut s = settings();
        s.client_auth = ClientAuth::RequireAndVerifyClientCert;
        s.client_ca_file = Some(PathBuf::from("/w/empty.pem"));
        let mut m = material(CERT, KEY);
        m.client_ca = Some(b"no certificate here".to_vec());
        let built = build(&s, &m).expect("accepted, as the toolkit does");
        assert!(
            built.warnings[0].contains("no usable CA"),
            "{:?}",
            built.warnings
        );
        let leaf = CertificateDer::from_pem_slice(CERT).unwrap();
        let verifier = verify_with(&s, &m, &mut Vec::new());
        assert!(verifier.client_auth_mandatory());
        assert!(
            verifier
                .verify_client_cert(&leaf, &[], UnixTime::now())
                .is_err()
        );
        // Without client_ca_file: the system's store, with a warning.
        s.client_ca_file = None;
        m.client_ca = None;
        m.system_roots = vec![leaf.clone()];
        let built = build(&s, &m).expect("accepted, as the toolkit does");
        assert!(
            built.warnings[0].contains("system's CA store"),
            "{:?}",
            built.warnings
        );
    }

    #[test]
    fn a_cert_file_without_certificates_is_refused() {
        let m = Material {
            cert: b"hello".to_vec(),
            key: vec![],
            client_ca: None,
            system_roots: vec![],
        };
        let e = build(&settings(), &m).err().expect("refused");
        assert_eq!(e.field, "tls_server_config.cert_file");
        assert!(e.problem.contains("/w/cert.pem"));
    }
}
