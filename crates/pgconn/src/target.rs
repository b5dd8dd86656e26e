//! A resolved connection target, and resolving one in named stages.
//!
//! Owns the order libpq applies its rules in (parse the string, vet its
//! parameters, fill from `PG*` variables, the user and database, the host
//! list with `hostaddr` paired to `host`, each host's password, TLS, the
//! session settings), the target's password-free name and its redactor.
//! Every error leaves `resolve` scrubbed of the passwords it has seen. It
//! does not connect (`walk`) and knows nothing of the daemon's variables
//! beyond the name it is given for the string.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::conninfo::{self, encode};
use crate::env;
use crate::passfile;
use crate::tls::Tls;
use crate::types::{
    Addr, DEFAULT_APPLICATION_NAME, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT, Env, Host, Origin,
    Params, Redactor, ResolveError, SessionAttrs, host_port,
};

/// libpq raises a `connect_timeout` of 1 to 2 s; so do we.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Where libpq (as Debian builds it) looks for the server's socket; the
/// others are where other builds put it. The first holding a socket wins.
const SOCKET_DIRS: &[&str] = &["/var/run/postgresql", "/private/tmp", "/tmp"];
/// The password file under the home directory when `passfile` is unset.
const DEFAULT_PASSFILE: &str = ".pgpass";

/// A resolved connection target: one or more hosts and how to talk to them.
#[derive(Clone)]
pub struct Target {
    hosts: Vec<Host>,
    user: String,
    dbname: String,
    pub(crate) tls: Tls,
    pub(crate) settings: Settings,
    origin: Origin,
    notes: Vec<String>,
    redactor: Redactor,
    display: String,
}

/// What every session is started with, from the parameters that are
/// neither where nor who.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) application_name: String,
    /// `-c name=value` pairs from `options`.
    pub(crate) options: Vec<(String, String)>,
    pub(crate) connect_timeout: Duration,
    /// `None` when neither the string nor PGTARGETSESSIONATTRS says.
    pub(crate) session_attrs: Option<SessionAttrs>,
}

impl Target {
    /// `conninfo` (a URL or `key=value` string, named `var` in messages)
    /// completed from `env` and libpq's defaults.
    pub fn resolve(conninfo: Option<(&'static str, &str)>, env: Env) -> Result<Self, ResolveError> {
        // Known before anything can fail: the password as written, so no
        // error echoing a piece of the string carries it.
        let mut secrets: Vec<String> = conninfo
            .and_then(|(_, s)| conninfo::raw_uri_password(s))
            .map(str::to_owned)
            .into_iter()
            .collect();
        Self::resolve_stages(conninfo, env, &mut secrets)
            .map_err(|cause| ResolveError(Redactor::new(secrets).redact(&cause)))
    }

    fn resolve_stages(
        conninfo: Option<(&'static str, &str)>,
        env: Env,
        secrets: &mut Vec<String>,
    ) -> Result<Self, String> {
        let mut params = match conninfo {
            Some((_, s)) => conninfo::parse(s)?,
            None => Params::new(),
        };
        secrets.extend(params.get("password").cloned());
        let mut notes = conninfo::vet(&mut params)?;
        let from_env = env::fill(&mut params, env);
        secrets.extend(params.get("password").cloned());
        let origin = match conninfo {
            Some((var, _)) => Origin::Url(var, from_env),
            None if from_env.is_empty() => Origin::Defaults,
            None => Origin::PgVariables(from_env),
        };
        let (user, dbname) = identity(&params)?;
        let home = env::home_dir(env);
        let mut hosts = host_list(&params)?;
        notes.extend(passwords(
            &params,
            home.as_deref(),
            &mut hosts,
            &dbname,
            &user,
        ));
        secrets.extend(hosts.iter().filter_map(|h| h.password.clone()));
        let tls = Tls::resolve(&params, home.as_deref(), &hosts)?;
        let settings = settings(&params)?;
        let display = display(&hosts, &user, &dbname, settings.session_attrs);
        Ok(Self {
            hosts,
            user,
            dbname,
            tls,
            settings,
            origin,
            notes,
            redactor: Redactor::new(secrets.clone()),
            display,
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
        self.settings.connect_timeout
    }

    /// The operator's `target_session_attrs`, if any.
    pub fn session_attrs(&self) -> Option<SessionAttrs> {
        self.settings.session_attrs
    }

    /// Things the operator should know that did not stop us (a password file
    /// ignored for its permissions, a parameter ignored).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Scrubs every password this target may send out of a message.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// `postgres://user@h1:p1,h2:p2/db`, no password; a single socket
    /// directory as libpq writes it, `postgres://user@/db?host=/dir` (with
    /// `&port=N` when the socket file is not `.s.PGSQL.5432`); `hostaddr`
    /// values in the query beside the names they pair with.
    pub fn display(&self) -> &str {
        &self.display
    }
}

impl std::fmt::Debug for Target {
    // Never print the passwords the target holds.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Target").field(&self.display).finish()
    }
}

/// Who connects to which database: `user`, else the OS user (never
/// `anonymous`); `dbname`, else the user's name.
fn identity(params: &Params) -> Result<(String, String), String> {
    let user = match params.get("user") {
        Some(u) => u.clone(),
        None => env::os_user_name().ok_or(
            "no user given and the operating-system user name cannot be read \
             (getpwuid found no entry for this uid); set PGUSER or put the user in the URL",
        )?,
    };
    let dbname = params.get("dbname").unwrap_or(&user).clone();
    Ok((user, dbname))
}

/// The host list: `host` and `hostaddr` comma lists paired entry by entry
/// (as long as each other when both are given), one port for all or one
/// per host, an empty entry meaning the default.
fn host_list(params: &Params) -> Result<Vec<Host>, String> {
    let list = |key: &str| {
        params
            .get(key)
            .map(|v| v.split(',').map(str::trim).collect::<Vec<_>>())
    };
    let names = list("host");
    let addrs = list("hostaddr");
    let count = match (&names, &addrs) {
        (Some(n), Some(a)) if n.len() != a.len() => {
            return Err(format!(
                "could not match {} host names to {} hostaddr values",
                n.len(),
                a.len()
            ));
        }
        (_, Some(a)) => a.len(),
        (Some(n), None) => n.len(),
        (None, None) => 1,
    };
    let ports = list("port").unwrap_or_else(|| vec![""]);
    if ports.len() != 1 && ports.len() != count {
        return Err(format!(
            "could not match {} port numbers to {count} hosts",
            ports.len()
        ));
    }
    let entry = |list: &Option<Vec<&str>>, i: usize| {
        list.as_ref()
            .map(|l| l[i].to_owned())
            .filter(|v| !v.is_empty())
    };
    (0..count)
        .map(|i| {
            let p = ports[if ports.len() == 1 { 0 } else { i }];
            let port = if p.is_empty() {
                DEFAULT_PORT
            } else {
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("invalid port number {p:?}"))?
            };
            let name = entry(&names, i);
            let addr = match (entry(&addrs, i), &name) {
                (Some(a), _) => Addr::HostAddr(a.parse().map_err(|_| {
                    format!(
                        "invalid hostaddr {a:?}: it takes a numeric IPv4 or IPv6 address \
                         (a name goes in host)"
                    )
                })?),
                (None, Some(h)) if h.starts_with('/') => Addr::Socket(PathBuf::from(h)),
                (None, Some(h)) => Addr::Tcp(h.clone()),
                (None, None) => default_addr(port),
            };
            Ok(Host {
                addr,
                port,
                name,
                password: None,
            })
        })
        .collect()
}

/// No host given: the first usual socket directory holding this port's
/// socket, else `localhost` over TCP.
fn default_addr(port: u16) -> Addr {
    SOCKET_DIRS
        .iter()
        .map(Path::new)
        .find(|d| d.join(format!(".s.PGSQL.{port}")).exists())
        .map(|d| Addr::Socket(d.to_path_buf()))
        .unwrap_or_else(|| Addr::Tcp("localhost".to_owned()))
}

/// Each host's password: the string's (or PGPASSWORD) for every host, else
/// the password file's line for that host. Returns notes on the file.
fn passwords(
    params: &Params,
    home: Option<&Path>,
    hosts: &mut [Host],
    dbname: &str,
    user: &str,
) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(pw) = params.get("password") {
        for h in hosts {
            h.password = Some(pw.clone());
        }
        return notes;
    }
    let path = params
        .get("passfile")
        .map(PathBuf::from)
        .or_else(|| home.map(|d| d.join(DEFAULT_PASSFILE)));
    if let Some(path) = path
        && let Some(lines) = passfile::read(&path, &mut notes)
    {
        for h in hosts {
            h.password = passfile::password_for(&lines, h, dbname, user);
        }
    }
    notes
}

/// The session settings: `application_name` (else
/// `fallback_application_name`, else ours), `connect_timeout` (0 or unset:
/// ours, never forever), `target_session_attrs`, `options`.
fn settings(params: &Params) -> Result<Settings, String> {
    let get = |k: &str| params.get(k).map(String::as_str);
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
    Ok(Settings {
        application_name,
        options,
        connect_timeout,
        session_attrs,
    })
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

/// The target's name for messages (see `Target::display`).
fn display(
    hosts: &[Host],
    user: &str,
    dbname: &str,
    session_attrs: Option<SessionAttrs>,
) -> String {
    let mut query = Vec::new();
    let netloc = match hosts {
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
            .map(|h| match (&h.addr, &h.name) {
                (Addr::Socket(dir), _) => {
                    format!("{}:{}", encode(&dir.display().to_string()), h.port)
                }
                (Addr::HostAddr(_), Some(name)) => host_port(name, h.port),
                (Addr::HostAddr(ip), None) => host_port(&ip.to_string(), h.port),
                (Addr::Tcp(name), _) => host_port(name, h.port),
            })
            .collect::<Vec<_>>()
            .join(","),
    };
    if hosts
        .iter()
        .any(|h| matches!(h.addr, Addr::HostAddr(_)) && h.name.is_some())
    {
        let addrs: Vec<String> = hosts
            .iter()
            .map(|h| match &h.addr {
                Addr::HostAddr(ip) => ip.to_string(),
                _ => String::new(),
            })
            .collect();
        query.push(format!("hostaddr={}", addrs.join(",")));
    }
    if let Some(attrs) = session_attrs {
        query.push(format!("target_session_attrs={}", attrs.as_str()));
    }
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{}", query.join("&"))
    };
    format!(
        "postgres://{}@{netloc}/{}{query}",
        encode(user),
        encode(dbname)
    )
}

#[cfg(test)]
mod tests;
