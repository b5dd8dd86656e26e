//! Reaching `check`'s two targets: the database, as the daemon's own host
//! walk does it (each host within the target's `connect_timeout`), saying
//! where the target came from; and the StatsD host, resolved once.

use std::time::{Duration, Instant};

use pgconn::{Addr, Origin};
use sqlx::PgConnection;

use super::report::{Line, Status};
use crate::config::{DbTarget, StatsdTarget};
use crate::pg::catalog;
use crate::pg::conn::ConnectError;

/// How long resolving the StatsD host may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a note on the connection settings is reported as.
pub(super) const SETTINGS: &str = "connection settings";

/// Said first on the connection line when the environment names no
/// database at all, so the operator does not mistake libpq's guess for it.
pub(super) const NOTHING_SET: &str = "neither LOCKDB_URL nor DATABASE_URL is set; using libpq's defaults \
     (no PG* variable is set either)";

/// How to name the database on purpose, when nothing did.
pub(super) const SET_TARGET: &str = "set LOCKDB_URL=postgres://USER@HOST:PORT/DATABASE (or libpq's PGHOST, \
     PGPORT, PGUSER, PGDATABASE) to the database the daemon sweeps";

/// What the connection line is named: the target, and where it came from.
pub(super) fn connect_what(db: &DbTarget) -> String {
    match db.target().origin() {
        Origin::Defaults => format!("connect {} (libpq defaults)", db.display()),
        _ => format!("connect {} (from {})", db.display(), db.origin()),
    }
}

/// The defaults spelled out: where libpq's rules led, and as whom.
pub(super) fn defaults_tried(db: &DbTarget) -> String {
    let target = db.target();
    let hosts: Vec<String> = target
        .hosts()
        .iter()
        .map(|h| match &h.addr {
            Addr::Socket(dir) => format!("the local socket in {} (port {})", dir.display(), h.port),
            _ => h.display(),
        })
        .collect();
    format!(
        "{NOTHING_SET}, so trying {} as role {}, database {}",
        hosts.join(", "),
        target.user(),
        target.dbname()
    )
}

/// Connects as the daemon would: the host walk, one host after the other,
/// each within the target's own `connect_timeout`
/// (`pgconn::DEFAULT_CONNECT_TIMEOUT` unless set). No deadline of check's
/// own is laid over the walk: a shorter one would cut it off on a silent
/// first host before the next one is tried.
pub(super) async fn connect(db: &DbTarget) -> Result<(PgConnection, Line), Line> {
    let what = connect_what(db);
    let defaults = matches!(db.target().origin(), Origin::Defaults);
    let mut said = Vec::new();
    if defaults {
        said.push(defaults_tried(db));
    }
    let started = Instant::now();
    let (mut conn, host) = match crate::pg::conn::connect_to(db).await {
        Ok(found) => found,
        Err(e) => {
            said.push(e.cause().to_owned());
            // Nothing named a database: naming one is the fix, whatever the
            // defaults ran into.
            if defaults {
                said.push(SET_TARGET.to_owned());
            } else if let ConnectError::Unreachable { hint, .. } = &e {
                said.push((*hint).to_owned());
            }
            return Err(Line::fail(what, said.join("; ")));
        }
    };
    let took = started.elapsed().as_millis();
    // Each check runs in its own short transaction: through PgBouncer in
    // transaction mode a statement outside one may be prepared on one server
    // connection and executed on another (see crate::pg::conn::in_tx).
    let session = match crate::pg::conn::in_tx(&mut conn, catalog::session).await {
        Ok(session) => session,
        Err(e) => {
            said.push(db.redactor().redact(&crate::pg::conn::describe(&e)));
            return Err(Line::fail(what, said.join("; ")));
        }
    };
    let hosts = db.target().hosts();
    let on = if hosts.len() > 1 {
        format!(
            " on {} (host {} of {})",
            hosts[host].display(),
            host + 1,
            hosts.len()
        )
    } else {
        String::new()
    };
    said.push(format!(
        "as role {}{on}, PostgreSQL {}, {took} ms",
        session.role, session.server_version
    ));
    if session.superuser {
        said.push(SUPERUSER.to_owned());
    }
    if defaults {
        said.push(SET_TARGET.to_owned());
    }
    let status = if session.superuser || defaults {
        Status::Warn
    } else {
        Status::Ok
    };
    Ok((conn, Line::new(status, what, said.join("; "))))
}

/// Why a superuser is a warning: the privilege checks prove nothing then.
pub(super) const SUPERUSER: &str =
    "superuser: every privilege check passes, prefer a least-privilege role";

/// Whether the StatsD host resolves. Delivery over UDP cannot be confirmed,
/// and the daemon starts without it; the preflight still flags it.
pub(super) async fn resolve_statsd(statsd: &StatsdTarget) -> Line {
    let what = format!("statsd {statsd}");
    let lookup = tokio::net::lookup_host((statsd.host.as_str(), statsd.port));
    match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
        Ok(Ok(addrs)) => {
            let addrs: Vec<String> = addrs.map(|a| a.to_string()).collect();
            if addrs.is_empty() {
                Line::fail(what, "resolves to no address; check STATSD_HOST")
            } else {
                Line::ok(
                    what,
                    format!(
                        "resolves to {} (UDP: delivery is not confirmed)",
                        addrs.join(", ")
                    ),
                )
            }
        }
        Ok(Err(e)) => Line::fail(
            what,
            format!("does not resolve ({e}); check STATSD_HOST and DNS"),
        ),
        Err(_) => Line::fail(
            what,
            format!(
                "no DNS answer within {} s; check STATSD_HOST and DNS",
                RESOLVE_TIMEOUT.as_secs()
            ),
        ),
    }
}
