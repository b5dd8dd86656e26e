//! The shared vocabulary of the crate: parsed parameters, hosts, session
//! attributes, where a target came from, and the one redactor.
//!
//! Owns the types every other module speaks and the defaults that are not
//! any one stage's. It does not parse, read the environment or connect; it
//! imports nothing from its siblings.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// PostgreSQL's port when none is given.
pub const DEFAULT_PORT: u16 = 5432;
/// How a DBA finds the daemon in `pg_stat_activity` unless told otherwise.
pub const DEFAULT_APPLICATION_NAME: &str = "lease-sweeper";
/// Per-host connect timeout when `connect_timeout` is unset or 0. libpq would
/// wait forever; a daemon that must keep sweeping never does.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// libpq parameters by name, as a connection string and the `PG*` variables
/// give them: still text, not yet checked beyond the string's syntax.
pub type Params = BTreeMap<String, String>;

/// Reads one environment variable (injectable for tests).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment, empty values counting as unset (as libpq does).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// libpq's `target_session_attrs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAttrs {
    Any,
    ReadWrite,
    ReadOnly,
    Primary,
    Standby,
    PreferStandby,
}

impl SessionAttrs {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "any" => Self::Any,
            "read-write" => Self::ReadWrite,
            "read-only" => Self::ReadOnly,
            "primary" => Self::Primary,
            "standby" => Self::Standby,
            "prefer-standby" => Self::PreferStandby,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::ReadWrite => "read-write",
            Self::ReadOnly => "read-only",
            Self::Primary => "primary",
            Self::Standby => "standby",
            Self::PreferStandby => "prefer-standby",
        }
    }

    /// Whether a server in `role` is acceptable (prefer-standby's first pass
    /// is `Standby`, its second `Any`).
    pub fn accepts(self, role: Role) -> bool {
        match self {
            Self::Any => true,
            Self::ReadWrite => role == Role::Writable,
            Self::ReadOnly => role != Role::Writable,
            Self::Primary => role != Role::Standby,
            Self::Standby | Self::PreferStandby => role == Role::Standby,
        }
    }
}

/// What a server turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Not in recovery, sessions read-write by default.
    Writable,
    /// Not in recovery, but `default_transaction_read_only` is on.
    ReadOnlyPrimary,
    /// In recovery: a hot standby.
    Standby,
}

/// Where one host's connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    /// A host name or literal address from `host`, looked up when connecting.
    Tcp(String),
    /// A numeric address from `hostaddr`: no name lookup.
    HostAddr(IpAddr),
    /// The directory holding the server's Unix socket.
    Socket(PathBuf),
}

/// One entry of the target's host list.
#[derive(Clone)]
pub struct Host {
    pub addr: Addr,
    pub port: u16,
    /// This entry of `host` as given, if it was: with `hostaddr`, the name
    /// the password file is matched with and TLS would verify.
    pub name: Option<String>,
    /// The password for this host: the connection string's or PGPASSWORD,
    /// else the password file's line for this host, port, database and user.
    pub(crate) password: Option<String>,
}

impl Host {
    /// `host:port`, `[v6]:port`, `/socket/dir:port`, or with `hostaddr`
    /// `name:port (hostaddr ip)`: safe to log.
    pub fn display(&self) -> String {
        match (&self.addr, &self.name) {
            (Addr::HostAddr(ip), Some(name)) => {
                format!("{} (hostaddr {ip})", host_port(name, self.port))
            }
            (Addr::HostAddr(ip), None) => host_port(&ip.to_string(), self.port),
            (Addr::Tcp(h), _) => host_port(h, self.port),
            (Addr::Socket(dir), _) => format!("{}:{}", dir.display(), self.port),
        }
    }

    /// The password this host is sent, if any.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }
}

/// `host:port`, with an IPv6 address in brackets.
pub(crate) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Where the target came from, for a `starting` line (names, never values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A connection string in this variable, plus the `PG*` variables that
    /// filled what it left out.
    Url(&'static str, Vec<&'static str>),
    /// No connection string: these `PG*` variables and defaults.
    PgVariables(Vec<&'static str>),
    /// Nothing set: libpq's defaults (local socket, the OS user).
    Defaults,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Url(var, env) if env.is_empty() => write!(f, "{var}"),
            Self::Url(var, env) => write!(f, "{var} + {}", env.join(" ")),
            Self::PgVariables(env) => {
                write!(f, "PG variables ({}) + libpq defaults", env.join(" "))
            }
            Self::Defaults => write!(f, "libpq defaults"),
        }
    }
}

/// Replaces every known secret in a message with `***`. The only place
/// secrets are scrubbed: a target's errors go through it before they leave
/// the crate, and the daemon scrubs server and driver messages with the
/// target's own (`Target::redactor`).
#[derive(Clone, Default)]
pub struct Redactor(Vec<String>);

impl Redactor {
    /// A redactor for these secrets (empty ones are dropped, longest first
    /// so a secret containing another is replaced whole).
    pub fn new(mut secrets: Vec<String>) -> Self {
        secrets.retain(|s| !s.is_empty());
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Self(secrets)
    }

    pub fn redact(&self, message: &str) -> String {
        let mut out = message.to_owned();
        for secret in &self.0 {
            out = out.replace(secret.as_str(), "***");
        }
        out
    }

    /// The secrets themselves (for tests and for checking a message).
    pub fn secrets(&self) -> &[String] {
        &self.0
    }
}

impl std::fmt::Debug for Redactor {
    // Never print what it scrubs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secrets)", self.0.len())
    }
}

/// A target that cannot be resolved: what was wrong, never a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ResolveError(pub(crate) String);
