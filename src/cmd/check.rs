//! `lease-sweeper check`: the operator's preflight, also run by systemd's
//! `ExecStartPre`.
//!
//! Owns the list of what the daemon needs from its environment and checking
//! each item once: the connection (with a short timeout), the migration
//! version, the tables, indexes and functions, the connecting role's
//! privileges, and that the StatsD host resolves. It prints one line per check
//! (`ok` or `FAIL` with what to do) on stdout and a summary, and exits 0 when
//! all pass, 1 otherwise (2 stays "configuration error", as everywhere).
//!
//! It changes nothing and never prints a password: the database is named by
//! `DbTarget::display`, and every error text goes through its redactor.
//!
//! It is data-driven on purpose: the schema grows in `migrations/` by other
//! hands, and adding a table, index, function or grant to check is one line in
//! `EXPECTED` or `GRANTS`. It does not own the SQL of the sweep, nor decide
//! whether a failed check blocks the daemon (the unit file does).

use std::fmt;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use sqlx::PgConnection;

use crate::config::{DbTarget, Redactor, StatsdTarget};

/// How long the preflight waits for the database, per host of the target.
/// Shorter than the daemon's own connect timeout: a preflight is interactive
/// or blocks a unit's start.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

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

/// One check's result: one output line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub ok: bool,
    /// What was checked, e.g. `table lock_entry`.
    pub what: String,
    /// What was found, or what to do about it.
    pub detail: String,
}

impl Line {
    fn ok(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            ok: true,
            what: what.into(),
            detail: detail.into(),
        }
    }

    fn fail(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            ok: false,
            what: what.into(),
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = if self.ok { "ok" } else { "FAIL" };
        write!(f, "{status:<4}  {}: {}", self.what, self.detail)
    }
}

/// Every check's line, in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub lines: Vec<Line>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.lines.iter().all(|l| l.ok)
    }

    pub fn failed(&self) -> usize {
        self.lines.iter().filter(|l| !l.ok).count()
    }

    /// The last line: a verdict an operator can read without scrolling.
    pub fn summary(&self) -> String {
        if self.passed() {
            format!("check passed: all {} checks ok", self.lines.len())
        } else {
            let grants_missing = self
                .lines
                .iter()
                .any(|l| !l.ok && l.detail.starts_with(LACKS));
            format!(
                "check FAILED: {} of {} checks failed (see the FAIL lines above){}",
                self.failed(),
                self.lines.len(),
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
/// on stdout, exits 0 when every check passed and 1 otherwise.
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
    match connect(db).await {
        Ok((mut conn, line)) => {
            report.lines.push(line);
            database_checks(&mut conn, &redactor, &mut report.lines).await;
            // Best effort: the server ends the session anyway when we exit.
            let _ =
                tokio::time::timeout(Duration::from_secs(1), sqlx::Connection::close(conn)).await;
        }
        Err(line) => {
            report.lines.push(line);
            report.lines.push(Line::fail(
                "schema and privileges",
                "not checked without a database connection",
            ));
        }
    }
    report.lines.push(resolve_statsd(statsd).await);
    report
}

async fn connect(db: &DbTarget) -> Result<(PgConnection, Line), Line> {
    let what = format!("connect {}", db.display());
    let started = Instant::now();
    // A multi-host target walks its hosts in turn: each gets the bound.
    let bound = CONNECT_TIMEOUT * db.target().hosts().len().max(1) as u32;
    let mut conn = match tokio::time::timeout(bound, crate::pg::conn::connect(db)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            return Err(Line::fail(
                what,
                format!(
                    "{}; check LOCKDB_URL, that the server runs and accepts this host and role",
                    e.cause()
                ),
            ));
        }
        Err(_) => {
            return Err(Line::fail(
                what,
                format!(
                    "no answer within {} s; check the host, port and firewall",
                    bound.as_secs()
                ),
            ));
        }
    };
    let took = started.elapsed().as_millis();
    // Each check runs in its own short transaction: through PgBouncer in
    // transaction mode a statement outside one may be prepared on one server
    // connection and executed on another (see crate::pg::conn::in_tx).
    let who: Result<(String, String, bool), _> = crate::pg::conn::in_tx(&mut conn, async |c| {
        sqlx::query_as(
            "SELECT current_user::text, pg_catalog.current_setting('server_version'),
                (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user)",
        )
        .persistent(false)
        .fetch_one(c)
        .await
    })
    .await;
    match who {
        Ok((role, version, superuser)) => {
            let note = if superuser {
                "; superuser: every privilege check passes, prefer a least-privilege role"
            } else {
                ""
            };
            Ok((
                conn,
                Line::ok(
                    what,
                    format!("as role {role}, PostgreSQL {version}, {took} ms{note}"),
                ),
            ))
        }
        Err(e) => Err(Line::fail(
            what,
            db.redactor().redact(&crate::pg::conn::describe(&e)),
        )),
    }
}

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

/// Warns (the line stays `ok`) when SECURITY DEFINER functions on this
/// role's search path are owned by a superuser: whatever flaw they have
/// would run with every right, so a dedicated owner role is safer.
async fn definer_owners(conn: &mut PgConnection) -> Result<Line, sqlx::Error> {
    let found: (Option<String>, Option<String>) = sqlx::query_as(
        "SELECT pg_catalog.string_agg(DISTINCT r.rolname::text, ', ') FILTER (WHERE r.rolsuper),
                pg_catalog.string_agg(DISTINCT r.rolname::text, ', ')
           FROM pg_catalog.pg_proc p
           JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) p.proowner
           JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
          WHERE p.prosecdef
            AND n.nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(false))
            AND n.nspname OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.name",
    )
    .persistent(false)
    .fetch_one(&mut *conn)
    .await?;
    Ok(match found {
        (Some(superusers), _) => Line::ok(
            DEFINER_OWNERS,
            format!(
                "WARNING: owned by superuser {superusers}, so a flaw in any of them runs with every right; \
                 migrate as a dedicated owner role instead (docs/least-privilege.md, \"Migrate as a dedicated owner\")"
            ),
        ),
        (None, Some(owners)) => Line::ok(
            DEFINER_OWNERS,
            format!("owned by {owners}, not a superuser"),
        ),
        (None, None) => Line::ok(DEFINER_OWNERS, "none on the search path"),
    })
}

/// Fails when a schema on the search path holds an overload of a built-in
/// owned by a role that is neither a superuser nor this one: it can win over
/// the built-in in an unqualified call (CVE-2018-1058). `migrate` refuses
/// to run then (`pg::migrate::PLANTED_OVERLOADS`, the same statement).
async fn planted_overloads(conn: &mut PgConnection) -> Result<Line, sqlx::Error> {
    let planted: Option<String> = sqlx::query_scalar(crate::pg::migrate::PLANTED_OVERLOADS)
        .persistent(false)
        .fetch_one(&mut *conn)
        .await?;
    Ok(match planted {
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
    let table: Option<String> = match crate::pg::conn::in_tx(conn, async |c| {
        sqlx::query_scalar("SELECT pg_catalog.to_regclass('_sqlx_migrations')::text")
            .persistent(false)
            .fetch_one(c)
            .await
    })
    .await
    {
        Ok(t) => t,
        Err(e) => return query_failed(WHAT.into(), redactor, &e),
    };
    if table.is_none() {
        return Line::fail(WHAT, format!("none applied; {MIGRATE_HINT}"));
    }
    let applied: Vec<(i64, bool, Vec<u8>)> = match crate::pg::conn::in_tx(conn, async |c| {
        sqlx::query_as("SELECT version, success, checksum FROM _sqlx_migrations")
            .persistent(false)
            .fetch_all(c)
            .await
    })
    .await
    {
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
        match applied.iter().find(|(v, _, _)| *v == m.version) {
            None => pending.push(m.version.to_string()),
            Some((_, false, _)) => failed.push(m.version.to_string()),
            Some((_, true, sum)) if sum.as_slice() != &*m.checksum => {
                changed.push(m.version.to_string())
            }
            Some(_) => {}
        }
    }
    let newer: Vec<String> = applied
        .iter()
        .filter(|(v, _, _)| built.iter().all(|m| m.version != *v))
        .map(|(v, _, _)| v.to_string())
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
    let mut detail = format!("all {} applied (latest {latest})", built.len());
    if !newer.is_empty() {
        // A rolling upgrade migrates before the last old binary stops.
        detail.push_str(&format!(
            "; the database also has {} newer ({}), fine while an upgrade rolls out",
            newer.len(),
            newer.join(", ")
        ));
    }
    Line::ok(WHAT, detail)
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
            let found: Option<(String, Option<bool>, String)> = sqlx::query_as(
                "SELECT c.relkind::text,
                        (SELECT i.indisvalid FROM pg_catalog.pg_index i
                          WHERE i.indexrelid OPERATOR(pg_catalog.=) c.oid),
                        n.nspname::text
                   FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                  WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1)",
            )
            .persistent(false)
            .bind(name)
            .fetch_optional(&mut *conn)
            .await?;
            let Some((relkind, valid, schema)) = found else {
                let elsewhere: Option<String> = sqlx::query_scalar(
                    "SELECT pg_catalog.string_agg(DISTINCT n.nspname::text, ', ')
                       FROM pg_catalog.pg_class c
                       JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                      WHERE c.relname OPERATOR(pg_catalog.=) $1",
                )
                .persistent(false)
                .bind(name)
                .fetch_one(&mut *conn)
                .await?;
                return Ok(missing(elsewhere));
            };
            let want_index = matches!(object, Object::Index(_));
            let is_index = matches!(relkind.as_str(), "i" | "I");
            let is_table = matches!(relkind.as_str(), "r" | "p");
            Ok(if want_index && !is_index || !want_index && !is_table {
                Line::fail(
                    what,
                    format!("{schema}.{name} exists but is not a {}", object.kind()),
                )
            } else if valid == Some(false) {
                Line::fail(
                    what,
                    format!(
                        "{schema}.{name} is INVALID (a failed concurrent build); REINDEX INDEX {schema}.{name}"
                    ),
                )
            } else {
                Line::ok(what, format!("{schema}.{name}"))
            })
        }
        Object::Function(name) => {
            let schemas: Vec<String> = sqlx::query_scalar(
                "SELECT DISTINCT n.nspname::text
                   FROM pg_catalog.pg_proc p
                   JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
                  WHERE p.proname OPERATOR(pg_catalog.=) $1 AND pg_catalog.pg_function_is_visible(p.oid)",
            )
            .persistent(false)
            .bind(name)
            .fetch_all(&mut *conn)
            .await?;
            Ok(match schemas.as_slice() {
                [] => {
                    let elsewhere: Option<String> = sqlx::query_scalar(
                        "SELECT pg_catalog.string_agg(DISTINCT n.nspname::text, ', ')
                           FROM pg_catalog.pg_proc p
                           JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
                          WHERE p.proname OPERATOR(pg_catalog.=) $1",
                    )
                    .persistent(false)
                    .bind(name)
                    .fetch_one(&mut *conn)
                    .await?;
                    missing(elsewhere)
                }
                found => Line::ok(what, format!("{}.{name}", found.join(","))),
            })
        }
    }
}

/// Whether the connecting role holds every privilege of `grant`.
async fn granted(conn: &mut PgConnection, grant: &Grant, what: &str) -> Result<Line, sqlx::Error> {
    let privileges: Vec<String> = grant.privileges.iter().map(|p| (*p).to_owned()).collect();
    // NULL when the object is missing; else the privileges this role lacks.
    let lacking: Option<Vec<String>> = match grant.on {
        Object::Table(name) | Object::Index(name) => {
            sqlx::query_scalar(
                "SELECT CASE WHEN pg_catalog.to_regclass($1) IS NULL THEN NULL ELSE
                        coalesce(pg_catalog.array_agg(p) FILTER (WHERE NOT
                            CASE WHEN p OPERATOR(pg_catalog.~~) '% (%'
                                 THEN (SELECT pg_catalog.bool_and(pg_catalog.has_column_privilege(
                                              pg_catalog.to_regclass($1)::pg_catalog.oid, pg_catalog.btrim(c),
                                              pg_catalog.split_part(p, ' ', 1)))
                                         FROM pg_catalog.unnest(pg_catalog.string_to_array(
                                              pg_catalog.rtrim(pg_catalog.split_part(p, '(', 2), ')'), ',')) AS c)
                                 ELSE pg_catalog.has_table_privilege(pg_catalog.to_regclass($1)::pg_catalog.oid, p) END),
                                 '{}'::pg_catalog.text[])
                        END
                   FROM pg_catalog.unnest($2::pg_catalog.text[]) AS p",
            )
            .persistent(false)
            .bind(name)
            .bind(&privileges)
            .fetch_one(&mut *conn)
            .await?
        }
        Object::Function(name) => {
            // Every visible overload must be callable.
            sqlx::query_scalar(
                "SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc f
                                               WHERE f.proname OPERATOR(pg_catalog.=) $1
                                                 AND pg_catalog.pg_function_is_visible(f.oid))
                        THEN NULL ELSE
                        coalesce(pg_catalog.array_agg(DISTINCT p) FILTER (WHERE NOT pg_catalog.has_function_privilege(f.oid, p)),
                                 '{}'::pg_catalog.text[])
                        END
                   FROM pg_catalog.unnest($2::pg_catalog.text[]) AS p
                   LEFT JOIN pg_catalog.pg_proc f ON f.proname OPERATOR(pg_catalog.=) $1
                        AND pg_catalog.pg_function_is_visible(f.oid)",
            )
.persistent(false)
            .bind(name)
            .bind(&privileges)
            .fetch_one(&mut *conn)
            .await?
        }
    };
    Ok(match lacking {
        None => Line::fail(what, format!("{} is missing; {MIGRATE_HINT}", grant.on)),
        Some(lacking) if lacking.is_empty() => Line::ok(what, grant.why),
        Some(lacking) => {
            let (keyword, target) = match grant.on {
                Object::Function(name) => ("FUNCTION", name),
                Object::Table(name) | Object::Index(name) => ("TABLE", name),
            };
            Line::fail(
                what,
                format!(
                    "{LACKS}{}, needed because {}; GRANT {} ON {keyword} {target} TO <this role>",
                    lacking.join(", "),
                    grant.why,
                    lacking.join(", ")
                ),
            )
        }
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
