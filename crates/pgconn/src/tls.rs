//! TLS: `sslmode` and the certificate files, with libpq's defaults under
//! `~/.postgresql/`.
//!
//! Owns choosing the mode, the CA (`sslrootcert`, `system` for the public
//! roots, else `~/.postgresql/root.crt`) and the client certificate and key
//! (`postgresql.crt`, `postgresql.key`), and refusing what cannot be
//! verified as asked. It does not read the certificates (sqlx does, when
//! connecting) and does not find the home directory (`env` does).

use std::path::{Path, PathBuf};

use sqlx::postgres::PgSslMode;

use crate::types::{Addr, Host, Params};

/// libpq's per-user directory of certificates, under the home directory.
const USER_DIR: &str = ".postgresql";
/// The CA file libpq uses when `sslrootcert` is unset.
const DEFAULT_ROOT_CERT: &str = "root.crt";
/// The client certificate libpq sends when `sslcert` is unset.
const DEFAULT_CLIENT_CERT: &str = "postgresql.crt";
/// The client key libpq uses when `sslkey` is unset.
const DEFAULT_CLIENT_KEY: &str = "postgresql.key";
/// `sslrootcert`'s word for the built-in public roots (sqlx's webpki set).
const SYSTEM_ROOTS: &str = "system";

/// How every host of a target talks TLS.
#[derive(Debug, Clone)]
pub struct Tls {
    pub mode: PgSslMode,
    /// `None`: the built-in public roots.
    pub rootcert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl Tls {
    /// The TLS settings for `params`, with defaults from `home`.
    pub fn resolve(params: &Params, home: Option<&Path>, hosts: &[Host]) -> Result<Self, String> {
        let get = |k: &str| params.get(k).map(String::as_str);
        let mode = match get("sslmode") {
            None => PgSslMode::Prefer,
            Some(m) => m.parse().map_err(|_| {
                format!(
                    "invalid sslmode {m:?} (disable, allow, prefer, require, verify-ca, verify-full)"
                )
            })?,
        };
        let user_dir = home.map(|d| d.join(USER_DIR));
        let default_file = |name: &str| {
            user_dir
                .as_ref()
                .map(|d| d.join(name))
                .filter(|p| p.is_file())
        };
        let verifying = matches!(mode, PgSslMode::VerifyCa | PgSslMode::VerifyFull);
        let rootcert = match get("sslrootcert") {
            Some(SYSTEM_ROOTS) => None,
            Some(path) => Some(PathBuf::from(path)),
            None => match default_file(DEFAULT_ROOT_CERT) {
                Some(p) => Some(p),
                None if verifying => {
                    return Err(format!(
                        "sslmode={} needs the CA that signed the server's certificate: set sslrootcert \
                         (or PGSSLROOTCERT), put it at ~/.postgresql/root.crt, or use sslrootcert=system \
                         for the public CAs",
                        get("sslmode").unwrap_or_default()
                    ));
                }
                None => None,
            },
        };
        if matches!(mode, PgSslMode::VerifyFull) {
            refuse_unverifiable_names(hosts)?;
        }
        Ok(Self {
            mode,
            rootcert,
            cert: get("sslcert")
                .map(PathBuf::from)
                .or_else(|| default_file(DEFAULT_CLIENT_CERT)),
            key: get("sslkey")
                .map(PathBuf::from)
                .or_else(|| default_file(DEFAULT_CLIENT_KEY)),
        })
    }
}

/// libpq verifies a `hostaddr` host's certificate against its `host` name.
/// sqlx checks the certificate against the address it connects to and has no
/// separate name for it, so that pairing cannot be verified here: refused
/// rather than checked against the wrong name.
fn refuse_unverifiable_names(hosts: &[Host]) -> Result<(), String> {
    for host in hosts {
        if let (Addr::HostAddr(ip), Some(name)) = (&host.addr, &host.name)
            && name.parse::<std::net::IpAddr>().ok() != Some(*ip)
        {
            return Err(format!(
                "sslmode=verify-full with hostaddr={ip} for host {name}: the certificate would be \
                 checked against {ip}, not {name}; leave hostaddr out (the name is looked up), or \
                 use sslmode=verify-ca"
            ));
        }
    }
    Ok(())
}
