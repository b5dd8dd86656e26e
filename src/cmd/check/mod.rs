//! `lease-sweeper check`: the operator's preflight, also run by systemd's
//! `ExecStartPre`.
//!
//! Owns the list of what the daemon needs from its environment and checking
//! each item once, one `ok`/`warn`/`FAIL` line on stdout each, then a verdict
//! (exit 1 on a `FAIL`, 2 for a configuration error). It changes nothing and
//! never prints a password (`DbTarget::display` and its redactor). Adding an
//! item is one line in `inventory`'s `EXPECTED` or `GRANTS`; `connection`
//! reaches the database and StatsD, `schema` asks once connected (through
//! `pg::catalog`'s statements), `report` words the lines. It does not decide
//! whether a failed check blocks the daemon (the unit file does).

use std::process::ExitCode;
use std::time::Duration;

use sqlx::PgConnection;

use crate::config::{DbTarget, Redactor, StatsdTarget};

mod connection;
mod inventory;
mod report;
mod schema;

pub use inventory::{EXPECTED, GRANTS, Grant, Object};
pub use report::{Line, Report, Status};

use connection::{SETTINGS, connect, resolve_statsd};
use report::query_failed;
use schema::{
    DEFINER_OWNERS, LOCK_SERVER, PLANTED, definer_owners, exists, granted, lock_server, migrations,
    missing_everywhere, never_migrated, planted_overloads,
};

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

async fn database_checks(conn: &mut PgConnection, redactor: &Redactor, lines: &mut Vec<Line>) {
    match crate::pg::conn::in_tx(conn, lock_server).await {
        Ok(Some(line)) => lines.push(line),
        Ok(None) => {}
        Err(e) => lines.push(query_failed(LOCK_SERVER.into(), redactor, &e)),
    }
    let (migrated, none_applied) = migrations(conn, redactor).await;
    let mut objects = Vec::with_capacity(EXPECTED.len());
    for object in EXPECTED {
        let what = object.to_string();
        objects.push(checked(conn, redactor, what, async |c| exists(c, *object).await).await);
    }
    let never_migrated_here = none_applied
        && objects
            .iter()
            .zip(EXPECTED)
            .filter(|(_, object)| inventory::Whose::of(**object) == inventory::Whose::Sidecar)
            .all(|(line, _)| missing_everywhere(line));
    if never_migrated_here {
        // Never migrated: one FAIL, not one per object and grant (the line
        // above says what `migrate` will add).
        lines.push(never_migrated(objects.len()));
    } else {
        lines.push(migrated);
        lines.extend(objects);
        grants(conn, redactor, lines).await;
    }
    let owners = checked(conn, redactor, DEFINER_OWNERS.into(), definer_owners).await;
    lines.push(owners);
    let planted = checked(conn, redactor, PLANTED.into(), planted_overloads).await;
    lines.push(planted);
    let view = checked(conn, redactor, HORIZON_VIEW.into(), horizon_view).await;
    lines.push(view);
}

async fn grants(conn: &mut PgConnection, redactor: &Redactor, lines: &mut Vec<Line>) {
    for grant in GRANTS {
        let what = format!("grant {} on {}", grant.privileges.join(", "), grant.on);
        let line = checked(conn, redactor, what.clone(), async |c| {
            granted(c, grant, &what).await
        });
        lines.push(line.await);
    }
}

/// What the horizon check can see of other roles' sessions.
const HORIZON_VIEW: &str = "horizon check's view of sessions";

/// A warning, not a failure: without `pg_read_all_stats` the horizon check
/// still names every holder, with less about other roles' sessions.
async fn horizon_view(conn: &mut PgConnection) -> Result<Line, sqlx::Error> {
    Ok(if crate::pg::horizon::reads_all_stats(conn).await? {
        Line::ok(
            HORIZON_VIEW,
            "member of pg_read_all_stats: every holder of the xmin horizon is seen in full",
        )
    } else {
        Line::warn(
            HORIZON_VIEW,
            "not a member of pg_read_all_stats: holders of the xmin horizon are still named \
             (pid, application_name, slot, prepared transaction), but other roles' sessions' \
             state, client address and transaction start are hidden; to see them, as a \
             superuser: GRANT pg_read_all_stats TO lease_sweeper (docs/least-privilege.md)",
        )
    })
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
