//! Where the lock database is, by libpq's rules, and the walk over its hosts.
//!
//! Owns reading a connection string (a `postgres://` URL, multi-host
//! `h1:p1,h2:p2` included, or a `key=value` conninfo), filling what it leaves
//! out from libpq's `PG*` variables and defaults (the OS user, never
//! `anonymous`; `~/.pgpass` with its matching and 0600 rules; the
//! `~/.postgresql/` certificates), naming the target without secrets, and
//! connecting: each host in order, each within `connect_timeout`, kept only
//! when it has the `target_session_attrs` asked for.
//!
//! It does not own session settings, retries, SQL of the sweeper or the
//! wording of errors for operators (`pg::conn`), and it never logs.
//!
//! sqlx's `PgConnectOptions` holds one host and reads some variables itself;
//! this module resolves everything first and hands sqlx one host at a time
//! (docs/decisions.md §11 says why the walk is ours).

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{Connection as _, PgConnection, Row as _};

/// PostgreSQL's port when none is given.
pub const DEFAULT_PORT: u16 = 5432;
/// How a DBA finds the sweeper in `pg_stat_activity` unless told otherwise.
pub const DEFAULT_APPLICATION_NAME: &str = "lease-sweeper";
/// Per-host connect timeout when `connect_timeout` is unset or 0. libpq would
/// wait forever; a daemon that must keep sweeping never does.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// libpq raises a `connect_timeout` of 1 to 2 s; so do we.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Where libpq (as Debian builds it) looks for the server's socket; the
/// others are where other builds put it. The first holding a socket wins.
const SOCKET_DIRS: &[&str] = &["/var/run/postgresql", "/private/tmp", "/tmp"];
/// libpq's compiled-in socket directory on Debian: for `.pgpass` it counts as
/// `localhost`.
const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";

/// One round trip telling a standby from a primary and a read-only session
/// from a writable one (libpq asks the same with `SHOW transaction_read_only`
/// and `pg_is_in_recovery()`). Simple protocol: no prepared statement.
const SESSION_ROLE: &str = "SELECT pg_catalog.pg_is_in_recovery()::text, \
     pg_catalog.current_setting('transaction_read_only')";

/// The connection parameters understood here (libpq's names).
const KNOWN_PARAMS: &[&str] = &[
    "host",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "connect_timeout",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "application_name",
    "fallback_application_name",
    "options",
    "target_session_attrs",
];

/// libpq parameters accepted but not acted on, with the one value that must
/// be refused because ignoring it would weaken what the operator asked for
/// (`None`: any value is harmless to ignore). Each ignored one is a note.
const IGNORED_PARAMS: &[(&str, Option<&str>)] = &[
    ("keepalives", None),
    ("keepalives_idle", None),
    ("keepalives_interval", None),
    ("keepalives_count", None),
    ("tcp_user_timeout", None),
    ("sslcompression", None),
    ("sslsni", None),
    ("gssencmode", Some("require")),
    ("channel_binding", Some("require")),
    ("sslnegotiation", Some("direct")),
];

/// Whether `key` is one of the ignored parameters, whose values are no secret.
fn harmless_key(key: &str) -> bool {
    IGNORED_PARAMS.iter().any(|(k, _)| *k == key)
}

/// libpq's environment variable for each parameter.
const ENV_VARS: &[(&str, &str)] = &[
    ("host", "PGHOST"),
    ("port", "PGPORT"),
    ("dbname", "PGDATABASE"),
    ("user", "PGUSER"),
    ("password", "PGPASSWORD"),
    ("passfile", "PGPASSFILE"),
    ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
    ("application_name", "PGAPPNAME"),
    ("options", "PGOPTIONS"),
    ("target_session_attrs", "PGTARGETSESSIONATTRS"),
];

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
    fn accepts(self, role: Role) -> bool {
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

/// Where one host is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    Tcp(String),
    /// The directory holding the server's Unix socket.
    Socket(PathBuf),
}

#[derive(Clone)]
pub struct Host {
    pub addr: Addr,
    pub port: u16,
    /// The password for this host: the connection string's or PGPASSWORD,
    /// else the password file's line for this host, port, database and user.
    password: Option<String>,
}

impl Host {
    /// `host:port`, `[v6]:port` or `/socket/dir:port`: safe to log.
    pub fn display(&self) -> String {
        match &self.addr {
            Addr::Tcp(h) if h.contains(':') => format!("[{h}]:{}", self.port),
            Addr::Tcp(h) => format!("{h}:{}", self.port),
            Addr::Socket(dir) => format!("{}:{}", dir.display(), self.port),
        }
    }
}

/// Where the target came from, for the `starting` line (names, never values).
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

/// A resolved connection target: one or more hosts and how to talk to them.
#[derive(Clone)]
pub struct Target {
    hosts: Vec<Host>,
    user: String,
    dbname: String,
    sslmode: PgSslMode,
    sslrootcert: Option<PathBuf>,
    sslcert: Option<PathBuf>,
    sslkey: Option<PathBuf>,
    application_name: String,
    options: Vec<(String, String)>,
    connect_timeout: Duration,
    /// `None` when neither the string nor PGTARGETSESSIONATTRS says.
    session_attrs: Option<SessionAttrs>,
    origin: Origin,
    notes: Vec<String>,
    secrets: Vec<String>,
}

/// Reads one environment variable (injectable for tests).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment, empty values counting as unset (as libpq does).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl Target {
    /// `conninfo` (a URL or `key=value` string, named `var` in messages)
    /// completed from `env` and libpq's defaults.
    pub fn resolve(conninfo: Option<(&'static str, &str)>, env: Env) -> Result<Self, String> {
        let mut params = match conninfo {
            Some((_, s)) if s.starts_with("postgres://") || s.starts_with("postgresql://") => {
                parse_url(s)?
            }
            Some((_, s)) => parse_conninfo(s)?,
            None => BTreeMap::new(),
        };
        let mut raw_secrets = Vec::new();
        if let Some((_, s)) = conninfo {
            raw_secrets.extend(raw_url_password(s));
        }
        let mut notes = Vec::new();
        let mut ignored = Vec::new();
        for (key, value) in &params {
            if KNOWN_PARAMS.contains(&key.as_str()) {
                continue;
            }
            let harmless = match IGNORED_PARAMS.iter().find(|(k, _)| k == key) {
                Some((_, None)) => true,
                Some((_, Some(refused))) => value != refused,
                None => false,
            };
            if !harmless {
                // The value is never echoed: it may be a secret (sslpassword).
                let what = if harmless_key(key) {
                    format!("{key}={value}")
                } else {
                    key.clone()
                };
                return Err(format!(
                    "unsupported parameter {what} (supported: {})",
                    KNOWN_PARAMS.join(", ")
                ));
            }
            notes.push(format!(
                "connection parameter {key} is not supported by lease-sweeper and is ignored"
            ));
            ignored.push(key.clone());
        }
        for key in ignored {
            params.remove(&key);
        }
        if env("PGHOSTADDR").is_some() {
            notes.push("PGHOSTADDR is not supported and is ignored; use PGHOST".to_owned());
        }
        let mut from_env = Vec::new();
        for (key, var) in ENV_VARS {
            if !params.contains_key(*key)
                && let Some(v) = env(var)
            {
                params.insert((*key).to_owned(), v);
                from_env.push(*var);
            }
        }
        let origin = match conninfo {
            Some((var, _)) => Origin::Url(var, from_env),
            None if from_env.is_empty() => Origin::Defaults,
            None => Origin::PgVariables(from_env),
        };
        let get = |k: &str| params.get(k).map(String::as_str);

        let user = match get("user") {
            Some(u) => u.to_owned(),
            None => os_user_name().ok_or(
                "no user given and the operating-system user name cannot be read \
                 (getpwuid found no entry for this uid); set PGUSER or put the user in the URL",
            )?,
        };
        let dbname = get("dbname").unwrap_or(&user).to_owned();
        let home = home_dir(env);

        // Hosts and ports: comma lists, one port for all or one per host.
        let host_list: Vec<&str> = get("host").map_or(vec![""], |h| h.split(',').collect());
        let port_list: Vec<&str> = get("port").map_or(vec![""], |p| p.split(',').collect());
        if port_list.len() != 1 && port_list.len() != host_list.len() {
            return Err(format!(
                "could not match {} port numbers to {} hosts",
                port_list.len(),
                host_list.len()
            ));
        }
        let mut hosts = Vec::with_capacity(host_list.len());
        for (i, h) in host_list.iter().enumerate() {
            let p = port_list[if port_list.len() == 1 { 0 } else { i }].trim();
            let port = if p.is_empty() {
                DEFAULT_PORT
            } else {
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("invalid port number {p:?}"))?
            };
            let h = h.trim();
            let addr = if h.is_empty() {
                default_addr(port)
            } else if h.starts_with('/') {
                Addr::Socket(PathBuf::from(h))
            } else {
                Addr::Tcp(h.to_owned())
            };
            hosts.push(Host {
                addr,
                port,
                password: None,
            });
        }

        // Passwords: the string's (or PGPASSWORD) for every host, else the
        // password file's line for each host.
        match get("password") {
            Some(pw) => {
                raw_secrets.push(pw.to_owned());
                for h in &mut hosts {
                    h.password = Some(pw.to_owned());
                }
            }
            None => {
                let passfile = get("passfile")
                    .map(PathBuf::from)
                    .or_else(|| home.as_ref().map(|d| d.join(".pgpass")));
                if let Some(path) = passfile
                    && let Some(lines) = read_passfile(&path, &mut notes)
                {
                    for h in &mut hosts {
                        h.password = passfile_password(&lines, h, &dbname, &user);
                        raw_secrets.extend(h.password.clone());
                    }
                }
            }
        }

        let sslmode = match get("sslmode") {
            None => PgSslMode::Prefer,
            Some(m) => m.parse().map_err(|_| {
                format!(
                    "invalid sslmode {m:?} (disable, allow, prefer, require, verify-ca, verify-full)"
                )
            })?,
        };
        let postgresql_dir = home.as_ref().map(|d| d.join(".postgresql"));
        let default_file = |name: &str| {
            postgresql_dir
                .as_ref()
                .map(|d| d.join(name))
                .filter(|p| p.is_file())
        };
        let verifying = matches!(sslmode, PgSslMode::VerifyCa | PgSslMode::VerifyFull);
        let sslrootcert = match get("sslrootcert") {
            // The built-in public roots (sqlx's webpki set), as libpq's `system`.
            Some("system") => None,
            Some(path) => Some(PathBuf::from(path)),
            None => match default_file("root.crt") {
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
        let sslcert = get("sslcert")
            .map(PathBuf::from)
            .or_else(|| default_file("postgresql.crt"));
        let sslkey = get("sslkey")
            .map(PathBuf::from)
            .or_else(|| default_file("postgresql.key"));

        let application_name = get("application_name")
            .or(get("fallback_application_name"))
            .unwrap_or(DEFAULT_APPLICATION_NAME)
            .to_owned();
        let connect_timeout = match get("connect_timeout") {
            None => DEFAULT_CONNECT_TIMEOUT,
            Some(t) => match t.trim().parse::<i64>() {
                Ok(s) if s <= 0 => DEFAULT_CONNECT_TIMEOUT,
                Ok(s) => Duration::from_secs(s as u64).max(MIN_CONNECT_TIMEOUT),
                Err(_) => return Err(format!("invalid connect_timeout {t:?} (whole seconds)")),
            },
        };
        let session_attrs = match get("target_session_attrs") {
            None => None,
            Some(a) => Some(SessionAttrs::parse(a).ok_or_else(|| {
                format!(
                    "invalid target_session_attrs {a:?} (any, read-write, read-only, primary, \
                     standby, prefer-standby)"
                )
            })?),
        };
        let options = match get("options") {
            None => Vec::new(),
            Some(o) => parse_options(o)?,
        };

        let mut secrets: Vec<String> = raw_secrets.into_iter().filter(|s| !s.is_empty()).collect();
        secrets.sort();
        secrets.dedup();
        Ok(Self {
            hosts,
            user,
            dbname,
            sslmode,
            sslrootcert,
            sslcert,
            sslkey,
            application_name,
            options,
            connect_timeout,
            session_attrs,
            origin,
            notes,
            secrets,
        })
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    pub fn user(&self) -> &str {
        &self.user
    }

    pub fn dbname(&self) -> &str {
        &self.dbname
    }

    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The operator's `target_session_attrs`, if any.
    pub fn session_attrs(&self) -> Option<SessionAttrs> {
        self.session_attrs
    }

    /// Things the operator should know that did not stop us (a password file
    /// ignored for its permissions).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Every password this target may send: for scrubbing messages.
    pub fn secrets(&self) -> &[String] {
        &self.secrets
    }

    /// `postgres://user@h1:p1,h2:p2/db`, no password; a single socket
    /// directory as libpq writes it, `postgres://user@/db?host=/dir` (with
    /// `&port=N` when the socket file is not `.s.PGSQL.5432`).
    pub fn display(&self) -> String {
        let mut query = Vec::new();
        let netloc = match self.hosts.as_slice() {
            [
                Host {
                    addr: Addr::Socket(dir),
                    port,
                    ..
                },
            ] => {
                // libpq's own form for a socket: no TCP host or port in the
                // authority; the port only names the socket file.
                query.push(format!("host={}", dir.display()));
                if *port != DEFAULT_PORT {
                    query.push(format!("port={port}"));
                }
                String::new()
            }
            hosts => hosts
                .iter()
                .map(|h| match &h.addr {
                    Addr::Socket(dir) => {
                        format!("{}:{}", encode(&dir.display().to_string()), h.port)
                    }
                    Addr::Tcp(_) => h.display(),
                })
                .collect::<Vec<_>>()
                .join(","),
        };
        if let Some(attrs) = self.session_attrs {
            query.push(format!("target_session_attrs={}", attrs.as_str()));
        }
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        format!(
            "postgres://{}@{netloc}/{}{query}",
            encode(&self.user),
            encode(&self.dbname)
        )
    }

    /// sqlx's options for host `i` alone.
    pub fn options_for(&self, i: usize) -> PgConnectOptions {
        let host = &self.hosts[i];
        let mut o = PgConnectOptions::new_without_pgpass()
            .port(host.port)
            .username(&self.user)
            .database(&self.dbname)
            .ssl_mode(self.sslmode)
            .application_name(&self.application_name)
            // Not a parameter PgBouncer knows: it would refuse the connection
            // unless told to ignore it. Only text-format floats need it; every
            // value here travels in binary.
            .extra_float_digits(None);
        o = match &host.addr {
            Addr::Tcp(h) => o.host(h),
            Addr::Socket(dir) => o.socket(dir),
        };
        if let Some(pw) = &host.password {
            o = o.password(pw);
        }
        if let Some(p) = &self.sslrootcert {
            o = o.ssl_root_cert(p);
        }
        if let Some(p) = &self.sslcert {
            o = o.ssl_client_cert(p);
        }
        if let Some(p) = &self.sslkey {
            o = o.ssl_client_key(p);
        }
        if !self.options.is_empty() {
            o = o.options(self.options.iter().map(|(k, v)| (k, v)));
        }
        o
    }

    /// libpq's host walk: each host in order, each within `connect_timeout`,
    /// the first whose session has `attrs` wins (prefer-standby: the first
    /// standby, else the first that answers at all). Returns the connection
    /// and the host's index, or why each host was passed over.
    pub async fn connect(&self, attrs: SessionAttrs) -> Result<(PgConnection, usize), WalkError> {
        let passes = match attrs {
            SessionAttrs::PreferStandby => vec![SessionAttrs::Standby, SessionAttrs::Any],
            other => vec![other],
        };
        let mut attempts = Vec::new();
        for pass in &passes {
            attempts.clear();
            for i in 0..self.hosts.len() {
                match self.try_host(i, *pass).await {
                    Ok(conn) => return Ok((conn, i)),
                    Err(why) => attempts.push((self.hosts[i].display(), why)),
                }
            }
        }
        Err(WalkError { attrs, attempts })
    }

    async fn try_host(&self, i: usize, attrs: SessionAttrs) -> Result<PgConnection, HostFailure> {
        let options = self.options_for(i);
        let mut conn =
            match tokio::time::timeout(self.connect_timeout, PgConnection::connect_with(&options))
                .await
            {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => return Err(HostFailure::Connect(e)),
                Err(_) => return Err(HostFailure::Timeout(self.connect_timeout)),
            };
        if attrs == SessionAttrs::Any {
            return Ok(conn);
        }
        match tokio::time::timeout(self.connect_timeout, session_role(&mut conn)).await {
            Ok(Ok(role)) if attrs.accepts(role) => Ok(conn),
            Ok(Ok(role)) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), conn.close()).await;
                Err(HostFailure::Role(role))
            }
            Ok(Err(e)) => Err(HostFailure::Connect(e)),
            Err(_) => Err(HostFailure::Timeout(self.connect_timeout)),
        }
    }
}

/// What the connected server is, asked in one simple-protocol round trip.
pub async fn session_role(conn: &mut PgConnection) -> Result<Role, sqlx::Error> {
    let row = sqlx::raw_sql(SESSION_ROLE).fetch_one(&mut *conn).await?;
    if row.len() != 2 {
        return Err(sqlx::Error::Protocol(format!(
            "the session check returned {} columns, expected 2",
            row.len()
        )));
    }
    let in_recovery: String = row.try_get(0)?;
    let read_only: String = row.try_get(1)?;
    Ok(if in_recovery == "true" {
        Role::Standby
    } else if read_only == "on" {
        Role::ReadOnlyPrimary
    } else {
        Role::Writable
    })
}

/// Why one host was passed over.
#[derive(Debug)]
pub enum HostFailure {
    Connect(sqlx::Error),
    Timeout(Duration),
    /// It answered, but not with the session asked for.
    Role(Role),
}

/// No host had a session with the attributes asked for.
#[derive(Debug)]
pub struct WalkError {
    pub attrs: SessionAttrs,
    /// Each host (as displayed) and why it was passed over, in walk order.
    pub attempts: Vec<(String, HostFailure)>,
}

impl WalkError {
    /// Every host answered, and every one is a hot standby.
    pub fn all_standby(&self) -> bool {
        !self.attempts.is_empty()
            && self
                .attempts
                .iter()
                .all(|(_, f)| matches!(f, HostFailure::Role(Role::Standby)))
    }
}

/// The OS user name of the effective uid, as libpq's `pg_fe_getauthname`.
pub fn os_user_name() -> Option<String> {
    // SAFETY: getpwuid_r writes into our buffers only; pw is read while buf lives.
    unsafe {
        let uid = libc::geteuid();
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let mut buf = vec![0 as libc::c_char; 16_384];
        let rc = libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut result);
        if rc != 0 || result.is_null() || pw.pw_name.is_null() {
            return None;
        }
        let name = CStr::from_ptr(pw.pw_name).to_string_lossy().into_owned();
        (!name.is_empty()).then_some(name)
    }
}

/// `$HOME`, else the passwd entry's directory (libpq ≥ 15 does the same).
fn home_dir(env: Env) -> Option<PathBuf> {
    if let Some(h) = env("HOME") {
        return Some(PathBuf::from(h));
    }
    // SAFETY: as in os_user_name.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let mut buf = vec![0 as libc::c_char; 16_384];
        let rc = libc::getpwuid_r(
            libc::geteuid(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        );
        if rc != 0 || result.is_null() || pw.pw_dir.is_null() {
            return None;
        }
        Some(PathBuf::from(
            CStr::from_ptr(pw.pw_dir).to_string_lossy().into_owned(),
        ))
    }
}

/// No host given: the first usual socket directory holding this port's
/// socket, else `localhost` over TCP (as sqlx did before).
fn default_addr(port: u16) -> Addr {
    SOCKET_DIRS
        .iter()
        .map(Path::new)
        .find(|d| d.join(format!(".s.PGSQL.{port}")).exists())
        .map(|d| Addr::Socket(d.to_path_buf()))
        .unwrap_or_else(|| Addr::Tcp("localhost".to_owned()))
}

/// The password file's lines, or `None` when it is absent or must be ignored
/// (not a plain file; group or world access, as libpq refuses it).
fn read_passfile(path: &Path, notes: &mut Vec<String>) -> Option<Vec<String>> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        notes.push(format!(
            "password file {:?} is not a plain file; it is ignored",
            path.display().to_string()
        ));
        return None;
    }
    if meta.mode() & 0o077 != 0 {
        notes.push(format!(
            "password file {:?} has group or world access; permissions should be u=rw (0600) or \
             less; it is ignored",
            path.display().to_string()
        ));
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    Some(text.lines().map(str::to_owned).collect())
}

/// The password of the first line matching `host:port:dbname:user`, with
/// libpq's rules: `*` matches anything, `\:` and `\\` escape, `#` starts a
/// comment line, a Unix socket in the default directory counts as
/// `localhost`.
fn passfile_password(lines: &[String], host: &Host, dbname: &str, user: &str) -> Option<String> {
    let hostname = match &host.addr {
        Addr::Tcp(h) => h.clone(),
        Addr::Socket(dir) if dir == Path::new(DEFAULT_SOCKET_DIR) => "localhost".to_owned(),
        Addr::Socket(dir) => dir.display().to_string(),
    };
    let port = host.port.to_string();
    let wanted = [hostname.as_str(), port.as_str(), dbname, user];
    for line in lines {
        let line = line.trim_end_matches('\r');
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let fields = split_passfile_line(line);
        if fields.len() < 5 {
            continue;
        }
        if fields[..4]
            .iter()
            .zip(wanted)
            .all(|(f, w)| f == "*" || f == w)
        {
            return Some(fields[4].clone()).filter(|p| !p.is_empty());
        }
    }
    None
}

/// Splits on unescaped `:` into at most five fields, unescaping `\x` to `x`.
fn split_passfile_line(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    fields.last_mut().expect("non-empty").push(n);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().expect("non-empty").push(c),
        }
    }
    fields
}

/// Parses a `postgres://` / `postgresql://` URL into libpq parameters.
fn parse_url(s: &str) -> Result<BTreeMap<String, String>, String> {
    let rest = s
        .strip_prefix("postgresql://")
        .or_else(|| s.strip_prefix("postgres://"))
        .ok_or("it must start with postgres:// or postgresql://")?;
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let (netloc, path) = match before_query.split_once('/') {
        Some((n, p)) => (n, Some(p)),
        None => (before_query, None),
    };
    let mut params = BTreeMap::new();
    let hostlist = match netloc.split_once('@') {
        Some((userinfo, hosts)) => {
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            if !user.is_empty() {
                params.insert("user".into(), decode(user)?);
            }
            if let Some(p) = password {
                params.insert("password".into(), decode(p)?);
            }
            hosts
        }
        None => netloc,
    };
    let mut hosts = Vec::new();
    let mut ports = Vec::new();
    for spec in hostlist.split(',') {
        let (host, port) = if let Some(v6) = spec.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("missing \"]\" in host {spec:?}"))?;
            let port = match after {
                "" => "",
                p => p
                    .strip_prefix(':')
                    .ok_or_else(|| format!("unexpected {p:?} after the IPv6 host"))?,
            };
            (h.to_owned(), port)
        } else {
            match spec.split_once(':') {
                Some((h, p)) => (decode(h)?, p),
                None => (decode(spec)?, ""),
            }
        };
        if !port.is_empty() && port.parse::<u16>().is_err() {
            return Err(format!("invalid port {port:?}"));
        }
        hosts.push(host);
        ports.push(port.to_owned());
    }
    if hosts.iter().any(|h| !h.is_empty()) {
        params.insert("host".into(), hosts.join(","));
    }
    if ports.iter().any(|p| !p.is_empty()) {
        params.insert("port".into(), ports.join(","));
    }
    if let Some(db) = path.filter(|p| !p.is_empty()) {
        params.insert("dbname".into(), decode(db)?);
    }
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("query parameter {pair:?} has no value"))?;
        let (k, v) = (decode(k)?, decode(v)?);
        // JDBC's spelling, which libpq accepts too.
        if k == "ssl" && v == "true" {
            params.insert("sslmode".into(), "require".into());
        } else {
            params.insert(k, v);
        }
    }
    Ok(params)
}

/// Parses libpq's `key=value key='quoted \' value'` form.
fn parse_conninfo(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut params = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(params);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(format!(
                "missing \"=\" after {key:?} (expected key=value pairs or a postgres:// URL)"
            ));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => return Err(format!("unterminated quoted value for {key:?}")),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        params.insert(key, value);
    }
}

/// `-c name=value` settings from libpq's `options` (also `--name=value`).
fn parse_options(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut words = s.split_whitespace();
    while let Some(w) = words.next() {
        let setting = if w == "-c" {
            words.next().ok_or("options: \"-c\" without a setting")?
        } else if let Some(s) = w.strip_prefix("-c").or_else(|| w.strip_prefix("--")) {
            s
        } else {
            return Err(format!(
                "options: only \"-c name=value\" settings are supported, got {w:?}"
            ));
        };
        let (k, v) = setting
            .split_once('=')
            .ok_or_else(|| format!("options: {setting:?} is not name=value"))?;
        out.push((k.replace('-', "_"), v.to_owned()));
    }
    Ok(out)
}

/// The password exactly as written in a URL (still percent-encoded), so a
/// message echoing the raw string is scrubbed too.
fn raw_url_password(s: &str) -> Option<String> {
    let rest = s
        .strip_prefix("postgresql://")
        .or_else(|| s.strip_prefix("postgres://"))?;
    let netloc = rest.split(['/', '?']).next()?;
    let (userinfo, _) = netloc.split_once('@')?;
    userinfo.split_once(':').map(|(_, p)| p.to_owned())
}

/// Percent-decoding as libpq does it (`+` stays `+`).
fn decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| "invalid percent-encoded token".to_owned())?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent-encoded value is not UTF-8".to_owned())
}

/// Percent-encodes what would break a URL's structure.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn multi_host_url_with_libpq_parameters() {
        let t = Target::resolve(
            Some((
                "LOCKDB_URL",
                "postgres://u:p%40ss@h1:5432,h2:5433,[::1]/db?target_session_attrs=read-write&connect_timeout=3",
            )),
            &env_of(&[("HOME", "/nonexistent")]),
        )
        .unwrap();
        let hosts: Vec<String> = t.hosts().iter().map(Host::display).collect();
        assert_eq!(hosts, ["h1:5432", "h2:5433", "[::1]:5432"]);
        assert_eq!(t.session_attrs(), Some(SessionAttrs::ReadWrite));
        assert_eq!(t.connect_timeout(), Duration::from_secs(3));
        assert_eq!(t.user(), "u");
        assert_eq!(t.dbname(), "db");
        assert!(t.secrets().contains(&"p@ss".to_owned()));
        assert!(t.secrets().contains(&"p%40ss".to_owned()));
        assert_eq!(
            t.display(),
            "postgres://u@h1:5432,h2:5433,[::1]:5432/db?target_session_attrs=read-write"
        );
        assert_eq!(t.origin().to_string(), "LOCKDB_URL");
    }

    #[test]
    fn pg_variables_comma_lists_and_the_os_user() {
        let t = Target::resolve(
            None,
            &env_of(&[
                ("PGHOST", "a,b"),
                ("PGPORT", "6000,6001"),
                ("PGDATABASE", "locks"),
                ("HOME", "/nonexistent"),
            ]),
        )
        .unwrap();
        assert_eq!(t.user(), os_user_name().unwrap());
        assert_ne!(t.user(), "anonymous");
        let hosts: Vec<String> = t.hosts().iter().map(Host::display).collect();
        assert_eq!(hosts, ["a:6000", "b:6001"]);
        assert_eq!(
            t.origin().to_string(),
            "PG variables (PGHOST PGPORT PGDATABASE) + libpq defaults"
        );
        let err = Target::resolve(None, &env_of(&[("PGHOST", "a,b,c"), ("PGPORT", "1,2")]))
            .err()
            .unwrap();
        assert_eq!(err, "could not match 2 port numbers to 3 hosts");
    }

    #[test]
    fn conninfo_and_unknown_parameters() {
        let t = Target::resolve(
            Some((
                "DATABASE_URL",
                "host=/run/pg port=5433 dbname='my db' user=me password='a \\' b'",
            )),
            &env_of(&[("HOME", "/nonexistent")]),
        )
        .unwrap();
        assert_eq!(t.dbname(), "my db");
        assert_eq!(t.secrets(), ["a ' b"]);
        assert_eq!(t.display(), "postgres://me@/my%20db?host=/run/pg&port=5433");
        let err = Target::resolve(Some(("LOCKDB_URL", "postgres://h/db?bogus=1")), &|_| None)
            .err()
            .unwrap();
        assert!(err.starts_with("unsupported parameter bogus ("), "{err}");
        let t = Target::resolve(
            Some((
                "LOCKDB_URL",
                "postgres://h/db?keepalives=1&gssencmode=disable",
            )),
            &|_| None,
        )
        .unwrap();
        assert_eq!(t.notes().len(), 2, "{:?}", t.notes());
        let err = Target::resolve(
            Some(("LOCKDB_URL", "postgres://h/db?channel_binding=require")),
            &|_| None,
        )
        .err()
        .unwrap();
        assert!(
            err.starts_with("unsupported parameter channel_binding"),
            "{err}"
        );
    }

    #[test]
    fn pgpass_matching_escapes_and_permissions() {
        let dir = std::env::temp_dir().join(format!("pgpass-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pass");
        std::fs::write(
            &file,
            "# comment\nother:5432:db:u:wrong\nh\\:x:*:db:u:nope\nh2:5433:*:u:s3\\:cret\n*:*:*:*:fallback\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let url = format!("postgres://u@h1,h2:5433/db?passfile={}", file.display());
        let leaked: &'static str = Box::leak(url.into_boxed_str());
        let t = Target::resolve(Some(("LOCKDB_URL", leaked)), &|_| None).unwrap();
        assert_eq!(t.hosts()[0].password.as_deref(), Some("fallback"));
        assert_eq!(t.hosts()[1].password.as_deref(), Some("s3:cret"));
        assert!(t.notes().is_empty());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let t = Target::resolve(Some(("LOCKDB_URL", leaked)), &|_| None).unwrap();
        assert_eq!(t.hosts()[0].password, None);
        assert!(
            t.notes()[0].contains("group or world access"),
            "{:?}",
            t.notes()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn session_attrs_accept_what_libpq_accepts() {
        use Role::*;
        use SessionAttrs as A;
        let table = [
            (A::Any, [true, true, true]),
            (A::ReadWrite, [true, false, false]),
            (A::ReadOnly, [false, true, true]),
            (A::Primary, [true, true, false]),
            (A::Standby, [false, false, true]),
            // Its first pass; the second is `Any`.
            (A::PreferStandby, [false, false, true]),
        ];
        for (attrs, expected) in table {
            let got = [Writable, ReadOnlyPrimary, Standby].map(|r| attrs.accepts(r));
            assert_eq!(got, expected, "{}", attrs.as_str());
            assert_eq!(SessionAttrs::parse(attrs.as_str()), Some(attrs));
        }
    }

    #[test]
    fn defaults_application_name_and_verify_needs_a_ca() {
        let t = Target::resolve(
            Some(("LOCKDB_URL", "postgres://u@h/db")),
            &env_of(&[("PGAPPNAME", "mine"), ("HOME", "/nonexistent")]),
        )
        .unwrap();
        assert_eq!(t.options_for(0).get_application_name(), Some("mine"));
        assert_eq!(t.origin().to_string(), "LOCKDB_URL + PGAPPNAME");
        let t = Target::resolve(Some(("LOCKDB_URL", "postgres://u@h/db")), &|_| None).unwrap();
        assert_eq!(
            t.options_for(0).get_application_name(),
            Some(DEFAULT_APPLICATION_NAME)
        );
        let err = Target::resolve(
            Some(("LOCKDB_URL", "postgres://u@h/db?sslmode=verify-full")),
            &env_of(&[("HOME", "/nonexistent")]),
        )
        .err()
        .unwrap();
        assert!(err.contains("sslrootcert"), "{err}");
    }
}
