//! The daemon's whole configuration: the environment, nothing else.
//!
//! Owns reading `LOCKDB_URL` / `DATABASE_URL` / libpq's `PG*` variables,
//! etcdctl's `ETCDCTL_*` variables, `STATSD_HOST` / `STATSD_PORT`,
//! `LEASE_SWEEPER_METRICS_ADDR` and `LEASE_SWEEPER_WEB_CONFIG_FILE` (its
//! name only: `output::web_config` reads the file), and how the database and etcd are named in
//! messages (never with a password). It does not connect to anything. The sweep
//! interval, batch size and metric tags are deliberately not configurable.

pub use pgconn::Redactor;
use pgconn::{SessionAttrs, Target, process_env};

/// Default StatsD agent address: the node-local agent of most pipelines.
pub const DEFAULT_STATSD_HOST: &str = "127.0.0.1";
/// The StatsD port every agent listens on by default.
pub const DEFAULT_STATSD_PORT: u16 = 8125;

/// A configuration the operator must fix; the daemon exits 2 on it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "{var} is not a valid PostgreSQL URL ({cause}); expected \
         postgres://USER[:PASSWORD]@HOST[:PORT][,HOST2[:PORT2]...]/DATABASE[?PARAM=VALUE&...] \
         or libpq's key=value form"
    )]
    DatabaseUrl { var: &'static str, cause: String },
    #[error(
        "no LOCKDB_URL or DATABASE_URL, and libpq's PG* variables do not make a valid target: {0}"
    )]
    PgVariables(String),
    #[error("STATSD_PORT must be a port number 1-65535, got {0:?}")]
    StatsdPort(String),
    #[error("STATSD_HOST must not be empty or contain spaces, got {0:?}")]
    StatsdHost(String),
    #[error(
        "LEASE_SWEEPER_METRICS_ADDR must be an IP address and port to listen on, such as \
         127.0.0.1:9464, 0.0.0.0:9464 or [::]:9464, got {0:?}; unset it to serve no metrics endpoint"
    )]
    MetricsAddr(String),
    #[error(
        "LEASE_SWEEPER_WEB_CONFIG_FILE is set but LEASE_SWEEPER_METRICS_ADDR is not: the web \
         configuration file only applies to the metrics endpoint; set LEASE_SWEEPER_METRICS_ADDR \
         to serve it, or unset LEASE_SWEEPER_WEB_CONFIG_FILE"
    )]
    WebConfigWithoutAddr,
    #[error(
        "ETCDCTL_ENDPOINTS must be a comma-separated list of etcd client URLs such as \
         https://10.0.0.1:2379,https://10.0.0.2:2379 (or host:port), got {0:?}"
    )]
    EtcdEndpoints(String),
    #[error("{var} names {path}, which cannot be read: {cause}")]
    EtcdFile {
        var: &'static str,
        path: String,
        cause: String,
    },
    #[error("{0}")]
    EtcdTls(&'static str),
    #[error("{var} is not set: {why}")]
    Missing {
        var: &'static str,
        why: &'static str,
    },
}

/// `LEASE_SWEEPER_METRICS_ADDR`: where `run` serves `GET /metrics`. Unset
/// or empty, nothing listens. An IP literal, not a name: a listening address
/// that depends on DNS at start would be one more way not to come up.
pub fn metrics_addr_from_env() -> Result<Option<std::net::SocketAddr>, ConfigError> {
    match std::env::var("LEASE_SWEEPER_METRICS_ADDR") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| ConfigError::MetricsAddr(v)),
        _ => Ok(None),
    }
}

/// `LEASE_SWEEPER_WEB_CONFIG_FILE`: the metrics endpoint's web
/// configuration file (TLS, Basic auth, headers). Unset or empty, the
/// endpoint is plain HTTP with no auth. `metrics_addr` is
/// `metrics_addr_from_env`'s answer: the file means nothing without it.
pub fn web_config_file_from_env(
    metrics_addr: Option<std::net::SocketAddr>,
) -> Result<Option<std::path::PathBuf>, ConfigError> {
    match std::env::var_os("LEASE_SWEEPER_WEB_CONFIG_FILE") {
        Some(v) if !v.is_empty() => match metrics_addr {
            Some(_) => Ok(Some(v.into())),
            None => Err(ConfigError::WebConfigWithoutAddr),
        },
        _ => Ok(None),
    }
}

/// Where the lock database is: the resolved target itself (its hosts, its
/// password-free name, its redactor), plus what the daemon asks of it.
#[derive(Clone, Debug)]
pub struct DbTarget(Target);

impl DbTarget {
    /// `LOCKDB_URL`, else `DATABASE_URL`, else libpq's `PG*` variables and
    /// defaults (the `pgconn` crate has the rules).
    pub fn from_env() -> Result<Self, ConfigError> {
        for var in ["LOCKDB_URL", "DATABASE_URL"] {
            if let Some(url) = std::env::var(var).ok().filter(|v| !v.trim().is_empty()) {
                return Self::from_url(var, &url);
            }
        }
        Target::resolve(None, &process_env)
            .map(Self)
            .map_err(|e| ConfigError::PgVariables(e.to_string()))
    }

    /// Parses a URL (or `key=value` string) named `var` in messages, completed
    /// from the `PG*` variables; the string itself is never echoed, and the
    /// cause comes scrubbed of its password.
    pub fn from_url(var: &'static str, url: &str) -> Result<Self, ConfigError> {
        Target::resolve(Some((var, url)), &process_env)
            .map(Self)
            .map_err(|e| ConfigError::DatabaseUrl {
                var,
                cause: e.to_string(),
            })
    }

    /// The resolved libpq-style target: hosts, TLS, timeouts.
    pub fn target(&self) -> &Target {
        &self.0
    }

    /// What a connection must be: the operator's `target_session_attrs`, else
    /// `read-write`, since sweeping deletes (libpq's own default is `any`).
    pub fn session_attrs(&self) -> SessionAttrs {
        self.0.session_attrs().unwrap_or(SessionAttrs::ReadWrite)
    }

    /// Where the target came from (variable names only): for `starting`.
    pub fn origin(&self) -> String {
        self.0.origin().to_string()
    }

    /// Warnings about the configuration that did not stop us.
    pub fn notes(&self) -> &[String] {
        self.0.notes()
    }

    /// `postgres://user@host:port/db` (hosts comma-separated): safe to log.
    pub fn display(&self) -> &str {
        self.0.display()
    }

    /// Scrubs the password out of any message about this database.
    pub fn redactor(&self) -> Redactor {
        self.0.redactor().clone()
    }
}

/// The PostgreSQL variables that name a database when set: with etcd's
/// endpoints also set, one of them is what asks for the job reaper.
pub const PG_TARGET_VARS: [&str; 5] = [
    "LOCKDB_URL",
    "DATABASE_URL",
    "PGHOST",
    "PGHOSTADDR",
    "PGDATABASE",
];

/// Whether the environment names a PostgreSQL database at all (rather than
/// leaving it to libpq's defaults).
pub fn pg_named_in_env() -> bool {
    PG_TARGET_VARS
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| !v.trim().is_empty()))
}

/// Where the locks are when they are in etcd: the variables etcd's own
/// `etcdctl` reads, so one environment serves both.
#[derive(Clone)]
pub struct EtcdTarget {
    /// Client URLs with their scheme (`http://` unless TLS files are set).
    pub endpoints: Vec<String>,
    /// PEM files: the CA that signed the servers, and the client's
    /// certificate and key (both or neither).
    pub ca: Option<Vec<u8>>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// etcd's own authentication: a user and its password.
    pub user: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display())
    }
}

impl EtcdTarget {
    /// `ETCDCTL_ENDPOINTS`, with `ETCDCTL_CACERT`, `ETCDCTL_CERT`,
    /// `ETCDCTL_KEY`, and `ETCDCTL_USER` (`user:password`, or `user` with
    /// `ETCDCTL_PASSWORD`); `None` when no endpoints are set.
    pub fn from_env() -> Result<Option<Self>, ConfigError> {
        let Some(list) = std::env::var("ETCDCTL_ENDPOINTS")
            .ok()
            .filter(|v| !v.trim().is_empty())
        else {
            return Ok(None);
        };
        let file = |var: &'static str| -> Result<Option<Vec<u8>>, ConfigError> {
            match std::env::var(var).ok().filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(path) => std::fs::read(&path)
                    .map(Some)
                    .map_err(|e| ConfigError::EtcdFile {
                        var,
                        path,
                        cause: e.to_string(),
                    }),
            }
        };
        let ca = file("ETCDCTL_CACERT")?;
        let identity = match (file("ETCDCTL_CERT")?, file("ETCDCTL_KEY")?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(ConfigError::EtcdTls(
                    "ETCDCTL_CERT and ETCDCTL_KEY go together: set both (a client \
                     certificate and its key) or neither",
                ));
            }
        };
        let tls = ca.is_some() || identity.is_some();
        let endpoints = endpoints(&list, tls).ok_or(ConfigError::EtcdEndpoints(list))?;
        let user = std::env::var("ETCDCTL_USER")
            .ok()
            .filter(|v| !v.is_empty())
            .map(|u| match u.split_once(':') {
                Some((name, pw)) => (name.to_owned(), pw.to_owned()),
                None => (u, std::env::var("ETCDCTL_PASSWORD").unwrap_or_default()),
            });
        Ok(Some(Self {
            endpoints,
            ca,
            identity,
            user,
        }))
    }

    /// `etcd at URL[,URL…] [as user NAME]`: safe to log (no password).
    pub fn display(&self) -> String {
        let mut s = format!("etcd at {}", self.endpoints.join(","));
        if let Some((name, _)) = &self.user {
            s.push_str(" as user ");
            s.push_str(name);
        }
        s
    }
}

/// Each endpoint with a scheme: `https://` when TLS files are set and the
/// endpoint names none, as etcdctl does.
fn endpoints(list: &str, tls: bool) -> Option<Vec<String>> {
    let out: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            if e.contains("://") {
                e.to_owned()
            } else if tls {
                format!("https://{e}")
            } else {
                format!("http://{e}")
            }
        })
        .collect();
    let valid = |e: &String| {
        let rest = e
            .strip_prefix("http://")
            .or_else(|| e.strip_prefix("https://"));
        rest.is_some_and(|r| !r.is_empty() && !r.contains(char::is_whitespace))
    };
    (!out.is_empty() && out.iter().all(valid)).then_some(out)
}

/// Where StatsD datagrams go. The host is resolved when sending, not here, so
/// a name that does not resolve yet never stops the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsdTarget {
    pub host: String,
    pub port: u16,
}

impl StatsdTarget {
    pub fn from_env() -> Result<Self, ConfigError> {
        let host = std::env::var("STATSD_HOST")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| DEFAULT_STATSD_HOST.to_owned());
        if host.trim().is_empty() || host.contains(char::is_whitespace) {
            return Err(ConfigError::StatsdHost(host));
        }
        let port = match std::env::var("STATSD_PORT") {
            Ok(p) if !p.is_empty() => p
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or(ConfigError::StatsdPort(p))?,
            _ => DEFAULT_STATSD_PORT,
        };
        Ok(Self { host, port })
    }
}

impl std::fmt::Display for StatsdTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_endpoints_take_a_scheme_as_etcdctl_does() {
        assert_eq!(
            endpoints("127.0.0.1:2379, 10.0.0.2:2379", false).unwrap(),
            ["http://127.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert_eq!(
            endpoints("127.0.0.1:2379,http://b:2379", true).unwrap(),
            ["https://127.0.0.1:2379", "http://b:2379"]
        );
        assert_eq!(endpoints(" , ", false), None);
        assert_eq!(endpoints("unix://x", false), None);
    }

    #[test]
    fn display_and_errors_never_carry_the_password() {
        let t = DbTarget::from_url(
            "LOCKDB_URL",
            "postgres://sweeper:s3cr%21t@db.example:6543/locks",
        )
        .unwrap();
        assert_eq!(t.display(), "postgres://sweeper@db.example:6543/locks");
        assert!(!format!("{t:?}").contains("s3cr"));
        assert_eq!(
            t.redactor().redact("auth failed for s3cr!t and s3cr%21t"),
            "auth failed for *** and ***"
        );
        let err =
            DbTarget::from_url("LOCKDB_URL", "postgres://u:hunter2@host:notaport/db").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("LOCKDB_URL is not a valid PostgreSQL URL"),
            "{msg}"
        );
        assert!(!msg.contains("hunter2"), "{msg}");
    }
}
