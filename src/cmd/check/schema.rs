//! What `check` asks the database once connected: the migrations applied,
//! each expected object, each grant, who owns the definer functions, and
//! overloads planted in front of built-ins. The statements are
//! `pg::catalog`'s; this module words the lines.

use sqlx::PgConnection;

use super::inventory::{Grant, Object, Whose};
use super::report::{LACKS, Line, MIGRATE_HINT, query_failed};
use crate::config::Redactor;
use crate::pg::catalog;

pub(super) const DEFINER_OWNERS: &str = "definer functions' owner";
/// The one line that stands for the migrations, objects and grants of a
/// database never migrated.
pub(super) const SCHEMA: &str = "schema";
pub(super) const PLANTED: &str = "overloads of built-ins";
pub(super) const LOCK_SERVER: &str = "lock server's table";

/// Whose `lock_entry` is, whether it fits what the sweep reads, and whether
/// the sidecar has adopted it; on a database not yet adopted, what
/// `migrate` will add. No line where this role sees no `lock_entry` (the
/// table's own line says so, or the one line of a database never migrated).
pub(super) async fn lock_server(conn: &mut PgConnection) -> Result<Option<Line>, sqlx::Error> {
    let Some(found) = crate::pg::adopt::describe(conn, "lock_entry").await? else {
        return Ok(None);
    };
    let table = format!("{}.lock_entry, owned by {}", found.schema, found.owner);
    let misfits = crate::pg::adopt::lock_entry_misfits(&found);
    if !misfits.is_empty() {
        return Ok(Some(Line::fail(
            LOCK_SERVER,
            format!(
                "{table}, does not fit what the sweep reads: {}; migrate refuses it (docs/adopting.md)",
                misfits.join("; ")
            ),
        )));
    }
    let state = catalog::adoption(conn).await?;
    let index = state.deadline_index.as_deref().map_or(
        ", and build lock_entry_expiry_idx CONCURRENTLY (none leads with expires_at)".to_owned(),
        |_| String::new(),
    );
    Ok(Some(match state {
        catalog::Adoption {
            installed: false, ..
        } => Line::fail(
            LOCK_SERVER,
            format!(
                "{table}, fits; not adopted yet: `lease-sweeper migrate`, run as {} or a superuser, \
                 will add the sidecar's records, functions, role and grants and three triggers on \
                 lock_entry{index}, and change none of the lock server's tables, rows or history",
                found.owner
            ),
        ),
        catalog::Adoption { triggers, .. } if triggers < catalog::HOOK_TRIGGERS => Line::fail(
            LOCK_SERVER,
            format!(
                "{table}, adopted, but {} of the sidecar's three triggers on it are missing: takeovers, \
                 late renewals and late releases go unreported; {MIGRATE_HINT}",
                catalog::HOOK_TRIGGERS - triggers
            ),
        ),
        catalog::Adoption {
            deadline_index: None,
            ..
        } => Line::fail(
            LOCK_SERVER,
            format!(
                "{table}, adopted, but no index leads with expires_at: every sweep scans the table; {MIGRATE_HINT}"
            ),
        ),
        catalog::Adoption {
            deadline_index: Some(index),
            ..
        } => Line::ok(
            LOCK_SERVER,
            format!(
                "{table}, fits and is adopted (deadline index {index}): its tables, rows, triggers \
                 and history are the lock server's; the records, functions, grants and the triggers \
                 lock_entry_takeover, lock_entry_late_renewal and lock_entry_late_release are the sidecar's"
            ),
        ),
    }))
}

/// Warns when SECURITY DEFINER functions on this role's search path are
/// owned by a superuser: whatever flaw they have would run with every right.
/// Not a failure: the daemon works, and re-owning them is a migration-time
/// decision (docs/least-privilege.md).
pub(super) async fn definer_owners(conn: &mut PgConnection) -> Result<Line, sqlx::Error> {
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
/// to run then (`pg::catalog::PLANTED_OVERLOADS`, the same statement).
pub(super) async fn planted_overloads(conn: &mut PgConnection) -> Result<Line, sqlx::Error> {
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

/// The line of a database never migrated: no migration applied and none of
/// the `objects` the daemon uses anywhere. One line instead of one per
/// object and grant, which would all give the same advice.
pub(super) fn never_migrated(objects: usize) -> Line {
    Line::fail(
        SCHEMA,
        format!(
            "not migrated (no migration applied, none of the {objects} tables, indexes and \
             functions the daemon uses exists); {MIGRATE_HINT}"
        ),
    )
}

/// Whether `line` says its object exists nowhere in the database (not merely
/// out of this role's sight).
pub(super) fn missing_everywhere(line: &Line) -> bool {
    line.failed() && line.detail == missing_detail()
}

fn missing_detail() -> String {
    format!("missing; {MIGRATE_HINT}")
}

/// Compares the database's `lease_sweeper_migrations` with the migrations built in;
/// the flag is true when no migration was ever applied (no such table).
pub(super) async fn migrations(conn: &mut PgConnection, redactor: &Redactor) -> (Line, bool) {
    const WHAT: &str = "migrations";
    match crate::pg::conn::in_tx(conn, catalog::migrations_table_exists).await {
        Ok(true) => {}
        Ok(false) => {
            return (
                Line::fail(WHAT, format!("none applied; {MIGRATE_HINT}")),
                true,
            );
        }
        Err(e) => return (query_failed(WHAT.into(), redactor, &e), false),
    }
    (migrations_applied(conn, redactor).await, false)
}

async fn migrations_applied(conn: &mut PgConnection, redactor: &Redactor) -> Line {
    const WHAT: &str = "migrations";
    let applied = match crate::pg::conn::in_tx(conn, catalog::applied_migrations).await {
        Ok(rows) => rows,
        Err(e) => {
            let mut line = query_failed(WHAT.into(), redactor, &e);
            if e.as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c == "42501")
            {
                line.detail
                    .push_str("; GRANT SELECT ON TABLE lease_sweeper_migrations TO <this role>");
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
                "{} partially applied (success=false); fix the schema by hand, delete its row from lease_sweeper_migrations, then run `lease-sweeper migrate`",
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
    // Only the versioned migrations: the functions' text is the line
    // `functions`, which can differ on a database that has every migration.
    let all = format!(
        "{n} of {n} versioned migrations applied (latest {latest})",
        n = built.len()
    );
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
pub(super) async fn exists(conn: &mut PgConnection, object: Object) -> Result<Line, sqlx::Error> {
    let what = object.to_string();
    // Not visible through search_path: either absent, or in a schema this
    // role may not use (a schema without USAGE is skipped silently).
    let missing = |elsewhere: Option<String>| match elsewhere {
        None => Line::fail(object.to_string(), missing_detail()),
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
                    Line::ok(what, format!("{schema}.{name}, {}", Whose::of(object)))
                },
            )
        }
        Object::Function(name) => {
            let schemas = catalog::visible_function_schemas(conn, name).await?;
            Ok(if schemas.is_empty() {
                missing(catalog::function_schemas_anywhere(conn, name).await?)
            } else {
                Line::ok(
                    what,
                    format!("{}.{name}, {}", schemas.join(","), Whose::of(object)),
                )
            })
        }
    }
}

/// Whether the connecting role holds every privilege of `grant`.
pub(super) async fn granted(
    conn: &mut PgConnection,
    grant: &Grant,
    what: &str,
) -> Result<Line, sqlx::Error> {
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
