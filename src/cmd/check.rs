//! `lease-sweeper check`: the operator's preflight, also run by systemd's
//! `ExecStartPre`.
//!
//! Owns the list of what the daemon needs from its environment and checking
//! each item once: where the target came from and the connection (each host
//! within the target's own `connect_timeout`, as the daemon's walk), the
//! migration version, the tables, indexes and functions, the connecting
//! role's privileges, who owns the definer functions, and that the StatsD
//! host resolves. It prints one line per check on stdout, `ok`, `warn` (a
//! finding worth acting on that does not stop the daemon) or `FAIL` (with
//! what to do), then a summary, and exits 0 unless a line is `FAIL`, 1
//! otherwise (2 stays "configuration error", as everywhere).
//!
//! It changes nothing and never prints a password: the database is named by
//! `DbTarget::display`, and every error text goes through its redactor.
//!
//! It is data-driven on purpose: the schema grows in `migrations/` by other
//! hands, and adding a table, index, function or grant to check is one line in
//! `EXPECTED` or `GRANTS`. The statements it sends are `pg::catalog`'s; this
//! module owns only the wording and the status of each line. It does not own
//! the SQL of the sweep, nor decide whether a failed check blocks the daemon
//! (the unit file does).

use std::fmt;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use pgconn::{Addr, Origin};
use sqlx::PgConnection;

use crate::config::{DbTarget, Redactor, StatsdTarget};
use crate::pg::catalog;
use crate::pg::conn::ConnectError;

/// How long resolving the StatsD host may take.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Said whenever part of the schema is missing.
const MIGRATE_HINT: &str = "run `lease-sweeper migrate` with a role that may create objects";

/// How a FAIL line about a missing privilege starts.
const LACKS: &str = "this role lacks ";

/// Added to the verdict when privileges are missing: the migrations ship a
/// role holding exactly what `run` and `check` need.
const ROLE_HINT: &str = "; the migrated role lease_sweeper holds every privilege listed: GRANT lease_sweeper TO <this role>";

/// A database object the daemon or its commands rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Object {
    /// A table, looked up through the connecting role's `search_path`.
    Table(&'static str),
    /// An index, which must also be valid (not a failed concurrent build).
    Index(&'static str),
    /// A function, by name, whatever its argument list.
    Function(&'static str),
}

impl Object {
    fn kind(self) -> &'static str {
        match self {
            Self::Table(_) => "table",
            Self::Index(_) => "index",
            Self::Function(_) => "function",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Table(n) | Self::Index(n) | Self::Function(n) => n,
        }
    }
}

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind(), self.name())
    }
}

/// The schema to find, in the order it is reported. One line per object.
pub const EXPECTED: &[Object] = &[
    // Lock leases (migrations/20261129000100_lock_leases.sql).
    Object::Table("lock_session"),
    Object::Table("lock_entry"),
    Object::Table("lock_expiry_outbox"),
    Object::Index("lock_entry_expiry_idx"),
    Object::Function("lock_acquire"),
    Object::Function("lock_renew"),
    Object::Function("lock_release"),
    Object::Function("lock_reap_expired"),
    Object::Function("lock_drain_takeovers"),
    // Backlog walk and shared held count (migrations/20261130000300_…).
    Object::Table("lock_held_count"),
    Object::Function("lock_reap_expired_walk"),
    Object::Function("lock_held_count_get"),
    Object::Function("lock_sweep_probe"),
    // Sweeps lower the shared count at once (migrations/20261201000100_…).
    Object::Table("lock_held_delta"),
    // Job leases (migrations/20261129000200_job_queue.sql).
    Object::Table("job_queue"),
    Object::Table("job_dead_letter"),
    Object::Table("queue_setting"),
    Object::Index("job_queue_lease_until_idx"),
    Object::Function("fn_job_reaper_gate_refusal"),
    Object::Function("fn_job_reaper_limit_refusal"),
    Object::Function("fn_job_reap_stale_leases_dry_run"),
    Object::Function("fn_job_reap_stale_leases_apply"),
    Object::Function("fn_queue_setting_set"),
    // The stale gauge alone (migrations/20261130000400_…).
    Object::Function("fn_job_stale_lease_count"),
    // Lease durations per kind and per job (migrations/20261201000200_…):
    // `lease-sweeper leases` and the claim and heartbeat of workers.
    Object::Table("job_kind_lease"),
    Object::Function("fn_job_kind_lease_set"),
    Object::Function("fn_job_default_lease_sec"),
];

/// A privilege the daemon's role needs, and why.
///
/// A privilege written `SELECT (a, b)` needs that privilege on each listed
/// column, not on the whole table: the daemon's role may read the job
/// columns the dry run uses, but not job payloads.
#[derive(Debug, Clone, Copy)]
pub struct Grant {
    pub on: Object,
    pub privileges: &'static [&'static str],
    pub why: &'static str,
}

/// What `run` does with the connecting role's rights. One line per object.
pub const GRANTS: &[Grant] = &[
    Grant {
        on: Object::Function("lock_held_count_get"),
        privileges: &["EXECUTE"],
        why: "the lock.held.current gauge reads the fleet's shared count",
    },
    // The sweep deletes only through these SECURITY DEFINER functions, which
    // can delete nothing but expired rows: no DELETE on the tables is needed.
    Grant {
        on: Object::Function("lock_reap_expired"),
        privileges: &["EXECUTE"],
        why: "the sweep deletes expired leases through it",
    },
    Grant {
        on: Object::Function("lock_reap_expired_walk"),
        privileges: &["EXECUTE"],
        why: "the sweep drains a backlog of expired leases through it",
    },
    Grant {
        on: Object::Function("lock_sweep_probe"),
        privileges: &["EXECUTE"],
        why: "an idle sweep asks in one statement whether there is anything to reap",
    },
    Grant {
        on: Object::Function("lock_drain_takeovers"),
        privileges: &["EXECUTE"],
        why: "the sweep drains recorded takeovers through it",
    },
    Grant {
        on: Object::Table("queue_setting"),
        privileges: &["SELECT"],
        why: "the daemon reads the queue gates",
    },
    // The gate check and the dry run are SECURITY INVOKER: they read with
    // the caller's rights. The apply is SECURITY DEFINER: EXECUTE suffices.
    Grant {
        on: Object::Table("job_queue"),
        privileges: &[
            "SELECT (job_id, job_kind, state, attempts, max_attempts, lease_owner, lease_until, lease_duration_sec, lease_duration_source)",
        ],
        why: "the dry run behind queue.lease.stale.current reads it",
    },
    Grant {
        on: Object::Function("fn_job_reaper_gate_refusal"),
        privileges: &["EXECUTE"],
        why: "the daemon asks the gates before each apply",
    },
    Grant {
        on: Object::Function("fn_job_reaper_limit_refusal"),
        privileges: &["EXECUTE"],
        why: "the dry run calls it",
    },
    Grant {
        on: Object::Function("fn_job_reap_stale_leases_dry_run"),
        privileges: &["EXECUTE"],
        why: "lease-sweeper jobs dry-run",
    },
    Grant {
        on: Object::Function("fn_job_stale_lease_count"),
        privileges: &["EXECUTE"],
        why: "the queue.lease.stale.current gauge",
    },
    Grant {
        on: Object::Function("fn_job_reap_stale_leases_apply"),
        privileges: &["EXECUTE"],
        why: "the daemon reaps stale job leases when the gates allow",
    },
];

/// What a check found: the first word of its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// As the daemon needs it.
    Ok,
    /// Works, but worth acting on (a superuser, an unset target, a schema
    /// newer than this binary): the exit status stays 0.
    Warn,
    /// The daemon would fail or lack something: the line says what to do.
    Fail,
}

impl Status {
    /// The word that starts the line; `STATUS_WIDTH` wide at most.
    pub fn word(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Fail => "FAIL",
        }
    }
}

/// Every status word is padded to this width, so the checks line up.
const STATUS_WIDTH: usize = 4;

/// One check's result: one output line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub status: Status,
    /// What was checked, e.g. `table lock_entry`.
    pub what: String,
    /// What was found, or what to do about it.
    pub detail: String,
}

impl Line {
    fn new(status: Status, what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            status,
            what: what.into(),
            detail: detail.into(),
        }
    }

    fn ok(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(Status::Ok, what, detail)
    }

    fn warn(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(Status::Warn, what, detail)
    }

    fn fail(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(Status::Fail, what, detail)
    }

    pub fn failed(&self) -> bool {
        self.status == Status::Fail
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<STATUS_WIDTH$}  {}: {}",
            self.status.word(),
            self.what,
            self.detail
        )
    }
}

/// Every check's line, in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub lines: Vec<Line>,
}

impl Report {
    /// No line is `FAIL` (warnings pass): what decides the exit status.
    pub fn passed(&self) -> bool {
        self.failed() == 0
    }

    pub fn failed(&self) -> usize {
        self.count(Status::Fail)
    }

    pub fn warned(&self) -> usize {
        self.count(Status::Warn)
    }

    fn count(&self, status: Status) -> usize {
        self.lines.iter().filter(|l| l.status == status).count()
    }

    /// The last line: a verdict an operator can read without scrolling.
    pub fn summary(&self) -> String {
        let total = self.lines.len();
        let warned = self.warned();
        let warnings = match warned {
            1 => "1 warning".to_owned(),
            n => format!("{n} warnings"),
        };
        if self.passed() {
            if warned == 0 {
                format!("check passed: all {total} checks ok")
            } else {
                format!(
                    "check passed: {} of {total} checks ok, {warnings} (see the warn lines above)",
                    total - warned
                )
            }
        } else {
            let grants_missing = self
                .lines
                .iter()
                .any(|l| l.failed() && l.detail.starts_with(LACKS));
            let (also, see) = if warned == 0 {
                (String::new(), "the FAIL lines")
            } else {
                (format!(", {warnings}"), "the FAIL and warn lines")
            };
            format!(
                "check FAILED: {} of {total} checks failed{also} (see {see} above){}",
                self.failed(),
                if grants_missing { ROLE_HINT } else { "" }
            )
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.lines {
            writeln!(f, "{line}")?;
        }
        writeln!(f, "{}", self.summary())
    }
}

/// `lease-sweeper check`: reads the environment like `run`, prints the report
/// on stdout, exits 0 when no check failed (warnings do not count), 1
/// otherwise.
pub async fn run() -> anyhow::Result<ExitCode> {
    let db = DbTarget::from_env()?;
    let statsd = StatsdTarget::from_env()?;
    let report = preflight(&db, &statsd).await;
    print!("{report}");
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Runs every check against `db` and `statsd`; never fails, reports.
pub async fn preflight(db: &DbTarget, statsd: &StatsdTarget) -> Report {
    let mut report = Report::default();
    let redactor = db.redactor();
    let connected = connect(db).await;
    // What the target's resolution ignored (a password file others may
    // read, an unsupported parameter): `run` logs the same as warnings.
    let notes = db
        .notes()
        .iter()
        .map(|note| Line::warn(SETTINGS, redactor.redact(note)));
    match connected {
        Ok((mut conn, line)) => {
            report.lines.push(line);
            report.lines.extend(notes);
            database_checks(&mut conn, &redactor, &mut report.lines).await;
            // Best effort: the server ends the session anyway when we exit.
            let _ =
                tokio::time::timeout(Duration::from_secs(1), sqlx::Connection::close(conn)).await;
        }
        Err(line) => {
            report.lines.push(line);
            report.lines.extend(notes);
            report.lines.push(Line::fail(
                "schema and privileges",
                "not checked without a database connection",
            ));
        }
    }
    report.lines.push(resolve_statsd(statsd).await);
    report
}

/// What a note on the connection settings is reported as.
const SETTINGS: &str = "connection settings";

/// Said first on the connection line when the environment names no
/// database at all, so the operator does not mistake libpq's guess for it.
const NOTHING_SET: &str = "neither LOCKDB_URL nor DATABASE_URL is set; using libpq's defaults \
     (no PG* variable is set either)";

/// How to name the database on purpose, when nothing did.
const SET_TARGET: &str = "set LOCKDB_URL=postgres://USER@HOST:PORT/DATABASE (or libpq's PGHOST, \
     PGPORT, PGUSER, PGDATABASE) to the database the daemon sweeps";

/// What the connection line is named: the target, and where it came from.
fn connect_what(db: &DbTarget) -> String {
    match db.target().origin() {
        Origin::Defaults => format!("connect {} (libpq defaults)", db.display()),
        _ => format!("connect {} (from {})", db.display(), db.origin()),
    }
}

/// The defaults spelled out: where libpq's rules led, and as whom.
fn defaults_tried(db: &DbTarget) -> String {
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
async fn connect(db: &DbTarget) -> Result<(PgConnection, Line), Line> {
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
const SUPERUSER: &str = "superuser: every privilege check passes, prefer a least-privilege role";

async fn database_checks(conn: &mut PgConnection, redactor: &Redactor, lines: &mut Vec<Line>) {
    lines.push(migrations(conn, redactor).await);
    for object in EXPECTED {
        let what = object.to_string();
        lines.push(checked(conn, redactor, what, async |c| exists(c, *object).await).await);
    }
    for grant in GRANTS {
        let what = format!("grant {} on {}", grant.privileges.join(", "), grant.on);
        let line = checked(conn, redactor, what.clone(), async |c| {
            granted(c, grant, &what).await
        });
        lines.push(line.await);
    }
    let owners = checked(conn, redactor, DEFINER_OWNERS.into(), definer_owners).await;
    lines.push(owners);
    let planted = checked(conn, redactor, PLANTED.into(), planted_overloads).await;
    lines.push(planted);
}

/// One check in its own guarded transaction (PgBouncer-safe, `in_tx`); a
/// query that fails becomes its FAIL line, named `what`.
async fn checked(
    conn: &mut PgConnection,
    redactor: &Redactor,
    what: String,
    check: impl AsyncFnOnce(&mut PgConnection) -> Result<Line, sqlx::Error>,
) -> Line {
    crate::pg::conn::in_tx(conn, check)
        .await
        .unwrap_or_else(|e| query_failed(what, redactor, &e))
}

const DEFINER_OWNERS: &str = "definer functions' owner";
const PLANTED: &str = "overloads of built-ins";

/// Warns when SECURITY DEFINER functions on this role's search path are
/// owned by a superuser: whatever flaw they have would run with every right.
/// Not a failure: the daemon works, and re-owning them is a migration-time
/// decision (docs/least-privilege.md).
async fn definer_owners(conn: &mut PgConnection) -> Result<Line, sqlx::Error> {
    let owners = catalog::definer_owners(conn).await?;
    Ok(match owners {
        catalog::DefinerOwners {
            superusers: Some(superusers),
            ..
        } => Line::warn(
            DEFINER_OWNERS,
            format!(
                "owned by superuser {superusers}, so a flaw in any of them runs with every right; \
                 migrate as a dedicated owner role instead (docs/least-privilege.md, \"Migrate as a dedicated owner\")"
            ),
        ),
        catalog::DefinerOwners {
            superusers: None,
            all: Some(owners),
        } => Line::ok(
            DEFINER_OWNERS,
            format!("owned by {owners}, not a superuser"),
        ),
        catalog::DefinerOwners {
            superusers: None,
            all: None,
        } => Line::ok(DEFINER_OWNERS, "none on the search path"),
    })
}

/// Fails when a schema on the search path holds an overload of a built-in
/// owned by a role that is neither a superuser nor this one: it can win over
/// the built-in in an unqualified call (CVE-2018-1058). `migrate` refuses
/// to run then (`pg::migrate::PLANTED_OVERLOADS`, the same statement).
async fn planted_overloads(conn: &mut PgConnection) -> Result<Line, sqlx::Error> {
    Ok(match catalog::planted_overloads(conn).await? {
        None => Line::ok(PLANTED, "none owned by another role on the search path"),
        Some(planted) => Line::fail(
            PLANTED,
            format!(
                "{planted}: each can be chosen instead of the built-in it shadows; have it dropped and \
                 REVOKE CREATE ON SCHEMA public FROM PUBLIC (migrate refuses to run until then)"
            ),
        ),
    })
}

fn query_failed(what: String, redactor: &Redactor, err: &sqlx::Error) -> Line {
    Line::fail(what, redactor.redact(&crate::pg::conn::describe(err)))
}

/// Compares the database's `_sqlx_migrations` with the migrations built in.
async fn migrations(conn: &mut PgConnection, redactor: &Redactor) -> Line {
    const WHAT: &str = "migrations";
    match crate::pg::conn::in_tx(conn, catalog::migrations_table_exists).await {
        Ok(true) => {}
        Ok(false) => return Line::fail(WHAT, format!("none applied; {MIGRATE_HINT}")),
        Err(e) => return query_failed(WHAT.into(), redactor, &e),
    }
    let applied = match crate::pg::conn::in_tx(conn, catalog::applied_migrations).await {
        Ok(rows) => rows,
        Err(e) => {
            let mut line = query_failed(WHAT.into(), redactor, &e);
            if e.as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c == "42501")
            {
                line.detail
                    .push_str("; GRANT SELECT ON TABLE _sqlx_migrations TO <this role>");
            }
            return line;
        }
    };
    let built: Vec<_> = crate::pg::migrate::MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .collect();
    let mut pending = Vec::new();
    let mut changed = Vec::new();
    let mut failed = Vec::new();
    for m in &built {
        match applied.iter().find(|a| a.version == m.version) {
            None => pending.push(m.version.to_string()),
            Some(a) if !a.success => failed.push(m.version.to_string()),
            Some(a) if a.checksum.as_slice() != &*m.checksum => changed.push(m.version.to_string()),
            Some(_) => {}
        }
    }
    let newer: Vec<String> = applied
        .iter()
        .filter(|a| built.iter().all(|m| m.version != a.version))
        .map(|a| a.version.to_string())
        .collect();
    let latest = built.iter().map(|m| m.version).max().unwrap_or(0);
    if !failed.is_empty() {
        return Line::fail(
            WHAT,
            format!(
                "{} partially applied (success=false); fix the schema by hand, delete its row from _sqlx_migrations, then run `lease-sweeper migrate`",
                failed.join(", ")
            ),
        );
    }
    if !changed.is_empty() {
        return Line::fail(
            WHAT,
            format!(
                "{} applied with a different checksum than this binary's; the database and binary disagree on the schema, deploy matching versions",
                changed.join(", ")
            ),
        );
    }
    if !pending.is_empty() {
        return Line::fail(
            WHAT,
            format!(
                "{} of {} pending ({}); {MIGRATE_HINT}",
                pending.len(),
                built.len(),
                pending.join(", ")
            ),
        );
    }
    let all = format!("all {} applied (latest {latest})", built.len());
    if newer.is_empty() {
        return Line::ok(WHAT, all);
    }
    // A rolling upgrade migrates before the last old binary stops: this
    // binary still works, but is the old one.
    Line::warn(
        WHAT,
        format!(
            "{all}; the database also has {} newer ({}): fine while an upgrade rolls out, \
             else deploy the binary that shipped them",
            newer.len(),
            newer.join(", ")
        ),
    )
}

/// Whether `object` exists, as this role's `search_path` resolves it.
async fn exists(conn: &mut PgConnection, object: Object) -> Result<Line, sqlx::Error> {
    let what = object.to_string();
    // Not visible through search_path: either absent, or in a schema this
    // role may not use (a schema without USAGE is skipped silently).
    let missing = |elsewhere: Option<String>| match elsewhere {
        None => Line::fail(object.to_string(), format!("missing; {MIGRATE_HINT}")),
        Some(schemas) => Line::fail(
            object.to_string(),
            format!(
                "not visible to this role, but found in schema {schemas}; GRANT USAGE ON SCHEMA {schemas} TO <this role>, or put it on the role's search_path"
            ),
        ),
    };
    match object {
        Object::Table(name) | Object::Index(name) => {
            let Some(found) = catalog::relation(conn, name).await? else {
                let elsewhere = catalog::relation_schemas_anywhere(conn, name).await?;
                return Ok(missing(elsewhere));
            };
            let schema = &found.schema;
            let want_index = matches!(object, Object::Index(_));
            Ok(
                if want_index && !found.is_index() || !want_index && !found.is_table() {
                    Line::fail(
                        what,
                        format!("{schema}.{name} exists but is not a {}", object.kind()),
                    )
                } else if found.valid == Some(false) {
                    Line::fail(
                        what,
                        format!(
                            "{schema}.{name} is INVALID (a failed concurrent build); REINDEX INDEX {schema}.{name}"
                        ),
                    )
                } else {
                    Line::ok(what, format!("{schema}.{name}"))
                },
            )
        }
        Object::Function(name) => {
            let schemas = catalog::visible_function_schemas(conn, name).await?;
            Ok(if schemas.is_empty() {
                missing(catalog::function_schemas_anywhere(conn, name).await?)
            } else {
                Line::ok(what, format!("{}.{name}", schemas.join(",")))
            })
        }
    }
}

/// Whether the connecting role holds every privilege of `grant`.
async fn granted(conn: &mut PgConnection, grant: &Grant, what: &str) -> Result<Line, sqlx::Error> {
    let privileges: Vec<String> = grant.privileges.iter().map(|p| (*p).to_owned()).collect();
    // NULL when the object is missing; else the privileges this role lacks.
    let (lacking, keyword, target) = match grant.on {
        Object::Table(name) | Object::Index(name) => (
            catalog::table_privileges_lacking(conn, name, &privileges).await?,
            "TABLE",
            name,
        ),
        Object::Function(name) => (
            catalog::function_privileges_lacking(conn, name, &privileges).await?,
            "FUNCTION",
            name,
        ),
    };
    Ok(match lacking {
        None => Line::fail(what, format!("{} is missing; {MIGRATE_HINT}", grant.on)),
        Some(lacking) if lacking.is_empty() => Line::ok(what, grant.why),
        Some(lacking) => Line::fail(
            what,
            format!(
                "{LACKS}{}, needed because {}; GRANT {} ON {keyword} {target} TO <this role>",
                lacking.join(", "),
                grant.why,
                lacking.join(", ")
            ),
        ),
    })
}

/// Whether the StatsD host resolves. Delivery over UDP cannot be confirmed,
/// and the daemon starts without it; the preflight still flags it.
async fn resolve_statsd(statsd: &StatsdTarget) -> Line {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn report(statuses: &[Status]) -> Report {
        Report {
            lines: statuses
                .iter()
                .enumerate()
                .map(|(i, s)| Line::new(*s, format!("check {i}"), "found"))
                .collect(),
        }
    }

    #[test]
    fn the_three_statuses_line_up() {
        let lines: Vec<String> = [Status::Ok, Status::Warn, Status::Fail]
            .into_iter()
            .map(|s| Line::new(s, "x", "y").to_string())
            .collect();
        assert_eq!(lines, ["ok    x: y", "warn  x: y", "FAIL  x: y"]);
    }

    #[test]
    fn warnings_pass_and_are_counted_in_the_summary() {
        use Status::*;
        let clean = report(&[Ok, Ok]);
        assert!(clean.passed());
        assert_eq!(clean.summary(), "check passed: all 2 checks ok");

        let warned = report(&[Ok, Warn, Ok]);
        assert!(warned.passed(), "a warning does not fail the check");
        assert_eq!(
            warned.summary(),
            "check passed: 2 of 3 checks ok, 1 warning (see the warn lines above)"
        );

        let failed = report(&[Fail, Warn, Warn, Ok]);
        assert!(!failed.passed());
        assert_eq!((failed.failed(), failed.warned()), (1, 2));
        assert_eq!(
            failed.summary(),
            "check FAILED: 1 of 4 checks failed, 2 warnings (see the FAIL and warn lines above)"
        );
        assert_eq!(
            report(&[Fail, Ok]).summary(),
            "check FAILED: 1 of 2 checks failed (see the FAIL lines above)"
        );
    }
}
