//! `lease-sweeper check`: the operator's preflight, also run by systemd's
//! `ExecStartPre`.
//!
//! Owns the list of what the daemon needs from its environment and checking
//! each item once, one `ok`/`warn`/`FAIL` line on stdout each, then a verdict
//! (exit 1 on a `FAIL`, 2 for a configuration error). It changes nothing and
//! never prints a password (`DbTarget::display` and its redactor). Adding an
//! item is one line in `inventory`'s `EXPECTED` or `GRANTS`; `connection`
//! reaches the database and StatsD, `schema` asks once connected (through
//! `pg::catalog`'s statements), `web` reads the metrics endpoint's web
//! configuration file as `run` would, `report` words the lines. It does not decide
//! whether a failed check blocks the daemon (the unit file does).

use std::process::ExitCode;
use std::time::Duration;

use sqlx::PgConnection;

use crate::config::{DbTarget, Redactor, StatsdTarget};

mod connection;
mod etcd;
mod functions;
mod inventory;
mod report;
mod schema;
mod web;

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
    let etcd = crate::config::EtcdTarget::from_env()?;
    let statsd = StatsdTarget::from_env()?;
    let web_config =
        crate::config::web_config_file_from_env(crate::config::metrics_addr_from_env()?)?;
    let mut report = match &etcd {
        // Locks in etcd, and no database named: etcd and StatsD only.
        Some(target) if !crate::config::pg_named_in_env() => {
            let mut report = Report::default();
            report.lines.extend(etcd::lines(target).await);
            report.lines.push(resolve_statsd(&statsd).await);
            report
        }
        _ => {
            let db = DbTarget::from_env()?;
            let mut report = preflight(&db, &statsd).await;
            if let Some(target) = &etcd {
                report.lines.splice(0..0, etcd::lines(target).await);
            }
            report
        }
    };
    if let Some(path) = &web_config {
        report.lines.push(web::line(path));
    }
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
    // Beside a lock server without a job queue the reaper idles: one line
    // says so instead of a FAIL per queue table and grant.
    let no_job_queue = match crate::pg::conn::in_tx(conn, job_queue::absent).await {
        Ok(absent) => absent,
        Err(e) => {
            lines.push(query_failed(job_queue::JOB_REAPER.into(), redactor, &e));
            false
        }
    };
    let expected: Vec<Object> = EXPECTED
        .iter()
        .copied()
        .filter(|object| {
            !(no_job_queue && inventory::Whose::of(*object) == inventory::Whose::JobQueue)
        })
        .collect();
    let mut objects = Vec::with_capacity(expected.len());
    for object in &expected {
        let what = object.to_string();
        objects.push(checked(conn, redactor, what, async |c| exists(c, *object).await).await);
    }
    let never_migrated_here = none_applied
        && objects
            .iter()
            .zip(&expected)
            .filter(|(_, object)| inventory::Whose::of(**object) == inventory::Whose::Sidecar)
            .all(|(line, _)| missing_everywhere(line));
    if never_migrated_here {
        // Never migrated: one FAIL, not one per object and grant (the line
        // above says what `migrate` will add).
        lines.push(never_migrated(objects.len()));
    } else {
        // A schema newer than this binary (an upgrade rolling out) makes
        // other function text expected, not a failure.
        let newer_schema = migrated.status == Status::Warn;
        lines.push(migrated);
        let mut texts = checked(conn, redactor, functions::FUNCTIONS.into(), async |c| {
            functions::function_texts(c, newer_schema).await
        })
        .await;
        if texts.failed() && texts.detail.contains("(SQLSTATE 42501)") {
            texts
                .detail
                .push_str("; GRANT SELECT ON TABLE lease_sweeper_sql TO <this role>");
        }
        lines.push(texts);
        if no_job_queue {
            lines.push(job_queue::idle());
        }
        lines.extend(objects);
        grants(conn, redactor, no_job_queue, lines).await;
        let features =
            crate::pg::conn::in_tx(conn, crate::pg::job_queue::lease_duration_parts).await;
        match features {
            Ok(Some(parts)) => lines.push(queue_features(parts)),
            Ok(None) => {}
            Err(e) => lines.push(query_failed(QUEUE_FEATURES.into(), redactor, &e)),
        }
    }
    let owners = checked(conn, redactor, DEFINER_OWNERS.into(), definer_owners).await;
    lines.push(owners);
    let planted = checked(conn, redactor, PLANTED.into(), planted_overloads).await;
    lines.push(planted);
    let view = checked(conn, redactor, HORIZON_VIEW.into(), horizon_view).await;
    lines.push(view);
}

async fn grants(
    conn: &mut PgConnection,
    redactor: &Redactor,
    no_job_queue: bool,
    lines: &mut Vec<Line>,
) {
    for grant in GRANTS {
        if no_job_queue && inventory::Whose::of(grant.on) == inventory::Whose::JobQueue {
            continue;
        }
        let what = format!("grant {} on {}", grant.privileges.join(", "), grant.on);
        let line = checked(conn, redactor, what.clone(), async |c| {
            granted(c, grant, &what).await
        });
        lines.push(line.await);
    }
}

/// Which of the sidecar's optional features the job queue supports.
const QUEUE_FEATURES: &str = "job queue's optional features";

/// Per-kind lease durations: `ok` where the queue has every part, `warn`
/// (not a failure: the reaper and the dry run work without them) naming
/// what it lacks where it does not, as a queue adopted as its own tool made
/// it may not.
fn queue_features(parts: crate::pg::job_queue::LeaseDurationParts) -> Line {
    let missing: Vec<&str> = [
        (parts.kind_table, "job_kind_lease"),
        (parts.setter, "fn_job_kind_lease_set"),
        (
            parts.recorded,
            "job_queue's lease_duration_sec and lease_duration_source",
        ),
    ]
    .into_iter()
    .filter_map(|(there, what)| (!there).then_some(what))
    .collect();
    if missing.is_empty() {
        return Line::ok(
            QUEUE_FEATURES,
            "per-kind lease durations: yes (job_kind_lease, fn_job_kind_lease_set, and the lease \
             each claim gave in job_queue): `leases` shows and sets them, and the dry run says \
             which lease each job was given",
        );
    }
    Line::warn(
        QUEUE_FEATURES,
        format!(
            "per-kind lease durations: no (the job queue lacks {}): the reaper and the dry run \
             work all the same, reaping whatever passed its lease_until; `leases` is not \
             available{}",
            lacks(&missing),
            if parts.recorded {
                ""
            } else {
                ", and the dry run does not say which lease each job was given"
            }
        ),
    )
}

/// The job reaper where there is no job queue.
mod job_queue {
    use sqlx::PgConnection;

    use super::Line;

    pub(super) const JOB_REAPER: &str = "job reaper";

    /// The sidecar is installed (its `lease_sweeper_sql` is somewhere) and
    /// no relation named `job_queue` is anywhere in the database (not
    /// merely out of this role's sight, which the table's own line
    /// reports). A database never migrated keeps its one line.
    pub(super) async fn absent(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
        use crate::pg::catalog::relation_schemas_anywhere;
        Ok(relation_schemas_anywhere(conn, "lease_sweeper_sql")
            .await?
            .is_some()
            && relation_schemas_anywhere(conn, "job_queue")
                .await?
                .is_none())
    }

    /// Not a warning: a lock server may run without a job queue, and the
    /// reaper idling beside it is what it should do.
    pub(super) fn idle() -> Line {
        Line::ok(
            JOB_REAPER,
            "idle: there is no job_queue in this database (the lock server runs without a job \
             queue, and migrate creates the stand-in queue only in an empty database); nothing to \
             reap, and lease-sweeper migrate adopts a job queue once one exists in the lock \
             server's schema",
        )
    }
}

/// `a`, `a and b`, `a, b, and c`.
fn lacks(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [one, two] => format!("{one} and {two}"),
        [rest @ .., last] => format!("{}, and {last}", rest.join(", ")),
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
